/* Specs canonicalize; every valid spec plans, forward and backward, for every
 * named target within its shared memory, with tiles that fit the tensor-core
 * shapes, the register budget and the sparse blocks; on h100 the Hopper
 * forward (fwd_sm90a) too, and the calls it takes or hands on; value head
 * dims of their own plan from both dims on the mma.sync families. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/bwd_sm80.h"
#include "families/fwd_sm80.h"
#include "families/bwd_sm90a.h"
#include "families/fwd_decode.h"
#include "families/fwd_mla.h"
#include "families/fwd_mla_sm90a.h"
#include "families/fwd_sm90a.h"
#include "families/sm90a.h"
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

    /* expressions: spellings that parse alike, texts at other addresses and
     * undeclared tensor slots canonicalize alike; "" is none */
    char text1[] = "s+bias[h,q-k]", text2[] = "(s + bias[h, (q - k)])";
    fg_spec e1 = fg_spec_default(64, FG_BF16), e2, ce1, ce2;
    e1.score_mod = text1, e1.aux_count = 1;
    e1.aux[0] = (fg_aux_decl){"bias", FG_AUX_F32, 2};
    e2 = e1;
    e2.score_mod = text2;
    e2.aux[3] = (fg_aux_decl){"unused", FG_AUX_I32, 1};
    e2.mask_mod = "";
    CHECK(spec_canonicalize(&e1, &ce1, err, sizeof err) == 0, "%s", err);
    CHECK(spec_canonicalize(&e2, &ce2, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(&ce1, &ce2, sizeof ce1) == 0, "equivalent expressions canonicalize alike");
    CHECK(ce1.score_mod != text1 && strcmp(ce1.score_mod, "s + bias[h, q - k]") == 0 &&
              ce1.mask_mod == NULL && ce1.aux[0].name != e1.aux[0].name,
          "the canonical spec holds its own texts");
    /* the canonical spec's text parses again: a flat chain (40 additions
     * of 0.1, whose canonical text is longer than the text given and must
     * nest no deeper) */
    {
        static char chain[256];
        static expr_tree score, mask;
        strcpy(chain, "s");
        for (int i = 0; i < 40; i++) strcat(chain, "+0.1");
        fg_spec c = fg_spec_default(64, FG_BF16), cc;
        c.score_mod = chain;
        CHECK(spec_canonicalize(&c, &cc, err, sizeof err) == 0 && strlen(cc.score_mod) > strlen(chain) &&
                  spec_expr_trees(&cc, &score, &mask, err, sizeof err) == 0 && score.count == 81,
              "a chain of 40 additions: %s", err);
    }
    e2.score_mod = "s + bias[h, k - q]";
    CHECK(spec_canonicalize(&e2, &ce2, err, sizeof err) == 0, "%s", err);
    char name2[128];
    spec_name(&ce1, name, sizeof name);
    spec_name(&ce2, name2, sizeof name2);
    CHECK(strncmp(name, "bf16_d64_s", 10) == 0 && strlen(name) == 26 && strcmp(name, name2) != 0,
          "expression names %s, %s", name, name2);
}

