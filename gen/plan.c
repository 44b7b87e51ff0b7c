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

static int fill_forward(fg_fwd_plan *plan, const fg_profile *prof, int bm, int bn, int warps,
                        int m_tiles, int dpad, int budget, char *err, size_t err_len);

int plan_next_budget(int budget) { return budget > 64 ? budget - 16 : 0; }

int plan_forward(const fg_spec *spec, const fg_profile *prof, fg_fwd_plan *plan, char *err,
                 size_t err_len) {
    return plan_forward_budget(spec, prof, 0, plan, err, err_len);
}

int plan_forward_budget(const fg_spec *spec, const fg_profile *prof, int budget,
                        fg_fwd_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    if (budget <= 0)
        budget = PLAN_ACCUMULATOR_REGISTERS;
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
    return fill_forward(plan, prof, bm, bn, warps, m_tiles, dpad, budget, err, err_len);
}

/* The figures of a tiling, once chosen. */
static int fill_forward(fg_fwd_plan *plan, const fg_profile *prof, int bm, int bn, int warps,
                        int m_tiles, int dpad, int budget, char *err, size_t err_len) {
    const int stages = 1;
    int smem = plan_forward_smem(bm, bn, stages, dpad);
    int per_sm = prof->smem_per_sm / smem;
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

/* ---- explicit tilings, for the tuner ---- */

int plan_forward_tiling(const fg_spec *spec, const fg_profile *prof, const plan_tiling *t,
                        fg_fwd_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    const int dpad = spec_head_dim_padded(spec);
    int bm = 16 * t->m_tiles * t->warps, bn = t->block_n;
    if (t->m_tiles < 1 || t->m_tiles > 2 || t->warps < 1 || t->warps > 8 || bn < 16 || bn > 128 ||
        bn % 16 != 0) {
        snprintf(err, err_len, "plan: tiling %d row tile(s) x %d warps, Bc %d is not supported",
                 t->m_tiles, t->warps, bn);
        return -1;
    }
    if (spec->sparsity != FG_SPARSE_NONE &&
        (spec->sparse_block_q % bm != 0 || spec->sparse_block_k % bn != 0)) {
        snprintf(err, err_len, "plan: tiles %dx%d do not divide sparse blocks %dx%d", bm, bn,
                 spec->sparse_block_q, spec->sparse_block_k);
        return -1;
    }
    int acc = accumulators(t->m_tiles, dpad, bn);
    if (acc > PLAN_ACCUMULATOR_REGISTERS) {
        snprintf(err, err_len, "plan: tiles %dx%d need %d accumulator registers (over %d)", bm, bn,
                 acc, PLAN_ACCUMULATOR_REGISTERS);
        return -1;
    }
    if (plan_forward_smem(bm, bn, 1, dpad) > prof->smem_per_block) {
        snprintf(err, err_len, "plan: tiles %dx%d need %d bytes of shared memory (over %d)", bm,
                 bn, plan_forward_smem(bm, bn, 1, dpad), prof->smem_per_block);
        return -1;
    }
    snprintf(plan->why, sizeof plan->why,
             "Tuned tiling: %d row tile(s) per warp x %d warps (Br = %d), Bc = %d; %d accumulator "
             "registers.\n",
             t->m_tiles, t->warps, bm, bn, acc);
    return fill_forward(plan, prof, bm, bn, t->warps, t->m_tiles, dpad, acc, err, err_len);
}

int plan_forward_candidates(const fg_spec *spec, const fg_profile *prof, plan_tiling *out,
                            int max) {
    static const int block_ns[] = {32, 64, 128};
    /* m_tiles, warps: Br 128 two ways, 64 two ways, 32 for small shared memories */
    static const int shapes[][2] = {{2, 4}, {1, 8}, {1, 4}, {2, 2}, {1, 2}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t b = 0; b < sizeof block_ns / sizeof block_ns[0]; b++) {
            plan_tiling t = {shapes[s][0], shapes[s][1], block_ns[b], 0, 0, 0};
            fg_fwd_plan p;
            char err[256];
            if (n < max && plan_forward_tiling(spec, prof, &t, &p, err, sizeof err) == 0)
                out[n++] = t;
        }
    return n;
}

void plan_forward_tiling_of(const fg_fwd_plan *plan, plan_tiling *t) {
    memset(t, 0, sizeof *t);
    t->m_tiles = plan->m_tiles, t->warps = plan->warps, t->block_n = plan->block_n;
}
