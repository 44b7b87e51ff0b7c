/* flashgen: exact attention with CUDA kernels generated for the problem at hand.
 *
 * One header. Every call returns an fg_status; on failure the context keeps a
 * message naming the argument and the reason (fg_context_message). Calls that
 * have no context yet (fg_context_create) leave their message in
 * fg_last_message(), which is per thread. The library never prints or exits.
 *
 * Tensors are device pointers with strides in elements for batch, sequence
 * and head; the last (head-dim) dimension is contiguous. (B,S,H,D) and
 * (B,H,S,D) are both expressed through strides.
 */
#ifndef FLASHGEN_H
#define FLASHGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHGEN_VERSION "0.1.0"

/* The library is built with its symbols hidden; FG_API marks the functions
 * libflashgen.so exports, which are these and no others. */
#if defined(__GNUC__)
#define FG_API __attribute__((visibility("default")))
#else
#define FG_API
#endif

typedef enum fg_status {
    FG_OK = 0,
    FG_ERR_INVALID_ARGUMENT, /* a bad value, pointer, shape or stride */
    FG_ERR_UNSUPPORTED,      /* valid request this target cannot run (bf16 on sm_75) */
    FG_ERR_NO_DEVICE,        /* no CUDA driver or device, or the context is offline */
    FG_ERR_CUDA,             /* a CUDA driver call failed; message has its error string */
    FG_ERR_COMPILE,          /* NVRTC rejected generated source; message has the log */
    FG_ERR_TEMPLATE,         /* a template failed; message names file:line */
    FG_ERR_CACHE,            /* the kernel cache could not be used */
    FG_ERR_OUT_OF_MEMORY,
    FG_ERR_INTERNAL
} fg_status;

FG_API const char *fg_status_name(fg_status status);

/* The library's version, FLASHGEN_VERSION as it was built (a program may
 * run with another copy of the shared library than it was compiled with). */
FG_API const char *fg_version(void);

/* ---- what a kernel is specialized on ------------------------------------ */

typedef enum fg_dtype { FG_FP16 = 0, FG_BF16 = 1 } fg_dtype;

typedef enum fg_mask {
    FG_MASK_NONE = 0,
    FG_MASK_CAUSAL = 1, /* key j visible to query i iff j <= i + align offset */
    FG_MASK_WINDOW = 2  /* i + off - left <= j <= i + off + right (sizes at launch) */
} fg_mask;

typedef enum fg_sparsity {
    FG_SPARSE_NONE = 0,
    FG_SPARSE_LAYOUT = 1,   /* runtime 0/1 block matrix (fg_layout) */
    FG_SPARSE_BUTTERFLY = 2 /* block (i,j) kept iff i^j in {0} U {2^k : k < factors} */
} fg_sparsity;

/* User expressions' auxiliary tensors: what a score or mask expression may
 * read as name[i] .. name[i, j, k]. Declared in the spec (the expression is
 * type-checked against them), passed at launch (fg_forward_args.aux). */
#define FG_MAX_AUX 8
typedef enum fg_aux_type { FG_AUX_F32 = 0, FG_AUX_I32 = 1 } fg_aux_type;
typedef struct fg_aux_decl {
    const char *name;  /* [A-Za-z_][A-Za-z0-9_]*, at most 32 characters, not a reserved name */
    fg_aux_type type;  /* float32 or int32 elements */
    int rank;          /* 1..3 indices */
} fg_aux_decl;

/* spec.kv_cache's value for a latent cache: each cached token one row of
 * head_dim (a multiple of 16 up to 576) columns, read as the key, whose
 * first head_dim_v (a multiple of 32 up to 512, at most head_dim) columns
 * are also its value. fg_forward_args.k is the cache (as a KV cache's k),
 * v and v_new are unused (data NULL), k_new its new rows. No softcap,
 * alibi, sinks or expressions. */
#define FG_KV_LATENT 2

