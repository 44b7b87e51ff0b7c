/* fwd_decode: planning (see fwd_decode.h), generation and launch arguments. */
#include "families/fwd_decode.h"

#include <stdio.h>
#include <string.h>

#include "families/mma_sync.h"
#include "gen/plan.h"
#include "gen/spec.h"

#define DECODE_WARPS 4
#define DECODE_SMEM_RESERVED 1024 /* what the driver keeps of an SM's shared memory per block */

/* Elements of a shared-memory row of `padded` elements. Rows of a multiple
 * of 64 are not padded: the kernel swizzles their 16-byte chunks
 * within each 128 bytes (chunk k of row r at k ^ (r & 7)), which keeps
 * ldmatrix free of bank conflicts and each copied 32-byte sector whole in
 * shared memory. Padded rows (16 bytes past a multiple of 32) split
 * sectors, and L2 then serves half as many sectors again as the copies
 * need. */
static int decode_row(int padded) {
    return padded % 64 == 0 ? padded : padded + PLAN_SMEM_ROW_PAD;
}

/* A warp's 16-key sub-tiles of a tile that it takes side by side, one
 * softmax over them: where the block's warps share one warp's rows (at
 * most 16) and a tile has more sub-tiles than warps (wide tiles of 128
 * keys: two), so that a warp's products overlap and its softmax and loop
 * are paid once for them (decode-notes, "v23"); else 1. */
static int decode_side(const fwd_decode_tiling *t) {
    int side = t->block_n / (16 * DECODE_WARPS);
    return t->max_rows == 16 && side > 1 ? side : 1;
}

/* Q, the larger of the ring and the merge, the tiles' pages; Q and K rows
 * dpad wide, V and O rows dvpad, the merge's O 64 columns at a time. */
static int decode_smem(const fwd_decode_tiling *t, int dpad, int dvpad) {
    int row = decode_row(dpad) * 2, row_v = decode_row(dvpad) * 2;
    int ring = t->stages * t->block_n * (row + row_v);
    int cols = dvpad < 64 ? dvpad : 64;
    int merge = DECODE_WARPS * 16 * (cols + 4 + 2) * 4; /* each warp's O, m and l */
    return t->max_rows * row + (ring > merge ? ring : merge) + t->stages * t->block_n * 4;
}

/* Where a pair's slots start in the ring (bytes; 0: no pairs). On sm_90
 * a step of two splits runs them as a cluster of two blocks that add their
 * rows from each other's shared memory (kernel_fwd_decode's pair_end):
 * each block's rows, normalised O and lse2, lie in the ring past the
 * merge's largest (all of O's columns in one round), where the ring holds
 * both. */
static int pair_at(const fwd_decode_tiling *t, int dpad, int dvpad, const fg_profile *prof) {
    int ring = t->stages * t->block_n * 2 * (decode_row(dpad) + decode_row(dvpad));
    int merge = DECODE_WARPS * 16 * (dvpad + 4 + 2) * 4, slots = t->max_rows * (dvpad + 1) * 4;
    return prof->arch >= 90 && merge + slots <= ring ? merge : 0;
}

/* Two splits' tiles past the SMs at d 128 (two_splits_past_sms): 64 keys
 * for up to 16 rows in two stages, room for three blocks an SM. */
static const fwd_decode_tiling two_split_tiles = {64, 16, 2};
static int same_tiling(const fwd_decode_tiling *x, const fwd_decode_tiling *y) {
    return x->block_n == y->block_n && x->max_rows == y->max_rows && x->stages == y->stages;
}

