/* A decoding step's call shape: see kv_cache_call.h. */
#include "families/kv_cache_call.h"

#include <stdint.h>
#include <string.h>

#include "families/forward_call.h"

int kv_cache_splits(const kv_cache_shape *shape, const fg_forward_args *a, const fg_profile *prof) {
    if (a->num_splits > 0) return a->num_splits;
    long long blocks = (long long)a->batch * a->heads_kv * shape->row_blocks;
    long long resident = (long long)prof->sm_count * (shape->wave_per_sm > 0 ? shape->wave_per_sm : 1);
    long long tiles = (a->seqlen_k + shape->block_n - 1) / shape->block_n;
    long long most = tiles < DECODE_MAX_SPLITS ? tiles : DECODE_MAX_SPLITS;
    if (blocks * 5 >= resident * 4 || most <= 1) return 1;
    /* s splits fill s * blocks of their waves' slots, a share that grows with
     * s within a wave: each wave's best is its most splits. The fewest
     * splits at 0.95 of the best share (as fractions: this runs on every
     * call) */
    long long waves = (most * blocks + resident - 1) / resident;
    long long best_n = 0, best_slots = 1;
    for (long long w = 1; w <= waves; w++) {
        long long top = w * resident / blocks < most ? w * resident / blocks : most;
        if (top * blocks * best_slots > best_n * w * resident)
            best_n = top * blocks, best_slots = w * resident;
    }
    long long s = most;
    for (long long w = 1, below = 0; w <= waves; w++) {
        long long top = w * resident / blocks < most ? w * resident / blocks : most;
        long long num = 19 * best_n * w * resident, den = 20 * blocks * best_slots;
        long long at = (num + den - 1) / den; /* in w waves */
        if (at <= below) at = below + 1;
        if (at <= top) {
            s = at;
            break;
        }
        below = top;
    }
    /* then, within its waves, the fewest splits whose largest share of
     * the tiles is the smallest those waves allow: a step takes as long as
     * its longest split (64 tiles: 64 splits of one, not 61 with three of
     * two) */
    long long room = (s * blocks + resident - 1) / resident * resident / blocks;
    if (room > most) room = most;
    long long share = (tiles + room - 1) / room, fewest = (tiles + share - 1) / share;
    return (int)(fewest > s ? fewest : s);
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

size_t kv_cache_workspace(const kv_cache_shape *shape, const fg_forward_args *a,
                          const fg_profile *prof) {
    int splits = kv_cache_splits(shape, a, prof);
    return splits == 1 ? 0 : parts_of(shape, splits, a).bytes;
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
    int columns = shape->columns_tiles > 0 &&
                  (tiles + x->num_splits - 1) / x->num_splits <= shape->columns_tiles;
    long long blocks = (long long)x->num_splits * x->row_blocks * a->heads_kv * a->batch;
    int counted = 0;
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
            x->combine_rows = (int)rows;
        }
    }
    if (blocks > INT32_MAX) blocks = -1; /* (refused: more thread blocks than a grid holds) */
    int *grids[] = {&x->key_blocks, &x->column_blocks, &x->counted_key_blocks,
                    &x->counted_column_blocks};
    *grids[columns + 2 * counted] = (int)blocks;
}
