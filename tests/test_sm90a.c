/* The sm_90a building blocks and compiles (docs/hopper-notes.md).
 *
 * The building blocks (templates/isa_sm90a.lua) on one tile: the probe
 * compiles for sm_90a with a clean ptxas report (here, any machine with
 * NVRTC), and on an sm_90 GPU its TMA loads, mbarrier and wgmmas give
 * C = A·B (64 x 64 x 64) for both B layouts, A from registers or as
 * (K, M), and C added into memory by a bulk reduction, against an fp64
 * product of the same half-precision inputs. The descriptor offsets are launch arguments,
 * so the test pins down which encoding the hardware reads.
 *
 * The forward family's kernels (fwd_sm90a) for a few specs, and the tiles
 * it names by a call's length, planned and generated as the runtime does,
 * compile with no ptxas warning, no note
 * that wgmma was serialized or fenced by the compiler, and no spills;
 * gpu_forward runs them (those with a value head dim of its own once the
 * family takes such calls: fwd_sm90a.c's supports). So do the backward's
 * (bwd_sm90a, gpu_backward) and the latent decoding family's (fwd_mla_sm90a,
 * gpu_decode). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/bwd_sm90a.h"
#include "families/fwd_mla_sm90a.h"
#include "families/fwd_sm90a.h"
#include "gen/generate.h"
#include "gen/spec.h"
#include "reference/reference.h"
#include "runtime/cuda_libs.h"
#include "tests/check.h"

#define N 64
#define SMEM_BYTES (2 * N * N * 2 + 8 + 1024) /* two tiles, a barrier, alignment */

typedef struct probe {
    const cuda_driver *cu;
    CUdeviceptr a, b, c;
    uint16_t a_host[N * N], b_host[N * N];
} probe;

/* How a probe reads its operands: A as (M, K) or (K, M) (a_mnmajor), B as
 * (N, K) (b_kmajor) or (K, N); and how many launches add into c (0: one
 * launch writes it). */
typedef struct probe_kind {
    int a_mnmajor, b_kmajor, reductions;
} probe_kind;

/* C = A·B of the rounded inputs in fp64, read as `kind` says, times the
 * launches that add it. */
static void reference(const probe *p, int dtype, probe_kind kind, double *c) {
    float (*to_float)(uint16_t) = dtype ? ref_bf16_to_float : ref_half_to_float;
    for (int m = 0; m < N; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < N; k++)
                s += (double)to_float(p->a_host[kind.a_mnmajor ? k * N + m : m * N + k]) *
                     to_float(p->b_host[kind.b_kmajor ? n * N + k : k * N + n]);
            c[m * N + n] = s * (kind.reductions ? kind.reductions : 1);
        }
}

/* A tensor map of 16-bit elements with 128-byte swizzled boxes: dims and box
 * innermost first, strides (rank - 1 of them) in bytes. 0 on success. */
