/* Argument validation without a GPU (the scores' variants' values among
 * them). An offline context validates a forward call completely before it
 * refuses to launch, so a valid call returns
 * FG_ERR_NO_DEVICE and every bad one must return its own status with a
 * message naming the argument. Device pointers are fake but aligned; nothing
 * is ever dereferenced. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "tests/check.h"

#define FAKE(addr) ((void *)(uintptr_t)(addr))

enum { B = 2, HQ = 4, HKV = 2, SQ = 100, SK = 130, D = 64, BLOCK = 64 };

/* A valid call: (B,S,H,D) tensors at distinct 64 KiB-aligned fake addresses. */
static fg_forward_args valid_args(int head_dim) {
    fg_forward_args a = fg_forward_args_default();
    a.q = fg_tensor_bshd(FAKE(0x10000), SQ, HQ, head_dim);
    a.k = fg_tensor_bshd(FAKE(0x20000), SK, HKV, head_dim);
    a.v = fg_tensor_bshd(FAKE(0x30000), SK, HKV, head_dim);
    a.o = fg_tensor_bshd(FAKE(0x40000), SQ, HQ, head_dim);
    a.lse = FAKE(0x50000);
    a.batch = B;
    a.heads_q = HQ;
    a.heads_kv = HKV;
    a.seqlen_q = SQ;
    a.seqlen_k = SK;
    return a;
}

static int contains(const char *msg, const char *needle) {
    return !needle || (msg && strstr(msg, needle) != NULL);
}

/* One forward call: the status must be `want` and, for failures, the context
 * message must contain both needles (NULL needles are not checked). */
static void expect(fg_context *ctx, const char *name, const fg_spec *spec,
                   const fg_forward_args *args, fg_status want, const char *needle1,
                   const char *needle2) {
    fg_status got = fg_forward(ctx, spec, args);
    const char *msg = fg_context_message(ctx);
    CHECK(got == want, "%s: got %s, want %s (message: %s)", name, fg_status_name(got),
          fg_status_name(want), msg);
    if (want != FG_OK && want != FG_ERR_NO_DEVICE)
        CHECK(contains(msg, needle1) && contains(msg, needle2),
              "%s: message '%s' should name '%s'%s%s", name, msg, needle1,
              needle2 ? " and '" : "", needle2 ? needle2 : "");
}