static void check_plan(const fg_spec *s, const fg_profile *prof) {
    fg_fwd_plan p;
    char err[256];
    int rc = plan_forward(s, prof, &p, err, sizeof err);
    CHECK(rc == 0, "%s d%d: %s", prof->name, s->head_dim, err);
    if (rc) return;
    CHECK(p.smem_bytes <= prof->smem_per_block, "%s d%d smem %d", prof->name, s->head_dim, p.smem_bytes);
    CHECK(p.smem_bytes == plan_forward_smem(p.block_m, p.block_n, p.stages, p.head_dim_padded, p.head_dim_v_padded), "smem formula");
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

/* fwd_sm90a on h100: a spec it takes plans within the shared memory and
 * the registers setmaxnreg hands out, with tiles wgmma and TMA take, whole
 * dropout stretches and whole sparse blocks; it refuses only sparse blocks
 * of fewer than 64 rows, or of rows that are no multiple of 64 (those go to
 * fwd_sm80). */
static void check_sm90a_plan(const fg_spec *s, const fg_profile *prof) {
    char err[256];
    fwd_sm90a_plan p;
    int refused = s->sparsity != FG_SPARSE_NONE && s->sparse_block_q % 64 != 0;
    int rc = fwd_sm90a_family.supports(s, prof, err, sizeof err);
    CHECK((rc != 0) == refused, "%s d%d sparse %dx%d: supports %d: %s", prof->name, s->head_dim,
          s->sparse_block_q, s->sparse_block_k, rc, err);
    if (rc != 0) return;
    CHECK(plan_fwd_sm90a(s, prof, 0, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.smem_bytes <= prof->smem_per_block, "d%d sm90a smem %d", s->head_dim, p.smem_bytes);
    CHECK(p.consumers >= 1 && p.consumers <= 3 && p.block_m == 64 * p.consumers &&
              p.threads == 128 * (p.consumers + 1),
          "d%d: %d consumers, Br %d", s->head_dim, p.consumers, p.block_m);
    CHECK(p.block_n % 16 == 0 && p.block_n >= 16 && p.block_n <= 256 && p.stages >= 2,
          "d%d: Bc %d, %d stages", s->head_dim, p.block_n, p.stages);
    CHECK(p.head_dim_padded >= s->head_dim && p.head_dim_padded % 16 == 0 &&
              p.v_cols == 64 * p.boxes && p.v_cols >= p.head_dim_padded && p.v_cols - 64 < p.head_dim_padded,
          "d%d: padded %d, %d boxes", s->head_dim, p.head_dim_padded, p.boxes);
    CHECK(p.accumulator_registers <= p.consumer_registers - SM90A_REGISTER_RESERVE &&
              /* setmaxnreg moves registers, the launch's 64K / threads in 8s */
              (p.consumers == 1 || p.consumers * p.consumer_registers + p.producer_registers <=
                                       (65536 / p.threads / 8 * 8) * (p.consumers + 1)) &&
              p.consumer_registers <= 240 && p.consumer_registers % 8 == 0,
          "d%d: registers %d of %d", s->head_dim, p.accumulator_registers, p.consumer_registers);
    CHECK(!s->dropout || p.block_n == 16 || p.block_n % 32 == 0, "dropout stretches, Bc %d",
          p.block_n);
    if (s->sparsity != FG_SPARSE_NONE)
        CHECK(s->sparse_block_q % p.block_m == 0 && s->sparse_block_k % p.block_n == 0,
              "d%d sm90a tiles %dx%d vs sparse %dx%d", s->head_dim, p.block_m, p.block_n,
              s->sparse_block_q, s->sparse_block_k);
    CHECK(p.turns == 0 || p.consumers > 1, "turns need two consumers");
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
                            if (prof->arch == 90) check_sm90a_plan(&c, prof);
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

/* The Hopper forward's derived tilings, as measured fastest on an H100
 * (docs/hopper-notes.md), and the family the runtime picks per target. */
static void test_sm90a_plans(void) {
    /* walk: O apart from Q fits beside the tiles (d 64), not beside d 128's
     * Bc 192; never with dropout or above d 128 */
    static const struct {
        int head_dim, dropout, consumers, block_n, turns, walk, stages;
    } known[] = {{64, 0, 3, 128, 1, 1, 5},  {128, 0, 2, 192, 1, 0, 2}, {256, 0, 2, 80, 1, 0, 2},
                 {64, 1, 3, 128, 1, 0, 6},  {128, 1, 2, 128, 1, 0, 3}, {256, 1, 2, 64, 1, 0, 2}};
    const fg_profile *h100 = profile_named("h100");
    char err[256];
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        fg_spec s = fg_spec_default(known[i].head_dim, FG_BF16);
        s.dropout = known[i].dropout;
        fwd_sm90a_plan p;
        CHECK(plan_fwd_sm90a(&s, h100, 0, &p, err, sizeof err) == 0 &&
                  p.consumers == known[i].consumers && p.block_n == known[i].block_n &&
                  p.turns == known[i].turns && p.walk == known[i].walk &&
                  p.stages == known[i].stages,
              "h100 d%d drop %d: %d consumers, Bc %d, turns %d, walk %d, %d stages",
              known[i].head_dim, known[i].dropout, p.consumers, p.block_n, p.turns, p.walk,
              p.stages);
    }
    /* d 128 at Bc 160 (2048 keys) and 128 (1024 keys, or a window's) walks,
     * causal or under a window, in two stages; not with dropout (at Bc 128
     * then in three) */
    for (int mask = 0; mask < 3; mask++)
        for (int bn = 128; bn <= 160; bn += 32) {
            fg_spec w = fg_spec_default(128, FG_BF16);
            w.mask = mask ? FG_MASK_WINDOW : FG_MASK_CAUSAL;
            w.dropout = mask == 2;
            fwd_sm90a_tiling t = {2, bn, 1};
            fwd_sm90a_plan p;
            CHECK(plan_fwd_sm90a_tiling(&w, h100, &t, &p, err, sizeof err) == 0 &&
                      p.walk == (mask < 2) && p.stages == (bn == 128 && mask == 2 ? 3 : 2),
                  "d128 Bc %d mask %d dropout %d: walk %d, %d stages (%s)", bn, w.mask,
                  w.dropout, p.walk, p.stages, err);
        }
    /* the planner shrinks with the budget: the spill ladder */
    fg_spec s = fg_spec_default(128, FG_BF16);
    fwd_sm90a_plan p, q;
    plan_fwd_sm90a(&s, h100, 0, &p, err, sizeof err);
    CHECK(plan_fwd_sm90a(&s, h100, p.accumulator_registers - 16, &q, err, sizeof err) == 0 &&
              q.accumulator_registers < p.accumulator_registers,
          "smaller budget: %d then %d", p.accumulator_registers, q.accumulator_registers);
    CHECK(fwd_sm90a_family.supports(&s, profile_named("a100"), err, sizeof err) != 0 &&
              strstr(err, "sm_90"),
          "a100 refused: %s", err);

    /* which family plans: fwd_sm90a on h100, fwd_sm80 elsewhere and for what
     * fwd_sm90a cannot tile */
    fg_context *ctx;
    fg_plan_info info;
    CHECK(fg_context_create(&ctx, "h100") == FG_OK, "h100 context");
    CHECK(fg_plan(ctx, &s, FG_PASS_FORWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_fwd_sm90a_bf16_d128_", 23) == 0,
          "h100: %s", info.kernel_name);
    fg_spec sparse = s;
    sparse.sparsity = FG_SPARSE_LAYOUT, sparse.sparse_block_q = 32, sparse.sparse_block_k = 64;
    CHECK(fg_plan(ctx, &sparse, FG_PASS_FORWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_fwd_sm90_bf16_d128_", 22) == 0,
          "32-row blocks: %s", info.kernel_name);
    /* the backward: bwd_sm90a where it serves the spec (dropout too; above
     * d = 128 the split kernel), else the mma.sync family */
    CHECK(fg_plan(ctx, &s, FG_PASS_BACKWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_bwd_sm90a_bf16_d128_", 23) == 0,
          "the backward: %s", info.kernel_name);
    fg_spec causal = s, dropped = s, wide = s, wide_dropped = s;
    causal.mask = FG_MASK_CAUSAL, dropped.dropout = 1, wide.head_dim = 192;
    wide_dropped.head_dim = 192, wide_dropped.dropout = 1;
    CHECK(fg_plan(ctx, &causal, FG_PASS_BACKWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_bwd_sm90a_bf16_d128_causal", 29) == 0,
          "the causal backward: %s", info.kernel_name);
    CHECK(fg_plan(ctx, &dropped, FG_PASS_BACKWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_bwd_sm90a_bf16_d128_drop", 27) == 0,
          "the dropout backward: %s", info.kernel_name);
    CHECK(fg_plan(ctx, &wide, FG_PASS_BACKWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_bwd_sm90a_bf16_d192_m64n64s2", 31) == 0,
          "the d192 backward: %s", info.kernel_name);
    CHECK(fg_plan(ctx, &wide_dropped, FG_PASS_BACKWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_bwd_sm90a_bf16_d192_drop_m64n64", 34) == 0,
          "the d192 backward with dropout: %s", info.kernel_name);
    fg_context_destroy(ctx);
    CHECK(fg_context_create(&ctx, "a100") == FG_OK, "a100 context");
    CHECK(fg_plan(ctx, &s, FG_PASS_FORWARD, &info) == FG_OK &&
              strncmp(info.kernel_name, "fg_fwd_sm80_", 12) == 0,
          "a100: %s", info.kernel_name);
    fg_context_destroy(ctx);
}

/* The maps encoded, how many of them fp32 ones whose boxes are 128 bytes
 * wide (the swizzle's span), and the row elements (dims[0]) of the first
 * eight. */
static int encoded, encoded_f32;
static uint64_t encoded_cols[8];
static int fake_encode(const family_device *dev, void *map, family_map_type type, int rank,
                       uint64_t address, const uint64_t *dims, const uint64_t *strides,
                       const uint32_t *box, char *err, size_t err_len) {
    (void)dev, (void)map, (void)address, (void)err, (void)err_len;
    for (int i = 0; i < rank - 1; i++)
        if (strides[i] == 0 || strides[i] % 16) return -1;
    if (encoded < 8) encoded_cols[encoded] = dims[0];
    encoded++;
    encoded_f32 += type == FAMILY_MAP_F32 && box[0] * 4 == 128;
    return 0;
}

/* fwd_sm90a with a value head dim of its own: Q and K in the head dim's
 * boxes, V and O in the value head dim's, Q's shared memory as wide as the
 * wider of Q and O (O is staged there), within h100's shared memory and
 * registers; the maps of v and o take the value head dim's rows. Calls
 * take fwd_sm80 meanwhile (supports refuses, naming both dims). */
static void test_sm90a_value_head_dims(void) {
    const fg_profile *h100 = profile_named("h100");
    static const int pairs[][2] = {{192, 128}, {256, 128}, {128, 64}, {64, 128}, {96, 72},
                                   {128, 256}, {40, 200}, {256, 64}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int d = pairs[i][0], dv = pairs[i][1];
        for (int causal = 0; causal < 2; causal++) {
            fg_spec s = fg_spec_default(d, FG_BF16);
            s.head_dim_v = dv, s.mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
            fwd_sm90a_plan p;
            char err[512] = "";
            CHECK(plan_fwd_sm90a(&s, h100, 0, &p, err, sizeof err) == 0, "d%d/%d: %s", d, dv, err);
            int qk = (spec_head_dim_padded(&s) + 63) / 64;
            int v = (spec_head_dim_v_padded(&s) + 63) / 64;
            CHECK(p.boxes == qk && p.v_boxes == v && p.o_boxes == (qk > v ? qk : v) &&
                      p.v_cols == 64 * v && p.head_dim_v_padded == spec_head_dim_v_padded(&s) &&
                      p.head_dim_padded == spec_head_dim_padded(&s),
                  "d%d/%d: boxes %d/%d/%d, v_cols %d", d, dv, p.boxes, p.v_boxes, p.o_boxes,
                  p.v_cols);
            /* O staged in shared memory of its own where the thread blocks walk */
            int smem = 1024 + p.o_boxes * p.block_m * 128 + p.walk * p.v_boxes * p.block_m * 128 +
                       p.stages * (p.boxes + p.v_boxes) * p.block_n * 128 + 8 * (2 + 4 * p.stages);
            CHECK(p.smem_bytes == smem && smem <= h100->smem_per_block,
                  "d%d/%d: %d bytes of shared memory (%d)", d, dv, p.smem_bytes, smem);
            CHECK(p.accumulator_registers >= 32 * p.v_boxes + p.block_n / 2 + p.block_n / 4 &&
                      p.accumulator_registers <= p.consumer_registers - SM90A_REGISTER_RESERVE,
                  "d%d/%d: %d accumulator registers", d, dv, p.accumulator_registers);
            CHECK(fwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0,
                  "d%d/%d: supports: %s", d, dv, err);
        }
    }
    /* the maps: q and k the head dim's rows, v and o the value head dim's */
    fg_spec s = fg_spec_default(192, FG_BF16);
    s.head_dim_v = 128;
    fg_forward_args a = fg_forward_args_default();
    char *base = (char *)(uintptr_t)0x10000, err[256] = "";
    a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seqlen_q = 100, a.seqlen_k = 77;
    a.q = fg_tensor_bshd(base, 100, 4, 192);
    a.k = fg_tensor_bshd(base, 77, 2, 192);
    a.v = fg_tensor_bshd(base, 77, 2, 128);
    a.o = fg_tensor_bshd(base, 100, 4, 128);
    family_device dev = {h100, 0, fake_encode, NULL};
    family_call call = {&a, NULL, {0}, &s, 0, 0};
    family_plan plan;
    family_args out;
    CHECK(fwd_sm90a_family.plan(&s, h100, 0, &plan, err, sizeof err) == 0, "%s", err);
    encoded = 0;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              encoded == 4 && encoded_cols[0] == 192 && encoded_cols[1] == 192 &&
              encoded_cols[2] == 128 && encoded_cols[3] == 128,
          "maps of q, k, v, o: %d encoded, rows of %llu, %llu, %llu, %llu (%s)", encoded,
          (unsigned long long)encoded_cols[0], (unsigned long long)encoded_cols[1],
          (unsigned long long)encoded_cols[2], (unsigned long long)encoded_cols[3], err);
}

/* fwd_sm90a's tiling for a call's lengths: key tiles of 128 for causal calls
 * of 513 to 1024 keys, 160 to 2048, and 176 for calls without a mask of 513
 * to 1024 keys, where the derived plan's are longer (d = 128: 192); at
 * d = 64 (derived 128) 96 for causal calls of 1025 to 2048 keys; longer
 * and shorter calls, other masks, dropout and shorter derived tiles keep
 * the derived plan */
static int block_n_for_call(const fg_spec *s, const family_call *call) {
    const fg_profile *h100 = profile_named("h100");
    family_tiling t;
    family_plan p;
    char err[256] = "";
    if (!fwd_sm90a_family.tiling_for_call(s, h100, call, &t)) return 0;
    if (fwd_sm90a_family.plan_tiling(s, h100, &t, &p, err, sizeof err) != 0) return -1;
    return ((const fwd_sm90a_plan *)p.bytes)->block_n;
}

static void test_sm90a_tiling_for_call(void) {
    const fg_profile *h100 = profile_named("h100");
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.mask = FG_MASK_CAUSAL;
    fg_forward_args a = fg_forward_args_default();
    a.seqlen_q = a.seqlen_k = 2048;
    family_call call = {&a, NULL, {0}, &s, 0, 0};
    family_tiling t;
    family_plan derived, p;
    char err[256] = "";
    CHECK(fwd_sm90a_family.plan(&s, h100, 0, &derived, err, sizeof err) == 0 &&
              ((const fwd_sm90a_plan *)derived.bytes)->block_n == 192,
          "d128 causal derived: %s", err);
    int got = fwd_sm90a_family.tiling_for_call(&s, h100, &call, &t);
    CHECK(got == 1 && fwd_sm90a_family.plan_tiling(&s, h100, &t, &p, err, sizeof err) == 0 &&
              ((const fwd_sm90a_plan *)p.bytes)->block_n == 160 &&
              ((const fwd_sm90a_plan *)p.bytes)->consumers ==
                  ((const fwd_sm90a_plan *)derived.bytes)->consumers,
          "d128 causal 2048 keys: %d (%s)", got, err);
    static const struct {
        int mask, keys, block_n;
    } lengths[] = {{FG_MASK_CAUSAL, 512, 0},   {FG_MASK_CAUSAL, 513, 128},
                   {FG_MASK_CAUSAL, 1024, 128}, {FG_MASK_CAUSAL, 1025, 160},
                   {FG_MASK_CAUSAL, 2049, 0},   {FG_MASK_NONE, 512, 0},
                   {FG_MASK_NONE, 513, 176},    {FG_MASK_NONE, 1024, 176},
                   {FG_MASK_NONE, 1025, 160},   {FG_MASK_NONE, 2048, 160},
                   {FG_MASK_NONE, 2049, 0},     {FG_MASK_WINDOW, 1024, 0}}; /* unbounded */
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        s.mask = lengths[i].mask;
        a.seqlen_k = lengths[i].keys;
        int bn = block_n_for_call(&s, &call);
        CHECK(bn == lengths[i].block_n, "mask %d, %d keys: Bc %d, expected %d", lengths[i].mask,
              lengths[i].keys, bn, lengths[i].block_n);
    }
    s.mask = FG_MASK_CAUSAL, s.head_dim = 64;
    static const struct {
        int head_dim, mask, keys, block_n;
    } small[] = {{64, FG_MASK_CAUSAL, 1024, 0},  {64, FG_MASK_CAUSAL, 1025, 96},
                 {64, FG_MASK_CAUSAL, 2048, 96}, {64, FG_MASK_CAUSAL, 2049, 0},
                 {64, FG_MASK_NONE, 2048, 0},    {57, FG_MASK_CAUSAL, 2048, 96},
                 {32, FG_MASK_CAUSAL, 2048, 0}};
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) {
        s.head_dim = small[i].head_dim, s.mask = small[i].mask;
        a.seqlen_k = small[i].keys;
        int bn = block_n_for_call(&s, &call);
        CHECK(bn == small[i].block_n, "d%d mask %d, %d keys: Bc %d, expected %d", small[i].head_dim,
              small[i].mask, small[i].keys, bn, small[i].block_n);
    }
    s.head_dim = 64, s.mask = FG_MASK_CAUSAL, s.dropout = 1;
    a.seqlen_k = 2048;
    CHECK(block_n_for_call(&s, &call) == 0, "d64 causal 2048 keys with dropout: derived tiles");
    /* a window's tiles: the widest power of two dividing Br and narrower
     * than the derived (128 at d 128, 64 at d 64's Br 192 and at d 256),
     * over spans of up to 4096 keys where that is Br, 256 where it is Br /
     * 3, 1024 otherwise; not with dropout, or where a side is unbounded */
    static const struct {
        int head_dim, dropout, left, right, block_n;
    } windows[] = {{128, 0, 255, 0, 128},  {128, 0, 1023, 0, 128}, {128, 0, 512, 511, 128},
                   {128, 0, 4095, 0, 128}, {128, 0, 4096, 0, 0},   {128, 0, 0, 4096, 0},
                   {128, 0, -1, 0, 0},     {128, 0, 100, -1, 0},   {128, 1, 1023, 0, 0},
                   {96, 0, 300, 40, 128},  {64, 0, 255, 0, 64},    {64, 0, 127, 128, 64},
                   {64, 0, 256, 0, 0},     {64, 0, 1023, 0, 0},    {256, 0, 1023, 0, 64},
                   {256, 0, 1024, 0, 0}};
    s.mask = FG_MASK_WINDOW;
    a.seqlen_k = 8192;
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        s.head_dim = windows[i].head_dim, s.dropout = windows[i].dropout;
        a.window_left = windows[i].left, a.window_right = windows[i].right;
        int bn = block_n_for_call(&s, &call);
        CHECK(bn == windows[i].block_n, "d%d dropout %d window (%d, %d): Bc %d, expected %d",
              windows[i].head_dim, windows[i].dropout, windows[i].left, windows[i].right, bn,
              windows[i].block_n);
    }
}

/* The calls fwd_sm90a takes: TMA needs 16-byte aligned tensors with strides
 * that are nonzero multiples of 16 bytes; a dimension of one element may
 * have any stride. Others are refused with the reason, which the runtime
 * logs as it hands the call to fwd_sm80. */
static void test_sm90a_calls(void) {
    const fg_profile *h100 = profile_named("h100");
    family_device dev = {h100, 0, fake_encode, NULL};
    fg_forward_args a = fg_forward_args_default();
    char *base = (char *)(uintptr_t)0x10000, why[256] = "";
    a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seqlen_q = 100, a.seqlen_k = 77;
    a.q = fg_tensor_bshd(base, 100, 4, 72);
    a.k = fg_tensor_bhsd(base, 77, 2, 72);
    a.v = fg_tensor_bshd(base, 77, 2, 72);
    a.o = a.q;
    fg_spec s = fg_spec_default(72, FG_FP16);
    family_call call = {&a, NULL, {0}, &s, 0, 0};
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "bshd/bhsd d72: %s", why);
    family_plan plan;
    family_args out;
    char err[256] = "";
    fwd_sm90a_family.plan(&s, h100, 0, &plan, err, sizeof err);
    encoded = 0;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              encoded == 4,
          "four maps encoded (%d): %s", encoded, err);
    /* query blocks in sections of heads: one head at a time without a mask;
     * under a causal mask as many heads as keep K and V within 24 MiB: all
     * 8 at 77 keys; at 64Ki keys, K and V of a key/value head take 18 MiB,
     * 9 per query head (GQA groups of 2), so 2 */
    const fg_fwd_tma_params *fp = (const fg_fwd_tma_params *)out.params;
    CHECK(fp->section_heads == 1, "no mask: %d heads per section", fp->section_heads);
    s.mask = FG_MASK_CAUSAL;
    fwd_sm90a_family.plan(&s, h100, 0, &plan, err, sizeof err);
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              fp->section_heads == 8,
          "causal, short: %d heads per section (%s)", fp->section_heads, err);
    a.seqlen_k = 1 << 16;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              fp->section_heads == 2,
          "causal, 64Ki keys: %d heads per section (%s)", fp->section_heads, err);
    a.seqlen_k = 77;
    s.mask = FG_MASK_NONE;
    fwd_sm90a_family.plan(&s, h100, 0, &plan, err, sizeof err);
    fg_forward_args b = a;
    b.k.stride_seq = 2 * 36; /* 144 bytes: fine */
    b.batch = 1, b.q.stride_batch = 0;  /* one batch: its stride is never used */
    call.forward = &b;
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "one batch: %s", why);
    b.q.stride_seq = 4 * 72 + 4; /* 584 bytes */
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "q's seq stride of 584 bytes"),
          "odd stride: %s", why);
    b = a, b.v.data = base + 8;
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "v.data") && strstr(why, "16-byte"),
          "misaligned v: %s", why);
    b = a, b.o.stride_head = 73; /* 146 bytes */
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "o's head stride of 146 bytes"),
          "odd o stride: %s", why);
    b = a, b.k.stride_head = 0; /* k broadcast over its heads */
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 && strstr(why, "k's head"),
          "broadcast k: %s", why);
    /* packed sequences: maps over (total, H, D), so the batch stride is
     * never used, and the rows are the packed tensors' */
    fg_spec packed = s;
    packed.varlen = 1;
    call.spec = &packed;
    b = a, b.total_q = 300, b.total_k = 1000, b.q.stride_batch = 3, b.k.stride_batch = 5;
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "packed: %s", why);
    b.k.stride_seq = 4 * 72 + 4;
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "k's seq stride of 584 bytes"),
          "packed, odd stride: %s", why);
    call.spec = &s;
    dev.encode_map = NULL;
    call.forward = &a;
    CHECK(fwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "cuTensorMapEncodeTiled"),
          "no encoder: %s", why);
}