static int fill(fwd_decode_plan *plan, const fg_spec *spec, const fg_profile *prof,
                const fwd_decode_tiling *t, char *err, size_t err_len) {
    const int dpad = spec_head_dim_padded(spec), dvpad = spec_head_dim_v_padded(spec);
    memset(plan, 0, sizeof *plan);
    if (t->block_n < 16 || t->block_n > 128 || t->block_n % 16 || (t->max_rows != 16 &&
        t->max_rows != 32 && t->max_rows != 64) || t->stages < 2 || t->stages > 4) {
        snprintf(err, err_len, "plan: decoding tiling Bc %d, rows %d, %d stages is not supported "
                 "(Bc a multiple of 16 up to 128, rows 16, 32 or 64, 2..4 stages)",
                 t->block_n, t->max_rows, t->stages);
        return -1;
    }
    int smem = decode_smem(t, dpad, dvpad);
    if (smem > prof->smem_per_block) {
        snprintf(err, err_len, "plan: decoding tiling Bc %d, rows %d, %d stages needs %d bytes of "
                 "shared memory (over %d on %s)", t->block_n, t->max_rows, t->stages, smem,
                 prof->smem_per_block, prof->name);
        return -1;
    }
    plan->block_n = t->block_n;
    plan->max_rows = t->max_rows;
    plan->stages = t->stages;
    plan->warps = DECODE_WARPS;
    plan->side = decode_side(t);
    plan->threads = 32 * plan->warps;
    plan->head_dim_padded = dpad;
    plan->smem_row = decode_row(dpad);
    plan->head_dim_v_padded = dvpad;
    plan->smem_row_v = decode_row(dvpad);
    plan->smem_bytes = smem;
    plan->blocks_per_sm = prof->smem_per_sm / (smem + DECODE_SMEM_RESERVED);
    /* the blocks an SM the kernel's registers leave room for (its launch
     * bound): three for the two splits' tiles, planned for three (at most
     * 168 registers a thread), else one */
    plan->min_blocks = same_tiling(t, &two_split_tiles) && plan->blocks_per_sm >= 3 ? 3 : 1;
    plan->max_splits = DECODE_MAX_SPLITS;
    plan->combine_threads = COMBINE_THREADS;
    plan->combine_warp_splits = COMBINE_WARP_SPLITS;
    plan->pair_at = pair_at(t, dpad, dvpad, prof);
    return 0;
}

/* The largest Bc, then the most rows, then the most stages that fit: first
 * among the tilings that leave room for two thread blocks per SM (twice
 * the warps to hide the latencies of a block's copies and block-table
 * reads), then among all. */
static int plan_derived(const fg_spec *spec, const fg_profile *prof, fwd_decode_plan *plan,
                        char *err, size_t err_len) {
    static const int block_ns[] = {64, 32, 16}, rows[] = {64, 32, 16};
    for (int want = 2; want >= 1; want--)
        for (int b = 0; b < 3; b++)
            for (int r = 0; r < 3; r++)
                for (int stages = 4; stages >= 2; stages--) {
                    fwd_decode_tiling t = {block_ns[b], rows[r], stages};
                    char why[256];
                    if (fill(plan, spec, prof, &t, why, sizeof why) != 0 || plan->blocks_per_sm < want)
                        continue;
                    snprintf(plan->why, sizeof plan->why,
                             "Decoding: 4 warps share each tile of Bc = %d keys; up to %d query "
                             "rows (the query heads of one KV head) per thread block; %d stages "
                             "of K and V in flight: %d bytes of shared memory of %d, %d block(s) "
                             "per SM. The KV length is split over thread blocks until they fill "
                             "the GPU.\n",
                             t.block_n, t.max_rows, t.stages, plan->smem_bytes,
                             prof->smem_per_block, plan->blocks_per_sm);
                    return 0;
                }
    snprintf(err, err_len, "plan: no decoding tiling of head dim %d (value head dim %d) fits %d "
             "bytes of shared memory on %s", spec->head_dim, spec_head_dim_v(spec),
             prof->smem_per_block, prof->name);
    return -1;
}

/* ---- the call's shape ---- */

/* Warps along the rows (the rest split each tile's keys), and row blocks. */
static void row_split(const fwd_decode_plan *plan, const fg_forward_args *a, int *warps_m,
                      int *row_blocks) {
    int rows = a->seqlen_q * (a->heads_q / a->heads_kv);
    int wm = rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
    if (wm > plan->max_rows / 16) wm = plan->max_rows / 16;
    *warps_m = wm;
    *row_blocks = (rows + 16 * wm - 1) / (16 * wm);
}

/* DRAM bandwidth per SM (GB/s) from which one block an SM no longer streams
 * its keys as fast as two, however many: an H200's 36.5, not an H100's 25.4
 * (decode-notes, "v12"). */
#define DECODE_TWO_BLOCKS_GB_PER_SM 30

/* Whether an SM's share of the GPU's DRAM bandwidth is an H200's. */
static int dram_rich(const fg_profile *prof) {
    return prof->dram_gb_per_s >= DECODE_TWO_BLOCKS_GB_PER_SM * prof->sm_count;
}