/* Valid calls; each fails only because the context is offline. */
static void test_valid_calls(fg_context *ctx) {
    fg_spec spec = fg_spec_default(D, FG_FP16);
    fg_forward_args a = valid_args(D);
    expect(ctx, "valid fp16 d64", &spec, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    CHECK(contains(fg_context_message(ctx), "offline"), "offline refusal should say so: %s",
          fg_context_message(ctx));

    fg_forward_args bhsd = a;
    bhsd.q = fg_tensor_bhsd(FAKE(0x10000), SQ, HQ, D);
    bhsd.o = fg_tensor_bhsd(FAKE(0x40000), SQ, HQ, D);
    bhsd.lse = NULL;
    expect(ctx, "valid bhsd, no lse", &spec, &bhsd, FG_ERR_NO_DEVICE, NULL, NULL);

    fg_spec causal = spec;
    causal.mask = FG_MASK_CAUSAL;
    fg_forward_args tl = a;
    tl.align = FG_ALIGN_TOP_LEFT;
    expect(ctx, "valid causal top-left", &causal, &tl, FG_ERR_NO_DEVICE, NULL, NULL);

    fg_spec drop = spec;
    drop.dropout = 1;
    fg_forward_args dp = a;
    dp.dropout_p = 1.0f; /* the closed interval: everything dropped is still valid */
    expect(ctx, "valid dropout p=1", &drop, &dp, FG_ERR_NO_DEVICE, NULL, NULL);

    fg_forward_args scaled = a;
    scaled.softmax_scale = 0.25f;
    expect(ctx, "valid explicit scale", &spec, &scaled, FG_ERR_NO_DEVICE, NULL, NULL);
}

static void test_tensors(fg_context *ctx) {
    fg_spec spec = fg_spec_default(D, FG_FP16);
    const fg_forward_args base = valid_args(D);
    const char *names[4] = {"q.data", "k.data", "v.data", "o.data"};
    for (int t = 0; t < 4; t++) {
        fg_forward_args a = base;
        fg_tensor *tensors[4] = {&a.q, &a.k, &a.v, &a.o};
        tensors[t]->data = NULL;
        expect(ctx, names[t], &spec, &a, FG_ERR_INVALID_ARGUMENT, names[t], "NULL");
    }

    /* 16-byte alignment for the vector path (head dim a multiple of 8) */
    fg_forward_args a = base;
    a.q.data = FAKE(0x10002);
    expect(ctx, "misaligned q, d64", &spec, &a, FG_ERR_INVALID_ARGUMENT, "q.data", "align");

    /* odd head dims load element-wise: 2-byte alignment suffices, 1 does not */
    fg_spec odd = fg_spec_default(33, FG_FP16);
    fg_forward_args b = valid_args(33);
    b.q.data = FAKE(0x10002);
    expect(ctx, "2-byte aligned q, d33", &odd, &b, FG_ERR_NO_DEVICE, NULL, NULL);
    b.q.data = FAKE(0x10001);
    expect(ctx, "odd address q, d33", &odd, &b, FG_ERR_INVALID_ARGUMENT, "q.data", "align");

    /* a row stride of 132 elements (not a multiple of 8) moves rows off
     * 16-byte boundaries: refused for d64, fine for d33 */
    const int64_t stride = HKV * D + 4;
    a = base;
    a.v.stride_seq = stride;
    a.v.stride_batch = SK * stride;
    expect(ctx, "v stride_seq % 8 != 0, d64", &spec, &a, FG_ERR_INVALID_ARGUMENT, "v:", "stride");
    b = valid_args(33);
    b.v.stride_seq = stride;
    b.v.stride_batch = SK * stride;
    expect(ctx, "same stride, d33", &odd, &b, FG_ERR_NO_DEVICE, NULL, NULL);

    a = base;
    a.o.stride_dim = 2;
    expect(ctx, "o.stride_dim 2", &spec, &a, FG_ERR_INVALID_ARGUMENT, "o.stride_dim", "contiguous");
    a = base;
    a.k.stride_head = -D;
    expect(ctx, "negative k stride", &spec, &a, FG_ERR_INVALID_ARGUMENT, "k:", "negative");
    a = base;
    a.lse = FAKE(0x50002);
    expect(ctx, "misaligned lse", &spec, &a, FG_ERR_INVALID_ARGUMENT, "lse", "align");
}

static void test_shapes(fg_context *ctx) {
    const fg_forward_args base = valid_args(D);
    fg_spec spec = fg_spec_default(0, FG_FP16);
    expect(ctx, "head_dim 0", &spec, &base, FG_ERR_INVALID_ARGUMENT, "spec.head_dim", "0");
    spec.head_dim = 257;
    expect(ctx, "head_dim 257", &spec, &base, FG_ERR_INVALID_ARGUMENT, "spec.head_dim", "257");
    expect(ctx, "spec NULL", NULL, &base, FG_ERR_INVALID_ARGUMENT, "spec", NULL);

    spec = fg_spec_default(D, FG_FP16);
    expect(ctx, "args NULL", &spec, NULL, FG_ERR_INVALID_ARGUMENT, "args", NULL);
    fg_forward_args a = base;
    a.heads_q = 6;
    a.heads_kv = 4;
    a.q = fg_tensor_bshd(FAKE(0x10000), SQ, 6, D);
    a.o = fg_tensor_bshd(FAKE(0x40000), SQ, 6, D);
    expect(ctx, "heads 6/4", &spec, &a, FG_ERR_INVALID_ARGUMENT, "heads_kv", "multiple");
    a = base;
    a.seqlen_q = 0;
    expect(ctx, "seqlen_q 0", &spec, &a, FG_ERR_INVALID_ARGUMENT, "seqlen_q", NULL);
    a = base;
    a.seqlen_k = 0;
    expect(ctx, "seqlen_k 0", &spec, &a, FG_ERR_INVALID_ARGUMENT, "seqlen_k", NULL);
    a = base;
    a.batch = 0;
    expect(ctx, "batch 0", &spec, &a, FG_ERR_INVALID_ARGUMENT, "batch", NULL);
    a = base;
    a.heads_kv = 0;
    expect(ctx, "heads_kv 0", &spec, &a, FG_ERR_INVALID_ARGUMENT, "heads", NULL);
}

static void test_scalars(fg_context *ctx) {
    const fg_forward_args base = valid_args(D);
    fg_spec spec = fg_spec_default(D, FG_FP16);
    fg_forward_args a = base;
    a.softmax_scale = -0.125f;
    expect(ctx, "negative scale", &spec, &a, FG_ERR_INVALID_ARGUMENT, "softmax_scale", NULL);
    a.softmax_scale = NAN;
    expect(ctx, "NaN scale", &spec, &a, FG_ERR_INVALID_ARGUMENT, "softmax_scale", NULL);
    a.softmax_scale = INFINITY;
    expect(ctx, "inf scale", &spec, &a, FG_ERR_INVALID_ARGUMENT, "softmax_scale", NULL);

    a = base;
    a.dropout_p = 0.1f;
    expect(ctx, "dropout_p without spec.dropout", &spec, &a, FG_ERR_INVALID_ARGUMENT, "dropout_p",
           "spec.dropout");
    fg_spec drop = spec;
    drop.dropout = 1;
    a.dropout_p = 1.5f;
    expect(ctx, "dropout_p 1.5", &drop, &a, FG_ERR_INVALID_ARGUMENT, "dropout_p", NULL);
    a.dropout_p = -0.1f;
    expect(ctx, "dropout_p -0.1", &drop, &a, FG_ERR_INVALID_ARGUMENT, "dropout_p", NULL);

    a = base;
    a.align = (fg_causal_align)7;
    expect(ctx, "align 7", &spec, &a, FG_ERR_INVALID_ARGUMENT, "align", NULL);
}

static void test_windows(fg_context *ctx) {
    const fg_forward_args base = valid_args(D);
    fg_spec causal = fg_spec_default(D, FG_FP16);
    causal.mask = FG_MASK_CAUSAL;
    fg_forward_args a = base;
    a.window_left = 16;
    expect(ctx, "window_left with causal", &causal, &a, FG_ERR_INVALID_ARGUMENT, "window_left",
           "causal");
    a = base;
    a.window_right = 0;
    expect(ctx, "window_right with causal", &causal, &a, FG_ERR_INVALID_ARGUMENT, "window_right",
           "causal");

    fg_spec window = causal;
    window.mask = FG_MASK_WINDOW;
    a = base;
    a.window_left = -2;
    expect(ctx, "window_left -2", &window, &a, FG_ERR_INVALID_ARGUMENT, "window_left", "-2");
    a = base;
    a.window_right = -2;
    expect(ctx, "window_right -2", &window, &a, FG_ERR_INVALID_ARGUMENT, "window_right", "-2");
    a = base;
    a.window_left = 0;
    a.window_right = 5;
    expect(ctx, "valid window 0/5", &window, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    /* sides of any size (the kernels take them clamped to the call's reach) */
    a.window_left = a.window_right = INT32_MAX;
    expect(ctx, "valid window 2^31-1/2^31-1", &window, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    /* a window's bounds add a side to a distance: keys at most 2^30 - 1024
     * from a query's diagonal, lengths and positions together */
    a.seqlen_k = (1 << 30) - 1024 - 256 + 1;
    expect(ctx, "window past its reach", &window, &a, FG_ERR_INVALID_ARGUMENT, "seqlen_q/seqlen_k",
           "2^30 - 1024");
    a.seqlen_k = SK, a.position_q = (1 << 30) - 1024 - 256 - SK + 1; /* reach SK + pq + 256 */
    expect(ctx, "window's positions past its reach", &window, &a, FG_ERR_INVALID_ARGUMENT,
           "seqlen_q/seqlen_k", "positions");
    a.position_q -= 1;
    expect(ctx, "window's positions at its reach", &window, &a, FG_ERR_NO_DEVICE, NULL, NULL);
}

static void test_bf16_on_t4(void) {
    fg_context *t4 = NULL;
    fg_status st = fg_context_create(&t4, "t4");
    CHECK(st == FG_OK && t4, "create t4: %s (%s)", fg_status_name(st), fg_last_message());
    if (!t4) return;
    CHECK(fg_context_arch(t4) == 75, "t4 arch %d", fg_context_arch(t4));
    const fg_forward_args a = valid_args(D);
    fg_spec spec = fg_spec_default(D, FG_BF16);
    expect(t4, "bf16 on t4", &spec, &a, FG_ERR_UNSUPPORTED, "bf16", "spec.dtype");
    fg_plan_info info;
    st = fg_plan(t4, &spec, FG_PASS_FORWARD, &info);
    CHECK(st == FG_ERR_UNSUPPORTED && contains(fg_context_message(t4), "bf16"),
          "fg_plan bf16 on t4: %s (%s)", fg_status_name(st), fg_context_message(t4));
    spec.dtype = FG_FP16;
    expect(t4, "fp16 on t4", &spec, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    fg_context_destroy(t4);
}

static fg_spec layout_spec(void) {
    fg_spec s = fg_spec_default(D, FG_FP16);
    s.sparsity = FG_SPARSE_LAYOUT;
    s.sparse_block_q = BLOCK;
    s.sparse_block_k = BLOCK;
    return s;
}

/* A 0/1 pattern of the given shape; NULL on out of memory. */
static uint8_t *pattern(int heads, int bq, int bk) {
    size_t n = (size_t)heads * bq * bk;
    uint8_t *m = malloc(n);
    if (m)
        for (size_t i = 0; i < n; i++) m[i] = (uint8_t)((i * 7 + 3) % 3 != 0);
    return m;
}

/* Creates a layout of the given shape on ctx and runs one call with it. */
static void expect_layout(fg_context *ctx, const char *name, int heads, int bq, int bk,
                          fg_status want, const char *needle) {
    uint8_t *mask = pattern(heads, bq, bk);
    fg_layout *layout = NULL;
    fg_status st = mask ? fg_layout_create(ctx, mask, heads, bq, bk, &layout) : FG_ERR_OUT_OF_MEMORY;
    CHECK(st == FG_OK && layout, "%s: fg_layout_create: %s (%s)", name, fg_status_name(st),
          fg_context_message(ctx));
    if (layout) {
        fg_spec spec = layout_spec();
        fg_forward_args a = valid_args(D);
        a.layout = layout;
        expect(ctx, name, &spec, &a, want, "layout", needle);
    }
    fg_layout_destroy(layout);
    free(mask);
}

static void test_layouts(fg_context *ctx) {
    const int bq = (SQ + BLOCK - 1) / BLOCK, bk = (SK + BLOCK - 1) / BLOCK;
    fg_spec spec = layout_spec();
    fg_forward_args a = valid_args(D);
    expect(ctx, "layout NULL", &spec, &a, FG_ERR_INVALID_ARGUMENT, "layout", "NULL");

    expect_layout(ctx, "layout per head", HQ, bq, bk, FG_ERR_NO_DEVICE, NULL);
    expect_layout(ctx, "layout shared", 1, bq, bk, FG_ERR_NO_DEVICE, NULL);
    expect_layout(ctx, "layout wrong blocks_q", HQ, bq + 1, bk, FG_ERR_INVALID_ARGUMENT, "shape");
    expect_layout(ctx, "layout wrong blocks_k", HQ, bq, bk - 1, FG_ERR_INVALID_ARGUMENT, "shape");
    expect_layout(ctx, "layout wrong heads", HKV, bq, bk, FG_ERR_INVALID_ARGUMENT, "shape");

    /* a layout with a dense spec, and a layout from another context */
    uint8_t *mask = pattern(1, bq, bk);
    fg_layout *layout = NULL;
    fg_context *other = NULL;
    fg_status st = mask ? fg_layout_create(ctx, mask, 1, bq, bk, &layout) : FG_ERR_OUT_OF_MEMORY;
    CHECK(st == FG_OK, "fg_layout_create: %s", fg_context_message(ctx));
    if (layout) {
        fg_spec dense = fg_spec_default(D, FG_FP16);
        a.layout = layout;
        expect(ctx, "layout with dense spec", &dense, &a, FG_ERR_INVALID_ARGUMENT, "layout",
               "sparsity");
        if (fg_context_create(&other, "h100") == FG_OK)
            expect(other, "layout from another context", &spec, &a, FG_ERR_INVALID_ARGUMENT,
                   "layout", "context");
    }
    fg_context_destroy(other);
    fg_layout_destroy(layout);

    /* entries other than 0/1 */
    layout = NULL;
    if (mask) mask[1] = 2;
    st = mask ? fg_layout_create(ctx, mask, 1, bq, bk, &layout) : FG_ERR_OUT_OF_MEMORY;
    CHECK(st == FG_ERR_INVALID_ARGUMENT && !layout, "mask entry 2: %s", fg_status_name(st));
    CHECK(contains(fg_context_message(ctx), "mask"), "mask entry 2: message '%s'",
          fg_context_message(ctx));
    fg_layout_destroy(layout);
    free(mask);

    uint8_t one = 1;
    layout = NULL;
    st = fg_layout_create(ctx, &one, 1, 0, 1, &layout);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && !layout, "layout blocks_q 0: %s", fg_status_name(st));
    st = fg_layout_create(ctx, NULL, 1, 1, 1, &layout);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && !layout, "layout mask NULL: %s", fg_status_name(st));
    st = fg_layout_create(NULL, &one, 1, 1, 1, &layout);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_last_message(), "ctx"),
          "layout ctx NULL: %s (%s)", fg_status_name(st), fg_last_message());

    /* block sizes live in the spec and must be multiples of 16 */
    spec.sparse_block_q = 40;
    expect(ctx, "sparse block 40", &spec, &a, FG_ERR_INVALID_ARGUMENT, "sparse_block", "16");
    fg_spec bfly = fg_spec_default(D, FG_FP16);
    bfly.sparsity = FG_SPARSE_BUTTERFLY;
    bfly.sparse_block_q = 64;
    bfly.sparse_block_k = 8;
    a.layout = NULL;
    expect(ctx, "butterfly block 8", &bfly, &a, FG_ERR_INVALID_ARGUMENT, "sparse_block", "16");
    bfly.sparse_block_k = 64;
    bfly.butterfly_factors = 31;
    expect(ctx, "butterfly factors 31", &bfly, &a, FG_ERR_INVALID_ARGUMENT, "butterfly_factors",
           NULL);
    bfly.butterfly_factors = 3;
    expect(ctx, "valid butterfly", &bfly, &a, FG_ERR_NO_DEVICE, NULL, NULL);
}

