/* A decoding step's call shape: see kv_cache_call.h. */
#include "families/kv_cache_call.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "families/forward_call.h"

/* The model's figures, measured on an H100 (decode-notes, "v19"): steps
 * reach 94% of the DRAM's peak; a block costs its SM about 1 us past its
 * reads (its start, Q, the last tile's math) and the merge of split parts
 * about 4. */
#define DECODE_DRAM_SHARE 0.94
#define DECODE_BLOCK_US 1.0
#define DECODE_MERGE_US 4.0

/* More splits than the best so far must take less than this share of its
 * time: within the model's error fewer splits merge less. The sweeps fit as
 * well either way (0.993 of the best count); without it 16 latent heads of
 * 16 x 64k on an H200 took 41 splits for 8, 1% apart. */
#define DECODE_MORE_SPLITS_GAIN 0.99

/* Splits past this many generations of blocks gain nothing the model sees
 * (a last generation's shortfall is under 1/16 of the step). */
#define DECODE_MAX_GENERATIONS 16

/* us for a generation of m blocks of kb KB each read at once, j of them on
 * the busiest SM: its SM's reads and the DRAM's, the larger raised where
 * the two are near (their 4-norm: a DRAM-bound step still goes faster with
 * more SMs reading, 128 blocks before 104), and its blocks' fixed costs.
 * GB/s is KB/us; j blocks read at j times one's rate up to the SM's. */
static double generation_us(const kv_cache_shape *x, long long m, long long j, double kb,
                            double dram) {
    double rate = (double)j * x->block_gb_per_s;
    if (rate > x->sm_gb_per_s) rate = x->sm_gb_per_s;
    double sm = (double)j * kb / rate, all = dram > 0 ? (double)m * kb / dram : 0;
    sm *= sm, all *= all;
    return sqrt(sqrt(sm * sm + all * all)) + (double)j * DECODE_BLOCK_US;
}

/* A step's time (us) in s splits of n = s * blocks thread blocks. They
 * start breadth-first (one an SM, then each SM's next place) and free
 * their places together, a generation at a time; a last generation that
 * fills part of the places takes whole SMs, as places free all at once
 * (decode-notes, "v19": 80 blocks in 4 splits, 320 on 264 places, take
 * 18% longer than in 3, 240). */
static double step_us(const kv_cache_shape *x, long long blocks, long long tiles, long long s,
                      int sms, double dram) {
    long long places = (long long)sms * x->blocks_per_sm, n = s * blocks;
    long long full = n / places, last = n % places;
    double kb = (double)((tiles + s - 1) / s) * x->block_n * x->key_bytes / 1e3;
    double us = (double)full * generation_us(x, places, x->blocks_per_sm, kb, dram);
    if (last) {
        long long j = !full ? (last + sms - 1) / sms
                      : last < x->blocks_per_sm ? last : x->blocks_per_sm;
        us += generation_us(x, last, j, kb, dram);
    }
    return us + (s > 1 ? DECODE_MERGE_US : 0);
}

/* The model's count over every split count that is the fewest of its
 * share (1-3 us at 2,048 tiles): kept for the next call of the thread,
 * which a model's next step usually is (the cache's capacity, not its
 * lengths, sets the tiles). */
typedef struct split_choice { /* no padding before splits: compared as bytes */
    long long blocks, tiles;
    kv_cache_shape shape;
    int sm_count, dram_gb_per_s, splits;
} split_choice;

static int chosen_splits(const kv_cache_shape *shape, long long blocks, long long tiles,
                         const fg_profile *prof) {
    long long places = (long long)prof->sm_count * shape->blocks_per_sm;
    long long most = tiles < DECODE_MAX_SPLITS ? tiles : DECODE_MAX_SPLITS;
    double dram = prof->dram_gb_per_s * DECODE_DRAM_SHARE;
    long long best = 1;
    double best_us = step_us(shape, blocks, tiles, 1, prof->sm_count, dram);
    for (long long s = 2, share = tiles; s <= most && s * blocks <= DECODE_MAX_GENERATIONS * places;
         s++) {
        if ((tiles + s - 1) / s == share) continue; /* fewer splits hold the same share */
        share = (tiles + s - 1) / s;
        double us = step_us(shape, blocks, tiles, s, prof->sm_count, dram);
        if (us < best_us * DECODE_MORE_SPLITS_GAIN) best = s, best_us = us;
    }
    return (int)best;
}

int kv_cache_splits(const kv_cache_shape *shape, const fg_forward_args *a, const fg_profile *prof) {
    static _Thread_local split_choice last;
    if (a->num_splits > 0) return a->num_splits;
    split_choice x;
    memset(&x, 0, sizeof x);
    x.shape = *shape;
    x.blocks = (long long)a->batch * a->heads_kv * shape->row_blocks;
    x.tiles = (a->seqlen_k + shape->block_n - 1) / shape->block_n;
    x.sm_count = prof->sm_count, x.dram_gb_per_s = prof->dram_gb_per_s;
    if (last.splits == 0 || memcmp(&x, &last, offsetof(split_choice, splits)) != 0) {
        x.splits = chosen_splits(shape, x.blocks, x.tiles, prof);
        last = x;
    }
    return last.splits;
}

