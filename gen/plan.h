/* The planner: spec x device profile -> tile sizes, warps, pipeline depth. */
#ifndef FG_PLAN_H
#define FG_PLAN_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/profile.h"

/* Accumulator registers per thread the planner first allows for O and S
 * together; the rest of the 255 go to operand fragments, addresses and
 * softmax state. Measured with ptxas 13.0: 160 fits most masks and archs
 * without spills and 192 never does. With dropout too: timed on an H200 at
 * d=128, 160 (Br 128 as two row tiles per warp, Bc 32) runs 13% faster than
 * 128 (one row tile, Bc 128), more resident warps hiding the Philox work.
 * When ptxas still spills, the runtime re-plans with the next smaller budget
 * (plan_next_budget) and compiles again. */
#define PLAN_ACCUMULATOR_REGISTERS 160
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

/* A tiling named explicitly (the tuner's candidates); all 0 names the
 * derived plan. Forward: row tiles per warp, warps, keys per iteration
 * (Br = 16 * m_tiles * warps); the other fields 0. Backward: warps, Bc, Br,
 * Q/dO buffers and column splits; m_tiles 0. */
typedef struct plan_tiling {
    int m_tiles, warps, block_n;
    int block_m, stages, col_splits;
} plan_tiling;

/* Plan a given tiling: checks it against the profile's shared memory, the
 * register limit and the sparse blocks. Returns 0, or -1 with err set. */
int plan_forward_tiling(const fg_spec *spec, const fg_profile *profile, const plan_tiling *t,
                        fg_fwd_plan *plan, char *err, size_t err_len);

/* The tilings worth timing for a spec on a profile, in a fixed order (up to
 * max); the derived plan's tiling is usually among them. Returns the count. */
int plan_forward_candidates(const fg_spec *spec, const fg_profile *profile, plan_tiling *out,
                            int max);

void plan_forward_tiling_of(const fg_fwd_plan *plan, plan_tiling *t);

/* Shared memory a forward tiling needs, in bytes. */
int plan_forward_smem(int block_m, int block_n, int stages, int head_dim_padded);

/* ---- backward ----
 * One thread block owns Bc keys of one key/value head, keeps their dK and dV
 * in registers and walks the query blocks (Br rows each) that see them. Each
 * step has three phases, each with its own warp grid:
 *   1. S = Q·Kᵀ and dP = dO·Vᵀ (Br x Bc): warps over query rows x keys; P and
 *      dS go to shared memory;
 *   2. dV += Pᵀ·dO, dK += dSᵀ·Q (Bc x d): warps over keys x head-dim columns;
 *   3. dQ += dS·K (Br x d): warps over query rows x columns, added to an fp32
 *      accumulator in global memory.
 * Where dK and dV of a whole key block do not fit the registers (large head
 * dims on small GPUs), the head dim is split: col_splits thread blocks share
 * a key block, each recomputing phase 1 and owning a slice of the columns. */
#define PLAN_BACKWARD_REGISTERS 192
/* At most this many backward tilings are offered to the tuner. */
#define PLAN_BACKWARD_MAX_CANDIDATES 8
/* Phase 3 works on at most this many dQ columns at a time per warp. */
#define PLAN_DQ_CHUNK 64

typedef struct fg_bwd_plan {
    int block_m;          /* Br: query rows per step */
    int block_n;          /* Bc: keys per thread block */
    int warps;
    int threads;
    int stages;           /* Q/dO buffers: 2 loads the next step during this one */
    int head_dim_padded;  /* a multiple of 16 x the column warps of phases 2 and 3 */
    int smem_row;         /* elements per Q/K/V/dO shared-memory row */
    int ds_row;           /* elements per P/dS shared-memory row */
    int smem_bytes;
    int s_warps_m, s_warps_n;   /* phase 1 warp grid: query rows x keys */
    int kv_warps_n, kv_warps_d; /* phase 2: keys x columns */
    int q_warps_m, q_warps_d;   /* phase 3: query rows x columns */
    int col_splits;             /* thread blocks per key block, each on d / col_splits columns */
    int accumulator_registers;  /* per thread: dK, dV and the larger of S+dP or a dQ chunk */
    int register_budget;
    int blocks_per_sm;
    char why[1024];
} fg_bwd_plan;

int plan_backward(const fg_spec *spec, const fg_profile *profile, fg_bwd_plan *plan, char *err,
                  size_t err_len);
int plan_backward_budget(const fg_spec *spec, const fg_profile *profile, int budget,
                         fg_bwd_plan *plan, char *err, size_t err_len);

/* Plan a given backward tiling (block_m, block_n, warps, stages,
 * col_splits) under the register limit. Returns 0, or -1 with err set. */
int plan_backward_tiling(const fg_spec *spec, const fg_profile *profile, const plan_tiling *t,
                         fg_bwd_plan *plan, char *err, size_t err_len);

/* The backward tilings worth timing, best first by the planner's order (up
 * to max); the derived plan's is the first. Returns the count. */
int plan_backward_candidates(const fg_spec *spec, const fg_profile *profile, plan_tiling *out,
                             int max);

void plan_backward_tiling_of(const fg_bwd_plan *plan, plan_tiling *t);

#endif
