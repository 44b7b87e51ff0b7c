/* Device profiles: the facts the planner needs about a GPU, for the live one
 * (filled from the driver by the runtime) or a named target. */
#ifndef FG_PROFILE_H
#define FG_PROFILE_H

typedef struct fg_profile {
    char name[64];          /* "h100", or the live device's name */
    int arch;               /* 75, 80, 86, 89, 90 */
    int sm_count;
    int smem_per_block;     /* bytes a block may opt in to */
    int smem_per_sm;        /* bytes */
    int regs_per_sm;
    int regs_per_block;
    int max_threads_per_sm;
    int dram_gb_per_s;      /* peak DRAM bandwidth, GB/s (0: unknown) */
} fg_profile;

/* Named targets: t4, a100, rtx3090, l4, h100. NULL if unknown. */
const fg_profile *profile_named(const char *name);
int profile_named_count(void);
const fg_profile *profile_named_at(int index);

#endif
