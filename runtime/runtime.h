/* Runtime internals: the context, its kernel table, and the calls the
 * runtime's files make of each other. */
#ifndef FG_RUNTIME_H
#define FG_RUNTIME_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "cache/bundle.h"
#include "cache/cache.h"
#include "families/family.h"
#include "flashgen.h"
#include "gen/profile.h"
#include "runtime/cuda_libs.h"
#include "runtime/tools.h"

/* A context's bundles (bundles.c). */
typedef struct bundle_set {
    cache_store *dirs;       /* read-only, searched in order */
    int count;
    int building;            /* 1: every compiled step is also saved in out */
    cache_store out;         /* writable, no size cap: nothing may be evicted */
    bundle_saved_fn saved;
    void *saved_user;
} bundle_set;

/* One generated kernel: found by (family, canonical spec, tiling) in the
 * context's table, so a repeated call does no generation, hashing or disk
 * I/O. */
typedef struct fg_kernel {
    const kernel_family *family;
    fg_spec spec;           /* canonical */
    family_tiling tiling;   /* a tuned tiling; all 0 for the derived plan */
    family_plan plan;
    kernel_target target;
    kernel_launch launch[LAUNCH_MAX]; /* as the template returned them */
    int launch_count;
    fg_kernel_info info;
    CUmodule module;        /* 0 until loaded (offline contexts never load) */
    CUfunction function[LAUNCH_MAX]; /* launch i's entry point */
} fg_kernel;

/* A tuned choice for (pass, spec, sequence-length bucket) on this GPU: a
 * family and its tiling, beside the derived plan's. */
typedef struct tune_choice {
    const kernel_family *family;
    family_tiling tiling;
} tune_choice;

typedef struct tune_entry {
    char spec[96];        /* spec_name */
    fg_pass pass;
    int bucket;           /* tune_bucket */
    tune_choice chosen, derived;
    double derived_ms, chosen_ms, spread;
} tune_entry;

typedef struct tune_table {
    int disabled;         /* fg_context_set_tuning(ctx, 0) or FLASHGEN_TUNING=off */
    int loaded;           /* the file has been read (once per context) */
    tune_entry *entries;
    int count, capacity;
} tune_table;

/* A spec's family for a pass, as family_of found it. */
#define FAMILY_MEMO 4
typedef struct family_memo {
    fg_pass pass;
    fg_spec spec;
    const kernel_family *family; /* NULL: an empty slot */
} family_memo;

/* The walk lists a context keeps (kernel_family.walk_key); calls of more
 * shapes walk without. */
#define WALK_LISTS_KEPT 64

struct fg_context {
    char message[8192];
    fg_profile profile;
    char target[256];
    int live;                  /* 1: a CUDA device; 0: offline named target */
    const cuda_driver *cu;
    int programmatic;          /* launches may be programmatic dependents: cuLaunchKernelEx
                                * and a driver that captures them into graphs (CUDA 12.3) */
    CUdevice device;
    CUcontext cu_context;      /* the device's primary context */
    size_t device_memory;      /* bytes of memory on the device */
    cache_store store;
    int cache_disabled;        /* FLASHGEN_CACHE=off */
    char cache_warning[2048];  /* told to the first compile log: the cache folder, the
                                * environment's values (context.c, bundles.c) */
    fg_kernel *kernels;
    int kernel_count, kernel_capacity;
    char *source;              /* last fg_source result */
    CUdeviceptr workspace;     /* workspace owned by the context (grown on demand) */
    size_t workspace_bytes;
    CUdeviceptr counters;      /* split steps' turn counters beside it, kept at 0 */
    size_t counter_bytes;
    /* walk lists made for calls (kernel_family.walk_key), by key, on the
     * device until the context goes: a captured graph may launch them later */
    struct {
        const kernel_family *family;
        uint64_t key[FAMILY_WALK_KEY_WORDS];
        CUdeviceptr lists;
    } walk_lists[WALK_LISTS_KEPT];
    int walk_lists_kept;
    tune_table tuning;
    fg_compile_log_fn compile_log; /* fg_context_set_compile_log */
    void *compile_log_user;
    bundle_set bundles;        /* read-only bundles searched first; a bundle build's output */
    const kernel_family *families_named[8]; /* FLASHGEN_FAMILIES: the families passes keep to */
    int families_named_count;
    /* family_of's answers for the last FAMILY_MEMO (pass, canonical spec) */
    family_memo family_memo[FAMILY_MEMO];
    int family_memo_next;
    /* A call a family declines runs on the next that takes it (launch.c):
     * the families after `after_of` that support `after_spec`, kept for the
     * last pair asked (a decoding step on sm_90 asks on every call), and
     * the last fallback told to the compile log. */
    const kernel_family *after_of, *after[8];
    fg_spec after_spec;
    int after_count;
    const kernel_family *told_from, *told_to;
    char told_why[512];
    int debug_checks;          /* FLASHGEN_DEBUG=1: checks that read device memory and wait */
};