/* Tiles a split up to which, given turn counters, a step takes the counted
 * kernel (one launch): a short step's host time is more than its kernel's,
 * and its launches are most of it (32/8 heads over 4k keys: 16 splits of 4
 * tiles; 2 x 4k: 8 of 8, 3 us less host time a call); a longer one's
 * blocks run beside the waiting combining blocks (decode-notes, "v13",
 * "v18"). */
#define DECODE_COUNTED_TILES 8

/* The bytes in flight (a block's ring) with which one block reads at the
 * SM's full rate on an H100: three stages of 64 keys at d 128. A smaller
 * ring reads at its share of it (d 64's four stages of 16 KB: about 20
 * GB/s a block; decode-notes, "v19"). */
#define DECODE_FULL_RATE_RING_BYTES (96 * 1024)

/* The shape the shared call code reads: the plan's figures and the call's
 * row blocks. A block alone reads at the SM's rate, or at its ring's share
 * of it, and at most half of it where a tile is gathered from pages shorter
 * than it, where the SM's share of DRAM bandwidth is more than an H100's,
 * and where blocks of more than one warp's rows take splits of at most 8
 * tiles to fill the SMs' places (their starts and merges weigh), as two
 * blocks an SM read faster there than one (decode-notes, "v7", "v10",
 * "v12", "v18", "v19"). Where warps share rows, splits of one tile split
 * O's columns among them rather than the keys, which saves their merge
 * (decode-notes, "v10"). */
static kv_cache_shape shape_of(const fwd_decode_plan *plan, const fg_forward_args *a,
                               const fg_profile *prof) {
    /* 16-bit K and V rows */
    kv_cache_shape x = {plan->block_n, 2 * (plan->head_dim_padded + plan->head_dim_v_padded),
                        plan->blocks_per_sm, 0, DECODE_SM_GB_PER_S, plan->head_dim_v_padded,
                        0, 0, 0, 0, 0};
    row_split(plan, a, &x.warps_m, &x.row_blocks);
    long long ring = (long long)plan->stages * plan->block_n * x.key_bytes;
    x.block_gb_per_s = ring >= DECODE_FULL_RATE_RING_BYTES
                           ? x.sm_gb_per_s
                           : (int)(x.sm_gb_per_s * ring / DECODE_FULL_RATE_RING_BYTES);
    long long tiles = (a->seqlen_k + plan->block_n - 1) / plan->block_n;
    long long blocks = (long long)a->batch * a->heads_kv * x.row_blocks;
    int short_splits = tiles * blocks <= 8LL * prof->sm_count * plan->blocks_per_sm;
    if (((a->block_table && a->page_size < plan->block_n) || dram_rich(prof) ||
         (x.warps_m > 1 && short_splits)) &&
        x.block_gb_per_s > x.sm_gb_per_s / 2)
        x.block_gb_per_s = x.sm_gb_per_s / 2;
    if (x.block_gb_per_s < 1) x.block_gb_per_s = 1;
    if (x.warps_m < plan->warps) x.columns_tiles = 1;
    x.counted_tiles = DECODE_COUNTED_TILES;
    x.pairs = plan->pair_at > 0;
    return x;
}

/* ---- the family interface ---- */

_Static_assert(sizeof(fwd_decode_plan) <= sizeof(family_plan), "fwd_decode_plan outgrew family_plan");
_Static_assert(sizeof(fwd_decode_tiling) <= sizeof(family_tiling), "tiling outgrew family_tiling");
_Static_assert(sizeof(fg_decode_params) <= FAMILY_PARAMS_MAX, "fg_decode_params outgrew family_args");

static const fwd_decode_plan *plan_of(const family_plan *p) { return (const fwd_decode_plan *)p->bytes; }

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    if (spec->kv_cache != 1) {
        snprintf(err, err_len, "fwd_decode runs decoding steps over a KV cache only (spec.kv_cache "
                 "1; a latent cache is fwd_mla's)");
        return -1;
    }
    return mma_sync_supports(spec, prof, err, err_len);
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    (void)budget; /* O is the only large accumulator: nothing to shrink */
    return plan_derived(spec, prof, (fwd_decode_plan *)out->bytes, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    fwd_decode_tiling x;
    family_tiling_unpack(t, &x, sizeof x);
    fwd_decode_plan *p = (fwd_decode_plan *)out->bytes;
    if (fill(p, spec, prof, &x, err, err_len) != 0) return -1;
    snprintf(p->why, sizeof p->why, "Tuned decoding tiling: Bc = %d, up to %d rows, %d stages.\n",
             x.block_n, x.max_rows, x.stages);
    return 0;
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    static const fwd_decode_tiling c[] = {{64, 64, 4}, {64, 64, 3}, {64, 64, 2}, {32, 64, 4},
                                          {128, 64, 2}, {64, 16, 4}};
    int n = 0;
    for (size_t i = 0; i < sizeof c / sizeof c[0] && n < max; i++) {
        fwd_decode_plan p;
        char err[256];
        if (fill(&p, spec, prof, &c[i], err, sizeof err) == 0) family_tiling_pack(&out[n++], &c[i], sizeof c[i]);
    }
    return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    fwd_decode_tiling x = {plan_of(p)->block_n, plan_of(p)->max_rows, plan_of(p)->stages};
    family_tiling_pack(t, &x, sizeof x);
}