/* The backward calls bwd_sm90a takes: q, k, v, dO, dK and dV TMA can
 * describe, both schedules. Its seven maps are encoded (the dQ
 * accumulator's in fp32), and
 * its workspace is D and the dQ accumulator, the part cleared, and after
 * them, cleared too, the fast schedule's counter of the tiles its thread
 * blocks walk, or where they take a tile each its thread blocks done per
 * (key/value head, batch) pair, whose last converts dQ, or the
 * deterministic schedule's counters, which a kernel after the main one
 * follows. */
static bwd_sm90a_plan *plan_of_test(family_plan *p) { return (bwd_sm90a_plan *)p->bytes; }

static void test_bwd_sm90a_calls(void) {
    const fg_profile *h100 = profile_named("h100");
    family_device dev = {h100, 0, fake_encode, NULL};
    char *base = (char *)(uintptr_t)0x10000, why[256] = "", err[256] = "";
    fg_backward_args b;
    memset(&b, 0, sizeof b);
    b.forward = fg_forward_args_default();
    fg_forward_args *a = &b.forward;
    a->batch = 2, a->heads_q = 4, a->heads_kv = 2, a->seqlen_q = 100, a->seqlen_k = 77;
    a->q = a->o = fg_tensor_bshd(base, 100, 4, 72);
    a->k = a->v = fg_tensor_bhsd(base, 77, 2, 72);
    b.d_o = b.d_q = a->q, b.d_k = b.d_v = a->k;
    fg_spec s = fg_spec_default(72, FG_BF16);
    family_call call = {a, &b, {0}, &s, 0, 0};
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "fast, d72: %s", why);
    family_plan plan;
    family_args out;
    CHECK(bwd_sm90a_family.plan(&s, h100, 0, &plan, err, sizeof err) == 0, "plan: %s", err);
    encoded = encoded_f32 = 0;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              encoded == 7 && encoded_f32 == 1,
          "seven maps encoded (%d, %d fp32): %s", encoded, encoded_f32, err);
    b.d_v.stride_seq = 76; /* 152 bytes: no multiple of 16 */
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 && strstr(why, "d_v"),
          "dV's rows TMA cannot store: %s", why);
    b.d_v = b.d_k;
    size_t rows = 2 * 4 * 100, delta = (rows * 4 + 255) / 256 * 256;
    size_t accum = (rows * 80 * 4 + 255) / 256 * 256; /* d72 padded to 80 */
    size_t done = 256;                                  /* 2 batches x 2 heads, u32 */
    size_t tile_next = 256;                             /* u32 */
    const fg_bwd_tma_params *bp = (const fg_bwd_tma_params *)out.params;
    /* the plan's thread blocks walk tiles (key block, head, batch): the
     * next one's counter after the accumulator, cleared with it, a block
     * per tile up to a block an SM, and dQ converted by the kernel after */
    CHECK(plan_of_test(&plan)->walk == 1 &&
              bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->tile_next == 4096 + delta + accum && bp->fast_grid == 4 && bp->dq_done == 0 &&
              bp->dq_post == 1,
          "walking tiles: the counter at %llu, %d thread blocks, dq_post %d (%s)",
          (unsigned long long)bp->tile_next, bp->fast_grid, bp->dq_post, err);
    CHECK(bwd_sm90a_family.workspace(&plan, &call, &dev) == delta + accum + tile_next &&
              out.clear_offset == delta && out.clear_bytes == accum + tile_next,
          "walking tiles: workspace %zu (D %zu, %zu cleared from %zu)",
          bwd_sm90a_family.workspace(&plan, &call, &dev), delta, out.clear_bytes,
          out.clear_offset);
    a->seqlen_k = 77 + 128 * 40; /* 41 key blocks x 2 heads x 2 batches: 164 tiles */
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->fast_grid == h100->sm_count && bp->fast_tiles == 164,
          "walking 164 tiles: %d thread blocks, %u tiles", bp->fast_grid, bp->fast_tiles);
    a->seqlen_k = 77;
    /* packed sequences walk too: every sequence, and the rows after the
     * last, counted with the longest one's key blocks; under a causal mask
     * a section holds one sequence's pairs (a divisor of the 6 key/value
     * heads), so a block past a sequence's keys skips the section's rest */
    {
      fg_spec packed = s;
      packed.varlen = 1, packed.mask = FG_MASK_CAUSAL;
      fg_forward_args pa = *a;
      fg_backward_args pb = b;
      pa.heads_q = 12, pa.heads_kv = 6, pa.seqlen_q = 100, pa.seqlen_k = 300;
      pa.total_q = 150, pa.total_k = 400;
      pa.cu_seqlens_q = pa.cu_seqlens_k = (const int32_t *)base;
      pa.q = pa.o = fg_tensor_bshd(base, 150, 12, 72);
      pa.k = pa.v = fg_tensor_bshd(base, 400, 6, 72);
      pb.forward = pa, pb.d_o = pb.d_q = pa.q, pb.d_k = pb.d_v = pa.k;
      family_call pcall = {&pb.forward, &pb, {0}, &packed, 0, 0};
      family_plan pplan;
      CHECK(bwd_sm90a_family.plan(&packed, h100, 0, &pplan, err, sizeof err) == 0 &&
                plan_of_test(&pplan)->walk == 1,
            "packed: a plan that walks (%s)", err);
      CHECK(bwd_sm90a_family.arguments(&pplan, &packed, &pcall, &dev, 4096, &out, err,
                                       sizeof err) == 0 &&
                bp->fast_tiles == 3 * 6 * 3 && bp->section_heads > 1 && 6 % bp->section_heads == 0,
            "packed: %u tiles, sections of %d pairs (%s)", bp->fast_tiles, bp->section_heads, err);
    }
    /* a plan whose blocks take a tile each (as packed calls'): the last of
     * each (key/value head, batch) pair converts its dQ */
    plan_of_test(&plan)->walk = 0;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->dq_done == 4096 + delta + accum && bp->dq_post == 0 && bp->tile_next == 0 &&
              bp->fast_grid == 4,
          "fast: pairs' counters at %llu, dq_post %d (%s)", (unsigned long long)bp->dq_done,
          bp->dq_post, err);
    CHECK(bwd_sm90a_family.workspace(&plan, &call, &dev) == delta + accum + done &&
              out.clear_offset == delta && out.clear_bytes == accum + done,
          "workspace %zu (D %zu, %zu cleared from %zu)",
          bwd_sm90a_family.workspace(&plan, &call, &dev), delta, out.clear_bytes,
          out.clear_offset);
    /* pairs of more than 1 MB of accumulator rows (2 query heads x 1639 rows
     * x 80 columns), sections of pairs, or dropout: the kernel after the
     * main one converts dQ */
    a->seqlen_q = 1639;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->dq_done == 0 && bp->dq_post == 1,
          "long pairs: counters at %llu, dq_post %d", (unsigned long long)bp->dq_done, bp->dq_post);
    a->seqlen_q = 1638;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->dq_done != 0 && bp->dq_post == 0,
          "1 MB pairs: counters at %llu, dq_post %d", (unsigned long long)bp->dq_done, bp->dq_post);
    a->seqlen_q = 100;
    /* under a causal mask the pairs of a section end together */
    s.mask = FG_MASK_CAUSAL;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->section_heads > 1 && bp->dq_done == 0 && bp->dq_post == 1,
          "causal: %d pairs a section, counters at %llu, dq_post %d", bp->section_heads,
          (unsigned long long)bp->dq_done, bp->dq_post);
    s.mask = FG_MASK_NONE;
    plan_of_test(&plan)->walk = 1;
    /* deterministic: the same thread blocks of the other main kernel, the
     * accumulators (planes: two where the plan splits the columns) that the
     * post kernel sums, and after them the counters that order the
     * reductions, (B, Hq, query blocks, planes) u32, cleared with them */
    b.deterministic = 1;
    size_t turns = (2 * 4 * 2 * 2 * 4 + 255) / 256 * 256; /* 100 rows: 2 query blocks */
    size_t planes = (2 * rows * 80 * 4 + 255) / 256 * 256;
    CHECK(plan_of_test(&plan)->dq_planes == 1, "unsplit: %d planes", plan_of_test(&plan)->dq_planes);
    plan_of_test(&plan)->dq_planes = 2; /* as a split plan has */
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "deterministic: %s", why);
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->num_n_blocks == 1 && bp->det_n_blocks == 1 && bp->fast_n_blocks == 0 &&
              bp->dq_turns == 4096 + delta + planes && bp->dq_done == 0 && bp->dq_post == 1 &&
              bp->dq_slices == 2 && bp->dq_slice == (int64_t)(rows * 80) &&
              bp->tile_next == 0 && bp->fast_grid == 0,
          "deterministic: %d key blocks (%d fast, %d deterministic), counters at %llu, "
          "pairs' at %llu, dq_post %d, %d planes %lld apart (%s)",
          bp->num_n_blocks, bp->fast_n_blocks, bp->det_n_blocks,
          (unsigned long long)bp->dq_turns, (unsigned long long)bp->dq_done, bp->dq_post,
          bp->dq_slices, (long long)bp->dq_slice, err);
    CHECK(bwd_sm90a_family.workspace(&plan, &call, &dev) == delta + planes + turns &&
              out.clear_offset == delta && out.clear_bytes == planes + turns,
          "deterministic workspace %zu, %zu cleared from %zu",
          bwd_sm90a_family.workspace(&plan, &call, &dev), out.clear_bytes, out.clear_offset);
    b.deterministic = 0;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->dq_turns == 0 && bp->dq_slices == 1 && bp->fast_n_blocks == 1 && bp->det_n_blocks == 0,
          "fast: no counters (%llu), %d fast and %d deterministic key blocks",
          (unsigned long long)bp->dq_turns, bp->fast_n_blocks, bp->det_n_blocks);
    /* a layout: both of its lists, the backward's per key block and the
     * forward's per query block (the deterministic order follows them) */
    call.layout = (family_layout){.batch = 1, .heads = 1, .blocks_q = 1, .blocks_k = 1,
                                  .counts = 0x1000, .indices = 0x2000, .counts_by_key = 0x3000,
                                  .indices_by_key = 0x4000};
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->block_count == 0x1000 && bp->block_index == 0x2000 &&
              bp->query_count == 0x3000 && bp->query_index == 0x4000 && bp->layout_heads == 1 &&
              bp->layout_batch == 1,
          "layout lists: %s", err);
    call.layout = (family_layout){0};
    /* dropout: the fast schedule here, and at d = 72 the deterministic one
     * with or without a mask, handed on under a mask beside an expression or
     * beside block sparsity (taken above d = 128, below) */
    s.dropout = 1;
    CHECK(bwd_sm90a_family.arguments(&plan, &s, &call, &dev, 4096, &out, err, sizeof err) == 0 &&
              bp->dq_done == 0 && bp->dq_post == 1,
          "dropout: counters at %llu, dq_post %d", (unsigned long long)bp->dq_done, bp->dq_post);
    b.deterministic = 1;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0,
          "deterministic with dropout, d72: %s", why);
    s.mask = FG_MASK_CAUSAL;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0,
          "deterministic with dropout, d72 causal: %s", why);
    s.score_mod = "s * 0.5";
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "deterministic") && strstr(why, "dropout") && strstr(why, "expression"),
          "deterministic with dropout, d72 causal with an expression: %s", why);
    s.score_mod = NULL, s.sparsity = FG_SPARSE_LAYOUT, s.sparse_block_q = s.sparse_block_k = 128;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "deterministic") && strstr(why, "sparsity"),
          "deterministic with dropout, d72 causal layout: %s", why);
    s.sparsity = FG_SPARSE_NONE, s.sparse_block_q = s.sparse_block_k = 0;
    s.mask = FG_MASK_NONE, b.deterministic = 0;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0, "fast with dropout: %s", why);
    s.dropout = 0;
    b.d_o.data = base + 8;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 &&
              strstr(why, "d_o.data") && strstr(why, "16-byte"),
          "misaligned dO: %s", why);
    /* above d = 128 the split kernel: 64 keys shared by both consumers, each
     * with half the columns and half of Sᵀ's queries; two stages at d <= 192,
     * one above; with dropout both schedules */
    static const int wide_dims[] = {136, 160, 192, 200, 256};
    for (int i = 0; i < 5; i++) {
        s.head_dim = wide_dims[i];
        bwd_sm90a_plan w;
        int boxes = (s.head_dim + 63) / 64;
        CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0 &&
                  plan_bwd_sm90a(&s, h100, 0, NULL, &w, err, sizeof err) == 0 && w.split == 1 &&
                  w.block_n == 64 && w.s_cols == 32 && w.v_cols == 32 * boxes && w.boxes == boxes &&
                  w.stages == (boxes == 3 ? 2 : 1) && w.smem_bytes <= h100->smem_per_block &&
                  w.accumulator_registers <= w.consumer_registers - 16 && w.dq_planes == 2 &&
                  w.fast_det == (w.stages == 1),
              "d%d: %s (split %d, block_n %d, stages %d, %d bytes, %d registers, %d planes, "
              "fast det %d)",
              s.head_dim, err, w.split, w.block_n, w.stages, w.smem_bytes, w.accumulator_registers,
              w.dq_planes, w.fast_det);
        /* with dropout the keep words of 64 keys by 64 queries beside lse and D */
        s.dropout = 1;
        CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0 &&
                  plan_bwd_sm90a(&s, h100, 0, NULL, &w, err, sizeof err) == 0 && w.split == 1 &&
                  w.block_m == 64 && w.smem_bytes <= h100->smem_per_block,
              "d%d with dropout: %s (split %d, %d bytes)", s.head_dim, err, w.split, w.smem_bytes);
        b.deterministic = 1, b.d_o.data = base;
        CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0,
              "d%d deterministic with dropout: %s", s.head_dim, why);
        b.deterministic = 0, b.d_o.data = base + 8;
        s.dropout = 0;
        /* under a mask one plane at one stage, two at two */
        s.mask = FG_MASK_CAUSAL;
        CHECK(plan_bwd_sm90a(&s, h100, 0, NULL, &w, err, sizeof err) == 0 && w.split == 1 &&
                  w.dq_planes == (w.stages == 1 ? 1 : 2),
              "d%d causal: %s (split %d, stages %d, %d planes)", s.head_dim, err, w.split,
              w.stages, w.dq_planes);
        s.mask = FG_MASK_NONE;
    }
    /* dropout: the keep words (a bit per key and query) in each stage, and
     * a producer that draws them keeps 40 registers; without dropout the
     * deterministic kernel is the fast one's steps in turn (det_ordered),
     * with its hand-over barriers (32 bytes) */
    s.head_dim = 128;
    bwd_sm90a_plan plain, dropped;
    const bwd_sm90a_tiling rows64 = {2, 64};
    CHECK(plan_bwd_sm90a(&s, h100, 0, &rows64, &plain, err, sizeof err) == 0, "d128: %s", err);
    s.dropout = 1;
    CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0 &&
              plan_bwd_sm90a(&s, h100, 0, NULL, &dropped, err, sizeof err) == 0,
          "dropout: %s", err);
    CHECK(plain.dq_sets == 1 && dropped.dq_sets == 1 && plain.det_ordered == 1 &&
              dropped.det_ordered == 0 &&
              dropped.smem_bytes == plain.smem_bytes - 32 + plain.stages * plain.block_n * 64 / 8 &&
              dropped.smem_bytes <= h100->smem_per_block,
          "dropout's keep words: %d bytes, %d without", dropped.smem_bytes, plain.smem_bytes);
    /* at d <= 64, under the derived budget, 128 query rows a step (Sᵀ and
     * dPᵀ of 128 queries: 192 accumulator registers; the deterministic
     * kernel, the fast one's steps in turn, 232 a consumer beside a
     * producer of 40) and one set of dQ's staging; under a smaller budget
     * (a kernel that spilled) 64 rows, where the deterministic kernel of
     * packed sequences stages dQ in a second set (fp32 block_m x v_cols,
     * two barriers per consumer); with dropout 64 rows and one set. Blocks
     * that walk tiles take 48 bytes of barriers and slots, the ordered
     * deterministic kernel 32 */
    s.head_dim = 64;
    bwd_sm90a_plan d64, d64_small, d64_drop;
    CHECK(plan_bwd_sm90a(&s, h100, 0, NULL, &d64_drop, err, sizeof err) == 0 &&
              d64_drop.block_m == 64 && d64_drop.dq_sets == 1,
          "d64 dropout: %s (block_m %d, %d sets)", err, d64_drop.block_m, d64_drop.dq_sets);
    /* and a deterministic kernel whose 64 load threads draw two tasks each
     * (the producer at 56 registers), but under a mask beside a layout; at
     * d = 128 without a mask too, the producer at 40 (its consumers need
     * 232) */
    CHECK(d64_drop.det_dropout == 1 && d64_drop.det_producer_registers == 56 &&
              d64_drop.det_consumer_registers == 224 && dropped.det_dropout == 1 &&
              dropped.det_producer_registers == 40 && dropped.det_consumer_registers == 232,
          "d64 deterministic with dropout: %d (%d/%d registers), d128 %d (%d/%d)",
          d64_drop.det_dropout, d64_drop.det_producer_registers, d64_drop.det_consumer_registers,
          dropped.det_dropout, dropped.det_producer_registers, dropped.det_consumer_registers);
    b.deterministic = 1, b.d_o.data = base;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) == 0,
          "d64 deterministic with dropout: %s", why);
    s.mask = FG_MASK_CAUSAL, s.sparsity = FG_SPARSE_LAYOUT, s.sparse_block_q = 128,
    s.sparse_block_k = 128;
    CHECK(bwd_sm90a_family.accepts(&call, &dev, why, sizeof why) != 0 && strstr(why, "sparsity"),
          "d64 causal layout deterministic with dropout: %s", why);
    s.mask = FG_MASK_NONE, s.sparsity = FG_SPARSE_NONE, s.sparse_block_q = s.sparse_block_k = 0;
    b.deterministic = 0, b.d_o.data = base + 8;
    s.dropout = 0;
    CHECK(plan_bwd_sm90a(&s, h100, 0, NULL, &d64, err, sizeof err) == 0 && d64.block_m == 128 &&
              d64.s_cols == 128 && d64.dq_rows == 64 && d64.dq_sets == 1 &&
              d64.accumulator_registers == 192 && d64.consumer_registers == 240 &&
              d64.det_consumer_registers == 232 && d64.det_producer_registers == 40 &&
              d64.det_ordered == 1 && d64.walk == 1 &&
              d64.fast_smem_bytes == d64.smem_bytes + 48 - 32 &&
              d64.smem_bytes <= h100->smem_per_block,
          "d64: %s (block_m %d, %d sets, %d registers, %d bytes)", err, d64.block_m, d64.dq_sets,
          d64.det_consumer_registers, d64.smem_bytes);
    CHECK(plan_bwd_sm90a(&s, h100, 224, NULL, &d64_small, err, sizeof err) == 0 &&
              d64_small.block_m == 64 && d64_small.dq_sets == 1 && d64_small.det_ordered == 1 &&
              d64_small.accumulator_registers < d64.accumulator_registers &&
              d64_small.walk == 1 && d64_small.fast_smem_bytes == d64_small.smem_bytes + 48 - 32 &&
              plain.fast_smem_bytes == plain.smem_bytes + 48 - 32,
          "d64 under 224 registers: block_m %d, %d sets, %d bytes (fast %d)", d64_small.block_m,
          d64_small.dq_sets, d64_small.smem_bytes, d64_small.fast_smem_bytes);
    {
        bwd_sm90a_plan packed, packed_small;
        fg_spec v = s;
        v.varlen = 1;
        CHECK(plan_bwd_sm90a(&v, h100, 0, NULL, &packed, err, sizeof err) == 0 &&
                  plan_bwd_sm90a(&v, h100, 224, NULL, &packed_small, err, sizeof err) == 0 &&
                  packed_small.block_m == 64 && packed_small.dq_sets == 2 &&
                  packed_small.det_ordered == 0 && packed.det_ordered == 0 &&
                  packed_small.smem_bytes ==
                      d64_small.smem_bytes + d64_small.block_m * d64_small.v_cols * 4 +
                          16 * d64_small.consumers,
              "d64 packed under 224 registers: %s (block_m %d, %d sets, %d bytes)", err,
              packed_small.block_m, packed_small.dq_sets, packed_small.smem_bytes);
    }
    /* the tuner's candidates at d = 64: 128 rows and 64, two stages and
     * one, each named by its text ("stages,block_m") and planned as named;
     * 128 rows refused by name where the head dims are wider than a box */
    family_tiling cands[8];
    int n_cands = bwd_sm90a_family.candidates(&s, h100, cands, 8);
    static const int want_rows[4] = {128, 128, 64, 64}, want_stages[4] = {2, 1, 2, 1};
    CHECK(n_cands == 4, "d64: %d backward candidates", n_cands);
    for (int i = 0; i < n_cands && i < 4; i++) {
        family_plan fp;
        family_tiling back;
        const kernel_family *fam = NULL;
        char text[64];
        int ok = bwd_sm90a_family.plan_tiling(&s, h100, &cands[i], &fp, err, sizeof err) == 0;
        const bwd_sm90a_plan *x = (const bwd_sm90a_plan *)fp.bytes;
        if (ok) bwd_sm90a_family.tiling_of(&fp, &back);
        family_choice_format(&bwd_sm90a_family, &cands[i], text, sizeof text);
        CHECK(ok && x->block_m == want_rows[i] && x->stages == want_stages[i] &&
                  memcmp(&back, &cands[i], sizeof back) == 0 &&
                  family_choice_parse(text, &fam, &back) == 0 && fam == &bwd_sm90a_family &&
                  memcmp(&back, &cands[i], sizeof back) == 0,
              "d64 candidate %d (%s): %s", i, text, ok ? "" : err);
    }
    {
        bwd_sm90a_tiling rows128 = {2, 128}, rows96 = {2, 96};
        bwd_sm90a_plan w;
        fg_spec wide = s;
        wide.head_dim = 128;
        CHECK(plan_bwd_sm90a(&wide, h100, 0, &rows128, &w, err, sizeof err) != 0 &&
                  strstr(err, "not take 128 "),
              "d128 with 128 rows a step refused: %s", err);
        CHECK(plan_bwd_sm90a(&s, h100, 0, &rows96, &w, err, sizeof err) != 0 && strstr(err, "not take 96 "),
              "96 rows a step refused: %s", err);
    }
    /* 80 rows where Q and K are two boxes wide (d = 128), causal or without
     * a mask, no dropout or sparsity, all of them in each consumer's dQ
     * (transposed): Sᵀ and dPᵀ of 80 queries beside dK and dV, 208
     * registers, only under the whole budget; V and dO one box wide too
     * (128/64); 64 rows with a window, with dropout (above), under a smaller
     * budget and where V is wider than Q and K's box (64/128) */
    {
        bwd_sm90a_plan d128, d128_small, d128_causal, w;
        fg_spec d = s;
        d.head_dim = 128;
        fg_spec causal = d, window = d;
        causal.mask = FG_MASK_CAUSAL;
        window.mask = FG_MASK_WINDOW;
        const bwd_sm90a_tiling rows80 = {2, 80};
        CHECK(plan_bwd_sm90a(&d, h100, 0, NULL, &d128, err, sizeof err) == 0 && d128.block_m == 80 &&
                  d128.s_cols == 80 && d128.dq_rows == 80 && d128.accumulator_registers == 208 &&
                  d128.consumer_registers == 240 && d128.det_consumer_registers == 240 &&
                  d128.walk == 1 && d128.det_ordered == 1 &&
                  d128.fast_smem_bytes == d128.smem_bytes + 48 - 32 &&
                  d128.fast_smem_bytes <= h100->smem_per_block,
              "d128: %s (block_m %d, dq_rows %d, %d registers, %d bytes)", err, d128.block_m,
              d128.dq_rows, d128.accumulator_registers, d128.smem_bytes);
        CHECK(plan_bwd_sm90a(&d, h100, 224, NULL, &d128_small, err, sizeof err) == 0 &&
                  d128_small.block_m == 64 && d128_small.dq_rows == 64 &&
                  d128_small.accumulator_registers < d128.accumulator_registers,
              "d128 under 224 registers: %s (block_m %d)", err, d128_small.block_m);
        CHECK(plan_bwd_sm90a(&causal, h100, 0, NULL, &d128_causal, err, sizeof err) == 0 &&
                  d128_causal.block_m == 80 && d128_causal.dq_rows == 80 && dropped.block_m == 64,
              "d128 causal: %s (block_m %d; dropout %d)", err, d128_causal.block_m, dropped.block_m);
        CHECK(plan_bwd_sm90a(&window, h100, 0, NULL, &w, err, sizeof err) == 0 && w.block_m == 64,
              "d128 window: %s (block_m %d)", err, w.block_m);
        CHECK(plan_bwd_sm90a(&window, h100, 0, &rows80, &w, err, sizeof err) != 0 &&
                  strstr(err, "not take 80 "),
              "d128 window with 80 rows a step refused: %s", err);
        fg_spec narrow_v = d;
        narrow_v.head_dim_v = 64;
        CHECK(plan_bwd_sm90a(&narrow_v, h100, 0, NULL, &w, err, sizeof err) == 0 && w.block_m == 80,
              "d128/64: %s (block_m %d)", err, w.block_m);
        family_tiling d128_cands[8];
        bwd_sm90a_tiling first;
        int n = bwd_sm90a_family.candidates(&d, h100, d128_cands, 8);
        family_tiling_unpack(&d128_cands[0], &first, sizeof first);
        CHECK(n == 4 && first.block_m == 80 && first.stages == 2, "d128: %d candidates, the first %d rows",
              n, first.block_m);
    }
    s.head_dim_v = 128;
    bwd_sm90a_plan d64v128;
    CHECK(plan_bwd_sm90a(&s, h100, 0, NULL, &d64v128, err, sizeof err) == 0 &&
              d64v128.block_m == 64,
          "d64/128: %s (block_m %d)", err, d64v128.block_m);
    s.head_dim_v = 0;
    s.head_dim = 128;
    CHECK(plain.producer_registers == 24 && plain.consumer_registers == 240 &&
              dropped.producer_registers == 40 && dropped.consumer_registers == 232,
          "registers: %d/%d, with dropout %d/%d", plain.producer_registers,
          plain.consumer_registers, dropped.producer_registers, dropped.consumer_registers);
    /* sparse blocks of whole tiles (64 queries x 128 keys); others go to
     * bwd_sm80 */
    s.dropout = 0;
    s.sparsity = FG_SPARSE_LAYOUT, s.sparse_block_q = 128, s.sparse_block_k = 128;
    CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0, "layout 128x128: %s", err);
    s.sparsity = FG_SPARSE_BUTTERFLY, s.sparse_block_q = 64, s.sparse_block_k = 256;
    CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) == 0, "butterfly 64x256: %s", err);
    s.sparse_block_q = 64, s.sparse_block_k = 64;
    CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) != 0 &&
              strstr(err, "64x128 do not divide sparse blocks 64x64"),
          "butterfly 64x64: %s", err);
    s.sparsity = FG_SPARSE_LAYOUT, s.sparse_block_q = 96, s.sparse_block_k = 128;
    CHECK(bwd_sm90a_family.supports(&s, h100, err, sizeof err) != 0 && strstr(err, "96x128"),
          "layout 96x128: %s", err);
}