typedef struct fg_spec {
    fg_dtype dtype;
    int head_dim;          /* 1..256; non-multiples of 8 are padded inside the kernel */
    fg_mask mask;
    int dropout;           /* 0 or 1; the probability is a launch argument */
    fg_sparsity sparsity;
    int sparse_block_q;    /* sparse block rows (queries), multiple of 16; layout/butterfly */
    int sparse_block_k;    /* sparse block columns (keys), multiple of 16 */
    int butterfly_factors; /* butterfly only: 0..30 */
    int varlen;            /* 0 or 1: sequences of their own lengths packed along the
                              sequence dimension (fg_forward_args.cu_seqlens_q, ...) */
    int kv_cache;          /* 0; 1: a decoding step over a KV cache (fg_forward_args.
                              cache_seqlens, block_table, k_new, ...): forward only, head dim a
                              multiple of 8, no dropout, sparsity or varlen; FG_KV_LATENT: one
                              over a latent cache, K alone, whose first head_dim_v columns are V
                              (multi-head latent attention, DeepSeek's 576/512) */
    /* Variants of the scores (the logits). Compiled in; their values are
     * launch arguments (fg_forward_args), so a new value never recompiles.
     * With s = softmax_scale·q·k the score of query i and key j, a row's
     * softmax sees
     *   t = softcap·tanh(s / softcap)          (softcap: the cap first)
     *       − slope[b,h]·|i + off − j|         (alibi: then the bias; off the
     *                                           mask's diagonal offset)
     * over its visible keys and, with sinks, one more term exp(sink[h]) in
     * the denominator only (a key with no value). The log-sum-exp the
     * forward writes is that of the t it normalized, the sink included. */
    int softcap; /* 0 or 1 */
    int alibi;   /* 0 or 1 */
    int sinks;   /* 0 or 1 */
    /* The value head dim Dv: the width of V, O, dO and dV rows, 1..256; 0
     * (or head_dim) for the same as head_dim, which stays the width of Q,
     * K, dQ and dK rows (S = Q·Kᵀ sums over head_dim, O = P·V has Dv
     * columns). Compiled in: specs that differ only in it never share a
     * kernel. The mma.sync families (sm_75 and later) take any pair their
     * tiles fit on the target, refusing the rest with both dims named; the
     * Hopper families take any pair; decoding steps (kv_cache) a Dv that
     * is a multiple of 8, as head_dim must be. (It sits where the struct
     * had padding: its size and every other offset are those of the struct
     * without it.) */
    int head_dim_v;
    /* User expressions (docs/expressions.md has the language): NULL or ""
     * for none. A score modifier rewrites each visible score,
     *   t = score_mod(s, b, h, q, k, seqlen_q, seqlen_k, aux...)
     * (a number; -inf hides the key); a mask predicate hides key k from
     * query q where it is false, beside spec.mask and sparsity. b is the
     * batch row (with packed sequences the sequence, with a KV cache the
     * cache row), h the query head, q and k the query's and the key's index
     * within their sequence (plus fg_forward_args.position_q/_k), seqlen_q
     * and seqlen_k that sequence's lengths (a decoding step's keys include
     * the new rows). Ints are 32-bit and wrap; '/' divides as floats;
     * x % 0 is 0; a read outside an aux tensor gives 0. Kernels evaluate in
     * float32, the backward with the derivative in s the generator derives.
     * A score modifier replaces softcap and alibi (write them in it); sinks
     * combine with both. The canonical text (parsed, re-printed) is what a
     * kernel is specialized on: spellings that parse alike share a kernel. */
    const char *score_mod;
    const char *mask_mod;
    int aux_count;               /* 0..FG_MAX_AUX */
    fg_aux_decl aux[FG_MAX_AUX]; /* the tensors the expressions may read */
} fg_spec;

/* A spec with defaults: fp16, mask none, no dropout, dense. */
FG_API fg_spec fg_spec_default(int head_dim, fg_dtype dtype);

/* ---- context ------------------------------------------------------------ */

typedef struct fg_context fg_context;

/* target: NULL or "" for a CUDA device (ordinal from FLASHGEN_DEVICE,
 * default 0), "cuda:N" for device N, or a named target for offline generation:
 * "t4", "a100", "rtx3090", "l4", "h100". An offline context plans, generates
 * and compiles but launching returns FG_ERR_NO_DEVICE. */