/* Wide tiles (128 keys, each warp's two 16-key sub-tiles side by side:
 * decode_side) for a step of one split over a contiguous cache, at most 16
 * rows a unit (a KV head of a sequence): a block of 64-key tiles alone on
 * its SM is held by its products' latencies, not its reads (28 GB/s a
 * block at d 128, a bare read of the same rows 36); a warp's two sub-tiles'
 * products overlap, their softmax and the loop paid once. The tiles'
 * stages, returned (0: not wide): three, but two (three blocks an SM) at
 * d 64 past the SMs on an H100, and on an H200 past the steps three stages
 * take there (below). Measured on an H100, graph us a cache a call (decode-notes,
 * "v21"-"v24"; 64-key tiles -> wide):
 * - d 128 (192 KB, one block an SM), units filling half to 5/8 of the
 *   SMs: 32/8 10 x 1k 21.9 -> 18.5, 10 x 4k 63.4 -> 60.1, 8/1 80 x 4k 65.1
 *   -> 60.6, 8/1 72 x 2k 33.9 -> 29.9; not at 96 units (12 x 4k: the DRAM
 *   sets the pace, 69.5 -> 76.8) nor over pages (10 x 4k in pages of 16
 *   64.7 -> 79.0, measured with 8 warps a wide tile);
 * - d 128 past twice the SMs to 16/5 of them, where the 64-key tiles take
 *   up to 4 splits (their merge) or leave a last generation of two blocks
 *   an SM part full: 32/8 36 x 1k 60.9 -> 57.9, 44 x 1k 72.5 -> 66.7,
 *   48 x 1k 78.0 -> 71.5, 44 x 2k 134.3 -> 125.2, 48 x 4k 274.0 -> 263.3,
 *   36 x 16k 799.7 -> 781.3, 8/1 288 x 2k 114.8 -> 107.1, 64/8 48 x 1k
 *   83.4 -> 72.2; not at 256 units (32 x 1k 48.9 -> 49.9) nor 432 (54 x 1k
 *   81.0 -> 83.0); one loss inside: 40 x 8k 446.4 -> 461.6;
 * - d 64, units filling 8/11 of the SMs to all: 32/8 12 x 1k 16.0 -> 12.7,
 *   12 x 4k 41.9 -> 37.4, 14 x 16k 169.3 -> 154.1, 16 x 4k 53.8 -> 46.7;
 *   and to three times them over 4k keys or more: 18 x 4k 60.8 -> 56.0,
 *   24 x 4k 78.6 -> 71.0, 32 x 4k 93.5 -> 90.9, 34 x 4k 110.7 -> 96.1,
 *   48 x 4k 141.7 -> 138.5, 24 x 16k 286.1 -> 265.2, 8/1 144 x 4k 61.3 ->
 *   55.0; not past the SMs over 1k keys (18 x 1k 17.4 -> 18.0) nor at 64
 *   units (8 x 16k 93.1 -> 107.9).
 * Where the SM's share of DRAM bandwidth is an H200's, the DRAM has room for
 * a wide block on every SM: d 128 from more than half the SMs to all of
 * them, over up to 4k keys, or any keys from 3/4 of them. Measured on an
 * H200, graph us a cache a call, alternating processes (decode-notes,
 * "v25"): 32/8 9 x 1k 16.4-16.5 -> 14.8, 10 x 4k 46.3 -> 43.5-43.6, 12 x 4k
 * 56.7-56.8 -> 50.9-51.0, 16 x 8k 128.4-129.8 -> 124.8-125.2, 16 x 16k
 * 251.6-253.3 -> 243.7-244.0, 8/1 96 x 4k 61.2-62.0 -> 52.0, 128/128 1 x 4k
 * 67.6-67.9 -> 65.0-65.2; not at 64 units (8/1 64 x 2k 23.7 -> 25.1), 48 (6
 * x 4k 30.6 -> 42.7) or 160 (20 x 4k 89.7 -> 107.0). Longer steps of fewer
 * units stay split, two blocks an SM: 9 x 16k takes 146.5 in three splits,
 * where one wide block a unit at its 9 x 4k rate (about 50 GB/s) would take
 * about 170 (not measured).
 * d 64 on an H200 (decode-notes, "v26"): from 8/11 of the SMs to all over up
 * to 2k keys, or any keys from 3/4 of them: 32/8 12 x 2k 18.6-19.0 ->
 * 17.8-18.0, 14 x 1k 14.0 -> 11.5, 16 x 4k 37.8-38.2 -> 34.4-34.6, 14 x 16k
 * 113.2-114.2 -> 110.4-110.5, 8/1 128 x 2k 25.0-25.1 -> 20.2-20.3, 120 x 16k
 * 122.3-122.5 -> 115.1-115.3; and past 5/4 of them to three times over 4k
 * keys or more: 24 x 4k 54.3-56.0 -> 52.2-53.4, 40 x 4k 90.6-91.1 ->
 * 80.4-81.2, 8/1 200 x 8k 110.7-111.3 -> 100.1-100.3; not at 64 units (8 x
 * 4k 22.4-22.8 -> 30.2-30.7) nor at 72-96 over 2k keys or more (9 x 2k 16.1
 * -> 17.4, 12 x 16k 102.4-102.7 -> 109.4-110.1). Past the SMs in three
 * stages (two blocks an SM: one generation up to twice the SMs; two stages
 * hold too few bytes in flight there, 32/8 18 x 4k 45.7-46.0 -> 48.2-48.7)
 * up to 5/3 of them over up to 2k keys, 4/3 over up to 4k, and from 7/6 to
 * 4/3 over more ("v33"): 32/8 17 x 1k 15.8-16.0 -> 13.8-14.1, 22 x 1k
 * 17.7-18.1 -> 15.4-15.5, 24 x 2k 30.0-30.2 -> 27.6-27.7, 8/1 200 x 2k
 * 31.3-32.0 -> 28.7-29.0, 18 x 4k 43.1-43.7 -> 42.5-42.6, 22 x 4k
 * 50.2-50.6 -> 47.1-47.3, 20 x 8k 86.2 -> 82.2-82.6, 22 x 16k 181.7-182.7
 * -> 171.0-172.1; not at 224 units over 1-2k keys (28 x 2k 31.5-32.2 ->
 * 31.7-32.0), 192 over 4k or more (24 x 8k 98.3-98.4 -> 98.6-98.9) nor 144
 * to 152 over 8k or more (18 x 8k 78.3-79.0 -> 79.9, 19 x 16k 153.6 ->
 * 156.4). */