/* Block masks: built from the spec's predicate (offline: the shape only),
 * used with that predicate only, refused without one or where it cannot be. */
static void test_block_masks(fg_context *ctx) {
    fg_spec spec = layout_spec();
    spec.mask_mod = "doc[q] == doc[k]";
    spec.aux_count = 1;
    spec.aux[0] = (fg_aux_decl){"doc", FG_AUX_I32, 1};
    fg_forward_args a = valid_args(D);
    a.aux[0] = (fg_aux_tensor){FAKE(0x66000), {SK, 0, 0}, {1, 0, 0}};
    fg_layout *mask = NULL;
    fg_status st = fg_block_mask_create(ctx, &spec, &a, &mask);
    CHECK(st == FG_OK && mask, "block mask: %s (%s)", fg_status_name(st), fg_context_message(ctx));
    a.layout = mask;
    expect(ctx, "block mask used", &spec, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    fg_spec other = spec;
    other.mask_mod = "doc[q] != doc[k]";
    expect(ctx, "block mask of another predicate", &other, &a, FG_ERR_INVALID_ARGUMENT,
           "block mask built for", "doc[q] != doc[k]");
    fg_layout_destroy(mask);

    /* a predicate reading b: a list set per batch row, which a call of
     * another batch cannot take */
    spec.mask_mod = "doc[q] == doc[k] || b == 1";
    mask = NULL;
    st = fg_block_mask_create(ctx, &spec, &a, &mask);
    CHECK(st == FG_OK && mask, "block mask reading b: %s (%s)", fg_status_name(st),
          fg_context_message(ctx));
    a.layout = mask;
    a.batch = 1;
    expect(ctx, "block mask of another batch", &spec, &a, FG_ERR_INVALID_ARGUMENT, "layout",
           "batch=1");
    a.batch = B;
    a.layout = NULL;
    fg_layout_destroy(mask);
    /* ... nor a larger one where it was built for one batch row */
    a.batch = 1;
    mask = NULL;
    st = fg_block_mask_create(ctx, &spec, &a, &mask);
    CHECK(st == FG_OK && mask, "block mask of one row: %s", fg_context_message(ctx));
    a.batch = B;
    a.layout = mask;
    expect(ctx, "block mask of one row, used for two", &spec, &a, FG_ERR_INVALID_ARGUMENT,
           "reads b", "batch 2");
    a.layout = NULL;
    fg_layout_destroy(mask);

    struct {
        const char *name, *needle;
        fg_spec spec;
    } refused[] = {{"no predicate", "mask_mod", spec}, {"no layout", "FG_SPARSE_LAYOUT", spec},
                   {"packed", "varlen", spec}};
    refused[0].spec.mask_mod = NULL;
    refused[1].spec.sparsity = FG_SPARSE_NONE;
    refused[2].spec.varlen = 1;
    for (int i = 0; i < 3; i++) {
        mask = NULL;
        st = fg_block_mask_create(ctx, &refused[i].spec, &a, &mask);
        CHECK(st != FG_OK && !mask && contains(fg_context_message(ctx), refused[i].needle),
              "block mask, %s: %s (%s)", refused[i].name, fg_status_name(st),
              fg_context_message(ctx));
    }
    fg_forward_args bad = a;
    bad.aux[0].data = NULL;
    st = fg_block_mask_create(ctx, &spec, &bad, &mask);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_context_message(ctx), "aux[0] (doc)"),
          "block mask without its tensor: %s (%s)", fg_status_name(st), fg_context_message(ctx));
    bad = a;
    bad.seqlen_k = 0;
    st = fg_block_mask_create(ctx, &spec, &bad, &mask);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_context_message(ctx), "seqlen"),
          "block mask of no keys: %s (%s)", fg_status_name(st), fg_context_message(ctx));
    CHECK(fg_block_mask_create(ctx, &spec, NULL, &mask) == FG_ERR_INVALID_ARGUMENT &&
              fg_block_mask_create(ctx, &spec, &a, NULL) == FG_ERR_INVALID_ARGUMENT &&
              fg_block_mask_create(NULL, &spec, &a, &mask) == FG_ERR_INVALID_ARGUMENT,
          "block mask with NULL arguments");
}