/* A value head dim of its own: canonical forms and names, refusals, plans
 * of every pair on every target from both dims, and the families that take
 * it (the mma.sync ones) or hand it on (the Hopper ones, decoding steps). */
static void test_value_head_dims(void) {
    char err[256], name[128];
    fg_spec a = fg_spec_default(128, FG_BF16), b = a, ca, cb;
    b.head_dim_v = 128; /* the same as head_dim: the spec it was */
    CHECK(spec_canonicalize(&a, &ca, err, sizeof err) == 0 &&
              spec_canonicalize(&b, &cb, err, sizeof err) == 0 && cb.head_dim_v == 0 &&
              memcmp(&ca, &cb, sizeof ca) == 0,
          "head_dim_v == head_dim canonicalizes to 0");
    spec_name(&cb, name, sizeof name);
    CHECK(strcmp(name, "bf16_d128") == 0, "name %s", name);
    b.head_dim_v = 64, b.mask = FG_MASK_CAUSAL;
    CHECK(spec_canonicalize(&b, &cb, err, sizeof err) == 0 && cb.head_dim_v == 64 &&
              spec_head_dim_v(&cb) == 64 && spec_head_dim_v(&ca) == 128 &&
              spec_head_dim_v_padded(&cb) == 64,
          "head_dim_v kept: %s", err);
    spec_name(&cb, name, sizeof name);
    CHECK(strcmp(name, "bf16_d128v64_causal") == 0, "name %s", name);
    b.mask = FG_MASK_NONE;
    CHECK(spec_canonicalize(&b, &cb, err, sizeof err) == 0 && memcmp(&ca, &cb, sizeof ca) != 0,
          "specs that differ only in head_dim_v differ");
    static const int bad_dims[] = {-1, 257, 1000};
    for (size_t i = 0; i < sizeof bad_dims / sizeof bad_dims[0]; i++) {
        b.head_dim_v = bad_dims[i];
        CHECK(spec_canonicalize(&b, &cb, err, sizeof err) != 0 && strstr(err, "spec.head_dim_v") &&
                  strstr(err, "1..256"),
              "head_dim_v %d: %s", bad_dims[i], err);
    }
    /* a decoding step takes a value head dim of its own, a multiple of 8 as
     * its head dim must be */
    b = fg_spec_default(64, FG_FP16), b.head_dim_v = 32, b.kv_cache = 1;
    CHECK(spec_canonicalize(&b, &cb, err, sizeof err) == 0 && cb.head_dim_v == 32,
          "a decoding step with a value head dim of its own: %s", err);
    b.head_dim_v = 36;
    CHECK(spec_canonicalize(&b, &cb, err, sizeof err) != 0 && strstr(err, "value head dim 36") &&
              strstr(err, "multiple of 8"),
          "a decoding step's value head dim 36: %s", err);

    /* every pair of a spread of dims plans on every target, forward and
     * backward, with masks, dropout and sparse blocks */
    static const int dims[] = {1, 8, 33, 64, 72, 96, 128, 160, 192, 200, 256};
    const int n = (int)(sizeof dims / sizeof dims[0]);
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                for (int v = 0; v < 3; v++) {
                    if (dims[i] == dims[j]) continue;
                    fg_spec s = fg_spec_default(dims[i], FG_FP16), c;
                    s.head_dim_v = dims[j];
                    if (v == 1) s.mask = FG_MASK_CAUSAL, s.dropout = 1;
                    if (v == 2) s.sparsity = FG_SPARSE_LAYOUT, s.sparse_block_q = 64,
                                s.sparse_block_k = 128;
                    if (spec_canonicalize(&s, &c, err, sizeof err) != 0) {
                        CHECK(0, "%s", err);
                        continue;
                    }
                    const int dv = dims[j];
                    fg_fwd_plan p;
                    int rc = plan_forward(&c, prof, &p, err, sizeof err);
                    CHECK(rc == 0, "%s d%d/%d: %s", prof->name, dims[i], dv, err);
                    if (rc == 0) {
                        CHECK(p.smem_bytes <= prof->smem_per_block &&
                                  p.smem_bytes == plan_forward_smem(p.block_m, p.block_n, p.stages,
                                                                    p.head_dim_padded,
                                                                    p.head_dim_v_padded),
                              "%s d%d/%d smem %d", prof->name, dims[i], dv, p.smem_bytes);
                        CHECK(p.head_dim_v_padded >= dv && p.head_dim_v_padded % 16 == 0 &&
                                  p.head_dim_v_padded < dv + 16 &&
                                  p.smem_row_v == p.head_dim_v_padded + PLAN_SMEM_ROW_PAD &&
                                  p.head_dim_padded >= dims[i] && p.head_dim_padded < dims[i] + 16,
                              "%s d%d/%d padded %d/%d", prof->name, dims[i], dv, p.head_dim_padded,
                              p.head_dim_v_padded);
                        /* O is dv wide: the accumulators count its columns */
                        CHECK(p.accumulator_registers ==
                                  p.m_tiles * (p.head_dim_v_padded / 2 + p.block_n / 2),
                              "%s d%d/%d accumulators %d", prof->name, dims[i], dv,
                              p.accumulator_registers);
                        CHECK(strstr(p.why, "value head dim") != NULL, "why: %s", p.why);
                    }
                    for (int budget = PLAN_BACKWARD_REGISTERS; budget >= 96;
                         budget = plan_next_budget(budget)) {
                        fg_bwd_plan q;
                        rc = plan_backward_budget(&c, prof, budget, &q, err, sizeof err);
                        CHECK(rc == 0, "%s d%d/%d backward budget %d: %s", prof->name, dims[i],
                              dv, budget, err);
                        if (rc) break;
                        int cols = q.head_dim_padded / q.col_splits;
                        int cols_v = q.head_dim_v_padded / q.col_splits;
                        CHECK(q.smem_bytes <= prof->smem_per_block &&
                                  q.accumulator_registers <= budget,
                              "%s d%d/%d backward smem %d acc %d", prof->name, dims[i], dv,
                              q.smem_bytes, q.accumulator_registers);
                        CHECK(q.head_dim_v_padded >= dv && q.head_dim_v_padded % 16 == 0 &&
                                  (cols_v / q.kv_warps_d) % 16 == 0 &&
                                  (cols / q.kv_warps_d) % 16 == 0 &&
                                  (cols / q.q_warps_d) % 16 == 0 &&
                                  q.smem_row_v == q.head_dim_v_padded + PLAN_SMEM_ROW_PAD,
                              "%s d%d/%d backward columns %d/%d, warps %d x %d", prof->name,
                              dims[i], dv, q.head_dim_padded, q.head_dim_v_padded, q.kv_warps_n,
                              q.kv_warps_d);
                    }
                }
    }

    /* the Hopper and mma.sync families take the pair (the Hopper backward
     * at 32 query rows a step, 128 keys a block, dQ once a pair of steps,
     * 64 rows, the deterministic kernel's consumers at 232; split, as five
     * boxes past 64 keys a consumer, under a smaller budget, with dropout
     * or under a named row count); the decoding family refuses */
    const fg_profile *h100 = profile_named("h100");
    fg_spec s = fg_spec_default(192, FG_BF16), c;
    s.head_dim_v = 128, s.mask = FG_MASK_CAUSAL;
    spec_canonicalize(&s, &c, err, sizeof err);
    CHECK(fwd_sm90a_family.supports(&c, h100, err, sizeof err) == 0, "fwd_sm90a 192/128: %s", err);
    bwd_sm90a_plan bp;
    CHECK(bwd_sm90a_family.supports(&c, h100, err, sizeof err) == 0 &&
              plan_bwd_sm90a(&c, h100, 0, NULL, &bp, err, sizeof err) == 0 && bp.split == 0 &&
              bp.block_m == 32 && bp.block_n == 128 && bp.boxes == 3 && bp.v_boxes == 2 &&
              bp.k_cols == 192 && bp.v_cols == 128 && bp.head_dim_v_padded == 128 &&
              bp.dq_rows == 64 && bp.accumulator_registers == 192 &&
              bp.det_consumer_registers == 232 && bp.dq_planes == 1 &&
              bp.smem_bytes <= h100->smem_per_block,
          "bwd_sm90a 192/128: %s (split %d, %dx%d, boxes %d/%d, columns %d/%d, %d registers)", err,
          bp.split, bp.block_m, bp.block_n, bp.boxes, bp.v_boxes, bp.k_cols, bp.v_cols,
          bp.accumulator_registers);
    {
        const bwd_sm90a_tiling rows_64 = {0, 64};
        bwd_sm90a_plan under, named;
        fg_spec dropped = c;
        dropped.dropout = 1;
        CHECK(plan_bwd_sm90a(&c, h100, 232, NULL, &under, err, sizeof err) == 0 && under.split &&
                  under.block_m == 64 && under.block_n == 64 && under.k_cols == 96 &&
                  under.v_cols == 64 &&
                  plan_bwd_sm90a(&c, h100, 0, &rows_64, &named, err, sizeof err) == 0 &&
                  named.split && named.block_m == 64 &&
                  plan_bwd_sm90a(&dropped, h100, 0, NULL, &bp, err, sizeof err) == 0 && bp.split,
              "bwd_sm90a 192/128 split: %s (under 232 %d, named 64 %d, dropout %d)", err,
              under.split, named.split, bp.split);
    }
    fg_spec d = s, cd;
    d.mask = FG_MASK_NONE, d.kv_cache = 1;
    fwd_decode_plan dp;
    family_plan fp;
    CHECK(spec_canonicalize(&d, &cd, err, sizeof err) == 0 &&
              fwd_decode_family.supports(&cd, h100, err, sizeof err) == 0 &&
              fwd_decode_family.plan(&cd, h100, 0, &fp, err, sizeof err) == 0,
          "fwd_decode 192/128: %s", err);
    memcpy(&dp, fp.bytes, sizeof dp);
    /* rows of a multiple of 64 unpadded (swizzled), others padded */
    CHECK(dp.head_dim_padded == 192 && dp.head_dim_v_padded == 128 && dp.smem_row == 192 &&
              dp.smem_row_v == 128,
          "fwd_decode 192/128: widths %d/%d, rows %d/%d", dp.head_dim_padded, dp.head_dim_v_padded,
          dp.smem_row, dp.smem_row_v);
    CHECK(fwd_sm80_family.supports(&c, h100, err, sizeof err) == 0 &&
              bwd_sm80_family.supports(&c, h100, err, sizeof err) == 0,
          "the mma.sync families take 192/128: %s", err);
    s.head_dim_v = 0; /* the same spec with one head dim stays on the Hopper families */
    spec_canonicalize(&s, &c, err, sizeof err);
    CHECK(fwd_sm90a_family.supports(&c, h100, err, sizeof err) == 0, "fwd_sm90a d192: %s", err);

    /* through the runtime: the family each pass gets, names and sources that
     * differ from the single head dim's, and the refusals' messages */
    static const char *const targets[] = {"h100", "a100", "t4"};
    static const int pairs[][2] = {{192, 128}, {128, 64}, {96, 64}, {256, 128}, {64, 128}};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        fg_context *ctx = NULL;
        if (fg_context_create(&ctx, targets[t]) != FG_OK) {
            CHECK(0, "%s: %s", targets[t], fg_last_message());
            continue;
        }
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
            for (int pass = 0; pass < 2; pass++) {
                fg_spec x = fg_spec_default(pairs[i][0], FG_FP16), y = x;
                x.head_dim_v = pairs[i][1];
                fg_plan_info px, py;
                fg_status st = fg_plan(ctx, &x, (fg_pass)pass, &px);
                CHECK(st == FG_OK, "%s %d/%d pass %d: %s", targets[t], pairs[i][0], pairs[i][1],
                      pass, fg_context_message(ctx));
                if (st) continue;
                /* on an H100 the Hopper families', elsewhere mma.sync */
                char want[64];
                snprintf(want, sizeof want, "fg_%s_sm%d%s_fp16_d%dv%d_", pass ? "bwd" : "fwd",
                         fg_context_arch(ctx), fg_context_arch(ctx) == 90 ? "a" : "", pairs[i][0],
                         pairs[i][1]);
                CHECK(strncmp(px.kernel_name, want, strlen(want)) == 0,
                      "%s %d/%d pass %d: kernel %s (want %s...)", targets[t], pairs[i][0],
                      pairs[i][1], pass, px.kernel_name, want);
                CHECK(fg_plan(ctx, &y, (fg_pass)pass, &py) == FG_OK &&
                          strcmp(px.kernel_name, py.kernel_name) != 0,
                      "names differ from the single head dim's");
                const char *src = NULL;
                size_t len = 0;
                char *copy = NULL;
                if (fg_source(ctx, &x, (fg_pass)pass, &src) == FG_OK) {
                    len = strlen(src);
                    copy = malloc(len + 1);
                    if (copy) memcpy(copy, src, len + 1);
                }
                CHECK(copy && fg_source(ctx, &y, (fg_pass)pass, &src) == FG_OK &&
                          strcmp(copy, src) != 0 && strstr(copy, "HEAD_DIM_V"),
                      "%s %d/%d pass %d: sources differ", targets[t], pairs[i][0], pairs[i][1],
                      pass);
                free(copy);
            }
        /* over a KV cache, V's tiles and O of the value head dim: the decode
         * family's, or on sm_90 the Hopper forward's (chunked prefill), whose
         * producer reads the cache */
        fg_spec k = fg_spec_default(64, FG_FP16);
        k.head_dim_v = 128, k.kv_cache = 1;
        fg_plan_info pk;
        const char *src = NULL;
        const int hopper = fg_context_arch(ctx) == 90;
        CHECK(fg_plan(ctx, &k, FG_PASS_FORWARD, &pk) == FG_OK &&
                  fg_source(ctx, &k, FG_PASS_FORWARD, &src) == FG_OK &&
                  strstr(src, hopper ? "fg_fwd_sm90a_" : "fg_decode_") &&
                  strstr(src, "#define HEAD_DIM_V 128") &&
                  strstr(src, hopper ? "load_cache_tile<V_BOXES>" : "V_CHUNKS"),
              "%s: kv_cache 64/128: %s", targets[t], fg_context_message(ctx));
        fg_context_destroy(ctx);
    }
}

