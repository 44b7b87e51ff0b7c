/* Specs canonicalize; every valid spec plans, forward and backward, for every
 * named target within its shared memory, with tiles that fit the tensor-core
 * shapes, the register budget and the sparse blocks. */
#include <string.h>

#include "families/bwd_sm80.h"
#include "families/fwd_sm80.h"
#include "gen/plan.h"
#include "gen/spec.h"
#include "tests/check.h"

static void test_canonical(void) {
    char err[256];
    fg_spec a = fg_spec_default(64, FG_BF16), b = a, ca, cb;
    b.sparse_block_q = 128; /* ignored without sparsity */
    b.butterfly_factors = 5;
    b.dropout = 7;
    a.dropout = 1;
    CHECK(spec_canonicalize(&a, &ca, err, sizeof err) == 0, "%s", err);
    CHECK(spec_canonicalize(&b, &cb, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&ca, &cb, sizeof ca) == 0, "equivalent specs canonicalize alike");
    fg_spec l = fg_spec_default(64, FG_FP16), cl;
    l.sparsity = FG_SPARSE_LAYOUT, l.sparse_block_q = 64, l.sparse_block_k = 128;
    l.butterfly_factors = 3; /* layout ignores factors */
    CHECK(spec_canonicalize(&l, &cl, err, sizeof err) == 0 && cl.butterfly_factors == 0, "layout");
    fg_spec bad = fg_spec_default(0, FG_FP16), out;
    CHECK(spec_canonicalize(&bad, &out, err, sizeof err) != 0 && strstr(err, "head_dim"), "%s", err);
    bad = fg_spec_default(64, FG_FP16), bad.sparsity = FG_SPARSE_BUTTERFLY;
    bad.sparse_block_q = 40, bad.sparse_block_k = 64;
    CHECK(spec_canonicalize(&bad, &out, err, sizeof err) != 0 && strstr(err, "sparse_block"), "%s", err);
    char name[128];
    fg_spec n = fg_spec_default(128, FG_BF16), cn;
    n.mask = FG_MASK_CAUSAL, n.dropout = 1;
    n.sparsity = FG_SPARSE_BUTTERFLY, n.sparse_block_q = n.sparse_block_k = 64, n.butterfly_factors = 3;
    spec_canonicalize(&n, &cn, err, sizeof err);
    spec_name(&cn, name, sizeof name);
    CHECK(strcmp(name, "bf16_d128_causal_drop_bfly3_b64x64") == 0, "name %s", name);
}

static void check_plan(const fg_spec *s, const fg_profile *prof) {
    fg_fwd_plan p;
    char err[256];
    int rc = plan_forward(s, prof, &p, err, sizeof err);
    CHECK(rc == 0, "%s d%d: %s", prof->name, s->head_dim, err);
    if (rc) return;
    CHECK(p.smem_bytes <= prof->smem_per_block, "%s d%d smem %d", prof->name, s->head_dim, p.smem_bytes);
    CHECK(p.smem_bytes == plan_forward_smem(p.block_m, p.block_n, p.stages, p.head_dim_padded), "smem formula");
    CHECK(p.block_m == 16 * p.m_tiles * p.warps, "Br = 16 * tiles * warps");
    CHECK(p.block_n % 16 == 0 && p.block_n >= 16 && p.block_n <= 128, "Bc %d", p.block_n);
    CHECK(p.head_dim_padded % 16 == 0 && p.head_dim_padded >= s->head_dim, "dpad");
    /* within the budget, unless O alone needs more (one 16-row tile, 16 keys) */
    int minimal = p.m_tiles == 1 && p.block_n == 16;
    CHECK(p.accumulator_registers <= p.register_budget || minimal, "%s d%d acc %d budget %d",
          prof->name, s->head_dim, p.accumulator_registers, p.register_budget);
    CHECK(p.threads * 255 <= prof->regs_per_block, "registers per block");
    if (s->sparsity != FG_SPARSE_NONE)
        CHECK(s->sparse_block_q % p.block_m == 0 && s->sparse_block_k % p.block_n == 0,
              "%s d%d tiles %dx%d vs sparse %dx%d", prof->name, s->head_dim, p.block_m, p.block_n,
              s->sparse_block_q, s->sparse_block_k);
    CHECK(strstr(p.why, "ceil(M/4d)") != NULL, "why names the paper's rule");
}

/* The backward plan: fits, its warp grids tile the three phases exactly in
 * whole 16x16 MMA tiles, and it fits every smaller budget of the spill
 * ladder down to 64 (what the runtime falls back to when ptxas spills). */
