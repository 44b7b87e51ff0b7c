/* Runtime internals shared by context.c, kernels.c, layout.c and forward.c. */
#ifndef FG_RUNTIME_H
#define FG_RUNTIME_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "cache/bundle.h"
#include "cache/cache.h"
#include "flashgen.h"
#include "gen/plan.h"
#include "gen/profile.h"
#include "runtime/cuda_libs.h"

/* A context's bundles (bundles.c). */
/* Called for each kernel a bundle build saves (sha256 and versions filled
 * in, step left empty for the caller, which knows which step was kept). */
typedef void (*bundle_saved_fn)(const bundle_entry *entry, void *user);

typedef struct bundle_set {
    cache_store *dirs;       /* read-only, searched in order */
    int count;
    int building;            /* 1: every compiled step is also saved in out */
    cache_store out;         /* writable, no size cap: nothing may be evicted */
    bundle_saved_fn saved;
    void *saved_user;
} bundle_set;

/* One generated kernel: found by canonical spec in the context's table, so a
 * repeated call does no generation, hashing or disk I/O. */
typedef struct fg_kernel {
    fg_pass pass;
    fg_spec spec;          /* canonical */
    plan_tiling tiling;    /* a tuned tiling; all 0 for the derived plan */
    fg_fwd_plan plan;      /* forward */
    fg_bwd_plan bwd_plan;  /* backward */
    fg_kernel_info info;
    CUmodule module;       /* 0 until loaded (offline contexts never load) */
    CUfunction function;   /* the forward kernel, or the backward's main kernel */
    CUfunction pre, post;  /* backward: D = rowsum(dO∘O); dQ from its fp32 accumulator */
} fg_kernel;

/* A tuned choice for (spec, pass, sequence-length bucket) on this GPU. */
typedef struct tune_entry {
    char spec[96];        /* spec_name */
    int pass;
    int bucket;           /* tune_bucket */
    plan_tiling chosen, derived;
    double derived_ms, chosen_ms, spread;
} tune_entry;

typedef struct tune_table {
    int disabled;         /* fg_context_set_tuning(ctx, 0) or FLASHGEN_TUNING=off */
    int loaded;           /* the file has been read (once per context) */
    tune_entry *entries;
    int count, capacity;
} tune_table;

struct fg_context {
    char message[8192];
    fg_profile profile;
    char target[256];
    int live;                  /* 1: a CUDA device; 0: offline named target */
    const cuda_driver *cu;
    CUdevice device;
    CUcontext cu_context;      /* the device's primary context */
    size_t device_memory;      /* bytes of memory on the device */
    cache_store store;
    int cache_disabled;        /* FLASHGEN_CACHE=off */
    char cache_warning[512];
    fg_kernel *kernels;
    int kernel_count, kernel_capacity;
    char *source;              /* last fg_source result */
    CUdeviceptr workspace;     /* backward workspace owned by the context (grown on demand) */
    size_t workspace_bytes;
    tune_table tuning;
    fg_compile_log_fn compile_log; /* fg_context_set_compile_log */
    void *compile_log_user;
    bundle_set bundles;        /* read-only bundles searched first; a bundle build's output */
};

/* Record a message on the context (or the thread's last message when ctx is
 * NULL) and return status. */