struct fg_layout {
    fg_context *ctx;
    family_layout lists; /* shape and device lists (int32), a list set per (batch, head):
                          * counts (batch, heads, blocks_q): kept key blocks per query block,
                          * indices (batch, heads, blocks_q, blocks_k): their indices, ascending,
                          * counts_by_key (batch, heads, blocks_k): query blocks keeping each
                          * key block, indices_by_key (batch, heads, blocks_k, blocks_q): their
                          * indices, ascending; a block mask's entries mark full blocks */
    /* a block mask's (fg_block_mask_create; NULL and 0 for a 0/1 layout):
     * the predicate (interned canonical text) its full blocks hold for, and
     * whether it reads b and h (its list sets are then per batch row, per
     * head: calls must have its batch, its heads) */
    const char *mask_mod;
    int per_batch, per_head;
};

/* ---- context.c ---- */

/* Record a message on the context (or the thread's last message when ctx is
 * NULL) and return status. */
fg_status fg_fail(fg_context *ctx, fg_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Make the context's CUDA context current on this thread. */
fg_status fg_make_current(fg_context *ctx);

/* CUDA result -> status with the error string in the message. */
fg_status fg_cuda_check(fg_context *ctx, CUresult r, const char *what);

/* Validate and canonicalize a spec (ctx may be NULL: the thread's message). */
fg_status canonical_spec(fg_context *ctx, const fg_spec *spec, fg_spec *canonical);
/* The same, as a pass builds it: a block mask's build keeps only what its
 * kernel reads (block_mask_spec), so specs differing elsewhere share it. */
fg_status canonical_pass_spec(fg_context *ctx, const fg_spec *spec, fg_pass pass,
                             fg_spec *canonical);

/* The families that may run a pass here, in the table's order: those for
 * the target's arch, narrowed to the ones FLASHGEN_FAMILIES names when it
 * names any of this pass. Returns the count (at most max). */
int context_families(const fg_context *ctx, fg_pass pass, const kernel_family **out, int max);

/* The families after f among context_families that support a canonical
 * spec: those a call f declines may run on. Returns the count. */
int families_after(const fg_context *ctx, const kernel_family *f, const fg_spec *canonical,
                   const kernel_family **out, int max);

/* "forward", "backward", "block_mask": tuning.tsv and bundle manifests. */
const char *pass_name(fg_pass pass);

/* The family that runs a pass of a canonical spec on this context's target:
 * the first of context_families that supports it. */
fg_status family_of(fg_context *ctx, const fg_spec *canonical, fg_pass pass,
                    const kernel_family **family);

/* ---- kernels.c: the kernel table ---- */

/* Find or build the kernel of a family for a canonical spec, with the
 * derived plan or a named tiling (NULL: derived); with load, also load it on
 * the device (live contexts only). */
fg_status kernels_get(fg_context *ctx, const kernel_family *family, const fg_spec *spec,
                      const family_tiling *tiling, int load, fg_kernel **out);

/* Release loaded modules. */
void kernels_release(fg_context *ctx);

/* ---- binary.c: a kernel's cubin, from a bundle, the user's cache or NVRTC ---- */

/* For generated source g of kernel k (plan and launches set): the cubin, in
 * *image inside *owned (free it), with k->info's compile report filled. */
fg_status binary_get(fg_context *ctx, fg_kernel *k, const generated *g, void **owned,
                     const void **image);

/* Payloads (the compile report, then the cubin): pack, and unpack to the
 * cubin when the payload is whole and holds the kernel k->info names. */
void *binary_pack(const fg_kernel_info *info, const void *cubin, size_t cubin_len, size_t *len);
const void *binary_unpack(const void *payload, size_t len, fg_kernel_info *info);

/* ---- compile.c: NVRTC ---- */

/* Compile k's source with NVRTC: the cubin (malloc'ed) and the report in
 * k->info; logs the compile (fg_context_set_compile_log). */
fg_status compile_cubin(fg_context *ctx, fg_kernel *k, const generated *g, void **cubin,
                        size_t *cubin_len);

/* ---- module.c ---- */

/* Load a cubin and find k's entry points. */
fg_status module_load(fg_context *ctx, fg_kernel *k, const void *cubin);

/* ---- bundles.c ---- */

/* FLASHGEN_BUNDLE_PATH at context creation (folders that are not bundles
 * are passed over), and freeing them. */
fg_status bundles_from_env(fg_context *ctx);
void bundles_release(fg_context *ctx);

/* The portable key of a source: the cache key with no NVRTC version. */
void bundles_key(const char *source, const kernel_target *target, char key[65]);

/* The first bundle holding kernel k under key, its cubin in *image inside
 * *owned; NULL-image when none does. Damaged entries, and entries holding
 * another kernel than planned, are passed over. */
void bundles_lookup(fg_context *ctx, fg_kernel *k, const char *key, void **owned,
                    const void **image);

/* Bundle builds: save a step's payload under its portable key and report it. */
fg_status bundles_save(fg_context *ctx, const fg_kernel *k, const char *key, const void *payload,
                       size_t len);

/* ---- call.c: validation ---- */

fg_status check_tensor(fg_context *ctx, const char *name, const fg_tensor *t, int head_dim);
fg_status check_forward_args(fg_context *ctx, const fg_spec *canonical, const fg_forward_args *a);
fg_status check_backward_args(fg_context *ctx, const fg_spec *canonical, const fg_backward_args *a);
/* What a block mask's build reads of a forward call: the shape, positions
 * and aux tensors. */
fg_status check_block_mask_args(fg_context *ctx, const fg_spec *canonical, const fg_forward_args *a);
/* Zero the float aux tensors' gradients the call asks for (d_aux), on its
 * stream: the backward adds into them. */
fg_status clear_aux_gradients(fg_context *ctx, const fg_spec *canonical, const fg_backward_args *a);

/* ---- launch.c ---- */

/* A validated call of kernel k's pass: forward args, and backward args for a
 * backward pass. */
family_call call_of(const fg_spec *spec, const fg_forward_args *forward,
                    const fg_backward_args *backward);

/* Bytes of workspace kernel k needs for a call. */
size_t launch_workspace(fg_context *ctx, const fg_kernel *k, const family_call *call);

/* One launch of function f as l describes it (threads, shared memory,
 * cluster) over a grid of `grid` thread blocks; programmatic: as a
 * programmatic dependent of the stream's previous launch. */
fg_status launch_one(fg_context *ctx, CUfunction f, const kernel_launch *l, int64_t grid,
                     CUstream stream, void **params, int programmatic);

/* Launch kernel k (loaded) for a validated call; the workspace is the
 * caller's (workspace, bytes) or, when NULL, the context's. */
fg_status launch_call(fg_context *ctx, const fg_kernel *k, const fg_spec *canonical,
                      const family_call *call, void *workspace, size_t workspace_bytes);

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

/* The tuned choice for a call of a pass (tune_store.c), or NULL for the
 * derived plan (tuning off, or nothing tuned for this GPU, spec and bucket).
 * No timing. */
const tune_choice *tune_lookup(fg_context *ctx, fg_pass pass, const fg_spec *canonical, int seqlen);

/* Keep a choice in the context and, when the cache folder is writable, in
 * tuning.tsv; *persisted says which. Returns FG_OK or FG_ERR_OUT_OF_MEMORY. */
fg_status tune_keep(fg_context *ctx, const tune_entry *e, int *persisted);

/* The checks fg_tune and fg_tuned share: context, out, spec and pass. */
fg_status tune_args(fg_context *ctx, const fg_spec *spec, fg_pass pass, const void *out,
                    fg_spec *canonical, const kernel_family **family);

/* The public report of a kept entry. */
void tune_report_of(fg_context *ctx, const fg_spec *canonical, const tune_entry *e,
                    fg_tune_report *out);

void tune_release(fg_context *ctx);

#endif