static void check_backward_plan(const fg_spec *s, const fg_profile *prof) {
    char err[256];
    for (int budget = PLAN_BACKWARD_REGISTERS; budget >= 96; budget = plan_next_budget(budget)) {
        fg_bwd_plan p;
        int rc = plan_backward_budget(s, prof, budget, &p, err, sizeof err);
        CHECK(rc == 0, "%s d%d budget %d: %s", prof->name, s->head_dim, budget, err);
        if (rc) return;
        CHECK(p.smem_bytes <= prof->smem_per_block, "%s d%d backward smem %d", prof->name,
              s->head_dim, p.smem_bytes);
        CHECK(p.accumulator_registers <= budget, "backward acc %d > %d", p.accumulator_registers, budget);
        CHECK(p.s_warps_m * p.s_warps_n == p.warps && p.kv_warps_n * p.kv_warps_d == p.warps &&
                  p.q_warps_m * p.q_warps_d == p.warps,
              "%s d%d warp grids", prof->name, s->head_dim);
        int cols = p.head_dim_padded / p.col_splits;
        CHECK(p.block_m % (16 * p.s_warps_m) == 0 && (p.block_n / p.s_warps_n) % 16 == 0 &&
                  p.block_n % (16 * p.kv_warps_n) == 0 && (cols / p.kv_warps_d) % 16 == 0 &&
                  p.block_m % (16 * p.q_warps_m) == 0 && (cols / p.q_warps_d) % 16 == 0,
              "%s d%d backward tiles %dx%d w%d", prof->name, s->head_dim, p.block_m, p.block_n,
              p.warps);
        CHECK(p.head_dim_padded >= s->head_dim && p.head_dim_padded % 16 == 0, "backward dpad");
        if (s->sparsity != FG_SPARSE_NONE)
            CHECK(s->sparse_block_q % p.block_m == 0 && s->sparse_block_k % p.block_n == 0,
                  "backward tiles vs sparse blocks");
    }
}

static void test_every_spec_plans(void) {
    static const int blocks[][2] = {{16, 16}, {32, 64}, {64, 64}, {128, 128}, {48, 80}, {256, 512}};
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        for (int d = 1; d <= 256; d++)
            for (int mask = 0; mask < 3; mask++)
                for (int drop = 0; drop < 2; drop++)
                    for (int sp = 0; sp < 3; sp++)
                        for (int b = 0; b < (sp ? 6 : 1); b++) {
                            fg_spec s = fg_spec_default(d, FG_FP16), c;
                            s.mask = (fg_mask)mask, s.dropout = drop, s.sparsity = (fg_sparsity)sp;
                            s.sparse_block_q = blocks[b][0], s.sparse_block_k = blocks[b][1];
                            s.butterfly_factors = 2;
                            char err[256];
                            if (spec_canonicalize(&s, &c, err, sizeof err) != 0) {
                                CHECK(0, "%s", err);
                                continue;
                            }
                            check_plan(&c, prof);
                            check_backward_plan(&c, prof);
                        }
    }
}

static void test_known_plans(void) {
    /* The paper's starting point and the register limit give the tilings
     * measured to run without spills. */
    fg_fwd_plan p;
    char err[256];
    fg_spec s = fg_spec_default(128, FG_BF16);
    plan_forward(&s, profile_named("h100"), &p, err, sizeof err);
    CHECK(p.block_m == 128 && p.block_n == 32 && p.warps == 4, "h100 d128: %dx%d w%d", p.block_m,
          p.block_n, p.warps);
    /* a smaller budget gives smaller accumulators, down to the minimum */
    int budget = p.register_budget, last = p.accumulator_registers;
    while ((budget = plan_next_budget(budget)) != 0) {
        fg_fwd_plan q;
        CHECK(plan_forward_budget(&s, profile_named("h100"), budget, &q, err, sizeof err) == 0, "%s", err);
        CHECK(q.accumulator_registers <= last, "budget %d: %d > %d", budget, q.accumulator_registers, last);
        last = q.accumulator_registers;
    }
    s = fg_spec_default(256, FG_FP16);
    plan_forward(&s, profile_named("t4"), &p, err, sizeof err);
    CHECK(p.smem_bytes <= 64 * 1024, "t4 d256 fits 64 KiB: %d", p.smem_bytes);
    CHECK(profile_named("nope") == NULL && profile_named("l4")->arch == 89, "profiles");
}

int main(void) {
    test_canonical();
    test_every_spec_plans();
    test_known_plans();
    return check_summary("test_spec_plan");
}