fg_status fg_fail(fg_context *ctx, fg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Make the context's CUDA context current on this thread. */
fg_status fg_make_current(fg_context *ctx);

/* CUDA result -> status with the error string in the message. */
fg_status fg_cuda_check(fg_context *ctx, CUresult r, const char *what);

/* Find or build the kernel of a pass for a canonical spec, with the derived
 * plan or (forward only) a given tiling; with load, also load it on the
 * device (live contexts only). */
fg_status kernels_get(fg_context *ctx, fg_pass pass, const fg_spec *spec,
                      const plan_tiling *tiling, int load, fg_kernel **out);

/* Release loaded modules. */
void kernels_release(fg_context *ctx);

/* Bundles (bundles.c): FLASHGEN_BUNDLE_PATH at context creation (folders
 * that are not bundles are passed over), and freeing them. */
fg_status bundles_from_env(fg_context *ctx);
void bundles_release(fg_context *ctx);

/* Bundle builds (cli/bundle.c): from now on every step compile_plan
 * compiles or reads from the user's cache is also saved in dir under its
 * portable key and reported to saved; bundles are then not searched, so each
 * entry's NVRTC version is known. */
fg_status bundles_build_into(fg_context *ctx, const char *dir, bundle_saved_fn saved, void *user);

/* Check a spec can run on the context's arch (bf16 needs sm_80). */
fg_status check_spec_for_target(fg_context *ctx, const fg_spec *canonical);

/* Validation shared by the forward and the backward (forward.c). */
fg_status check_tensor(fg_context *ctx, const char *name, const fg_tensor *t, int head_dim);
fg_status check_forward_args(fg_context *ctx, const fg_spec *canonical, const fg_forward_args *a);

/* Kernel arguments both passes derive from a forward call. */
typedef struct launch_values {
    int32_t diag_offset;      /* key j is on query i's diagonal when j == i + diag_offset */
    float softmax_scale;
    float scale_log2;         /* softmax_scale * log2(e) */
    uint32_t drop_threshold4; /* the 8-bit threshold in every byte: keep iff draw >= it */
    float out_scale;          /* 1/(1-p) for the threshold used; 1 without dropout */
    uint32_t philox_keys[20]; /* the dropout stream's round keys */
} launch_values;
void launch_values_of(const fg_spec *canonical, const fg_forward_args *a, launch_values *out);

/* A tensor's batch, sequence and head strides into three params fields. */
static inline void tensor_strides(const fg_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh) {
    *sb = t->stride_batch, *ss = t->stride_seq, *sh = t->stride_head;
}

/* Set the kernel arguments both passes take from a forward call `f` on
 * either params struct (fg_fwd_params and fg_bwd_params name them alike):
 * q, k, v, o and lse with their strides, shapes, scales, dropout, layout shape. */
#define SET_FORWARD_CALL_PARAMS(p, f, lv)                                          \
    do {                                                                           \
        (p).q = (uint64_t)(uintptr_t)(f)->q.data;                                  \
        (p).k = (uint64_t)(uintptr_t)(f)->k.data;                                  \
        (p).v = (uint64_t)(uintptr_t)(f)->v.data;                                  \
        (p).o = (uint64_t)(uintptr_t)(f)->o.data;                                  \
        (p).lse = (uint64_t)(uintptr_t)(f)->lse;                                   \
        tensor_strides(&(f)->q, &(p).q_sb, &(p).q_ss, &(p).q_sh);                  \
        tensor_strides(&(f)->k, &(p).k_sb, &(p).k_ss, &(p).k_sh);                  \
        tensor_strides(&(f)->v, &(p).v_sb, &(p).v_ss, &(p).v_sh);                  \
        tensor_strides(&(f)->o, &(p).o_sb, &(p).o_ss, &(p).o_sh);                  \
        (p).seed = (f)->seed, (p).offset = (f)->offset;                            \
        (p).batch = (f)->batch, (p).heads_q = (f)->heads_q;                        \
        (p).heads_kv = (f)->heads_kv;                                              \
        (p).seqlen_q = (f)->seqlen_q, (p).seqlen_k = (f)->seqlen_k;                \
        (p).diag_offset = (lv).diag_offset;                                        \
        (p).window_left = (f)->window_left, (p).window_right = (f)->window_right;  \
        (p).softmax_scale = (lv).softmax_scale, (p).scale_log2 = (lv).scale_log2;  \
        (p).drop_threshold4 = (lv).drop_threshold4;                                \
        (p).out_scale = (lv).out_scale;                                            \
        memcpy((p).philox_keys, (lv).philox_keys, sizeof (p).philox_keys);         \
        if ((f)->layout) {                                                         \
            (p).layout_heads = (f)->layout->heads;                                 \
            (p).layout_blocks_q = (f)->layout->blocks_q;                           \
            (p).layout_blocks_k = (f)->layout->blocks_k;                           \
        }                                                                          \
    } while (0)

/* ---- tuning ---- */

#define TUNE_MAX_CANDIDATES 16
#define TUNE_MAX_ROUNDS 64

/* One timed run of candidate i in milliseconds, or < 0 if it failed. */
typedef double (*tune_time_fn)(void *user, int candidate);

typedef struct tune_outcome {
    int n;
    int chosen;                          /* 0: the derived plan */
    int failed[TUNE_MAX_CANDIDATES];     /* did not run (or ran wrong) */
    double median[TUNE_MAX_CANDIDATES];  /* ms */
    double spread;                       /* relative run-to-run spread */
} tune_outcome;

/* Time n candidates (0 = the derived plan) in interleaved rounds after
 * warm-up runs and choose (tune_select.c). Returns 0, or -1 when the derived
 * plan failed or the counts are out of range. */
int tune_measure(int n, tune_time_fn time, void *user, int warmup, int rounds,
                 tune_outcome *out);

/* The selection rule alone: the index chosen from medians and the spread. */
int tune_select(int n, const double *median, const int *failed, double spread);

/* Sequence lengths are tuned by bucket: the smallest power of two >= the
 * length, from 512 up to 32768 (which holds everything longer). */
int tune_bucket(int seqlen);

/* The tuned tiling for a call of a pass, or NULL for the derived plan
 * (tuning off, or nothing tuned for this GPU, spec and bucket). No timing. */
const plan_tiling *tune_lookup(fg_context *ctx, fg_pass pass, const fg_spec *canonical, int seqlen);

void tune_release(fg_context *ctx);

/* Launch a backward kernel for a validated call (backward.c). */
fg_status backward_launch(fg_context *ctx, const fg_spec *canonical, const fg_backward_args *a,
                          const fg_kernel *k);

/* Launch a forward kernel for a validated call (forward.c). */
fg_status forward_launch(fg_context *ctx, const fg_spec *canonical, const fg_forward_args *a,
                         const fg_kernel *k);

struct fg_layout {
    fg_context *ctx;
    int heads, blocks_q, blocks_k;
    CUdeviceptr counts;  /* int32 (heads, blocks_q): kept key blocks per query block */
    CUdeviceptr indices; /* int32 (heads, blocks_q, blocks_k): their indices, ascending */
    CUdeviceptr counts_by_key;  /* int32 (heads, blocks_k): query blocks keeping each key block */
    CUdeviceptr indices_by_key; /* int32 (heads, blocks_k, blocks_q): their indices, ascending */
};

#endif