static int wide_tiles(const fg_spec *spec, const fg_profile *prof, const fg_forward_args *a,
                      int64_t units) {
    int d = spec_head_dim_padded(spec), sms = prof->sm_count, keys = a->seqlen_k;
    if (d != spec_head_dim_v_padded(spec) || a->num_splits > 1 || keys < 1024 || a->block_table)
        return 0;
    /* past the SMs at d 64: two stages, three blocks an SM */
    int two_stages_past_sms = d == 64 && units > sms && units <= 3 * sms && keys >= 4096;
    if (dram_rich(prof)) {
        if (units <= sms) {
            if (d == 128) return 2 * units > sms && (keys <= 4096 || 4 * units >= 3 * sms) ? 3 : 0;
            return d == 64 && 11 * units >= 8 * sms && (keys <= 2048 || 4 * units >= 3 * sms) ? 3 : 0;
        }
        /* three stages, two blocks an SM: one generation up to twice the SMs */
        if (d == 64 && (keys <= 2048 ? 3 * units <= 5 * sms
                                     : 3 * units <= 4 * sms && (keys <= 4096 || 6 * units > 7 * sms)))
            return 3;
        return two_stages_past_sms && 4 * units > 5 * sms ? 2 : 0;
    }
    if (d == 128)
        return (2 * units >= sms && 8 * units <= 5 * sms) || (units > 2 * sms && 5 * units <= 16 * sms)
                   ? 3
                   : 0;
    if (two_stages_past_sms) return 2;
    return d == 64 && 11 * units >= 8 * sms && units <= sms ? 3 : 0;
}

