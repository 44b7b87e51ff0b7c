#include "gen/plan.h"

int plan_next_budget(int budget) { return budget > 64 ? budget - 16 : 0; }
