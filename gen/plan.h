/* The planner: spec x device profile -> tile sizes, warps, pipeline depth. */
#ifndef FG_PLAN_H
#define FG_PLAN_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/profile.h"

/* Accumulator registers per thread the planner first allows for O and S
 * together; the rest of the 255 go to operand fragments, addresses and
 * softmax state. Measured with ptxas 13.0: 160 fits most masks and archs
 * without spills and 192 never does; dropout keeps the Philox state live.
 * When ptxas still spills, the runtime re-plans with the next smaller budget
 * (plan_next_budget) and compiles again. */
#define PLAN_ACCUMULATOR_REGISTERS 160
#define PLAN_ACCUMULATOR_REGISTERS_DROPOUT 128
/* Shared-memory rows are padded by 8 elements (16 bytes) so that the eight
 * row addresses of an ldmatrix fall in distinct bank groups. */
#define PLAN_SMEM_ROW_PAD 8

typedef struct fg_fwd_plan {
    int block_m;          /* Br: query rows per thread block */
    int block_n;          /* Bc: keys per iteration */
    int warps;
    int m_tiles;          /* 16-row MMA tiles per warp: block_m = 16 * m_tiles * warps */
    int stages;           /* K/V buffer pairs in shared memory */
    int head_dim_padded;  /* head dim rounded up to 16 */
    int smem_row;         /* elements per shared-memory row (padded) */
    int smem_bytes;
    int threads;
    int accumulator_registers; /* per thread: O and S in fp32 */
    int register_budget;       /* the budget it was planned under */
    int blocks_per_sm;    /* resident blocks the shared memory allows */
    char why[1024];
} fg_fwd_plan;

/* Plan the forward kernel of a canonical spec for a profile. Returns 0, or -1
 * with err set when no tiling fits (a bug for valid specs on named targets:
 * the tests check every spec against every target). */
int plan_forward(const fg_spec *spec, const fg_profile *profile, fg_fwd_plan *plan, char *err,
                 size_t err_len);

/* The same with an explicit accumulator budget (0: the default above). */
int plan_forward_budget(const fg_spec *spec, const fg_profile *profile, int budget,
                        fg_fwd_plan *plan, char *err, size_t err_len);

/* The budget to try after `budget` spilled, or 0 when there is none. */
int plan_next_budget(int budget);

/* Shared memory a forward tiling needs, in bytes. */
int plan_forward_smem(int block_m, int block_n, int stages, int head_dim_padded);

#endif