FG_API fg_status fg_context_create(fg_context **out, const char *target);
FG_API void fg_context_destroy(fg_context *ctx);
FG_API const char *fg_context_message(const fg_context *ctx);
FG_API const char *fg_last_message(void);
/* Short description of the target: "h100 (sm_90, 132 SMs, 227 KiB smem/block)". */
FG_API const char *fg_context_target(const fg_context *ctx);
FG_API int fg_context_arch(const fg_context *ctx); /* 75, 80, 86, 89, 90 */

/* Called with one line for each kernel compiled by NVRTC (never for a cache
 * hit), so a cold start shows instead of looking like a hang:
 *   "flashgen: compiled fg_fwd_sm90_bf16_d128_causal_m128n32w4 for sm_90 in 431 ms
 *    (254 registers, 0 bytes spilled)"   (one line)
 * (the kernel name holds pass, arch, spec and tiling). fn NULL turns it off.
 * The first log installed on a context is also told, once, what went wrong
 * in setting it up without failing it, in one line that starts
 * "flashgen: warning: " (an unusable cache folder, a FLASHGEN_BUNDLE_PATH
 * entry that is not a bundle, a FLASHGEN_CACHE or FLASHGEN_TUNING value other
 * than "off"; several are joined by "; ").
 * The command-line tool logs to stderr when FLASHGEN_COMPILE_LOG=1, and
 * always prints the warnings. */
typedef void (*fg_compile_log_fn)(const char *line, void *user);
FG_API void fg_context_set_compile_log(fg_context *ctx, fg_compile_log_fn fn, void *user);

/* Add a bundle: a read-only folder of precompiled kernels made by
 * `flashgen bundle build` (DIR/manifest.tsv, DIR/sm_<arch>/<key>.fgc).
 * Kernels are looked up in the context's bundles first, in the order added
 * (those named by FLASHGEN_BUNDLE_PATH, colon-separated, come first), then in
 * the user's cache, then compiled. A kernel found in a bundle loads with no
 * NVRTC call: NVRTC is only loaded when the bundles miss, so a program that
 * uses only bundled kernels runs where NVRTC is absent. A damaged entry, or
 * one for another arch or generator version, is never loaded (it is a miss).
 * Returns FG_ERR_INVALID_ARGUMENT when dir is not a folder with a
 * manifest.tsv that `flashgen bundle verify` would accept as one (its
 * first line this version's, every line well formed); the manifest is read
 * here, the kernels only when one is looked up. */
FG_API fg_status fg_context_add_bundle(fg_context *ctx, const char *dir);

/* ---- block-sparse layouts ------------------------------------------------ */

typedef struct fg_layout fg_layout;

/* mask: host array of 0/1 bytes, shape (heads, blocks_q, blocks_k), row-major;
 * heads is 1 (shared by all query heads) or the number of query heads.
 * Block sizes come from the spec. The runtime builds per-query-block lists of
 * kept key blocks once and uploads them; the layout is reused across calls. */
FG_API fg_status fg_layout_create(fg_context *ctx, const uint8_t *mask, int heads,
                                  int blocks_q, int blocks_k, fg_layout **out);
FG_API void fg_layout_destroy(fg_layout *layout);

/* ---- forward -------------------------------------------------------------- */

typedef enum fg_causal_align {
    FG_ALIGN_BOTTOM_RIGHT = 0, /* default: offset Sk - Sq, last query sees all keys */
    FG_ALIGN_TOP_LEFT = 1      /* offset 0: query i sees keys 0..i (PyTorch is_causal) */
} fg_causal_align;

typedef struct fg_tensor {
    void *data;           /* device pointer */
    int64_t stride_batch; /* in elements */
    int64_t stride_seq;
    int64_t stride_head;
    int64_t stride_dim;   /* must be 1: the head dim is contiguous */
} fg_tensor;

/* Dense tensors in the two common layouts. */
FG_API fg_tensor fg_tensor_bshd(void *data, int seqlen, int heads, int head_dim); /* (B,S,H,D) */
FG_API fg_tensor fg_tensor_bhsd(void *data, int seqlen, int heads, int head_dim); /* (B,H,S,D) */

typedef struct fg_aux_tensor {
    const void *data;
    int64_t size[3];
    int64_t stride[3];
} fg_aux_tensor;

