/* A decoding step's call shape, shared by the families that take one
 * (fwd_decode, fwd_mla): the split count, the split workspace's parts and
 * the launch arguments (fg_decode_params), from the figures of the
 * family's plan and its row blocks. */
#ifndef FG_KV_CACHE_CALL_H
#define FG_KV_CACHE_CALL_H

#include <stddef.h>

#include "families/family.h"
#include "families/forward_call.h"
#include "gen/kernel_params.h"

#define DECODE_MAX_SPLITS 128

/* The combine kernel (lib_kv_cache's combine, which the families' plans
 * hand these as the figures combine_threads and combine_warp_splits):
 * thread blocks of COMBINE_THREADS; a warp a query row, a block's warps'
 * rows each, where the parts' rows are at most 128 columns (4 a lane) and
 * the splits at most COMBINE_WARP_SPLITS (one batch of loads a lane); a
 * block a row otherwise (many splits: its warps share them). */
#define COMBINE_THREADS 128
#define COMBINE_WARP_SPLITS 8
#define COMBINE_WARP_COLUMNS 128
#define COMBINE_ROWS_A_BLOCK (COMBINE_THREADS / 32)

/* GB/s of a cache an SM reads: 31.7 with one block of 96 KB in flight on
 * an H100, 32 with two (decode-notes, "v19"). */
#define DECODE_SM_GB_PER_S 32

/* The cache's fields of launch arguments p (KV_CACHE_PARAMS) from forward
 * arguments a: append_items the new rows (B, seqlen_new, Hkv). */
#define SET_KV_CACHE_PARAMS(p, a)                                                         \
    do {                                                                                  \
        (p).k_new = (uint64_t)(uintptr_t)(a)->k_new.data;                                 \
        (p).v_new = (uint64_t)(uintptr_t)(a)->v_new.data;                                 \
        tensor_strides(&(a)->k_new, &(p).kn_sb, &(p).kn_ss, &(p).kn_sh);                  \
        tensor_strides(&(a)->v_new, &(p).vn_sb, &(p).vn_ss, &(p).vn_sh);                  \
        (p).seqlen_new = (a)->k_new.data ? (a)->seqlen_new : 0;                           \
        (p).cache_seqlens = (uint64_t)(uintptr_t)(a)->cache_seqlens;                      \
        (p).block_table = (uint64_t)(uintptr_t)(a)->block_table;                          \
        (p).block_table_stride = (a)->block_table_stride;                                 \
        (p).page_size = (a)->block_table ? (a)->page_size : 1;                            \
        (p).page_shift = -1;                                                              \
        for (int shift_ = 0; shift_ < 31; shift_++)                                       \
            if ((p).page_size == 1 << shift_) (p).page_shift = shift_;                    \
        (p).num_pages = (a)->block_table ? (a)->num_pages : 1;                            \
        (p).append_items = (int)((long long)(a)->batch * (p).seqlen_new * (a)->heads_kv); \
    } while (0)

/* What the shared code reads of a family's plan and the call's rows. */
typedef struct kv_cache_shape {
    int block_n;           /* keys per tile */
    int key_bytes;         /* bytes of a key's rows in the cache (K and V, or the latent row) */
    int blocks_per_sm;     /* thread blocks an SM holds at once (the plan's shared memory) */
    int block_gb_per_s;    /* GB/s of the cache a block reads alone on its SM */
    int sm_gb_per_s;       /* ... and the SM's blocks together at most */
    int head_dim_v_padded; /* the split parts' O columns */
    int warps_m;           /* warps along a row block's rows */
    int row_blocks;        /* row blocks per (sequence, KV head) */
    int columns_tiles;     /* splits of at most this many tiles split O's columns (0: never) */
    int counted_tiles;     /* given turn counters, splits of at most this many tiles take the
                            * counted kernels, which add the parts themselves (0: never) */
    int pairs;             /* 1: a step of two splits (not split by columns) runs them in
                            * clusters of two, which add their rows themselves (pair_blocks) */
} kv_cache_shape;

/* The split count of a call: num_splits as given, else the count (at most
 * one per key tile, DECODE_MAX_SPLITS, the fewest of a largest share of
 * the tiles) a cost model takes least time for. By the model a step's
 * blocks are read a generation at a time, each about the longer of its
 * busiest SM's reads and the DRAM's, plus its blocks' fixed costs;
 * splits add their merge (kv_cache_call.c, decode-notes "v19"). */
int kv_cache_splits(const kv_cache_shape *shape, const fg_forward_args *a, const fg_profile *prof);

/* The workspace a call needs (0 with one split, and in pairs). */
size_t kv_cache_workspace(const kv_cache_shape *shape, const fg_forward_args *a,
                          const fg_profile *prof);

/* The launch arguments of a call into out (ws: the workspace's address). */
void kv_cache_arguments(const kv_cache_shape *shape, const fg_spec *spec, const family_call *call,
                        const fg_profile *prof, uint64_t ws, family_args *out);

#endif