/* Latent caches (FG_KV_LATENT): the spec's bounds and refusals, fwd_mla's
 * plans on every target that holds them, and its source. */
static void test_latent_caches(void) {
    char err[512];
    fg_spec s = fg_spec_default(576, FG_BF16), c;
    s.head_dim_v = 512, s.kv_cache = FG_KV_LATENT;
    CHECK(spec_canonicalize(&s, &c, err, sizeof err) == 0 && c.kv_cache == FG_KV_LATENT &&
              c.head_dim == 576 && c.head_dim_v == 512,
          "576/512 latent: %s", err);
    char name[128];
    spec_name(&c, name, sizeof name);
    CHECK(strcmp(name, "bf16_d576v512_kvlatent") == 0, "latent name %s", name);
    static const struct {
        int d, dv, kv, softcap;
        const char *want;
    } bad[] = {
        {576, 512, 1, 0, "spec.head_dim: 576 is outside 1..256"},
        {592, 512, FG_KV_LATENT, 0, "spec.head_dim: 592 is outside 1..576 (a latent cache's)"},
        {576, 544, FG_KV_LATENT, 0, "spec.head_dim_v: 544 is outside 1..512"},
        {576, 500, FG_KV_LATENT, 0, "value head dim that is a multiple of 32"},
        {200, 128, FG_KV_LATENT, 0, "a head dim that is a multiple of 16"},
        {128, 192, FG_KV_LATENT, 0, "at most the head dim"},
        {576, 512, FG_KV_LATENT, 1, "a latent cache takes no softcap"},
        {576, 512, 3, 0, "spec.kv_cache: 3 is not 0, 1 or FG_KV_LATENT (2)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_spec b = fg_spec_default(bad[i].d, FG_BF16);
        b.head_dim_v = bad[i].dv, b.kv_cache = bad[i].kv, b.softcap = bad[i].softcap;
        CHECK(spec_canonicalize(&b, &c, err, sizeof err) != 0 && strstr(err, bad[i].want),
              "latent %d/%d kv %d: '%s' lacks '%s'", bad[i].d, bad[i].dv, bad[i].kv, err,
              bad[i].want);
    }
    /* fwd_mla on the targets whose shared memory holds Q's 64 rows and two
     * stages at 576 (not an RTX 3090's 99 KB, nor T4's 64 KB) */
    static const char *targets[] = {"h100", "a100", "rtx3090", "t4"};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        fg_context *ctx = NULL;
        if (fg_context_create(&ctx, targets[t]) != FG_OK) continue;
        fg_plan_info pi;
        const char *src = NULL;
        fg_status st = fg_plan(ctx, &s, FG_PASS_FORWARD, &pi);
        if (strcmp(targets[t], "rtx3090") == 0 || strcmp(targets[t], "t4") == 0) {
            fg_spec h = s;
            h.dtype = FG_FP16; /* T4 has no bf16 */
            CHECK(fg_plan(ctx, &h, FG_PASS_FORWARD, &pi) != FG_OK &&
                      strstr(fg_context_message(ctx), "bytes of shared memory"),
                  "%s 576/512 latent: %s", targets[t], fg_context_message(ctx));
        } else if (strcmp(targets[t], "h100") == 0) {
            /* fwd_mla_sm90a: 64 rows, tiles of 64 keys, wgmma; a head dim
             * that is not whole boxes goes to fwd_mla (at 96 value columns,
             * 64 rows: O's split four ways is not in 16s) */
            CHECK(st == FG_OK && pi.block_m == 64 && pi.block_n == 64 && pi.threads == 256 &&
                      pi.smem_bytes <= 227 * 1024 && strstr(pi.kernel_name, "_wg") &&
                      fg_source(ctx, &s, FG_PASS_FORWARD, &src) == FG_OK &&
                      strstr(src, "wgmma.mma_async") && strstr(src, "#define HEAD_DIM_V 512") &&
                      !strstr(src, "p.v_new +") && !strstr(src, "p.v +"),
                  "%s 576/512 latent: %s", targets[t], fg_context_message(ctx));
            fg_spec o = s;
            o.head_dim = 160, o.head_dim_v = 96;
            CHECK(fg_plan(ctx, &o, FG_PASS_FORWARD, &pi) == FG_OK && pi.block_m == 64 &&
                      strstr(pi.kernel_name, "fg_mla_sm90_") && !strstr(pi.kernel_name, "_wg"),
                  "%s 160/96 latent: %s", targets[t], fg_context_message(ctx));
        } else {
            /* fwd_mla: 64 rows of 32 keys where two stages of 64 do not fit */
            CHECK(st == FG_OK && pi.block_m == 64 && pi.block_n == 32 && pi.threads == 256 &&
                      fg_source(ctx, &s, FG_PASS_FORWARD, &src) == FG_OK &&
                      strstr(src, "fg_mla_") && strstr(src, "#define HEAD_DIM_V 512") &&
                      !strstr(src, "wgmma") && !strstr(src, "p.v_new +") && !strstr(src, "p.v +"),
                  "%s 576/512 latent: %s", targets[t], fg_context_message(ctx));
        }
        fg_spec d = s;
        d.dtype = FG_FP16, d.mask = FG_MASK_CAUSAL, d.head_dim = 192, d.head_dim_v = 128;
        CHECK(fg_plan(ctx, &d, FG_PASS_FORWARD, &pi) == FG_OK && pi.stages >= 2,
              "%s 192/128 latent: %s", targets[t], fg_context_message(ctx));
        fg_context_destroy(ctx);
    }
    const kernel_family *fams[] = {&fwd_decode_family, &fwd_sm80_family, &fwd_sm90a_family};
    spec_canonicalize(&s, &c, err, sizeof err);
    const fg_profile *h100 = profile_named("h100");
    for (size_t i = 0; i < 3; i++)
        CHECK(fams[i]->supports(&c, h100, err, sizeof err) != 0, "%s took a latent cache",
              fams[i]->name);
    CHECK(fwd_mla_family.supports(&c, h100, err, sizeof err) == 0, "fwd_mla: %s", err);
    CHECK(fwd_mla_sm90a_family.supports(&c, h100, err, sizeof err) == 0, "fwd_mla_sm90a: %s", err);
    static const int widths[][2] = {{160, 128}, {576, 480}, {128, 64}, {512, 512}};
    for (size_t i = 0; i < 4; i++) {
        fg_spec w = c;
        w.head_dim = widths[i][0], w.head_dim_v = widths[i][1];
        CHECK(fwd_mla_sm90a_family.supports(&w, h100, err, sizeof err) != 0 &&
                  strstr(err, "multiple of 64") && strstr(err, "past a value head dim"),
              "fwd_mla_sm90a took %d/%d: %s", widths[i][0], widths[i][1], err);
    }
    c.kv_cache = 1;
    CHECK(fwd_mla_family.supports(&c, h100, err, sizeof err) != 0 && strstr(err, "latent"),
          "fwd_mla took a KV cache: %s", err);
    CHECK(fwd_mla_sm90a_family.supports(&c, h100, err, sizeof err) != 0 && strstr(err, "latent"),
          "fwd_mla_sm90a took a KV cache: %s", err);
}