/* Shapes: D is spec.head_dim, Dv spec.head_dim_v (D when 0). */
typedef struct fg_forward_args {
    fg_tensor q;       /* (B, Sq, Hq, D) via strides */
    fg_tensor k;       /* (B, Sk, Hkv, D) */
    fg_tensor v;       /* (B, Sk, Hkv, Dv) */
    fg_tensor o;       /* (B, Sq, Hq, Dv) output */
    float *lse;        /* (B, Hq, Sq) fp32 output, contiguous; NULL to skip */
    int batch;
    int heads_q;
    int heads_kv;      /* heads_q must be a multiple */
    int seqlen_q;
    int seqlen_k;
    float softmax_scale; /* 0 means 1/sqrt(head_dim) (D, the query/key head dim) */
    fg_causal_align align;
    int window_left;   /* window mask: keys visible left of the diagonal; -1 unbounded */
    int window_right;  /* ... right of it; -1 unbounded */
    float dropout_p;   /* 0..1, needs spec.dropout; resolved to 1/256 (docs/c-library.md) */
    uint64_t seed;
    uint64_t offset;
    const fg_layout *layout; /* FG_SPARSE_LAYOUT only */
    void *stream;      /* CUstream; NULL for the default stream */
    /* spec.varlen: `batch` sequences packed along the sequence dimension.
     * q, o (and dO, dQ) are (total_q, Hq, D or Dv) and k, v (and dK, dV)
     * (total_k, Hkv, D or Dv) through their sequence and head strides (the
     * batch stride is not used); sequence b holds query rows cu_seqlens_q[b] ..
     * cu_seqlens_q[b+1]-1 and key rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1,
     * of which it sees the first seqused_k[b] (all when seqused_k is NULL).
     * seqlen_q and seqlen_k are the longest sequence's rows (they size the
     * launch), lse is (Hq, total_q). Masks are aligned per sequence (bottom
     * right: key j is on query i's diagonal when j - i = its keys - its
     * queries), and dropout keeps what a dense batch keeps at (b, h, i, j)
     * with i, j counted from the sequence's start. A sequence may be empty.
     * The backward writes zeros into dK, dV rows no sequence sees and dQ
     * rows past the last sequence. The arrays are int32 in device memory;
     * they are checked to be increasing and within the tensors, and the
     * lengths within seqlen_q/seqlen_k, only when the context's debug checks
     * are on (FLASHGEN_DEBUG=1): the check reads them back and waits. */
    const int32_t *cu_seqlens_q; /* (batch + 1): first row of each sequence, then the end */
    const int32_t *cu_seqlens_k; /* (batch + 1) */
    const int32_t *seqused_k;    /* (batch) or NULL */
    int total_q, total_k;        /* rows of the packed tensors */
    /* spec.kv_cache: a decoding step. q and o are (B, Sq, Hq, D) as in a
     * dense call, with few queries per sequence (Sq x Hq / Hkv up to 64 rows
     * per KV head fill one thread block; more take several). k and v are
     * the cache: (B, seqlen_k, Hkv, D) through their strides, or with a
     * block_table a pool of pages (num_pages, page_size, Hkv, D) whose batch
     * stride is the page stride. Key j of sequence b is then row
     * j % page_size of page block_table[b * block_table_stride +
     * j / page_size]; any page size >= 1. seqlen_k is the keys a sequence
     * may hold (at most block_table_stride x page_size with pages).
     * Sequence b sees its first cache_seqlens[b] keys (seqlen_k when NULL)
     * and then, with k_new, the seqlen_new rows of k_new and v_new
     * (B, seqlen_new, Hkv, D), which the call first writes into the cache
     * at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1
     * (cache_seqlens is not changed). Masks are aligned per sequence as
     * with packed sequences. The KV length is split over num_splits thread
     * blocks per (sequence, KV head) (0: chosen from the GPU's size and the
     * call) whose partial O and log-sum-exp are merged in fp32; the parts
     * live in the workspace (fg_forward_workspace_size; NULL: the
     * context's, as for the backward). seqlen_new past seqlen_k is refused
     * on every call. cache_seqlens and block_table are in device memory:
     * the kernels clamp block table entries to the pool and lengths to
     * seqlen_k (new rows past it are not written: nothing outside the cache
     * is touched, but the step is wrong); entries past the pool and lengths
     * that with seqlen_new pass seqlen_k are refused, naming the argument,
     * only with the context's debug checks (FLASHGEN_DEBUG=1), which read
     * them back and wait. */
    const int32_t *cache_seqlens; /* (batch) or NULL */
    const int32_t *block_table;   /* (batch, block_table_stride) or NULL: no pages */
    int block_table_stride;       /* entries per sequence */
    int page_size;                /* rows per page */
    int num_pages;                /* pages in the pool */
    fg_tensor k_new, v_new;       /* (B, seqlen_new, Hkv, D); data NULL: none */
    int seqlen_new;
    int num_splits;               /* 0: chosen; 1: no split */
    void *workspace;              /* NULL: owned by the context */
    size_t workspace_bytes;
    /* A split step's turn counters: int32 in device memory, one per query
     * row (batch x heads_q x seqlen_q), all 0 before the first call given
     * them. With them a short split step (fewer query rows than the GPU has
     * SMs, splits of a few key tiles) is one launch: thread blocks after
     * the splits' add the parts into o and lse, a query row each, once the
     * row's splits have counted themselves done there; otherwise a second
     * kernel adds them. Every call leaves them 0 for the next; calls that
     * run at once (other streams) need counters of their own. NULL: the
     * context's, kept beside its workspace, where the workspace is the
     * context's too. The debug checks (FLASHGEN_DEBUG=1) read them back and
     * refuse any not 0. */
    int32_t *split_counters;
    /* A dense call over a block of a longer sequence (context parallelism:
     * one block of the longer call's attention matrix): the positions of q's
     * row 0 and of k's row 0 in it (default 0). Masks see query row i at
     * position_q + i and key j at position_k + j (the alignment's offset
     * still comes from this call's seqlen_q and seqlen_k: top-left, or equal
     * lengths, puts the diagonal where the longer call has it), and dropout
     * keeps what the longer call keeps there. Not with packed sequences, a
     * KV cache or sparsity; with dropout, position_q must be a multiple of
     * 16 and position_k of 32 (the tiles dropout draws for). Each plus its
     * length stays below 2^31 - 4096, and together they put keys at most
     * 2^31 - 4096 from a query's diagonal (2^30 - 1024 under a window
     * mask). */
    int64_t position_q, position_k;
    /* The variants' values (fg_spec.softcap, .alibi, .sinks; ignored
     * without them). alibi_slopes and sinks are fp32 device arrays. */
    float softcap;              /* the cap, > 0 and finite */
    const float *alibi_slopes;  /* (Hq), or (B, Hq) with alibi_stride_batch */
    int64_t alibi_stride_batch; /* elements between batch rows: 0 for (Hq), Hq for (B, Hq) */
    const float *sinks;         /* (Hq): each head's sink logit, natural-log units */
    /* spec.aux: the auxiliary tensors, in the spec's order: device memory of
     * the declared element type, size[d] elements along index d and
     * stride[d] elements between them (>= 0; 0 broadcasts); the elements
     * number, and the last one's offset is, below 2^31. Unused dimensions
     * past the rank are ignored. */
    fg_aux_tensor aux[FG_MAX_AUX];
} fg_forward_args;

