/* fwd_sm80: the mma.sync forward, for sm_75 and later. One thread block per
 * Br query rows of one head walks the visible key tiles (Bc keys each) with
 * S and O in registers (templates/kernel_fwd_sm80.lua).
 *
 * Planning: start from the paper's rule (Bc = ceil(M / 4d), Br = min(Bc, d),
 * M the shared memory in elements), round to tensor-core tiles, then bring
 * the tiling within the registers and the shared memory of the profile:
 *   registers   each warp owns m_tiles x 16 query rows and keeps their O
 *               (m_tiles * dvpad / 2 fp32 per thread, dvpad the value head
 *               dim padded) and S (m_tiles * Bc / 2) in registers;
 *   warps       4 warps per block keep the tensor cores fed; 8 when a warp
 *               can hold only one 16-row tile (large head dims);
 *   shared mem  Q (Br rows) plus K and V (Bc rows each, per stage), rows
 *               padded by 8 elements (Q and K rows the head dim, V rows the
 *               value head dim wide); with a value head dim of its own the
 *               paper's 4d per row is 2d + 2dv;
 *   sparsity    Br must divide the sparse block rows, Bc the block columns,
 *               so each tile lies in one sparse block. */
#ifndef FG_FWD_SM80_H
#define FG_FWD_SM80_H

#include <stddef.h>

#include "families/family.h"
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

/* The plan. Its figures reach the template by these names:
 *   block_m                Br: query rows per thread block (16 * m_tiles * warps)
 *   block_n                Bc: keys per iteration
 *   warps, threads
 *   m_tiles                16-row MMA tiles per warp
 *   stages                 K/V buffer pairs in shared memory
 *   head_dim_padded        head dim rounded up to 16
 *   smem_row               elements per shared-memory row of Q and K (padded)
 *   head_dim_v_padded      value head dim rounded up to 16 (V and O)
 *   smem_row_v             elements per shared-memory row of V (padded)
 *   smem_bytes
 *   accumulator_registers  per thread: O and S in fp32
 *   register_budget        the budget it was planned under
 *   blocks_per_sm          resident blocks the shared memory allows */
#define FWD_PLAN_FIGURES(X)                                                                \
    X(block_m) X(block_n) X(warps) X(m_tiles) X(stages) X(head_dim_padded) X(smem_row)     \
    X(head_dim_v_padded) X(smem_row_v) X(smem_bytes) X(threads) X(accumulator_registers)   \
    X(register_budget) X(blocks_per_sm)

typedef struct fg_fwd_plan {
#define FWD_PLAN_FIELD(name) int name;
    FWD_PLAN_FIGURES(FWD_PLAN_FIELD)
#undef FWD_PLAN_FIELD
    char why[1024];
} fg_fwd_plan;

/* A tiling named explicitly (the tuner's candidates); all 0 names the
 * derived plan. Br = 16 * m_tiles * warps. Text: "m_tiles,warps,block_n". */
typedef struct fwd_tiling {
    int m_tiles, warps, block_n;
} fwd_tiling;

/* Plan the forward of a canonical spec for a profile. Returns 0, or -1 with
 * err set when no tiling fits (a bug for valid specs on named targets: the
 * tests check every spec against every target). */
int plan_forward(const fg_spec *spec, const fg_profile *profile, fg_fwd_plan *plan, char *err,
                 size_t err_len);

/* The same with an explicit accumulator budget (0: the default above). */
int plan_forward_budget(const fg_spec *spec, const fg_profile *profile, int budget,
                        fg_fwd_plan *plan, char *err, size_t err_len);

/* Plan a given tiling: checks it against the profile's shared memory, the
 * register limit and the sparse blocks. Returns 0, or -1 with err set. */
int plan_forward_tiling(const fg_spec *spec, const fg_profile *profile, const fwd_tiling *t,
                        fg_fwd_plan *plan, char *err, size_t err_len);

/* The tilings worth timing for a spec on a profile, in a fixed order (up to
 * max); the derived plan's tiling is usually among them. Returns the count. */
int plan_forward_candidates(const fg_spec *spec, const fg_profile *profile, fwd_tiling *out,
                            int max);

void plan_forward_tiling_of(const fg_fwd_plan *plan, fwd_tiling *t);

/* Shared memory a forward tiling needs, in bytes: Q and K rows of
 * head_dim_padded, V rows of head_dim_v_padded (each padded). */
int plan_forward_smem(int block_m, int block_n, int stages, int head_dim_padded,
                      int head_dim_v_padded);

extern const kernel_family fwd_sm80_family;

#endif