/* sm90a_walk_lists: every unit once, each block's in order, and at d = 128
 * 2k causal (16 blocks of Br 128 a head at Bc 160, 128 heads in sections
 * of 24, 132 thread blocks) a longest list less than the pairs' every-132nd
 * walk. */
static void test_walk_lists(void) {
    enum { M = 16, HEADS = 128, SECTION = 24, UNITS = M * HEADS, BLOCKS = 132 };
    static int w[UNITS];
    static uint16_t out[BLOCKS + 1 + UNITS];
    for (int u = 0; u < UNITS; u++) { /* sections of heads, the last query blocks first */
        int head0 = u / (SECTION * M) * SECTION;
        int heads = HEADS - head0 < SECTION ? HEADS - head0 : SECTION;
        int m = M - 1 - u % (SECTION * M) / heads;
        w[u] = (128 * (m + 1) + 159) / 160 + 1; /* key tiles, and one for the start */
    }
    int n = sm90a_walk_lists(w, UNITS, BLOCKS, out, BLOCKS + 1 + UNITS);
    CHECK(n == BLOCKS + 1 + UNITS, "entries %d", n);
    static int seen[UNITS];
    int64_t most = 0, total = 0;
    for (int b = 0; b < BLOCKS; b++) {
        int64_t load = 0;
        CHECK(out[b] <= out[b + 1], "offsets rise");
        for (int i = out[b]; i < out[b + 1]; i++) {
            int u = out[BLOCKS + 1 + i];
            seen[u]++;
            load += w[u];
            if (i > out[b]) CHECK(out[BLOCKS + i] < u, "block %d: unit %d in order", b, u);
        }
        most = load > most ? load : most;
        total += load;
    }
    CHECK(out[BLOCKS] == UNITS, "every unit listed");
    for (int u = 0; u < UNITS; u++) CHECK(seen[u] == 1, "unit %d listed %d times", u, seen[u]);
    /* greedy's bound: the mean plus the longest unit */
    CHECK(most <= total / BLOCKS + 1 + w[0], "longest list %lld, mean %lld", (long long)most,
          (long long)(total / BLOCKS));
    int64_t pairs[BLOCKS] = {0}, pairs_most = 0; /* pairs M-1-i and i, every 132nd */
    for (int u = 0; u < UNITS / 2; u++) {
        int i = u % (M / 2);
        pairs[u % BLOCKS] += w[i * SECTION] + w[(M - 1 - i) * SECTION]; /* blocks M-1-i and i */
    }
    for (int b = 0; b < BLOCKS; b++) pairs_most = pairs[b] > pairs_most ? pairs[b] : pairs_most;
    CHECK(most * 100 < pairs_most * 97, "lists %lld against pairs %lld", (long long)most,
          (long long)pairs_most);
    /* no units; too small an output; more units than 16 bits */
    CHECK(sm90a_walk_lists(w, 0, 4, out, 5) == 5 && out[0] == 0 && out[4] == 0, "no units");
    CHECK(sm90a_walk_lists(w, UNITS, BLOCKS, out, BLOCKS + UNITS) == -1, "cap");
    CHECK(sm90a_walk_lists(w, 70000, BLOCKS, NULL, 1 << 20) == -1, "16 bits");
}