/* Two splits of 64-key tiles for up to 16 rows at d 128, three blocks an SM
 * (two stages, 69 KB of shared memory, 166 registers under the launch bound
 * three blocks set), for a step of 1k to 16k keys, contiguous or in pages of
 * 16 rows or more, whose units are more than the SMs and at most 5/4 of
 * them, where the SM's share of DRAM bandwidth is an H200's: the step's
 * blocks run in one generation, where the derived tiles' two blocks an SM
 * leave a tail, and the SMs holding three read theirs at the headroom an SM
 * has over its share. Not with expressions, whose registers spill under the
 * bound (tiling_for_call). At d 64 (three stages, 130 registers) they gave
 * way to wide tiles in three stages (wide_tiles, "v33").
 * Measured on an H200, graph us a cache a call, the derived plan -> two
 * splits of these (decode-notes, "v29", "v30"): 32/8 17 x 1k 27.0 -> 23.6,
 * 17 x 2k 43.4 -> 40.0, 17 x 4k 76.5-76.7 -> 71.0-72.0, 18 x 4k 78.7-79.5
 * -> 74.4-76.3, 19 x 4k 81.6-82.5 -> 78.0-79.7, 20 x 4k 84.7-86.4 (one
 * split) -> 81.1-83.3, 8/1 144 x 4k 84.2 -> 79.6, 64/8 18 x 4k 85.0 ->
 * 79.6, 128/8 18 x 4k 92.0 -> 85.0; even at 20 x 2k and 8/1 160 x 4k; past
 * 4k keys and over pages: 32/8 17 x 6k 109.1-109.3 -> 103.7-103.8, 17 x 8k
 * 139.8-140.0 -> 133.1-133.4, 20 x 8k 158.7-158.8 -> 153.6-153.7, 17 x 16k
 * 271.1-271.6 -> 266.8-267.1, 20 x 16k 313.2-313.4 -> 307.0-307.9, 8/1 144
 * x 8k 157.1-157.7 -> 149.2-149.4, 128/8 17 x 8k 161.5-162.3 ->
 * 146.4-146.6; pages of 16: 18 x 4k 85.3-85.7 -> 81.1-81.3; of 64: 17 x 2k
 * 47.9-48.1 -> 43.6, 20 x 4k 95.5-95.7 -> 87.8, 17 x 8k 155.6 ->
 * 148.5-149.1; of 256: 17 x 8k 153.2-153.6 -> 147.7-148.1, 20 x 1k
 * 29.7-30.1 -> 28.3-28.8; not past 5/4 of the SMs (22 x 4k 89.2 -> 89.8, 24
 * x 2k 51.4-51.9 -> 53.5; 32 x 4k, more blocks than three an SM, 122.5 ->
 * 148.8). */
static int two_splits_past_sms(int d, int dv, const fg_profile *prof, const fg_forward_args *a) {
    int64_t units = (int64_t)a->batch * a->heads_kv;
    int sms = prof->sm_count;
    return dram_rich(prof) && d == 128 && dv == d && (!a->block_table || a->page_size >= 16) &&
           a->seqlen_k <= 16384 && a->num_splits == 0 &&
           a->seqlen_q * (a->heads_q / a->heads_kv) <= 16 && a->seqlen_k >= 1024 && units > sms &&
           4 * units <= 5 * sms;
}

/* Tiles of 32 keys in four stages for a short step on sm_90 whose 64-key
 * tiles (the derived plan's up to head dims of 128) are fewer than the
 * SMs: even splits of one tile would leave SMs idle, and twice the blocks
 * of half the keys finish sooner. Measured on an H100 at d 128 (CUDA
 * graphs; decode-notes, "Short steps in tiles of 32 keys"): 32/8 heads
 * over 1k keys 8.7-8.9 -> 8.0-8.2 us contiguous, 8.9-9.1 -> 8.2-8.4 in
 * pages of 16 and 64; 8/1 over 4k 8.1-8.5 -> 7.7-8.2; 8/1 2 x 2k in pages
 * of 16 8.6 -> 7.4-7.5; at 512 tiles and more (32/8 over 4k) 64-key tiles
 * are as fast or faster. Steps of one row block of at most 16 rows over a
 * contiguous cache or pages of 16 rows or more, as measured; wide tiles
 * where wide_tiles takes the step, two_split_tiles where
 * two_splits_past_sms does; the derived plan's tiles otherwise. A few
 * comparisons: it runs on every call. */
