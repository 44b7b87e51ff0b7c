/* bwd_sm80: the mma.sync backward, for sm_75 and later. One module of three
 * kernels (templates/kernel_bwd_sm80.lua): row statistics D = rowsum(dO∘O), the
 * main kernel, and dQ from its fp32 accumulator.
 *
 * The main kernel: one thread block owns Bc keys of one key/value head,
 * keeps their dK and dV in registers and walks the query blocks (Br rows
 * each) that see them. Each step has three phases, each with its own warp
 * grid:
 *   1. S = Q·Kᵀ and dP = dO·Vᵀ (Br x Bc): warps over query rows x keys; P and
 *      dS go to shared memory;
 *   2. dV += Pᵀ·dO (Bc x dv), dK += dSᵀ·Q (Bc x d): warps over keys x
 *      head-dim columns;
 *   3. dQ += dS·K (Br x d): warps over query rows x columns, added to an fp32
 *      accumulator in global memory.
 * With a value head dim dv of its own, S sums over d columns and dP = dO·Vᵀ
 * over dv; V, dO and dV rows are dv wide, Q, K, dQ and dK rows d wide.
 * Where dK and dV of a whole key block do not fit the registers (large head
 * dims on small GPUs), the head dim is split: col_splits thread blocks share
 * a key block, each recomputing phase 1 and owning a slice of the columns.
 *
 * Planning: the paper's rule bounds the key block: Bc <= ceil(M / 4d), M the
 * shared memory in elements (K and V stay resident, Q and dO stream
 * through; ceil(M / (2d + 2dv)) with a value head dim of its own). Within that bound every tiling Br, Bc in 16..128 (powers of two)
 * with 1..8 warps is a candidate; the planner keeps those that fit the
 * registers, the shared memory, the sparse blocks and the warp grids, and
 * picks, in order: the fewest column splits (a split repeats phase 1, so it
 * is the fallback), the largest Br x Bc step discounted by head-dim padding
 * (fewest loads of Q and dO per key, fewest barriers), the larger Bc, more
 * warps, then double-buffered Q/dO. */
#ifndef FG_BWD_SM80_H
#define FG_BWD_SM80_H

#include <stddef.h>

#include "families/family.h"
#include "flashgen.h"
#include "gen/profile.h"

#define PLAN_BACKWARD_REGISTERS 192
/* At most this many backward tilings are offered to the tuner. */
#define PLAN_BACKWARD_MAX_CANDIDATES 8
/* Phase 3 works on at most this many dQ columns at a time per warp. */
#define PLAN_DQ_CHUNK 64

/* The plan. Its figures reach the template by these names:
 *   block_m, block_n       Br: query rows per step; Bc: keys per thread block
 *   warps, threads
 *   stages                 Q/dO buffers: 2 loads the next step during this one
 *   head_dim_padded        a multiple of 16 x the column warps of phases 2 and 3
 *   head_dim_v_padded      the value head dim, a multiple of 16 x phase 2's column
 *                          warps x col_splits (head_dim_padded where the dims agree)
 *   smem_row               elements per Q/K shared-memory row
 *   smem_row_v             elements per V/dO shared-memory row
 *   ds_row                 elements per P/dS shared-memory row
 *   smem_bytes
 *   s_warps_m, s_warps_n   phase 1 warp grid: query rows x keys
 *   kv_warps_n, kv_warps_d phase 2: keys x columns
 *   q_warps_m, q_warps_d   phase 3: query rows x columns
 *   col_splits             thread blocks per key block, each on d / col_splits columns
 *                          (and dv / col_splits of dV)
 *   dq_chunk               dQ columns phase 3 works on at a time per warp
 *   accumulator_registers  per thread: dK, dV and the larger of S+dP or a dQ chunk
 *   register_budget, blocks_per_sm */
#define BWD_PLAN_FIGURES(X)                                                                  \
    X(block_m) X(block_n) X(warps) X(threads) X(stages) X(head_dim_padded) X(smem_row)       \
    X(head_dim_v_padded) X(smem_row_v) X(ds_row) X(smem_bytes) X(s_warps_m) X(s_warps_n)     \
    X(kv_warps_n) X(kv_warps_d) X(q_warps_m) X(q_warps_d) X(col_splits) X(dq_chunk)          \
    X(accumulator_registers) X(register_budget) X(blocks_per_sm)

typedef struct fg_bwd_plan {
#define BWD_PLAN_FIELD(name) int name;
    BWD_PLAN_FIGURES(BWD_PLAN_FIELD)
#undef BWD_PLAN_FIELD
    char why[1024];
} fg_bwd_plan;

/* A tiling named explicitly; all 0 names the derived plan. Text:
 * "block_m,block_n,warps,stages,col_splits". */
typedef struct bwd_tiling {
    int block_m, block_n, warps, stages, col_splits;
} bwd_tiling;

int plan_backward(const fg_spec *spec, const fg_profile *profile, fg_bwd_plan *plan, char *err,
                  size_t err_len);
int plan_backward_budget(const fg_spec *spec, const fg_profile *profile, int budget,
                         fg_bwd_plan *plan, char *err, size_t err_len);

/* Plan a given backward tiling under the register limit. Returns 0, or -1
 * with err set. */
int plan_backward_tiling(const fg_spec *spec, const fg_profile *profile, const bwd_tiling *t,
                         fg_bwd_plan *plan, char *err, size_t err_len);

/* The backward tilings worth timing, best first by the planner's order (up
 * to max); the derived plan's is the first. Returns the count. */
int plan_backward_candidates(const fg_spec *spec, const fg_profile *profile, bwd_tiling *out,
                             int max);

void plan_backward_tiling_of(const fg_bwd_plan *plan, bwd_tiling *t);

extern const kernel_family bwd_sm80_family;

#endif