/* The walk lists' calls: batch 8 x 16 heads over 2048 keys at head dim d,
 * q, k, v and o at one address (nothing is read) */
static fg_forward_args walk_args(int d) {
    fg_forward_args a = fg_forward_args_default();
    a.batch = 8, a.heads_q = a.heads_kv = 16, a.seqlen_q = a.seqlen_k = 2048;
    a.q = a.k = a.v = a.o = fg_tensor_bshd((char *)(uintptr_t)0x10000, 2048, 16, d);
    return a;
}

/* Under a window (d = 64 over 2048 keys, window (1023, 0), 8 x 16 heads of
 * 11 query blocks; the tiling named here, Br 192 and Bc 64, which the
 * window rule takes only up to spans of 256 keys): the first blocks of a
 * head are short. The lists hold every unit once, weighted by the
 * window's tiles (computed here from lib_mask's key range), within
 * greedy's bound, where taking every 132nd unit would give each thread
 * block the same block of every head (132 = 12 x 11); another window has
 * another key; without lists the call does not walk. */
static void test_sm90a_window_lists(void) {
    enum { M = 11, HEADS = 128, UNITS = M * HEADS, BLOCKS = 132, BM = 192, BN = 64 };
    const fg_profile *h100 = profile_named("h100");
    fg_spec s = fg_spec_default(64, FG_BF16);
    s.mask = FG_MASK_WINDOW;
    fg_forward_args a = walk_args(64);
    char err[256] = "";
    a.window_left = 1023, a.window_right = 0;
    family_device dev = {h100, 0, fake_encode, NULL};
    family_call call = {&a, NULL, {0}, &s, 0, 0};
    family_tiling t;
    family_plan plan;
    const fwd_sm90a_tiling bn64 = {3, BN, 1};
    family_tiling_pack(&t, &bn64, sizeof bn64);
    CHECK(fwd_sm90a_family.plan_tiling(&s, h100, &t, &plan, err, sizeof err) == 0 &&
              ((const fwd_sm90a_plan *)plan.bytes)->block_m == BM &&
              ((const fwd_sm90a_plan *)plan.bytes)->block_n == BN &&
              ((const fwd_sm90a_plan *)plan.bytes)->walk == 1,
          "d64 window: Br 192, Bc 64, walking (%s)", err);
    uint64_t key[FAMILY_WALK_KEY_WORDS], again[FAMILY_WALK_KEY_WORDS];
    int entries = 0, more = 0;
    static uint16_t lists[BLOCKS + 1 + UNITS];
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, key, &entries) == 1 &&
              entries == BLOCKS + 1 + UNITS &&
              fwd_sm90a_family.walk_lists(&plan, &call, &dev, lists, entries) == entries &&
              lists[BLOCKS] == UNITS,
          "window: %d entries", entries);
    static int seen[UNITS];
    int64_t most = 0, total = 0, stride[BLOCKS] = {0}, stride_most = 0;
    for (int b = 0; b < BLOCKS; b++) {
        int64_t load = 0;
        for (int i = lists[b]; i < lists[b + 1]; i++) {
            int u = lists[BLOCKS + 1 + i], row0 = (M - 1 - u % M) * BM; /* one head a section */
            int lo = row0 - 1023 > 0 ? row0 - 1023 : 0, hi = row0 + BM < 2048 ? row0 + BM : 2048;
            int w = (hi + BN - 1) / BN - lo / BN + 1;
            seen[u]++;
            load += w;
            stride[u % BLOCKS] += w;
        }
        most = load > most ? load : most;
        total += load;
    }
    for (int u = 0; u < UNITS; u++) CHECK(seen[u] == 1, "unit %d listed %d times", u, seen[u]);
    for (int b = 0; b < BLOCKS; b++) stride_most = stride[b] > stride_most ? stride[b] : stride_most;
    CHECK(most <= total / BLOCKS + 1 + 20 && stride_most * 100 > most * 115,
          "longest list %lld, mean %lld; every 132nd unit %lld", (long long)most,
          (long long)(total / BLOCKS), (long long)stride_most);
    a.window_left = 511;
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, again, &more) == 1 &&
              memcmp(key, again, sizeof key) != 0, "another window, another key");
    family_args out;
    const fg_fwd_tma_params *params = (const fg_fwd_tma_params *)out.params;
    call.walk_lists = 0x20000;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->walk_lists == 0x20000 && params->units == UNITS && params->blocks == BLOCKS,
          "window with lists: %d units, %d blocks (%s)", params->units, params->blocks, err);
    call.walk_lists = 0;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->walk_lists == 0 && params->blocks == UNITS,
          "window without lists: %d blocks (%s)", params->blocks, err);
}