static size_t align_up(size_t x) {
    return (x + FAMILY_WORKSPACE_ALIGN - 1) / FAMILY_WORKSPACE_ALIGN * FAMILY_WORKSPACE_ALIGN;
}

/* The workspace of split calls: lse (splits, B, Hq, Sq), then O (...,
 * value head dim padded). */
typedef struct kv_cache_parts {
    size_t o_offset, bytes;
} kv_cache_parts;

static kv_cache_parts parts_of(const kv_cache_shape *shape, int splits, const fg_forward_args *a) {
    size_t rows = (size_t)splits * a->batch * a->heads_q * a->seqlen_q;
    kv_cache_parts x;
    x.o_offset = align_up(rows * sizeof(float));
    x.bytes = x.o_offset + align_up(rows * shape->head_dim_v_padded * sizeof(float));
    return x;
}

/* Whether a call of `splits` splits takes the kernel whose warps split O's
 * columns (splits of at most columns_tiles tiles), and whether it runs in
 * pairs. */
static int by_columns(const kv_cache_shape *shape, const fg_forward_args *a, int splits) {
    long long tiles = (a->seqlen_k + shape->block_n - 1) / shape->block_n;
    return shape->columns_tiles > 0 && (tiles + splits - 1) / splits <= shape->columns_tiles;
}
static int in_pairs(const kv_cache_shape *shape, const fg_forward_args *a, int splits) {
    return shape->pairs && splits == 2 && !by_columns(shape, a, splits);
}

size_t kv_cache_workspace(const kv_cache_shape *shape, const fg_forward_args *a,
                          const fg_profile *prof) {
    int splits = kv_cache_splits(shape, a, prof);
    return splits == 1 || in_pairs(shape, a, splits) ? 0 : parts_of(shape, splits, a).bytes;
}

/* q (B,Sq,Hq,D), o (B,Sq,Hq,Dv); k, v the cache (B,Sk,Hkv,D|Dv) or pages
 * (P,page,Hkv,D|Dv) */
void kv_cache_arguments(const kv_cache_shape *shape, const fg_spec *spec, const family_call *call,
                        const fg_profile *prof, uint64_t ws, family_args *out) {
    const fg_forward_args *a = call->forward;
    memset(out, 0, sizeof *out);
    fg_decode_params *x = (fg_decode_params *)out->params;
    forward_call_values v;
    forward_call_values_of(spec, a, &v);
    SET_FORWARD_CALL_PARAMS(*x, a, v, call->layout);
    SET_KV_CACHE_PARAMS(*x, a);
    x->group = a->heads_q / a->heads_kv;
    x->rows = a->seqlen_q * x->group;
    x->warps_m = shape->warps_m;
    x->row_blocks = shape->row_blocks;
    x->num_splits = kv_cache_splits(shape, a, prof);
    long long tiles = (a->seqlen_k + shape->block_n - 1) / shape->block_n;
    int columns = by_columns(shape, a, x->num_splits);
    long long blocks = (long long)x->num_splits * x->row_blocks * a->heads_kv * a->batch;
    int counted = 0;
    if (in_pairs(shape, a, x->num_splits)) {
        x->pair_blocks = blocks > INT32_MAX ? -1 : (int)blocks;
        return;
    }
    if (x->num_splits > 1) {
        kv_cache_parts parts = parts_of(shape, x->num_splits, a);
        x->lse_part = ws;
        x->o_part = ws + parts.o_offset;
        long long rows = (long long)a->batch * a->heads_q * a->seqlen_q;
        /* the counted kernels' combining blocks wait for the splits: fewer
         * of them than SMs leave an SM to the splits, whatever the order
         * the GPU starts blocks in, so none waits forever */
        counted = call->split_counters &&
                  (tiles + x->num_splits - 1) / x->num_splits <= shape->counted_tiles &&
                  rows < prof->sm_count;
        if (counted) {
            x->split_counters = call->split_counters;
            blocks += rows;
        } else {
            x->combine_row_warps = shape->head_dim_v_padded <= COMBINE_WARP_COLUMNS &&
                                   x->num_splits <= COMBINE_WARP_SPLITS;
            x->combine_blocks = (int)(x->combine_row_warps
                                          ? (rows + COMBINE_ROWS_A_BLOCK - 1) / COMBINE_ROWS_A_BLOCK
                                          : rows);
        }
    }
    if (blocks > INT32_MAX) blocks = -1; /* (refused: more thread blocks than a grid holds) */
    int *grids[] = {&x->key_blocks, &x->column_blocks, &x->counted_key_blocks,
                    &x->counted_column_blocks};
    *grids[columns + 2 * counted] = (int)blocks;
}