static int encode_map(const cuda_driver *cu, CUtensorMap *map, CUdeviceptr data, int dtype,
                      unsigned rank, const cuuint64_t *dims, const cuuint64_t *strides,
                      const cuuint32_t *box) {
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    return cu->cuTensorMapEncodeTiled(
               map, dtype ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
               rank, (void *)data, dims, strides, box, element_strides,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* A 64 x 64 matrix, one box. */
static int encode(const probe *p, CUtensorMap *map, CUdeviceptr data, int dtype) {
    const cuuint64_t dims[2] = {N, N}, strides[1] = {N * 2};
    const cuuint32_t box[2] = {N, N};
    return encode_map(p->cu, map, data, dtype, 2, dims, strides, box);
}

/* Largest |gpu - reference| of a probe's launches, or -1 when one failed;
 * the descriptors' offsets (leading, stride) of A and B. */
static double run(probe *p, CUfunction fn, int dtype, probe_kind kind, const unsigned offsets[4]) {
    CUtensorMap a_map, b_map;
    if (encode(p, &a_map, p->a, dtype) || encode(p, &b_map, p->b, dtype)) return -1;
    unsigned lead_a = offsets[0], stride_a = offsets[1], lead_b = offsets[2], stride_b = offsets[3];
    void *args[] = {&a_map, &b_map, &p->a, &p->c, &lead_a, &stride_a, &lead_b, &stride_b};
    /* NaN where one launch writes c (unwritten outputs fail); zeros where
     * launches add into it */
    p->cu->cuMemsetD8(p->c, kind.reductions ? 0 : 0xFF, N * N * 4);
    for (int l = 0; l < (kind.reductions ? kind.reductions : 1); l++)
        if (p->cu->cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, SMEM_BYTES, NULL, args, NULL) ||
            p->cu->cuCtxSynchronize())
            return -1;
    static float got[N * N];
    static double want[N * N];
    if (p->cu->cuMemcpyDtoH(got, p->c, sizeof got)) return -1;
    reference(p, dtype, kind, want);
    double worst = 0;
    for (int i = 0; i < N * N; i++) {
        double e = fabs(got[i] - want[i]);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* Compile generated source for sm_90a; frees it. With `fast`, the kernel
 * must also compile free of the notes that cost speed. */
static int compile_source(generated *gp, int fast, void **cubin, size_t *len) {
    generated g = *gp;
    char err[4096];
    char *log = NULL;
    nvrtc_resources res;
    int rc = nvrtc_compile_cubin(g.source, g.kernel_name, "sm_90a", NULL, 0, cubin, len, &log, &res,
                                 err, sizeof err);
    CHECK(rc == 0, "compile %s for sm_90a: %s\n%s", g.kernel_name, err, log ? log : "");
    if (rc == 0) {
        /* warnings, and with `fast` the wgmma notes (C75xx: wgmma serialized,
         * warpgroup.arrive injected) */
        CHECK(!log || (!strstr(log, "arning") && !(fast && strstr(log, "(C75"))),
              "ptxas warns on %s:\n%s", g.kernel_name, log);
        CHECK(res.spill_stores == 0 && res.spill_loads == 0, "%s spills %d/%d bytes",
              g.kernel_name, res.spill_stores, res.spill_loads);
        printf("%s: %d registers\n", g.kernel_name, res.registers);
    }
    free(log);
    generated_free(&g);
    return rc;
}

/* The GPU, when it is an sm_90 one; NULL otherwise, with why. */
static const cuda_driver *hopper(char *why, size_t len) {
    const cuda_driver *cu = cuda_driver_load(why, len);
    if (!cu) return NULL;
    CUdevice dev;
    CUcontext ctx;
    int count = 0, major = 0;
    if (cu->cuDeviceGetCount(&count) || count == 0 || cu->cuDeviceGet(&dev, 0)) {
        snprintf(why, len, "no CUDA device");
        return NULL;
    }
    cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    if (major != 9) {
        snprintf(why, len, "device 0 is not an sm_90 GPU");
        return NULL;
    }
    if (!cu->cuTensorMapEncodeTiled) {
        snprintf(why, len, "the driver has no cuTensorMapEncodeTiled");
        return NULL;
    }
    if (cu->cuDevicePrimaryCtxRetain(&ctx, dev) || cu->cuCtxSetCurrent(ctx)) {
        snprintf(why, len, "no context on device 0");
        return NULL;
    }
    return cu;
}

/* ---- the family's kernels -------------------------------------------------------- */

/* The fwd_sm90a kernels of a few specs, planned and generated as the runtime
 * does, compiled with a clean ptxas report: no warning (C7508 would say
 * setmaxnreg was dropped), no spills. */
static const struct {
    int head_dim;
    fg_mask mask;
    int dropout;
    const char *score_mod, *mask_mod; /* over bias (Hq, 2S) float and doc (S) int */
    int head_dim_v;                   /* 0: the head dim */
} family_specs[] = {
    {64, FG_MASK_NONE, 0, NULL, NULL, 0}, {128, FG_MASK_NONE, 0, NULL, NULL, 0},
    {128, FG_MASK_CAUSAL, 1, NULL, NULL, 0}, {256, FG_MASK_NONE, 0, NULL, NULL, 0},
    {256, FG_MASK_WINDOW, 1, NULL, NULL, 0}, {80, FG_MASK_CAUSAL, 0, NULL, NULL, 0},
    {33, FG_MASK_NONE, 1, NULL, NULL, 0}, {192, FG_MASK_CAUSAL, 0, NULL, NULL, 0},
    {128, FG_MASK_NONE, 0, "s + bias[h, q - k + seqlen_k]", "doc[q] == doc[k]", 0},
    {64, FG_MASK_CAUSAL, 1, "30.0 * tanh(s / 30.0)", "k % 3 != 1", 0},
    /* value head dims of their own: fewer, as many and more boxes than Q's */
    {192, FG_MASK_CAUSAL, 0, NULL, NULL, 128}, {256, FG_MASK_NONE, 0, NULL, NULL, 128},
    {128, FG_MASK_NONE, 1, NULL, NULL, 64},    {64, FG_MASK_CAUSAL, 0, NULL, NULL, 128},
    {96, FG_MASK_WINDOW, 0, NULL, NULL, 72},   {128, FG_MASK_CAUSAL, 0, NULL, NULL, 256},
    {192, FG_MASK_NONE, 0, "s + bias[h, q - k + seqlen_k]", NULL, 128},
    {64, FG_MASK_WINDOW, 0, NULL, NULL, 0}, /* walking, O apart */
};

/* The tensors the expressions above read. */
static void set_expressions(fg_spec *s, const char *score_mod, const char *mask_mod) {
    if (!score_mod && !mask_mod) return;
    s->score_mod = score_mod, s->mask_mod = mask_mod;
    s->aux_count = 2;
    s->aux[0] = (fg_aux_decl){"bias", FG_AUX_F32, 2};
    s->aux[1] = (fg_aux_decl){"doc", FG_AUX_I32, 1};
}
#define FAMILY_SPECS ((int)(sizeof family_specs / sizeof family_specs[0]))

/* fwd_sm90a's kernel of s: the derived plan, or with keys the tiling the
 * family names for a call of that many keys (tiling_for_call), under a
 * window of (left, 0) */
static int compile_forward(const fg_spec *s, int keys, int left, void **cubin, size_t *len) {
    const fg_profile *h100 = profile_named("h100");
    family_plan plan;
    generated g;
    char err[4096] = "";
    const kernel_target target = {90, 1};
    int planned;
    if (keys) {
        fg_forward_args a = fg_forward_args_default();
        a.seqlen_q = a.seqlen_k = keys;
        if (s->mask == FG_MASK_WINDOW) a.window_left = left, a.window_right = 0;
        family_call call = {&a, NULL, {0}, s, 0, 0};
        family_tiling t;
        planned = fwd_sm90a_family.tiling_for_call(s, h100, &call, &t) == 1 &&
                  fwd_sm90a_family.plan_tiling(s, h100, &t, &plan, err, sizeof err) == 0;
    } else {
        planned = fwd_sm90a_family.plan(s, h100, 0, &plan, err, sizeof err) == 0;
    }
    if (!planned || fwd_sm90a_family.generate(s, &plan, &target, &g, err, sizeof err) != 0) {
        CHECK(0, "fwd_sm90a, head dim %d, value head dim %d, %d keys: %s", s->head_dim,
              s->head_dim_v, keys, err);
        return -1;
    }
    return compile_source(&g, 1, cubin, len);
}

/* family's kernel of s as the runtime plans it on an H100 (its derived plan),
 * compiled as compile_source does with `fast` */
static int compile_planned(const kernel_family *family, const fg_spec *s, void **cubin,
                           size_t *len) {
    family_plan plan;
    generated g;
    char err[4096];
    const kernel_target target = {90, 1};
    if (family->plan(s, profile_named("h100"), 0, &plan, err, sizeof err) != 0 ||
        family->generate(s, &plan, &target, &g, err, sizeof err) != 0) {
        CHECK(0, "%s, head dims %d/%d: %s", family->name, s->head_dim, s->head_dim_v, err);
        return -1;
    }
    return compile_source(&g, 1, cubin, len);
}

static int compile_family(int i, int bf16, void **cubin, size_t *len) {
    fg_spec s = fg_spec_default(family_specs[i].head_dim, bf16 ? FG_BF16 : FG_FP16);
    s.mask = family_specs[i].mask, s.dropout = family_specs[i].dropout;
    s.head_dim_v = family_specs[i].head_dim_v;
    set_expressions(&s, family_specs[i].score_mod, family_specs[i].mask_mod);
    return compile_forward(&s, 0, 0, cubin, len);
}

/* fwd_sm90a's tiles by a call's length: d = 128 causal Bc 160 and without a
 * mask Bc 176 and 160 (the walking ones: 2048 keys), d = 64 causal Bc 96
 * (packed sequences too); a window's (left, 0): d = 128 Bc 128, d = 64 Bc
 * 64 (walking) */
static const struct {
    int head_dim;
    fg_mask mask;
    int varlen, keys, left;
} length_specs[] = {{128, FG_MASK_CAUSAL, 0, 2048, 0},    {128, FG_MASK_NONE, 0, 1024, 0},
                    {128, FG_MASK_NONE, 0, 2048, 0},      {64, FG_MASK_CAUSAL, 0, 2048, 0},
                    {64, FG_MASK_CAUSAL, 1, 1500, 0},     {128, FG_MASK_WINDOW, 0, 8192, 1023},
                    {64, FG_MASK_WINDOW, 0, 8192, 255},   {256, FG_MASK_WINDOW, 0, 8192, 1023}};
#define LENGTH_SPECS ((int)(sizeof length_specs / sizeof length_specs[0]))

/* The bwd_sm90a kernels of the head dims it serves, as for the forward;
 * with dropout and with sparse blocks of 128x128; above d = 128 the split
 * kernels (consumers sharing 64 keys, three and four boxes); value head
 * dims of their own, split (192/128, 256/128, 32/256) and not; packed
 * sequences. */
static const struct {
    int head_dim;
    fg_mask mask;
    int dropout;
    fg_sparsity sparsity;
    const char *score_mod, *mask_mod; /* as the forward's; reads spill at d128 (notes) */
    int head_dim_v;                   /* 0: the head dim */
    int varlen;                       /* packed sequences (their blocks walk tiles too) */
} backward_specs[] = {{64, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {128, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {100, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {33, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {128, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {64, FG_MASK_NONE, 1, FG_SPARSE_LAYOUT, NULL, NULL, 0, 0},
                      {128, FG_MASK_CAUSAL, 0, FG_SPARSE_BUTTERFLY, NULL, NULL, 0, 0},
                      {128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, "30.0 * tanh(s / 30.0)", "k % 3 != 1",
                       0, 0},
                      {64, FG_MASK_NONE, 1, FG_SPARSE_NONE, "s + bias[h, q - k + seqlen_k]",
                       "doc[q] == doc[k]", 0, 0},
                      {192, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {136, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {256, FG_MASK_CAUSAL, 0, FG_SPARSE_BUTTERFLY, NULL, NULL, 0, 0},
                      {192, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, "30.0 * tanh(s / 30.0)", "k % 3 != 1",
                       0, 0},
                      {192, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, NULL, NULL, 128, 0},
                      {256, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 128, 0},
                      {32, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 256, 0},
                      {128, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, NULL, NULL, 64, 0},
                      {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 128, 0},
                      {96, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, NULL, NULL, 72, 0},
                      {256, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, NULL, NULL, 0, 0},
                      {192, FG_MASK_WINDOW, 1, FG_SPARSE_NONE, NULL, NULL, 128, 0},
                      {128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, NULL, NULL, 0, 1},
                      {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, NULL, NULL, 0, 1}};
#define BACKWARD_SPECS ((int)(sizeof backward_specs / sizeof backward_specs[0]))

static int compile_backward(int i, int bf16, void **cubin, size_t *len) {
    fg_spec s = fg_spec_default(backward_specs[i].head_dim, bf16 ? FG_BF16 : FG_FP16);
    s.head_dim_v = backward_specs[i].head_dim_v;
    s.mask = backward_specs[i].mask;
    s.dropout = backward_specs[i].dropout;
    s.sparsity = backward_specs[i].sparsity;
    s.varlen = backward_specs[i].varlen;
    if (s.sparsity != FG_SPARSE_NONE) s.sparse_block_q = s.sparse_block_k = 128;
    s.butterfly_factors = s.sparsity == FG_SPARSE_BUTTERFLY ? 2 : 0;
    set_expressions(&s, backward_specs[i].score_mod, backward_specs[i].mask_mod);
    return compile_planned(&bwd_sm90a_family, &s, cubin, len);
}

/* fwd_mla_sm90a's kernels (the 64-row and the narrow one in one source) of
 * the latent pairs it serves: DeepSeek's 576/512, 448/384 and 192/128,
 * under each mask it takes */
static const struct {
    int head_dim, head_dim_v;
    fg_mask mask;
} latent_specs[] = {{576, 512, FG_MASK_NONE},
                    {576, 512, FG_MASK_CAUSAL},
                    {448, 384, FG_MASK_CAUSAL},
                    {192, 128, FG_MASK_WINDOW}};
#define LATENT_SPECS ((int)(sizeof latent_specs / sizeof latent_specs[0]))

static int compile_latent(int i, int bf16, void **cubin, size_t *len) {
    fg_spec s = fg_spec_default(latent_specs[i].head_dim, bf16 ? FG_BF16 : FG_FP16);
    s.head_dim_v = latent_specs[i].head_dim_v;
    s.mask = latent_specs[i].mask;
    s.kv_cache = FG_KV_LATENT;
    return compile_planned(&fwd_mla_sm90a_family, &s, cubin, len);
}

/* FG_SM90A_CUBINS=folder keeps the cubins there, for cuobjdump --dump-sass */
static void keep_cubin(const char *name, const void *cubin, size_t len) {
    const char *keep = getenv("FG_SM90A_CUBINS");
    if (!keep) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.cubin", keep, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(cubin, 1, len, f);
        fclose(f);
    }
}

/* Kernel i of a list (compile: compile_family, compile_backward,
 * compile_latent) in fp16 and bf16, each cubin kept as name_<dtype> */
static void compile_both(int (*compile)(int i, int bf16, void **cubin, size_t *len), int i,
                         const char *name) {
    for (int t = 0; t < 2; t++) {
        void *bin = NULL;
        size_t n = 0;
        if (compile(i, t, &bin, &n) == 0) {
            char kept[96];
            snprintf(kept, sizeof kept, "%s_%s", name, t ? "bf16" : "fp16");
            keep_cubin(kept, bin, n);
        }
        free(bin);
    }
}

int main(void) {
    char err[512];
    if (nvrtc_lib_load(err, sizeof err) != 0) check_skip(err);
    void *cubin[2] = {NULL, NULL};
    size_t len[2];
    const char *dtypes[2] = {"fp16", "bf16"};
    for (int t = 0; t < 2; t++) {
        generated g;
        if (generate_probe_sm90a(dtypes[t], &g, err, sizeof err) != 0) {
            CHECK(0, "generate the %s probe: %s", dtypes[t], err);
            return check_summary("test_sm90a");
        }
        if (compile_source(&g, 0, &cubin[t], &len[t]) != 0) return check_summary("test_sm90a");
        char name[64];
        snprintf(name, sizeof name, "probe_%s", dtypes[t]);
        keep_cubin(name, cubin[t], len[t]);
    }
    for (int i = 0; i < FAMILY_SPECS; i++) {
        char name[64];
        snprintf(name, sizeof name, "fwd_d%d%s%d_%s%s", family_specs[i].head_dim,
                 family_specs[i].head_dim_v ? "v" : "", family_specs[i].head_dim_v,
                 spec_mask_name(family_specs[i].mask), family_specs[i].dropout ? "_drop" : "");
        compile_both(compile_family, i, name);
    }

    for (int i = 0; i < LENGTH_SPECS; i++) {
        fg_spec s = fg_spec_default(length_specs[i].head_dim, FG_BF16);
        s.mask = length_specs[i].mask, s.varlen = length_specs[i].varlen;
        void *bin = NULL;
        size_t n = 0;
        if (compile_forward(&s, length_specs[i].keys, length_specs[i].left, &bin, &n) == 0) {
            char name[64];
            snprintf(name, sizeof name, "fwd_d%d_%s_bf16%s_keys%d", length_specs[i].head_dim,
                     spec_mask_name(length_specs[i].mask), length_specs[i].varlen ? "_varlen" : "",
                     length_specs[i].keys);
            keep_cubin(name, bin, n);
        }
        free(bin);
    }

    for (int i = 0; i < BACKWARD_SPECS; i++) {
        char name[64];
        char dv[16] = "";
        if (backward_specs[i].head_dim_v) snprintf(dv, sizeof dv, "v%d", backward_specs[i].head_dim_v);
        snprintf(name, sizeof name, "bwd_d%d%s_%s%s%s", backward_specs[i].head_dim, dv,
                 spec_mask_name(backward_specs[i].mask), backward_specs[i].dropout ? "_drop" : "",
                 backward_specs[i].sparsity == FG_SPARSE_LAYOUT      ? "_layout"
                 : backward_specs[i].sparsity == FG_SPARSE_BUTTERFLY ? "_bfly"
                                                                      : "");
        compile_both(compile_backward, i, name);
    }

    for (int i = 0; i < LATENT_SPECS; i++) {
        char name[64];
        snprintf(name, sizeof name, "mla_d%dv%d_%s", latent_specs[i].head_dim,
                 latent_specs[i].head_dim_v, spec_mask_name(latent_specs[i].mask));
        compile_both(compile_latent, i, name);
    }

    probe p;
    p.cu = hopper(err, sizeof err);
    if (!p.cu) {
        printf("note: the probe compiled; not run: %s\n", err);
    } else {
        CHECK(!p.cu->cuMemAlloc(&p.a, N * N * 2) && !p.cu->cuMemAlloc(&p.b, N * N * 2) &&
                  !p.cu->cuMemAlloc(&p.c, N * N * 4),
              "allocations");
        srand(7);
        for (int t = 0; t < 2; t++) {
            for (int i = 0; i < N * N; i++) {
                float x = (float)rand() / RAND_MAX - 0.5f, y = (float)rand() / RAND_MAX - 0.5f;
                p.a_host[i] = t ? ref_float_to_bf16(x) : ref_float_to_half(x);
                p.b_host[i] = t ? ref_float_to_bf16(y) : ref_float_to_half(y);
            }
            p.cu->cuMemcpyHtoD(p.a, p.a_host, sizeof p.a_host);
            p.cu->cuMemcpyHtoD(p.b, p.b_host, sizeof p.b_host);
            CUmodule mod;
            CUfunction kmajor, mnmajor, registers, a_mnmajor, reduce;
            CHECK(!p.cu->cuModuleLoadData(&mod, cubin[t]) &&
                      !p.cu->cuModuleGetFunction(&kmajor, mod, "fg_probe_b_kmajor") &&
                      !p.cu->cuModuleGetFunction(&mnmajor, mod, "fg_probe_b_mnmajor") &&
                      !p.cu->cuModuleGetFunction(&registers, mod, "fg_probe_a_registers") &&
                      !p.cu->cuModuleGetFunction(&a_mnmajor, mod, "fg_probe_a_mnmajor") &&
                      !p.cu->cuModuleGetFunction(&reduce, mod, "fg_probe_reduce"),
                  "load the %s probe", dtypes[t]);
            /* fp32 sums of 64 products of values below 0.5: far below 1e-3 */
            const unsigned kmajor_offsets[4] = {16, 1024, 16, 1024};
            const probe_kind b_nk = {0, 1, 0}, b_kn = {0, 0, 0};
            double e = run(&p, kmajor, t, b_nk, kmajor_offsets);
            printf("%s, B (N, K): leading 16, stride 1024: max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 1e-3, "%s, B as (N, K): max error %g", dtypes[t], e);
            /* B as (K, N), one 64-wide swizzle atom along N: the stride offset
             * steps between 8-row groups along K, the leading offset (between
             * atoms along N) is not read; swapping the two must fail. Offsets
             * that leave the tile are not tried: they fault and end the
             * context. */
            const unsigned candidates[][3] = {{16, 1024, 1}, {8192, 1024, 1}, {1024, 16, 0}};
            for (int c = 0; c < 3; c++) {
                const unsigned offsets[4] = {16, 1024, candidates[c][0], candidates[c][1]};
                e = run(&p, mnmajor, t, b_kn, offsets);
                printf("%s, B (K, N): leading %u, stride %u: max error %g\n", dtypes[t],
                       candidates[c][0], candidates[c][1], e);
                if (candidates[c][2])
                    CHECK(e >= 0 && e < 1e-3, "%s, B as (K, N), leading %u, stride %u: error %g",
                          dtypes[t], candidates[c][0], candidates[c][1], e);
                else
                    CHECK(e >= 0 && !(e < 1e-3), "%s, B as (K, N), leading %u, stride %u read "
                          "as intended, which the layout rules out", dtypes[t], candidates[c][0],
                          candidates[c][1]);
            }
            /* A from registers (as P in O = P·V), B as (K, N) */
            e = run(&p, registers, t, b_kn, kmajor_offsets);
            printf("%s, A in registers, B (K, N): max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 1e-3, "%s, A in registers: max error %g", dtypes[t], e);
            /* A as (K, M) (dS in a backward's dQ = dS·K): offsets as B's as
             * (K, N), 16 rows along K 2048 bytes apart */
            const probe_kind a_km = {1, 1, 0};
            e = run(&p, a_mnmajor, t, a_km, kmajor_offsets);
            printf("%s, A (K, M), B (N, K): max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 1e-3, "%s, A as (K, M): max error %g", dtypes[t], e);
            /* C added into c by bulk reductions, twice: c = 2·A·B */
            const probe_kind twice = {0, 1, 2};
            e = run(&p, reduce, t, twice, kmajor_offsets);
            printf("%s, C added twice by bulk reductions: max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 2e-3, "%s, bulk reduction: max error %g", dtypes[t], e);
            p.cu->cuModuleUnload(mod);
        }
        p.cu->cuMemFree(p.a);
        p.cu->cuMemFree(p.b);
        p.cu->cuMemFree(p.c);
    }
    for (int t = 0; t < 2; t++) free(cubin[t]);
    return check_summary("test_sm90a");
}
