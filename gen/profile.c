#include "gen/profile.h"

#include <string.h>

/* Figures from the vendors' tuning guides: the opt-in shared memory per block
 * is what one block may use; per SM is what all resident blocks share. */
static const fg_profile named_profiles[] = {
    /* name      arch  SMs  smem/block      smem/SM         regs/SM regs/blk threads/SM DRAM GB/s */
    {"t4",       75,   40,  64 * 1024,      64 * 1024,      65536,  65536,   1024,      320},
    {"a100",     80,   108, 163 * 1024,     164 * 1024,     65536,  65536,   2048,      1555},
    {"rtx3090",  86,   82,  99 * 1024,      100 * 1024,     65536,  65536,   1536,      936},
    {"l4",       89,   58,  99 * 1024,      100 * 1024,     65536,  65536,   1536,      300},
    {"h100",     90,   132, 227 * 1024,     228 * 1024,     65536,  65536,   2048,      3352},
};

int profile_named_count(void) { return (int)(sizeof named_profiles / sizeof named_profiles[0]); }

const fg_profile *profile_named_at(int index) {
    if (index < 0 || index >= profile_named_count()) return 0;
    return &named_profiles[index];
}

const fg_profile *profile_named(const char *name) {
    if (!name) return 0;
    for (int i = 0; i < profile_named_count(); i++)
        if (strcmp(named_profiles[i].name, name) == 0) return &named_profiles[i];
    return 0;
}