static void test_contexts(void) {
    fg_context *ctx = (fg_context *)FAKE(0x1);
    fg_status st = fg_context_create(&ctx, "v100x");
    CHECK(st == FG_ERR_INVALID_ARGUMENT && !ctx, "unknown target: %s", fg_status_name(st));
    CHECK(contains(fg_last_message(), "v100x") && contains(fg_last_message(), "target"),
          "unknown target message: '%s'", fg_last_message());

    st = fg_context_create(NULL, "h100");
    CHECK(st == FG_ERR_INVALID_ARGUMENT, "create with out NULL: %s", fg_status_name(st));

    /* device ordinals are numbers, checked before any driver is asked */
    const char *bad_devices[] = {"cuda:", "cuda:x", "cuda:-1", "cuda:1x"};
    for (int i = 0; i < 4; i++) {
        st = fg_context_create(&ctx, bad_devices[i]);
        CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_last_message(), "cuda:N"),
              "target %s: %s (%s)", bad_devices[i], fg_status_name(st), fg_last_message());
    }
    setenv("FLASHGEN_DEVICE", "first", 1);
    st = fg_context_create(&ctx, NULL);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_last_message(), "FLASHGEN_DEVICE=first"),
          "FLASHGEN_DEVICE=first: %s (%s)", fg_status_name(st), fg_last_message());
    unsetenv("FLASHGEN_DEVICE");

    fg_spec spec = fg_spec_default(D, FG_FP16);
    const fg_forward_args a = valid_args(D);
    st = fg_forward(NULL, &spec, &a);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && contains(fg_last_message(), "ctx"),
          "forward with NULL ctx: %s (%s)", fg_status_name(st), fg_last_message());

    /* the live device: none on CPU-only machines; where there is one the
     * context must describe it */
    ctx = NULL;
    st = fg_context_create(&ctx, NULL);
    if (st == FG_OK) {
        printf("note: a CUDA device is present: %s\n", fg_context_target(ctx));
        CHECK(fg_context_arch(ctx) >= 75, "live arch %d", fg_context_arch(ctx));
        fg_context_destroy(ctx);
    } else {
        const char *msg = fg_last_message();
        CHECK(st == FG_ERR_NO_DEVICE && !ctx, "live context: %s (%s)", fg_status_name(st), msg);
        CHECK(contains(msg, "driver") || contains(msg, "device"),
              "no-device message should mention the driver or device: '%s'", msg);
    }
}

static void test_plan(fg_context *ctx) {
    const int dims[] = {1, 33, 64, 128, 256};
    for (size_t n = 0; n < sizeof dims / sizeof dims[0]; n++) {
        fg_spec spec = fg_spec_default(dims[n], FG_FP16);
        fg_plan_info p;
        memset(&p, 0x55, sizeof p);
        fg_status st = fg_plan(ctx, &spec, FG_PASS_FORWARD, &p);
        CHECK(st == FG_OK, "fg_plan d%d: %s (%s)", dims[n], fg_status_name(st),
              fg_context_message(ctx));
        if (st != FG_OK) continue;
        CHECK(p.block_m >= 16 && p.block_m % 16 == 0 && p.block_m <= 256, "d%d block_m %d",
              dims[n], p.block_m);
        CHECK(p.block_n >= 16 && p.block_n % 16 == 0 && p.block_n <= 512, "d%d block_n %d",
              dims[n], p.block_n);
        CHECK(p.warps >= 1 && p.warps <= 16 && p.threads == 32 * p.warps, "d%d warps %d threads %d",
              dims[n], p.warps, p.threads);
        CHECK(p.stages >= 1 && p.stages <= 8, "d%d stages %d", dims[n], p.stages);
        CHECK(p.head_dim_padded >= dims[n] && p.head_dim_padded % 16 == 0 &&
                  p.head_dim_padded < dims[n] + 16,
              "d%d padded %d", dims[n], p.head_dim_padded);
        /* at least Q and one K/V tile pair, and within the H100's 227 KiB */
        int min_smem = 2 * (p.block_m + 2 * p.block_n) * p.head_dim_padded;
        CHECK(p.smem_bytes >= min_smem && p.smem_bytes <= 227 * 1024, "d%d smem %d (min %d)",
              dims[n], p.smem_bytes, min_smem);
        CHECK(memchr(p.kernel_name, 0, sizeof p.kernel_name) && strlen(p.kernel_name) > 0 &&
                  memchr(p.why, 0, sizeof p.why) && strlen(p.why) > 0,
              "d%d kernel name / why are empty or unterminated", dims[n]);
    }
    fg_spec bad = fg_spec_default(300, FG_FP16);
    fg_plan_info p;
    CHECK(fg_plan(ctx, &bad, FG_PASS_FORWARD, &p) == FG_ERR_INVALID_ARGUMENT, "fg_plan head_dim 300 accepted");
}

