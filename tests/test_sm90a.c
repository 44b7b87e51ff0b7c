/* The sm_90a work in progress (docs/hopper-notes.md).
 *
 * The building blocks (templates/isa_sm90a.lua) on one tile: the probe
 * compiles for sm_90a with a clean ptxas report (here, any machine with
 * NVRTC), and on an sm_90 GPU its TMA loads, mbarrier and wgmmas give
 * C = A·B (64 x 64 x 64) for both B layouts, against an fp64 product of the
 * same half-precision inputs. The descriptor offsets are launch arguments,
 * so the test pins down which encoding the hardware reads.
 *
 * The forward in progress (kernel_fwd_sm90a.lua, d = 128, no mask): compiled
 * without spills everywhere; on the GPU compared with the fp64 reference at
 * odd lengths with GQA (at most twice the naive input-precision error), then
 * timed at 16k tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/generate.h"
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

/* C = A·B with B given as (N, K) (b_kmajor) or (K, N), from the rounded
 * inputs, in fp64. */
static void reference(const probe *p, int dtype, int b_kmajor, double *c) {
    float (*to_float)(uint16_t) = dtype ? ref_bf16_to_float : ref_half_to_float;
    for (int m = 0; m < N; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < N; k++)
                s += (double)to_float(p->a_host[m * N + k]) *
                     to_float(p->b_host[b_kmajor ? n * N + k : k * N + n]);
            c[m * N + n] = s;
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

/* Largest |gpu - reference| of one launch, or -1 when it failed. */
static double run(probe *p, CUfunction fn, int dtype, int b_kmajor, unsigned lead_b,
                  unsigned stride_b) {
    CUtensorMap a_map, b_map;
    if (encode(p, &a_map, p->a, dtype) || encode(p, &b_map, p->b, dtype)) return -1;
    unsigned lead_a = 16, stride_a = 1024;
    void *args[] = {&a_map, &b_map, &p->a, &p->c, &lead_a, &stride_a, &lead_b, &stride_b};
    p->cu->cuMemsetD8(p->c, 0xFF, N * N * 4); /* NaN: unwritten outputs fail */
    if (p->cu->cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, SMEM_BYTES, NULL, args, NULL) ||
        p->cu->cuCtxSynchronize())
        return -1;
    static float got[N * N];
    static double want[N * N];
    if (p->cu->cuMemcpyDtoH(got, p->c, sizeof got)) return -1;
    reference(p, dtype, b_kmajor, want);
    double worst = 0;
    for (int i = 0; i < N * N; i++) {
        double e = fabs(got[i] - want[i]);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

typedef int (*generator)(const char *dtype, generated *out, char *err, size_t err_len);

static int compile(generator gen, const char *dtype, void **cubin, size_t *len) {
    generated g;
    char err[4096];
    if (gen(dtype, &g, err, sizeof err) != 0) {
        CHECK(0, "generate %s: %s", dtype, err);
        return -1;
    }
    char *log = NULL;
    nvrtc_resources res;
    int rc = nvrtc_compile_cubin(g.source, g.kernel_name, "sm_90a", NULL, 0, cubin, len, &log, &res,
                                 err, sizeof err);
    CHECK(rc == 0, "compile %s for sm_90a: %s\n%s", g.kernel_name, err, log ? log : "");
    if (rc == 0) {
        CHECK(!log || !strstr(log, "arning"), "ptxas warns on %s:\n%s", g.kernel_name, log);
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

/* ---- the first forward -------------------------------------------------------- */

#define FWD_SMEM (2 * 128 * 128 + 3 * 4 * 128 * 128 + 56 + 1024) /* Q, 3 stages, barriers */

typedef struct fwd_args {
    CUdeviceptr o, lse;
    int64_t o_batch, o_seq, o_head;
    int seqlen_q, seqlen_k, heads_q, group;
    float scale_log2;
} fwd_args;

/* A (B, S, H, 128) tensor's map: boxes of 64 columns x rows, 128-byte swizzle. */
static int encode_bshd(const cuda_driver *cu, CUtensorMap *map, CUdeviceptr data, int dtype, int B,
                       int S, int H, int rows) {
    const cuuint64_t dims[4] = {128, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)H * 256, 256, (cuuint64_t)S * H * 256};
    const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
    return encode_map(cu, map, data, dtype, 4, dims, strides, box);
}

typedef struct fwd_problem {
    int B, Hq, Hkv, Sq, Sk;
    CUdeviceptr q, k, v, o, lse;
} fwd_problem;

static int fwd_launch(const cuda_driver *cu, CUfunction fn, const fwd_problem *f, int dtype) {
    CUtensorMap qm, km, vm;
    if (encode_bshd(cu, &qm, f->q, dtype, f->B, f->Sq, f->Hq, 128) ||
        encode_bshd(cu, &km, f->k, dtype, f->B, f->Sk, f->Hkv, 128) ||
        encode_bshd(cu, &vm, f->v, dtype, f->B, f->Sk, f->Hkv, 128))
        return -1;
    fwd_args a = {f->o, f->lse, (int64_t)f->Sq * f->Hq * 128, (int64_t)f->Hq * 128, 128,
                  f->Sq, f->Sk, f->Hq, f->Hq / f->Hkv, (float)(1.4426950408889634 / sqrt(128.0))};
    void *args[] = {&qm, &km, &vm, &a};
    return cu->cuLaunchKernel(fn, (unsigned)(f->Sq + 127) / 128, (unsigned)f->Hq, (unsigned)f->B,
                              384, 1, 1, FWD_SMEM, NULL, args, NULL) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* Random (B, S, H, 128) values rounded to dtype: the device copy's halves and
 * a (B, H, S, 128) float copy for the reference. */
static uint16_t *fwd_inputs(int dtype, int B, int S, int H, float *bhsd) {
    uint16_t *h = malloc((size_t)B * S * H * 128 * 2);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int hh = 0; hh < H; hh++)
                for (int d = 0; d < 128; d++) {
                    float x = 2.f * rand() / RAND_MAX - 1.f;
                    uint16_t u = dtype ? ref_float_to_bf16(x) : ref_float_to_half(x);
                    h[(((size_t)b * S + s) * H + hh) * 128 + d] = u;
                    bhsd[(((size_t)b * H + hh) * S + s) * 128 + d] =
                        dtype ? ref_bf16_to_float(u) : ref_half_to_float(u);
                }
    return h;
}

static void test_forward(const cuda_driver *cu, void *cubin, int dtype) {
    CUmodule mod;
    CUfunction fn;
    char name[64];
    snprintf(name, sizeof name, "fg_fwd_sm90a_%s_d128", dtype ? "bf16" : "fp16");
    if (cu->cuModuleLoadData(&mod, cubin) || cu->cuModuleGetFunction(&fn, mod, name) ||
        cu->cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, FWD_SMEM)) {
        CHECK(0, "load %s", name);
        return;
    }
    /* correctness: odd lengths, grouped-query heads, Sq != Sk */
    fwd_problem f = {2, 4, 2, 200, 333, 0, 0, 0, 0, 0};
    size_t nq = (size_t)f.B * f.Sq * f.Hq * 128, nk = (size_t)f.B * f.Sk * f.Hkv * 128;
    float *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4), *lowp = malloc(nq * 4);
    double *ref = malloc(nq * 8), *ref_lse = malloc((size_t)f.B * f.Hq * f.Sq * 8);
    uint16_t *qh = fwd_inputs(dtype, f.B, f.Sq, f.Hq, qf), *kh = fwd_inputs(dtype, f.B, f.Sk, f.Hkv, kf),
             *vh = fwd_inputs(dtype, f.B, f.Sk, f.Hkv, vf), *oh = malloc(nq * 2);
    float *lse = malloc((size_t)f.B * f.Hq * f.Sq * 4);
    cu->cuMemAlloc(&f.q, nq * 2);
    cu->cuMemAlloc(&f.k, nk * 2);
    cu->cuMemAlloc(&f.v, nk * 2);
    cu->cuMemAlloc(&f.o, nq * 2);
    cu->cuMemAlloc(&f.lse, (size_t)f.B * f.Hq * f.Sq * 4);
    cu->cuMemcpyHtoD(f.q, qh, nq * 2);
    cu->cuMemcpyHtoD(f.k, kh, nk * 2);
    cu->cuMemcpyHtoD(f.v, vh, nk * 2);
    cu->cuMemsetD8(f.o, 0xFF, nq * 2); /* NaN: rows never written fail */
    int ok = fwd_launch(cu, fn, &f, dtype) == 0 && cu->cuCtxSynchronize() == CUDA_SUCCESS;
    CHECK(ok, "%s: launch", name);
    if (ok) {
        cu->cuMemcpyDtoH(oh, f.o, nq * 2);
        cu->cuMemcpyDtoH(lse, f.lse, (size_t)f.B * f.Hq * f.Sq * 4);
        ref_problem rp = {f.B, f.Hq, f.Hkv, f.Sq, f.Sk, 128, 1 / sqrt(128.0), REF_MASK_NONE,
                          f.Sk - f.Sq, -1, -1, 0, 0, 0, REF_SPARSE_NONE, 0, 0, NULL, 1, 0};
        ref_attention_fp64(&rp, qf, kf, vf, ref, ref_lse);
        ref_attention_lowp(&rp, dtype, qf, kf, vf, lowp);
        double err = 0, base = 0, lse_err = 0;
        for (int b = 0; b < f.B; b++)
            for (int h = 0; h < f.Hq; h++)
                for (int s = 0; s < f.Sq; s++) {
                    size_t r = ((size_t)b * f.Hq + h) * f.Sq + s;
                    lse_err = fmax(lse_err, fabs(lse[r] - ref_lse[r]));
                    for (int d = 0; d < 128; d++) {
                        uint16_t u = oh[(((size_t)b * f.Sq + s) * f.Hq + h) * 128 + d];
                        double g = dtype ? ref_bf16_to_float(u) : ref_half_to_float(u);
                        double e = fabs(g - ref[r * 128 + d]);
                        err = isnan(g) ? INFINITY : fmax(err, e);
                        base = fmax(base, fabs(lowp[r * 128 + d] - ref[r * 128 + d]));
                    }
                }
        printf("%s: max error %.3g (naive %s %.3g), lse %.3g\n", name, err,
               dtype ? "bf16" : "fp16", base, lse_err);
        CHECK(err <= 2 * base, "%s: error %.3g > 2 x %.3g", name, err, base);
        CHECK(lse_err < 1e-3, "%s: lse error %.3g", name, lse_err);
    }
    cu->cuMemFree(f.q);
    cu->cuMemFree(f.k);
    cu->cuMemFree(f.v);
    cu->cuMemFree(f.o);
    cu->cuMemFree(f.lse);
    free(qf), free(kf), free(vf), free(lowp), free(ref), free(ref_lse);
    free(qh), free(kh), free(vh), free(oh), free(lse);

    /* speed: 16k tokens, hidden 2048, seqlen 8192 (the notes' table) */
    fwd_problem t = {2, 16, 16, 8192, 8192, 0, 0, 0, 0, 0};
    size_t n = (size_t)t.B * t.Sq * t.Hq * 128 * 2;
    CUevent start, stop;
    if (!ok || cu->cuMemAlloc(&t.q, n) || cu->cuMemAlloc(&t.k, n) || cu->cuMemAlloc(&t.v, n) ||
        cu->cuMemAlloc(&t.o, n) || cu->cuMemAlloc(&t.lse, (size_t)t.B * t.Hq * t.Sq * 4)) {
        cu->cuModuleUnload(mod);
        return;
    }
    cu->cuMemsetD8(t.q, 0x3C, n); /* any finite values: speed only */
    cu->cuMemsetD8(t.k, 0x3C, n);
    cu->cuMemsetD8(t.v, 0x3C, n);
    cu->cuEventCreate(&start, 0);
    cu->cuEventCreate(&stop, 0);
    for (int i = 0; i < 3; i++) fwd_launch(cu, fn, &t, dtype);
    cu->cuEventRecord(start, NULL);
    for (int i = 0; i < 10; i++) fwd_launch(cu, fn, &t, dtype);
    cu->cuEventRecord(stop, NULL);
    cu->cuEventSynchronize(stop);
    float ms = 0;
    cu->cuEventElapsedTime(&ms, start, stop);
    double tflops = 4.0 * t.B * t.Hq * (double)t.Sq * t.Sk * 128 / (ms / 10 * 1e-3) / 1e12;
    printf("%s: B 2, H 16, S 8192, d 128, non-causal: %.3f ms, %.0f TFLOP/s\n", name, ms / 10,
           tflops);
    cu->cuEventDestroy(start);
    cu->cuEventDestroy(stop);
    cu->cuMemFree(t.q);
    cu->cuMemFree(t.k);
    cu->cuMemFree(t.v);
    cu->cuMemFree(t.o);
    cu->cuMemFree(t.lse);
    cu->cuModuleUnload(mod);
}

int main(void) {
    char err[512];
    if (nvrtc_lib_load(err, sizeof err) != 0) check_skip(err);
    void *cubin[2] = {NULL, NULL}, *forward[2] = {NULL, NULL};
    size_t len[2], forward_len[2];
    const char *dtypes[2] = {"fp16", "bf16"};
    for (int t = 0; t < 2; t++)
        if (compile(generate_probe_sm90a, dtypes[t], &cubin[t], &len[t]) != 0 ||
            compile(generate_fwd_sm90a, dtypes[t], &forward[t], &forward_len[t]) != 0)
            return check_summary("test_sm90a");
    /* FG_SM90A_CUBINS=folder keeps the cubins there, for cuobjdump --dump-sass */
    const char *keep = getenv("FG_SM90A_CUBINS");
    for (int t = 0; keep && t < 2; t++) {
        char path[1024];
        void *bins[2] = {cubin[t], forward[t]};
        size_t lens[2] = {len[t], forward_len[t]};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/%s_%s.cubin", keep, i ? "forward" : "probe", dtypes[t]);
            FILE *f = fopen(path, "wb");
            if (f) {
                fwrite(bins[i], 1, lens[i], f);
                fclose(f);
            }
        }
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
            CUfunction kmajor, mnmajor, registers;
            CHECK(!p.cu->cuModuleLoadData(&mod, cubin[t]) &&
                      !p.cu->cuModuleGetFunction(&kmajor, mod, "fg_probe_b_kmajor") &&
                      !p.cu->cuModuleGetFunction(&mnmajor, mod, "fg_probe_b_mnmajor") &&
                      !p.cu->cuModuleGetFunction(&registers, mod, "fg_probe_a_registers"),
                  "load the %s probe", dtypes[t]);
            /* fp32 sums of 64 products of values below 0.5: far below 1e-3 */
            double e = run(&p, kmajor, t, 1, 16, 1024);
            printf("%s, B (N, K): leading 16, stride 1024: max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 1e-3, "%s, B as (N, K): max error %g", dtypes[t], e);
            /* B as (K, N), one 64-wide swizzle atom along N: the stride offset
             * steps between 8-row groups along K, the leading offset (between
             * atoms along N) is not read; swapping the two must fail. Offsets
             * that leave the tile are not tried: they fault and end the
             * context. */
            const unsigned candidates[][3] = {{16, 1024, 1}, {8192, 1024, 1}, {1024, 16, 0}};
            for (int c = 0; c < 3; c++) {
                e = run(&p, mnmajor, t, 0, candidates[c][0], candidates[c][1]);
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
            e = run(&p, registers, t, 0, 16, 1024);
            printf("%s, A in registers, B (K, N): max error %g\n", dtypes[t], e);
            CHECK(e >= 0 && e < 1e-3, "%s, A in registers: max error %g", dtypes[t], e);
            p.cu->cuModuleUnload(mod);
        }
        p.cu->cuMemFree(p.a);
        p.cu->cuMemFree(p.b);
        p.cu->cuMemFree(p.c);
        for (int t = 0; t < 2; t++) test_forward(p.cu, forward[t], t);
    }
    for (int t = 0; t < 2; t++) {
        free(cubin[t]);
        free(forward[t]);
    }
    return check_summary("test_sm90a");
}