static int tiling_for_call(const fg_spec *spec, const fg_profile *prof, const family_call *call,
                           family_tiling *out) {
    const fg_forward_args *a = call->forward;
    if (prof->arch != 90 || spec_head_dim_padded(spec) > 128 || spec_head_dim_v_padded(spec) > 128 ||
        a->seqlen_q * (a->heads_q / a->heads_kv) > 16)
        return 0;
    int64_t units = (int64_t)a->batch * a->heads_kv;
    if ((!a->block_table || a->page_size >= 16) && units * ((a->seqlen_k + 63) / 64) < prof->sm_count) {
        const fwd_decode_tiling short_step = {32, 64, 4};
        family_tiling_pack(out, &short_step, sizeof short_step);
        return 1;
    }
    int wide_stages = wide_tiles(spec, prof, a, units);
    if (wide_stages) {
        const fwd_decode_tiling wide = {128, 16, wide_stages};
        family_tiling_pack(out, &wide, sizeof wide);
        return 1;
    }
    /* at d 128 under three blocks' launch bound the expressions' kernels
     * spill (8-16 bytes each; NVRTC 13.0). ALiBi's and the sinks' spill only
     * in the counted kernel of splits of one tile (8-16 bytes), which two
     * splits of 1k keys or more never launch. */
    int spills = spec_head_dim_padded(spec) == 128 &&
                 (spec_has_expr(spec->score_mod) || spec_has_expr(spec->mask_mod));
    if (!spills &&
        two_splits_past_sms(spec_head_dim_padded(spec), spec_head_dim_v_padded(spec), prof, a)) {
        family_tiling_pack(out, &two_split_tiles, sizeof two_split_tiles);
        return 1;
    }
    return 0;
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    /* O and a 16-key S for each sub-tile taken side by side */
    *accumulators = plan_of(p)->head_dim_v_padded / 2 + 8 * plan_of(p)->side;
    *budget = 0;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fwd_decode_plan *x = plan_of(p);
    family_plan_info(out, x->max_rows, x->block_n, x->warps, x->stages, x->head_dim_padded,
                     x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fwd_decode_plan *plan = plan_of(p);
#define DECODE_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {DECODE_PLAN_FIGURES(DECODE_FIGURE)};
#undef DECODE_FIGURE
    return generate_kernel("kernel_fwd_decode.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &decode_params_layout, out,
                           err, err_len);
}

/* One split for a d 128 step of up to 16 rows a unit over a contiguous
 * cache of up to 4k keys whose units are 6/5 to 3/2 of the SMs, where the
 * SM's share of DRAM bandwidth is an H200's: the SMs holding two blocks
 * read them at about 50 GB/s, not the 32 the split model has (an H100's),
 * so the split counts it takes there are slower. Measured on an H200,
 * graph us a cache a call, the chosen count -> one split (decode-notes,
 * "v27"): 32/8 20 x 2k 48.6-48.9 -> 45.1-45.4, 20 x 4k 89.1-89.6 ->
 * 85.6-86.8, 22 x 2k 52.9-53.2 -> 48.2, 24 x 2k 58.1-58.5 -> 52.9-53.4,
 * 8/1 160 x 4k 94.9-95.1 -> 88.2-88.4, 64/8 20 x 4k 94.5-94.8 ->
 * 87.8-88.2; not at 144 units (18 x 4k 79.9-80.0 -> 83.0-83.2) nor over
 * 8k keys (20 x 8k 164.0-165.0 -> 167.7-168.9). Up to 5/4 of the SMs it
 * takes the steps two_splits_past_sms leaves to the derived tiles
 * (expressions). */
static int one_split(const fwd_decode_plan *plan, const fg_forward_args *a,
                     const fg_profile *prof) {
    int64_t units = (int64_t)a->batch * a->heads_kv;
    int sms = prof->sm_count;
    return dram_rich(prof) && plan->side == 1 && plan->head_dim_padded == 128 &&
           plan->head_dim_v_padded == 128 && !a->block_table &&
           a->seqlen_q * (a->heads_q / a->heads_kv) <= 16 && a->seqlen_k <= 4096 &&
           5 * units > 6 * sms && 2 * units <= 3 * sms;
}

/* Two splits, in pairs, for a d 128 step of up to 16 rows a unit over a
 * contiguous cache of 1k to 16k keys whose units are 5/12 to half the SMs,
 * where the SM's share of DRAM bandwidth is an H200's: a block an SM, its
 * pair's other block on another, where the split model takes three splits
 * of two blocks an SM and the combine kernel. Measured on an H200, graph us
 * a cache a call, the chosen count -> two in pairs (decode-notes, "v34"):
 * 32/8 7 x 1k 13.3-13.5 -> 12.6, 8 x 1k 14.6-15.3 -> 13.0, 8 x 2k 22.4-22.6
 * -> 20.6-20.7, 7 x 4k 34.4-34.9 -> 33.2, 8 x 4k 37.9-38.0 -> 35.6, 8 x 8k
 * 67.9-68.1 -> 64.9-65.0, 8 x 16k 128.8 -> 124.9-126.2, 8/1 64 x 4k
 * 38.7-38.9 -> 36.9-37.1; even at 7 x 16k (116.3-116.4 -> 115.7-115.8) and
 * 48 units over 1k (12.4 -> 12.2-12.3); not at 48 units over 4k or more (6
 * x 4k 29.9-30.0 -> 32.7-32.8, 6 x 16k 99.1-99.5 -> 114.1), at 80 (10 x 8k
 * 84.5 -> 86.0-86.4) nor at 32 (4 x 2k 14.5 -> 18.6). */
static int pairs_near_half_sms(const fwd_decode_plan *plan, const fg_forward_args *a,
                               const fg_profile *prof) {
    int64_t units = (int64_t)a->batch * a->heads_kv;
    int sms = prof->sm_count;
    return dram_rich(prof) && plan->pair_at > 0 && plan->side == 1 &&
           plan->head_dim_padded == 128 && plan->head_dim_v_padded == 128 && !a->block_table &&
           a->seqlen_q * (a->heads_q / a->heads_kv) <= 16 && a->seqlen_k >= 1024 &&
           a->seqlen_k <= 16384 && 12 * units >= 5 * sms && 2 * units <= sms;
}

/* The call as its plan runs it: two_split_tiles in two splits where
 * two_splits_past_sms took them, and two splits where pairs_near_half_sms
 * takes them (both in pairs: kv_cache_call.c), wide tiles in one
 * (wide_tiles takes them for steps of one split), and the steps one_split
 * takes in one; else as asked. */
static family_call planned_call(const fwd_decode_plan *plan, const family_call *call,
                                const fg_profile *prof, fg_forward_args *own) {
    family_call c = *call;
    const fg_forward_args *a = call->forward;
    const fwd_decode_tiling x = {plan->block_n, plan->max_rows, plan->stages};
    int splits = a->num_splits;
    if (splits == 0 && ((same_tiling(&x, &two_split_tiles) &&
                         two_splits_past_sms(plan->head_dim_padded, plan->head_dim_v_padded, prof, a)) ||
                        pairs_near_half_sms(plan, a, prof)))
        splits = 2;
    else if (splits == 0 && (plan->side > 1 || one_split(plan, a, prof)))
        splits = 1;
    if (splits != a->num_splits) {
        *own = *a;
        own->num_splits = splits;
        c.forward = own;
    }
    return c;
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    fg_forward_args own;
    family_call c = planned_call(plan_of(p), call, dev->profile, &own);
    kv_cache_shape shape = shape_of(plan_of(p), c.forward, dev->profile);
    return kv_cache_workspace(&shape, c.forward, dev->profile);
}

static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)err, (void)err_len;
    fg_forward_args own;
    family_call c = planned_call(plan_of(p), call, dev->profile, &own);
    kv_cache_shape shape = shape_of(plan_of(p), c.forward, dev->profile);
    kv_cache_arguments(&shape, spec, &c, dev->profile, ws, out);
    return 0;
}

const kernel_family fwd_decode_family = {
    .name = "fwd_decode",
    .pass = FG_PASS_FORWARD,
    .min_cc = 75,
    .max_cc = 0,
    .arch_specific = 0,
    .params = &decode_params_layout,
    .writes = FAMILY_WRITES_O,
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .tiling_for_call = tiling_for_call,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(fwd_decode_tiling) / sizeof(int)),
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