/* fwd_sm90a's walk lists: a causal call that walks (d = 128, 2048 keys: Bc
 * 160, 8 x 16 heads of 16 query blocks, 132 SMs) has a key and its lists,
 * and its arguments take single blocks from them; without lists it walks
 * in pairs; a call that does not walk, or has no causal mask, has none. */
static void test_sm90a_walk_lists(void) {
    const fg_profile *h100 = profile_named("h100");
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.mask = FG_MASK_CAUSAL;
    fg_forward_args a = walk_args(128);
    char *base = (char *)(uintptr_t)0x10000, err[256] = "";
    family_device dev = {h100, 0, fake_encode, NULL};
    family_call call = {&a, NULL, {0}, &s, 0, 0};
    family_tiling t;
    family_plan plan;
    CHECK(fwd_sm90a_family.tiling_for_call(&s, h100, &call, &t) == 1 &&
              fwd_sm90a_family.plan_tiling(&s, h100, &t, &plan, err, sizeof err) == 0,
          "d128 causal 2048 keys: %s", err);
    uint64_t key[FAMILY_WALK_KEY_WORDS], again[FAMILY_WALK_KEY_WORDS];
    int entries = 0, more = 0;
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, key, &entries) == 1 &&
              entries == 133 + 2048, "key: %d entries", entries);
    static uint16_t lists[133 + 2048];
    CHECK(fwd_sm90a_family.walk_lists(&plan, &call, &dev, lists, entries) == entries &&
              lists[132] == 2048, "lists");
    /* a longest unit (the last query blocks come first in the units'
     * order) goes first, to thread block 0 */
    CHECK(lists[0] == 0 && lists[133] == 0, "block 0 starts with unit %d", lists[133]);
    a.seqlen_k = 2000;
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, again, &more) == 1 &&
              memcmp(key, again, sizeof key) != 0, "another length, another key");
    a.seqlen_k = 2048;
    family_args out;
    const fg_fwd_tma_params *params = (const fg_fwd_tma_params *)out.params;
    call.walk_lists = 0x20000;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->walk_lists == 0x20000 && params->unit_blocks == 1 &&
              params->units == 2048 && params->units_per_head == 16 && params->blocks == 132,
          "with lists: %llu, %d, %d, %d (%s)", (unsigned long long)params->walk_lists,
          params->unit_blocks, params->units, params->blocks, err);
    call.walk_lists = 0;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->walk_lists == 0 && params->unit_blocks == 2 && params->units == 1024 &&
              params->blocks == 132, "pairs without (%s)", err);
    /* 8192 keys, 64 query blocks a head: with lists the thread blocks walk,
     * without them (pairs only up to 16 a head) a thread block a block */
    a.seqlen_q = a.seqlen_k = 8192;
    a.q = a.k = a.v = a.o = fg_tensor_bshd(base, 8192, 16, 128);
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, key, &entries) == 1 &&
              entries == 133 + 8192, "8k: %d entries", entries);
    call.walk_lists = 0x20000;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->unit_blocks == 1 && params->units == 8192 && params->blocks == 132,
          "8k with lists: %d units, %d blocks (%s)", params->units, params->blocks, err);
    call.walk_lists = 0;
    CHECK(fwd_sm90a_family.arguments(&plan, &s, &call, &dev, 0, &out, err, sizeof err) == 0 &&
              params->walk_lists == 0 && params->units == 8192 && params->blocks == 8192,
          "8k without: %d blocks (%s)", params->blocks, err);
    /* the derived plan (Bc 192) does not walk; nor does a call without a mask get lists */
    family_plan derived;
    CHECK(fwd_sm90a_family.plan(&s, h100, 0, &derived, err, sizeof err) == 0 &&
              fwd_sm90a_family.walk_key(&derived, &call, &dev, key, &entries) == 0,
          "the derived plan: no lists");
    s.mask = FG_MASK_NONE;
    CHECK(fwd_sm90a_family.walk_key(&plan, &call, &dev, key, &entries) == 0, "no mask: none");
    test_sm90a_window_lists();
}

/* fwd_decode's two splits' tiles past the SMs with an H200's DRAM bandwidth
 * (32/8 heads, one query, 18 sequences over 4,096 keys: 144 units on 132
 * SMs): 64 keys for 16 rows in two stages at d 128, under a launch bound of
 * three blocks an SM, with ALiBi and sinks too; not with an expression (its
 * registers spill under it), nor with an H100's bandwidth, nor at d 64
 * (wide tiles); other plans' bound stays one. */
static void test_decode_two_split_tiles(void) {
    fg_profile h200 = *profile_named("h100");
    h200.dram_gb_per_s = 4800;
    fg_forward_args a = fg_forward_args_default();
    a.batch = 18, a.heads_q = 32, a.heads_kv = 8, a.seqlen_q = 1, a.seqlen_k = 4096;
    static const struct {
        int d, variant, rich, stages; /* variant 1 ALiBi, 2 sinks, 3 a score expression */
    } cases[] = {{128, 0, 1, 2}, {64, 0, 1, 0}, {64, 1, 1, 0}, {64, 2, 1, 0}, {128, 1, 1, 2},
                 {128, 2, 1, 2}, {128, 3, 1, 0}, {128, 0, 0, 0}, {64, 0, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_spec s0 = fg_spec_default(cases[i].d, FG_BF16), s;
        s0.kv_cache = 1;
        s0.alibi = cases[i].variant == 1, s0.sinks = cases[i].variant == 2;
        if (cases[i].variant == 3) s0.score_mod = "s - 0.01 * abs(q - k)";
        char err[256] = "";
        CHECK(spec_canonicalize(&s0, &s, err, sizeof err) == 0, "decode spec: %s", err);
        family_call call = {&a, NULL, {0}, &s, 0, 0};
        const fg_profile *prof = cases[i].rich ? &h200 : profile_named("h100");
        family_tiling t;
        family_plan p;
        const int got = fwd_decode_family.tiling_for_call(&s, prof, &call, &t);
        const int planned = (got ? fwd_decode_family.plan_tiling(&s, prof, &t, &p, err, sizeof err)
                                 : fwd_decode_family.plan(&s, prof, 0, &p, err, sizeof err)) == 0;
        const fwd_decode_plan *x = (const fwd_decode_plan *)p.bytes;
        const int two = got && planned && x->block_n == 64 && x->max_rows == 16;
        /* else the derived plan, or on an H100 at d 64 wide tiles */
        CHECK(planned && (cases[i].stages ? two && x->stages == cases[i].stages &&
                                                x->blocks_per_sm >= 3 && x->min_blocks == 3
                                          : !two && x->min_blocks == 1),
              "d %d variant %d, %s: %d (%s)", cases[i].d, cases[i].variant,
              cases[i].rich ? "h200" : "h100", got, err);
    }
}

int main(void) {
    test_canonical();
    test_value_head_dims();
    test_latent_caches();
    test_sm90a_plans();
    test_sm90a_calls();
    test_sm90a_tiling_for_call();
    test_decode_two_split_tiles();
    test_walk_lists();
    test_sm90a_walk_lists();
    test_sm90a_value_head_dims();
    test_bwd_sm90a_calls();
    test_every_spec_plans();
    test_known_plans();
    return check_summary("test_spec_plan");
}