/* Defaults: scale 0 (1/sqrt d), bottom-right, windows -1, no dropout, no layout,
 * no packed sequences, no KV cache arguments. */
FG_API fg_forward_args fg_forward_args_default(void);

FG_API fg_status fg_forward(fg_context *ctx, const fg_spec *spec, const fg_forward_args *args);

/* A block mask: a layout built on the device from spec's mask predicate
 * (spec.mask_mod, with spec.sparsity FG_SPARSE_LAYOUT giving the block
 * sizes). For each block of queries and keys the predicate is evaluated on
 * its elements inside the sequences: a block where it holds nowhere is left
 * out of the lists (the kernels never visit it), one where it holds
 * everywhere is marked full (the kernels skip the predicate there), the rest
 * are tested element by element as without a block mask. args gives what
 * the predicate sees: batch, heads_q, seqlen_q, seqlen_k, aux and stream
 * (the build is queued on it; q, k, v, o and the other fields are not
 * read). The layout has a list set per batch row only where the predicate
 * reads b, per head only where it reads h. Use it with calls of a spec with
 * the same mask_mod and block sizes (refused otherwise), the same lengths
 * (batch and heads as above) and the aux tensors it was built from: it holds
 * their contents at the time of the build, so build it again when they
 * change. Reusable across calls and layers; destroy with fg_layout_destroy. */