/* The backward validates the forward's arguments and its own. */
static fg_backward_args valid_backward(void) {
    fg_backward_args b;
    memset(&b, 0, sizeof b);
    b.forward = valid_args(D);
    b.d_o = fg_tensor_bshd(FAKE(0x60000), SQ, HQ, D);
    b.d_q = fg_tensor_bshd(FAKE(0x70000), SQ, HQ, D);
    b.d_k = fg_tensor_bshd(FAKE(0x80000), SK, HKV, D);
    b.d_v = fg_tensor_bshd(FAKE(0x90000), SK, HKV, D);
    return b;
}

static void expect_backward(fg_context *ctx, const char *name, const fg_spec *spec,
                            const fg_backward_args *b, fg_status want, const char *needle) {
    fg_status got = fg_backward(ctx, spec, b);
    const char *msg = fg_context_message(ctx);
    CHECK(got == want, "%s: got %s, want %s (message: %s)", name, fg_status_name(got),
          fg_status_name(want), msg);
    if (want != FG_ERR_NO_DEVICE)
        CHECK(contains(msg, needle), "%s: message '%s' should name '%s'", name, msg, needle);
}

static void test_backward(fg_context *ctx) {
    fg_spec spec = fg_spec_default(D, FG_FP16);
    fg_backward_args b = valid_backward();
    expect_backward(ctx, "valid backward", &spec, &b, FG_ERR_NO_DEVICE, NULL);
    b.deterministic = 1;
    expect_backward(ctx, "valid deterministic backward", &spec, &b, FG_ERR_NO_DEVICE, NULL);

    size_t fast = 0, det = 0;
    b = valid_backward();
    CHECK(fg_backward_workspace_size(ctx, &spec, &b, &fast) == FG_OK, "workspace size: %s",
          fg_context_message(ctx));
    b.deterministic = 1;
    CHECK(fg_backward_workspace_size(ctx, &spec, &b, &det) == FG_OK, "workspace size: %s",
          fg_context_message(ctx));
    /* row statistics plus at least one (B, Hq, Sq, d) fp32 dQ accumulator */
    CHECK(fast >= (size_t)B * HQ * SQ * (D + 1) * 4 && det >= fast, "workspace %zu / %zu", fast, det);

    CHECK(fg_backward(ctx, &spec, NULL) == FG_ERR_INVALID_ARGUMENT, "NULL args accepted");
    b = valid_backward();
    b.forward.lse = NULL;
    expect_backward(ctx, "backward without lse", &spec, &b, FG_ERR_INVALID_ARGUMENT, "lse");
    b = valid_backward();
    b.d_k.data = FAKE(0x80008);
    expect_backward(ctx, "misaligned d_k", &spec, &b, FG_ERR_INVALID_ARGUMENT, "d_k");
    b = valid_backward();
    b.d_q.stride_dim = 2;
    expect_backward(ctx, "strided d_q head dim", &spec, &b, FG_ERR_INVALID_ARGUMENT, "d_q.stride_dim");
    b = valid_backward();
    b.d_o.data = NULL;
    expect_backward(ctx, "NULL d_o", &spec, &b, FG_ERR_INVALID_ARGUMENT, "d_o");
    b = valid_backward();
    b.deterministic = 2;
    expect_backward(ctx, "deterministic 2", &spec, &b, FG_ERR_INVALID_ARGUMENT, "deterministic");
    b = valid_backward();
    b.workspace = FAKE(0xA0010);
    expect_backward(ctx, "misaligned workspace", &spec, &b, FG_ERR_INVALID_ARGUMENT, "workspace");
    b = valid_backward();
    b.forward.heads_kv = 3;
    expect_backward(ctx, "forward heads not divisible", &spec, &b, FG_ERR_INVALID_ARGUMENT, "heads_kv");

    fg_plan_info info;
    CHECK(fg_plan(ctx, &spec, (fg_pass)7, &info) == FG_ERR_INVALID_ARGUMENT &&
              contains(fg_context_message(ctx), "pass"),
          "pass 7 accepted: %s", fg_context_message(ctx));
    CHECK(fg_plan(ctx, &spec, FG_PASS_BACKWARD, &info) == FG_OK &&
              contains(info.kernel_name, "fg_bwd_sm90"),
          "backward plan: %s", fg_context_message(ctx));
}

/* Packed sequences: the arrays go with spec.varlen and only with it; an
 * offline context checks what needs no device (the values need debug checks
 * on a live one: gpu_varlen). */
