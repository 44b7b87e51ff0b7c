/* Forward planning.
 *
 * Start from the paper's rule (Bc = ceil(M / 4d), Br = min(Bc, d), M the
 * shared memory in elements), round to tensor-core tiles, then bring the
 * tiling within the registers and the shared memory of the profile:
 *   registers   each warp owns m_tiles x 16 query rows and keeps their O
 *               (m_tiles * dpad / 2 fp32 per thread) and S (m_tiles * Bc / 2)
 *               in registers;
 *   warps       4 warps per block keep the tensor cores fed; 8 when a warp
 *               can hold only one 16-row tile (large head dims);
 *   shared mem  Q (Br rows) plus K and V (Bc rows each, per stage), rows
 *               padded by 8 elements;
 *   sparsity    Br must divide the sparse block rows, Bc the block columns,
 *               so each tile lies in one sparse block.
 */
#include "gen/plan.h"

#include <stdio.h>
#include <string.h>

#include "gen/spec.h"

static int pow2_floor(int x) {
    int p = 1;
    while (p * 2 <= x) p *= 2;
    return p;
}

static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

int plan_forward_smem(int block_m, int block_n, int stages, int head_dim_padded) {
    int row_bytes = (head_dim_padded + PLAN_SMEM_ROW_PAD) * 2;
    return (block_m + 2 * stages * block_n) * row_bytes;
}

static int accumulators(int m_tiles, int dpad, int bn) { return m_tiles * (dpad / 2 + bn / 2); }

int plan_next_budget(int budget) { return budget > 64 ? budget - 16 : 0; }

int plan_forward(const fg_spec *spec, const fg_profile *prof, fg_fwd_plan *plan, char *err,
                 size_t err_len) {
    return plan_forward_budget(spec, prof, 0, plan, err, err_len);
}

int plan_forward_budget(const fg_spec *spec, const fg_profile *prof, int budget,
                        fg_fwd_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    if (budget <= 0)
        budget = spec->dropout ? PLAN_ACCUMULATOR_REGISTERS_DROPOUT : PLAN_ACCUMULATOR_REGISTERS;
    const int d = spec->head_dim;
    const int dpad = spec_head_dim_padded(spec);
    const int m_elems = prof->smem_per_block / 2;
    char *why = plan->why;
    size_t wl = sizeof plan->why;
    int n = 0;

    /* 1. the paper's rule */
    int bc_paper = (m_elems + 4 * d - 1) / (4 * d);
    int br_paper = bc_paper < d ? bc_paper : d;
    int bn = clamp(pow2_floor(bc_paper), 16, 128);
    n += snprintf(why + n, wl - n,
                  "M = %d elements of shared memory: paper Bc = ceil(M/4d) = %d, Br = min(Bc,d) = "
                  "%d; Bc rounded to a power of two in 16..128: %d.\n",
                  m_elems, bc_paper, br_paper, bn);

    /* 2. registers: two 16-row tiles per warp (each K/V fragment feeds two
     * MMAs) while O and S fit with Bc >= 32, else one */
    int m_tiles = 2;
    while (accumulators(m_tiles, dpad, bn) > budget) {
        if (bn > 32) bn /= 2;
        else if (m_tiles > 1) m_tiles = 1;
        else if (bn > 16) bn /= 2;
        else break;
    }
    /* one tile per warp frees registers: take back the longest key tile that fits */
    while (m_tiles == 1 && bn < 128 && accumulators(1, dpad, 2 * bn) <= budget) bn *= 2;
    int warps = m_tiles == 2 ? 4 : 8;
    int bm = 16 * m_tiles * warps;
    n += snprintf(why + n, wl - n,
                  "Registers: O and S take %d fp32 per thread with %d row tile(s) per warp and "
                  "Bc = %d (budget %d); %d warps give Br = %d (O lives in registers, so the "
                  "paper's Br <= d bound on SRAM does not apply).\n",
                  accumulators(m_tiles, dpad, bn), m_tiles, bn, budget, warps,
                  bm);

    /* 3. sparsity: tiles inside sparse blocks */
    if (spec->sparsity != FG_SPARSE_NONE) {
        while (spec->sparse_block_q % bm != 0) {
            if (warps > 1) warps /= 2;
            else m_tiles = 1, warps = 1;
            bm = 16 * m_tiles * warps;
            if (bm == 16) break;
        }
        while (spec->sparse_block_k % bn != 0 && bn > 16) bn /= 2;
        n += snprintf(why + n, wl - n, "Sparse blocks %dx%d: Br = %d and Bc = %d divide them.\n",
                      spec->sparse_block_q, spec->sparse_block_k, bm, bn);
    }

    /* 4. shared memory: shrink the larger tile until Q, K and V fit */
    int stages = 1;
    while (plan_forward_smem(bm, bn, stages, dpad) > prof->smem_per_block) {
        if (bn >= bm && bn > 16) {
            bn /= 2;
        } else if (bm > 16) {
            /* fewer rows: drop a row tile per warp first (fewer registers), then warps */
            if (m_tiles > 1) m_tiles = 1;
            else warps /= 2;
            bm = 16 * m_tiles * warps;
        } else {
            snprintf(err, err_len,
                     "plan: no tiling of head dim %d fits %d bytes of shared memory on %s", d,
                     prof->smem_per_block, prof->name);
            return -1;
        }
    }
    int smem = plan_forward_smem(bm, bn, stages, dpad);
    int per_sm = prof->smem_per_sm / smem;
    n += snprintf(why + n, wl - n,
                  "Shared memory: (Br + 2*%d*Bc) rows x (%d + %d) x 2 bytes = %d of %d per block; "
                  "%d block(s) per SM by shared memory.\n",
                  stages, dpad, PLAN_SMEM_ROW_PAD, smem, prof->smem_per_block, per_sm);

    plan->block_m = bm;
    plan->block_n = bn;
    plan->warps = warps;
    plan->m_tiles = m_tiles;
    plan->stages = stages;
    plan->head_dim_padded = dpad;
    plan->smem_row = dpad + PLAN_SMEM_ROW_PAD;
    plan->smem_bytes = smem;
    plan->threads = 32 * warps;
    plan->accumulator_registers = accumulators(m_tiles, dpad, bn);
    plan->register_budget = budget;
    plan->blocks_per_sm = per_sm;
    if (per_sm < 1) {
        snprintf(err, err_len, "plan: %d bytes exceed the %d per SM of %s", smem,
                 prof->smem_per_sm, prof->name);
        return -1;
    }
    return 0;
}