FG_API fg_status fg_block_mask_create(fg_context *ctx, const fg_spec *spec,
                                      const fg_forward_args *args, fg_layout **out);

/* Bytes of workspace a forward call needs (0 for all but split decoding
 * steps, spec.kv_cache). */
FG_API fg_status fg_forward_workspace_size(fg_context *ctx, const fg_spec *spec,
                                           const fg_forward_args *args, size_t *bytes);

/* ---- backward --------------------------------------------------------------- */

/* Gradients of the forward call described by `forward` (the same spec, the
 * same arguments: q, k, v, o as it wrote it, lse as it wrote it (required),
 * scale, mask, dropout seed and offset, layout, stream). dq, dk and dv are
 * written with their own strides; for GQA/MQA dk and dv are summed over the
 * query heads that share a key/value head. The attention matrix is
 * recomputed on chip, never stored.
 *
 * Schedules: deterministic = 0 adds dQ from every key block with fp32
 * atomics (fastest; the order of additions, and so the last bits of dq, can
 * vary between runs). deterministic = 1 gives each thread block a fixed list
 * of key blocks and its own fp32 dQ slice, added to by one thread per element
 * and summed in a fixed order: dq, dk and dv are bitwise identical from run
 * to run on the same GPU. It uses as few slices as keep the GPU as busy as
 * the fast schedule does.
 *
 * Workspace: fp32 row statistics and the dQ accumulator,
 * fg_backward_workspace_size bytes. Pass it in `workspace` (device memory,
 * 256-byte aligned), or leave it NULL and the context allocates one, keeps
 * it and grows it as needed (freed by fg_context_destroy). A context-owned
 * workspace is shared by every call through that context, so such calls on
 * different streams must not overlap; pass your own to run them
 * concurrently. */
typedef struct fg_backward_args {
    fg_forward_args forward; /* the forward call; its o and lse are inputs here */
    fg_tensor d_o;           /* (B, Sq, Hq, Dv): gradient of the output */
    fg_tensor d_q;           /* (B, Sq, Hq, D) output */
    fg_tensor d_k;           /* (B, Sk, Hkv, D) output */
    fg_tensor d_v;           /* (B, Sk, Hkv, Dv) output */
    int deterministic;       /* 0: fast (atomic dQ), 1: bitwise reproducible */
    void *workspace;         /* NULL: owned by the context */
    size_t workspace_bytes;
    /* spec.sinks: the gradient of the sink logits, (Hq) fp32 in device
     * memory, written (not added to): dσ_h = −Σ_(b,i) e^(σ_h − lse)·D with
     * D = rowsum(dO∘O), summed in a fixed order (bitwise reproducible in
     * either schedule). NULL: not computed. */
    float *d_sinks;
    /* spec.score_mod: the gradients of the float aux tensors the score
     * modifier reads, fp32 device memory, contiguous (row-major over the
     * aux tensor's sizes), written (zeroed first, then every read's
     * dL/dt·∂t/∂read added with fp32 atomics: the order, and so the last
     * bits, can vary between runs even with deterministic = 1). NULL: not
     * computed. */
    float *d_aux[FG_MAX_AUX];
} fg_backward_args;

/* Bytes of workspace a backward call needs (shapes and schedule only). */
FG_API fg_status fg_backward_workspace_size(fg_context *ctx, const fg_spec *spec,
                                            const fg_backward_args *args, size_t *bytes);

FG_API fg_status fg_backward(fg_context *ctx, const fg_spec *spec, const fg_backward_args *args);

/* ---- offline generation and inspection ------------------------------------ */