static void test_packed(fg_context *ctx) {
    fg_spec dense = fg_spec_default(D, FG_FP16), varlen = dense;
    varlen.varlen = 1;
    fg_forward_args a = valid_args(D);
    a.q = fg_tensor_bshd(FAKE(0x10000), 0, HQ, D), a.o = fg_tensor_bshd(FAKE(0x40000), 0, HQ, D);
    a.k = fg_tensor_bshd(FAKE(0x20000), 0, HKV, D), a.v = fg_tensor_bshd(FAKE(0x30000), 0, HKV, D);
    a.cu_seqlens_q = FAKE(0x60000), a.cu_seqlens_k = FAKE(0x61000);
    a.total_q = 190, a.total_k = 250;
    const fg_forward_args base = a;
    expect(ctx, "valid packed", &varlen, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    a.seqlen_q = a.seqlen_k = 0;
    expect(ctx, "packed, every sequence empty", &varlen, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    expect(ctx, "cu_seqlens without spec.varlen", &dense, &base, FG_ERR_INVALID_ARGUMENT,
           "cu_seqlens_q", "spec.varlen is 0");
    a = base;
    a.cu_seqlens_k = NULL;
    expect(ctx, "no cu_seqlens_k", &varlen, &a, FG_ERR_INVALID_ARGUMENT, "cu_seqlens_k", "NULL");
    a = base;
    a.cu_seqlens_q = FAKE(0x60002);
    expect(ctx, "cu_seqlens_q misaligned", &varlen, &a, FG_ERR_INVALID_ARGUMENT, "cu_seqlens_q",
           "aligned");
    a = base;
    a.total_k = -1;
    expect(ctx, "negative total_k", &varlen, &a, FG_ERR_INVALID_ARGUMENT, "total_k", "-1");
    a = base;
    a.seqlen_q = -1;
    expect(ctx, "negative seqlen_q", &varlen, &a, FG_ERR_INVALID_ARGUMENT, "seqlen_q", "0..2^30");
    fg_forward_args d = valid_args(D);
    d.seqused_k = FAKE(0x62000);
    expect(ctx, "seqused_k without spec.varlen", &dense, &d, FG_ERR_INVALID_ARGUMENT, "seqused_k",
           "spec.varlen");
    /* on H100 the Hopper families take packed calls */
    fg_plan_info info;
    CHECK(fg_plan(ctx, &varlen, FG_PASS_FORWARD, &info) == FG_OK &&
              strstr(info.kernel_name, "fg_fwd_sm90a_") && strstr(info.kernel_name, "_varlen"),
          "packed forward plan on h100: %s (%s)", info.kernel_name, fg_context_message(ctx));
    CHECK(fg_plan(ctx, &varlen, FG_PASS_BACKWARD, &info) == FG_OK &&
              strstr(info.kernel_name, "fg_bwd_sm90a_") && strstr(info.kernel_name, "_varlen"),
          "packed backward plan on h100: %s (%s)", info.kernel_name, fg_context_message(ctx));
}

/* Decoding steps: the cache's arguments go with spec.kv_cache and only with
 * it; pages must agree with the pool's strides; new rows fit seqlen_k; no
 * backward. */
static void test_kv_cache(fg_context *ctx) {
    fg_spec dense = fg_spec_default(D, FG_FP16), kv = dense;
    kv.kv_cache = 1;
    fg_forward_args a = valid_args(D);
    /* a pool of 40 pages of 16 rows: (40, 16, HKV, D) */
    a.k = fg_tensor_bshd(FAKE(0x20000), 16, HKV, D), a.v = fg_tensor_bshd(FAKE(0x30000), 16, HKV, D);
    a.block_table = FAKE(0x60000), a.block_table_stride = 20, a.page_size = 16, a.num_pages = 40;
    a.cache_seqlens = FAKE(0x61000);
    a.seqlen_q = 1, a.seqlen_k = 300;
    const fg_forward_args base = a;
    expect(ctx, "valid decoding step", &kv, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    expect(ctx, "block_table without spec.kv_cache", &dense, &base, FG_ERR_INVALID_ARGUMENT,
           "block_table", "spec.kv_cache is 0");
    a.page_size = 32; /* the pool's page stride holds 16 rows */
    expect(ctx, "page size against the strides", &kv, &a, FG_ERR_INVALID_ARGUMENT, "page_size: 32",
           "k's pages");
    a = base;
    a.block_table_stride = 10; /* 160 rows < seqlen_k */
    expect(ctx, "short block table rows", &kv, &a, FG_ERR_INVALID_ARGUMENT, "block_table_stride",
           "seqlen_k");
    a = base;
    a.block_table = FAKE(0x60002);
    expect(ctx, "block_table misaligned", &kv, &a, FG_ERR_INVALID_ARGUMENT, "block_table", "aligned");
    a = base;
    a.num_splits = 129;
    expect(ctx, "num_splits", &kv, &a, FG_ERR_INVALID_ARGUMENT, "num_splits", "0..128");
    a = base;
    a.k_new = fg_tensor_bshd(FAKE(0x70000), 2, HKV, D), a.seqlen_new = 2;
    expect(ctx, "k_new without v_new", &kv, &a, FG_ERR_INVALID_ARGUMENT, "v_new", "both");
    a.v_new = fg_tensor_bshd(FAKE(0x78000), 2, HKV, D), a.cache_seqlens = NULL;
    expect(ctx, "new rows without cache_seqlens", &kv, &a, FG_ERR_INVALID_ARGUMENT, "cache_seqlens",
           "NULL");
    /* the new rows against the keys a sequence may hold: the lengths are in
     * device memory (checked only with debug checks), their count is not */
    a.cache_seqlens = base.cache_seqlens, a.seqlen_new = 300;
    a.k_new = fg_tensor_bshd(FAKE(0x70000), 301, HKV, D);
    a.v_new = fg_tensor_bshd(FAKE(0x78000), 301, HKV, D);
    expect(ctx, "new rows filling seqlen_k", &kv, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    a.seqlen_new = 301;
    expect(ctx, "new rows past seqlen_k", &kv, &a, FG_ERR_INVALID_ARGUMENT, "seqlen_new: 301",
           "seqlen_k (300)");
    a.block_table = NULL, a.page_size = a.num_pages = a.block_table_stride = 0;
    a.k = fg_tensor_bshd(FAKE(0x20000), 300, HKV, D);
    a.v = fg_tensor_bshd(FAKE(0x30000), 300, HKV, D);
    expect(ctx, "new rows past a contiguous cache", &kv, &a, FG_ERR_INVALID_ARGUMENT,
           "seqlen_new: 301", "seqlen_k (300)");
    a = base;
    a.block_table = NULL;
    expect(ctx, "page_size without a block table", &kv, &a, FG_ERR_INVALID_ARGUMENT, "page_size",
           "without a block_table");
    fg_spec bad = kv;
    bad.dropout = 1;
    expect(ctx, "kv_cache with dropout", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.kv_cache",
           "dropout");
    bad = kv, bad.head_dim = 60;
    expect(ctx, "kv_cache head dim 60", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.kv_cache",
           "multiple of 8");
    fg_plan_info info;
    /* on sm_90 the first family over a KV cache is the Hopper forward (chunked
     * prefill), which hands the steps of a few queries to fwd_decode */
    CHECK(fg_plan(ctx, &kv, FG_PASS_FORWARD, &info) == FG_OK &&
              strstr(info.kernel_name, "fg_fwd_sm90a_") && strstr(info.kernel_name, "_kvcache"),
          "KV cache plan on h100: %s (%s)", info.kernel_name, fg_context_message(ctx));
    CHECK(fg_plan(ctx, &kv, FG_PASS_BACKWARD, &info) == FG_ERR_INVALID_ARGUMENT &&
              contains(fg_context_message(ctx), "no backward"),
          "decoding backward planned: %s", fg_context_message(ctx));
}

/* Blocks of a longer call: dense specs only, positions in range, and on
 * dropout's tiles. */
static void test_positions(fg_context *ctx) {
    fg_spec dense = fg_spec_default(D, FG_FP16), drop = dense, sparse = dense;
    drop.dropout = 1;
    sparse.sparsity = FG_SPARSE_BUTTERFLY, sparse.sparse_block_q = sparse.sparse_block_k = BLOCK;
    fg_forward_args a = valid_args(D);
    a.position_q = 7, a.position_k = 1 << 30;
    expect(ctx, "valid positions", &dense, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    expect(ctx, "positions with a sparse spec", &sparse, &a, FG_ERR_INVALID_ARGUMENT, "position_q",
           "sparse");
    expect(ctx, "positions off dropout's tiles", &drop, &a, FG_ERR_INVALID_ARGUMENT, "position_q",
           "multiples of 16 and 32");
    a.position_q = 48, a.position_k = 96;
    expect(ctx, "valid positions with dropout", &drop, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    a.position_k = 80;
    expect(ctx, "position_k off dropout's tiles", &drop, &a, FG_ERR_INVALID_ARGUMENT,
           "position_k", "multiples");
    a.position_q = -16, a.position_k = 0;
    expect(ctx, "negative position_q", &dense, &a, FG_ERR_INVALID_ARGUMENT, "position_q", "0..2^31");
    a.position_q = 0, a.position_k = (int64_t)1 << 31;
    expect(ctx, "position_k past 2^31", &dense, &a, FG_ERR_INVALID_ARGUMENT, "position_k", "0..2^31");
    /* the rows' and keys' positions in the longer call are ints (the
     * expressions' q and k) */
    a.position_q = INT32_MAX, a.position_k = 0, a.seqlen_k = SK;
    expect(ctx, "rows past an int", &dense, &a, FG_ERR_INVALID_ARGUMENT, "position_q",
           "positions must stay below 2^31 - 4096");
    a.position_q = 0, a.position_k = ((int64_t)1 << 31) - 4096 - SK + 1;
    expect(ctx, "keys past the positions' range", &dense, &a, FG_ERR_INVALID_ARGUMENT, "position_k",
           "positions must stay below");
    a.position_k = 0;
    /* the kernels' distances in 32 bits: keys at most 2^31 - 4096 from any
     * query's diagonal (the lengths, a tile past them and the positions) */
    a.position_q = INT32_MAX - 4096 - 256 - SK + 2; /* reach SK + pq + 256 = 2^31 - 4095 */
    expect(ctx, "diagonal past the kernels' reach", &dense, &a, FG_ERR_INVALID_ARGUMENT,
           "position_q", "2^31 - 4096");
    a.position_q -= 1;
    expect(ctx, "diagonal at the kernels' reach", &dense, &a, FG_ERR_NO_DEVICE, NULL, NULL);

    fg_spec varlen = dense;
    varlen.varlen = 1;
    fg_forward_args p = valid_args(D);
    p.cu_seqlens_q = FAKE(0x60000), p.cu_seqlens_k = FAKE(0x61000);
    p.total_q = SQ, p.total_k = SK, p.position_k = 32;
    expect(ctx, "positions with packed sequences", &varlen, &p, FG_ERR_INVALID_ARGUMENT,
           "position_k", "spec.varlen");
}

/* The scores' variants: their values go with the spec's variant and only
 * with it; a cap finite and > 0, slopes and sinks 4-byte aligned, a slope
 * stride of 0 or more; the backward's d_sinks only with spec.sinks. */
static void test_variants(fg_context *ctx) {
    fg_spec plain = fg_spec_default(D, FG_FP16), all = plain;
    all.softcap = all.alibi = all.sinks = 1;
    fg_forward_args a = valid_args(D);
    a.softcap = 30.f;
    a.alibi_slopes = FAKE(0x62000), a.alibi_stride_batch = HQ;
    a.sinks = FAKE(0x63000);
    const fg_forward_args base = a;
    expect(ctx, "valid variants", &all, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    a.alibi_stride_batch = 0; /* one slope per head */
    expect(ctx, "valid slopes per head", &all, &a, FG_ERR_NO_DEVICE, NULL, NULL);

    const float caps[4] = {0.f, -1.f, NAN, INFINITY};
    for (int c = 0; c < 4; c++) {
        a = base;
        a.softcap = caps[c];
        expect(ctx, "bad cap", &all, &a, FG_ERR_INVALID_ARGUMENT, "softcap", "finite cap > 0");
    }
    /* caps whose factors the kernels cannot hold: scale/cap infinite or
     * flushed to 0, cap·log2(e) infinite (D 64: scale 1/8) */
    const float far_caps[3] = {1e-40f, 1e38f, 3e38f};
    for (int c = 0; c < 3; c++) {
        a = base;
        a.softcap = far_caps[c];
        expect(ctx, "cap out of the factors' range", &all, &a, FG_ERR_INVALID_ARGUMENT, "softcap",
               "normal float");
    }
    a = base;
    a.softcap = 1e-30f, a.softmax_scale = 1.f;
    expect(ctx, "a tiny cap that holds", &all, &a, FG_ERR_NO_DEVICE, NULL, NULL);
    fg_spec no_cap = all;
    no_cap.softcap = 0;
    expect(ctx, "a cap without spec.softcap", &no_cap, &base, FG_ERR_INVALID_ARGUMENT, "softcap",
           "spec.softcap is 0");

    a = base;
    a.alibi_slopes = NULL;
    expect(ctx, "no slopes", &all, &a, FG_ERR_INVALID_ARGUMENT, "alibi_slopes", "NULL");
    a = base;
    a.alibi_slopes = FAKE(0x62002);
    expect(ctx, "slopes misaligned", &all, &a, FG_ERR_INVALID_ARGUMENT, "alibi_slopes", "aligned");
    a = base;
    a.alibi_stride_batch = -1;
    expect(ctx, "negative slope stride", &all, &a, FG_ERR_INVALID_ARGUMENT, "alibi_stride_batch",
           "-1");
    fg_spec no_alibi = all;
    no_alibi.alibi = 0;
    a = base;
    a.alibi_stride_batch = 0;
    expect(ctx, "slopes without spec.alibi", &no_alibi, &a, FG_ERR_INVALID_ARGUMENT, "alibi_slopes",
           "spec.alibi is 0");
    a.alibi_slopes = NULL, a.alibi_stride_batch = HQ;
    expect(ctx, "a slope stride without spec.alibi", &no_alibi, &a, FG_ERR_INVALID_ARGUMENT,
           "alibi_stride_batch", "spec.alibi is 0");

    a = base;
    a.sinks = NULL;
    expect(ctx, "no sinks", &all, &a, FG_ERR_INVALID_ARGUMENT, "sinks", "NULL");
    a.sinks = FAKE(0x63001);
    expect(ctx, "sinks misaligned", &all, &a, FG_ERR_INVALID_ARGUMENT, "sinks", "aligned");
    fg_spec no_sinks = all;
    no_sinks.sinks = 0;
    expect(ctx, "sinks without spec.sinks", &no_sinks, &base, FG_ERR_INVALID_ARGUMENT, "sinks",
           "spec.sinks is 0");
    expect(ctx, "every value with a plain spec", &plain, &base, FG_ERR_INVALID_ARGUMENT, NULL,
           NULL);

    /* the backward: the forward's values, and d_sinks with spec.sinks only */
    fg_backward_args b = valid_backward();
    b.forward = base;
    expect_backward(ctx, "valid backward with variants", &all, &b, FG_ERR_NO_DEVICE, NULL);
    b.d_sinks = FAKE(0x64000);
    expect_backward(ctx, "valid backward with d_sinks", &all, &b, FG_ERR_NO_DEVICE, NULL);
    b.d_sinks = FAKE(0x64002);
    expect_backward(ctx, "d_sinks misaligned", &all, &b, FG_ERR_INVALID_ARGUMENT, "d_sinks");
    b.d_sinks = FAKE(0x64000);
    b.forward.sinks = NULL;
    expect_backward(ctx, "d_sinks without spec.sinks", &no_sinks, &b, FG_ERR_INVALID_ARGUMENT,
                    "d_sinks: given, but spec.sinks is 0");
    b.forward.sinks = FAKE(0x63000), b.d_sinks = NULL;
    b.forward.softcap = -3.f;
    expect_backward(ctx, "backward with a bad cap", &all, &b, FG_ERR_INVALID_ARGUMENT, "softcap");
}

/* Expressions: a spec's text refused at its column; aux tensors declared and
 * passed alike (data, sizes, strides, a span the kernels' 32-bit offsets
 * hold); d_aux only for a score's float tensors. */
static void test_expressions(fg_context *ctx) {
    fg_spec spec = fg_spec_default(D, FG_FP16);
    spec.score_mod = "s + bias[h, q - k + 200]";
    spec.mask_mod = "doc[q] == doc[k]";
    spec.aux_count = 2;
    spec.aux[0] = (fg_aux_decl){"bias", FG_AUX_F32, 2};
    spec.aux[1] = (fg_aux_decl){"doc", FG_AUX_I32, 1};
    fg_forward_args base = valid_args(D), a;
    base.aux[0] = (fg_aux_tensor){FAKE(0x65000), {HQ, 401, 0}, {401, 1, 0}};
    base.aux[1] = (fg_aux_tensor){FAKE(0x66000), {SQ, 0, 0}, {1, 0, 0}};
    expect(ctx, "valid expressions", &spec, &base, FG_ERR_NO_DEVICE, NULL, NULL);

    fg_spec bad = spec;
    bad.score_mod = "s + bias[h, q - k + 200] + nope";
    expect(ctx, "unknown name", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.score_mod: column 28",
           "unknown name 'nope'");
    bad = spec;
    bad.mask_mod = "doc[q] == doc[k]; exit(0)";
    expect(ctx, "injection", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.mask_mod: column 17",
           "unexpected character ';'");
    bad = spec;
    bad.score_mod = "s + bias[h, doc[q]]";
    bad.aux[1].type = FG_AUX_F32;
    expect(ctx, "a float index", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.score_mod: column 13",
           "index 2 of 'bias' must be int");
    bad = spec;
    bad.aux_count = 9;
    expect(ctx, "nine tensors", &bad, &base, FG_ERR_INVALID_ARGUMENT, "spec.aux_count", "0..8");
    bad = spec;
    bad.softcap = 1;
    a = base;
    a.softcap = 30.f;
    expect(ctx, "a score modifier with a cap", &bad, &a, FG_ERR_INVALID_ARGUMENT, "spec.score_mod",
           "softcap");
    bad = fg_spec_default(D, FG_FP16);
    bad.aux_count = 1;
    bad.aux[0] = spec.aux[0];
    a = valid_args(D);
    expect(ctx, "tensors and no expression", &bad, &a, FG_ERR_INVALID_ARGUMENT,
           "spec.aux_count", "no score_mod or mask_mod");

    a = base;
    a.aux[1].data = NULL;
    expect(ctx, "no data", &spec, &a, FG_ERR_INVALID_ARGUMENT, "aux[1] (doc)", "NULL");
    a = base;
    a.aux[0].data = FAKE(0x65002);
    expect(ctx, "misaligned", &spec, &a, FG_ERR_INVALID_ARGUMENT, "aux[0] (bias)", "aligned");
    a = base;
    a.aux[0].stride[1] = -1;
    expect(ctx, "a negative stride", &spec, &a, FG_ERR_INVALID_ARGUMENT, "aux[0] (bias)",
           "strides >= 0");
    a = base;
    a.aux[0].size[0] = 3, a.aux[0].stride[0] = (int64_t)1 << 31;
    expect(ctx, "a span of 2^32", &spec, &a, FG_ERR_INVALID_ARGUMENT, "aux[0] (bias)",
           "fewer than 2^31");
    a = base;
    a.aux[2] = base.aux[1];
    expect(ctx, "an undeclared tensor", &spec, &a, FG_ERR_INVALID_ARGUMENT, "aux[2]",
           "declares 2 aux tensors");

    fg_backward_args b = valid_backward();
    b.forward = base;
    b.d_aux[0] = FAKE(0x67000);
    expect_backward(ctx, "a float tensor's gradient", &spec, &b, FG_ERR_NO_DEVICE, NULL);
    b.d_aux[1] = FAKE(0x68000);
    expect_backward(ctx, "an int tensor's gradient", &spec, &b, FG_ERR_INVALID_ARGUMENT,
                    "d_aux[1]: given, but that tensor holds int32");
    b.d_aux[1] = NULL;
    fg_spec mask_only = spec;
    mask_only.score_mod = NULL;
    expect_backward(ctx, "a gradient without a score modifier", &mask_only, &b,
                    FG_ERR_INVALID_ARGUMENT, "d_aux[0]: given, but the spec has no score_mod");
}

int main(void) {
    fg_context *ctx = NULL;
    fg_status st = fg_context_create(&ctx, "h100");
    CHECK(st == FG_OK && ctx, "create h100: %s (%s)", fg_status_name(st), fg_last_message());
    if (!ctx) return check_summary("test_bad_input");
    CHECK(fg_context_arch(ctx) == 90, "h100 arch %d", fg_context_arch(ctx));
    CHECK(contains(fg_context_target(ctx), "h100"), "target '%s'", fg_context_target(ctx));

    test_valid_calls(ctx);
    test_tensors(ctx);
    test_shapes(ctx);
    test_scalars(ctx);
    test_windows(ctx);
    test_layouts(ctx);
    test_plan(ctx);
    test_backward(ctx);
    test_packed(ctx);
    test_kv_cache(ctx);
    test_positions(ctx);
    test_variants(ctx);
    test_expressions(ctx);
    test_block_masks(ctx);
    fg_context_destroy(ctx);
    test_bf16_on_t4();
    test_contexts();
    return check_summary("test_bad_input");
}
