#include "gen/target.h"

#include <stdio.h>

void target_name(const kernel_target *t, char *buf, size_t len) {
    snprintf(buf, len, "sm_%d%s", t->cc, t->arch_specific ? "a" : "");
}

void target_tag(const kernel_target *t, char *buf, size_t len) {
    snprintf(buf, len, "sm%d%s", t->cc, t->arch_specific ? "a" : "");
}