typedef enum fg_pass {
    FG_PASS_FORWARD = 0,
    FG_PASS_BACKWARD = 1, /* one module: row statistics, the main kernel, dQ */
    FG_PASS_BLOCK_MASK = 2 /* a block mask's build (fg_block_mask_create): not tuned */
} fg_pass;

typedef struct fg_plan_info {
    int block_m;       /* Br: query rows per thread block (backward: per step) */
    int block_n;       /* Bc: keys per inner iteration (backward: per thread block) */
    int warps;
    int stages;        /* forward: K/V buffers; backward: Q/dO buffers */
    int head_dim_padded;
    int smem_bytes;
    int threads;
    char kernel_name[128];
    char why[1024];    /* how the figures were derived */
} fg_plan_info;

/* The plan derived from the target's shared memory and registers. If ptxas
 * spills with it, fg_compile re-plans with smaller tiles; its info.plan
 * (and info.plan.why) says which tiles the kernel finally uses. */
FG_API fg_status fg_plan(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_plan_info *out);

/* Generated CUDA source for the spec on this context's target. *source is
 * owned by the context and valid until the next call on it. */
FG_API fg_status fg_source(fg_context *ctx, const fg_spec *spec, fg_pass pass, const char **source);

typedef struct fg_kernel_info {
    fg_plan_info plan;
    int registers;
    int spill_bytes;   /* spill stores + loads reported by ptxas */
    int stack_bytes;
    int smem_static;
    double compile_ms; /* 0 when the kernel came from a cache */
    int from_cache;    /* 0 compiled, 1 disk cache, 2 memory, 3 a bundle (no NVRTC) */
    char cache_path[512];
} fg_kernel_info;

/* Generate and compile (or find in the cache) the kernel of a pass. For the
 * backward, registers and spills are those of the main kernel. */
FG_API fg_status fg_compile(fg_context *ctx, const fg_spec *spec, fg_pass pass,
                            fg_kernel_info *out);

/* ---- auto-tuning ------------------------------------------------------------ */

/* The planner derives a plan from the GPU's shared memory and registers;
 * tuning times tilings around it on the live GPU and keeps one only if it
 * beats the derived plan by more than the measured run-to-run spread (ties
 * go to the derived plan, so two tuning runs pick alike). Choices are kept
 * per (GPU name, arch, driver version, NVRTC version, pass, spec,
 * sequence-length bucket) in tuning.tsv in the kernel cache folder, and later
 * calls of that pass, spec and bucket use them with no timing. The bucket of
 * a call is that of seqlen_k: the smallest power of two >= it, from 512
 * (lengths 1..512) to 32768 (every length above 16384). A tuned backward
 * plan may change fg_backward_workspace_size: ask for it after tuning. */
typedef struct fg_tune_report {
    int seqlen_bucket;
    int candidates;        /* tilings timed, the derived one included */
    int chosen_is_derived; /* no candidate won by more than the spread */
    fg_plan_info derived, chosen;
    double derived_ms, chosen_ms; /* medians of the timed runs */
    double spread;         /* relative run-to-run spread measured */
    int persisted;         /* 0: kept in this context only (no writable cache folder) */
} fg_tune_report;

/* Tune the kernel of a pass (FG_PASS_FORWARD or FG_PASS_BACKWARD) of spec
 * for seqlen's bucket now: compiles the candidates (each checked against the
 * derived plan's output: O, or dQ, dK and dV), times them on fresh random
 * inputs of 16k tokens (or seqlen, if longer) with hidden size 2048, warm-up
 * and interleaved repetitions, and keeps the choice. The backward is timed
 * with the fast schedule; its choice serves both schedules. */
FG_API fg_status fg_tune(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                         fg_tune_report *out);

/* The choice kept for spec and seqlen's bucket on this GPU: *found is 0 when
 * none was tuned (the derived plan is used). No timing. */
FG_API fg_status fg_tuned(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                          fg_tune_report *out, int *found);

/* on = 0: calls use the derived plans and ignore tuned choices. Default: on,
 * unless the environment has FLASHGEN_TUNING=off. */
FG_API void fg_context_set_tuning(fg_context *ctx, int on);

#ifdef __cplusplus
}
#endif
#endif
