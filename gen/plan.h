/* What the families' planners share. Each family's plan type and planner
 * live with the family (families/); these are the rules they have in common. */
#ifndef FG_PLAN_H
#define FG_PLAN_H

/* Shared-memory rows are padded by 8 elements (16 bytes) so that the eight
 * row addresses of an ldmatrix fall in distinct bank groups. */
#define PLAN_SMEM_ROW_PAD 8

/* Accumulator budgets step down by 16 registers after a plan spills; the
 * budget to try after `budget`, or 0 when there is none. */
int plan_next_budget(int budget);

#endif
