/* Decoding steps over a KV cache (spec.kv_cache) on a live GPU against each
 * sequence's fp64 reference.
 *
 * Every case gives `batch` sequences their own cached lengths (0, 1 and
 * lengths that are no multiple of any tile among them) in a cache of
 * `capacity` rows per sequence: contiguous (B, capacity, Hkv, D), or a pool
 * of pages of page_size rows (1, 3, 16, 64, 256) handed out in a shuffled
 * order through the block table. Cache rows no sequence holds are NaN, and
 * so are table entries past each sequence's keys (they point outside the
 * pool): a kernel that reads either shows. With seqlen_new, the new rows
 * come in k_new, v_new and the call appends them first.
 * The call runs with 1, 2, 7, 128 and the chosen number of splits (on sm_90
 * two splits run in pairs, clusters of two blocks that add their rows
 * themselves, and the chunks of many queries run on the Hopper forward
 * with 1 and the chosen, and once more in a context that keeps to it); each
 * time, per sequence (a problem of its own: its queries, its keys then its
 * new rows), with the bounds of harness/compare.h:
 *   - O and lse (O exactly 0 and lse -inf where it sees no key);
 *   - nothing written outside O and lse (guard zones);
 * and across split counts, the largest difference to one split. Calls of 7
 * splits give the same bits each time, through the context (its turn
 * counters: one launch where the step is short) and with a workspace of
 * their own, with counters of their own (left 0) and without (the combine
 * kernel).
 * After the calls the appended rows are in the cache, bit for bit.
 * Then the checks that only a live GPU can make: cache_seqlens in host
 * memory is refused, and with FLASHGEN_DEBUG=1 so are a block table entry
 * outside the pool, a cached length past seqlen_k and one within it whose
 * new rows pass it, each naming the argument.
 *
 * usage: gpu_decode [--quick] [--shard I/N] [name-filter]
 * --quick runs the cases marked quick (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "harness/compare.h"
#include "harness/paged.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "harness/timing.h"
#include "tests/check.h"
#include "tests/gpu_common.h"

#define MAX_SEQS 8

typedef struct decode_case {
    const char *name;
    fg_dtype dtype;
    int d;
    fg_mask mask;
    fg_causal_align align;
    int window_left, window_right;
    int hq, hkv;
    int batch, seqlen_q;
    int cached[MAX_SEQS]; /* keys in the cache before the call */
    int seqlen_new;       /* rows appended by the call */
    int capacity;         /* seqlen_k: rows a sequence may hold */
    int page_size;        /* 0: contiguous cache */
    int quick;
    int softcap, alibi, sinks; /* the logits' variants (fg_spec's) */
    float cap;
    int expr; /* 1: a distance bias and a predicate (expressions) */
    int dv;   /* the value head dim (0: d) */
    int latent; /* 1: a latent cache (FG_KV_LATENT): K alone, V its first dv columns */
} decode_case;

#define BR FG_ALIGN_BOTTOM_RIGHT
#define TL FG_ALIGN_TOP_LEFT

static const decode_case cases[] = {
    {"gqa 4 pages 16", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 32, 8, 3, 1,
     {1000, 1, 4097}, 0, 4200, 16, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"pages 1", FG_FP16, 64, FG_MASK_NONE, BR, -1, -1, 8, 2, 4, 1,
     {77, 0, 300, 5}, 0, 320, 1, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"pages 3 causal spec", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 16, 2, 3, 5,
     {200, 33, 1}, 0, 260, 3, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"pages 64 append", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1, -1, 8, 8, 3, 3,
     {500, 0, 129}, 3, 640, 64, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"pages 256 gqa 8", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 64, 8, 2, 1,
     {3000, 257}, 0, 3072, 256, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"contiguous window", FG_BF16, 64, FG_MASK_WINDOW, BR, 100, 0, 12, 4, 3, 2,
     {1500, 90, 0}, 0, 1600, 0, 0, 0, 0, 0, 0.f, 0, 0, 0},
    /* sides of INT_MAX (the kernels take them clamped to the call's reach) */
    {"pages 16 window max/max", FG_BF16, 64, FG_MASK_WINDOW, BR, INT32_MAX, INT32_MAX, 8, 2, 2, 3,
     {400, 17}, 0, 500, 16, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"contiguous append 16q", FG_FP16, 256, FG_MASK_CAUSAL, BR, -1, -1, 4, 1, 2, 16,
     {700, 3}, 16, 800, 0, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"top-left d96 pages 5", FG_BF16, 96, FG_MASK_CAUSAL, TL, -1, -1, 6, 3, 2, 4,
     {90, 2}, 2, 100, 5, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"many rows", FG_FP16, 128, FG_MASK_NONE, BR, -1, -1, 16, 2, 2, 12,
     {333, 64}, 0, 400, 16, 0, 0, 0, 0, 0.f, 0, 0, 0},
    /* the logits' variants: a sink per head with a window (as gpt-oss
     * decodes), a sequence of no keys (its rows: O = 0, lse = the sink) */
    {"sinks window 16 pages 16", FG_BF16, 64, FG_MASK_WINDOW, BR, 16, 0, 16, 2, 3, 2,
     {1000, 0, 37}, 0, 1040, 16, 1, 0, 0, 1, 0.f, 0, 0, 0},
    {"softcap alibi causal append", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1, -1, 8, 2, 2, 3,
     {700, 5}, 2, 720, 0, 1, 1, 1, 0, 1.5f, 0, 0, 0},
    {"all variants pages 3 gqa 8", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 64, 8, 2, 1,
     {2000, 129}, 0, 2100, 3, 0, 1, 1, 1, 3.0f, 0, 0, 0},
    /* expressions: an ALiBi-like bias written out and a predicate, pages of 16
     * and a split; sinks beside them */
    {"expr bias predicate sinks", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 16, 4, 3, 2,
     {900, 0, 65}, 1, 1000, 16, 1, 0, 0, 1, 0.f, 1, 0, 0},
    /* a value head dim of its own (DeepSeek's 192/128 and others): V, v_new
     * and O of dv, pages, appends, splits and the variants beside it */
    {"dv 192/128 pages 64", FG_BF16, 192, FG_MASK_NONE, BR, -1, -1, 16, 1, 3, 1,
     {1000, 0, 129}, 0, 1100, 64, 1, 0, 0, 0, 0.f, 0, 128, 0},
    {"dv 64/128 append causal", FG_FP16, 64, FG_MASK_CAUSAL, BR, -1, -1, 8, 2, 2, 3,
     {300, 5}, 2, 320, 0, 1, 0, 0, 0, 0.f, 0, 128, 0},
    {"dv 128/64 pages 3 sinks softcap", FG_BF16, 128, FG_MASK_WINDOW, BR, 50, 0, 16, 8, 2, 2,
     {500, 17}, 1, 520, 3, 0, 1, 0, 1, 2.0f, 0, 64, 0},
    {"dv 96/64 pages 16 expr", FG_FP16, 96, FG_MASK_NONE, BR, -1, -1, 6, 3, 2, 4,
     {90, 2}, 2, 100, 16, 0, 0, 0, 0, 0.f, 1, 64, 0},
    {"dv 256/128 many rows", FG_BF16, 256, FG_MASK_CAUSAL, TL, -1, -1, 16, 1, 2, 3,
     {700, 40}, 1, 760, 16, 0, 0, 1, 0, 0.f, 0, 128, 0},
    {"dv 72/40 pages 1", FG_FP16, 72, FG_MASK_NONE, BR, -1, -1, 4, 4, 3, 1,
     {77, 1, 300}, 0, 320, 1, 0, 0, 0, 0, 0.f, 0, 40, 0},
    /* chunked prefill: many queries a step, on sm_90 through the Hopper
     * forward (fwd_sm90a: more than 2800 query rows, in one wave of blocks
     * here; pages of a multiple of 8 rows; no splits asked for), elsewhere
     * and on the other runs through fwd_decode; a sequence with fewer keys
     * than queries (its first rows see none), new rows as many as the
     * queries */
    {"prefill pages 16 causal", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 8, 2, 3, 200,
     {1000, 0, 333}, 0, 1300, 16, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill append pages 64", FG_FP16, 64, FG_MASK_CAUSAL, BR, -1, -1, 32, 8, 2, 97,
     {500, 31}, 97, 700, 64, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill contiguous window", FG_BF16, 128, FG_MASK_WINDOW, BR, 64, 0, 16, 2, 2, 130,
     {2000, 7}, 0, 2200, 0, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill pages 256 d256", FG_FP16, 256, FG_MASK_NONE, BR, -1, -1, 16, 4, 2, 100,
     {1500, 300}, 0, 1600, 256, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill pages 8 dv 192/128 sinks", FG_BF16, 192, FG_MASK_CAUSAL, TL, -1, -1, 16, 4, 2, 150,
     {700, 64}, 5, 800, 8, 1, 1, 0, 1, 3.0f, 0, 128, 0},
    {"prefill expr pages 32 append", FG_FP16, 128, FG_MASK_NONE, BR, -1, -1, 16, 4, 3, 70,
     {900, 0, 65}, 1, 1000, 32, 0, 0, 0, 0, 0.f, 1, 0, 0},
    {"prefill alibi d96 pages 16", FG_FP16, 96, FG_MASK_CAUSAL, BR, -1, -1, 12, 3, 2, 120,
     {400, 2}, 120, 530, 16, 0, 0, 1, 0, 0.f, 0, 0, 0},
    {"prefill pages 48 gqa 4", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 16, 4, 2, 100,
     {900, 20}, 0, 960, 48, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill pages 256 causal append", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 32, 8, 1, 128,
     {2000}, 128, 2304, 256, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"prefill pages 3 (decode family)", FG_BF16, 64, FG_MASK_CAUSAL, BR, -1, -1, 4, 2, 2, 100,
     {300, 50}, 0, 400, 3, 0, 0, 0, 0, 0.f, 0, 0, 0},
    /* latent caches (multi-head latent attention, DeepSeek's 576/512: V is
     * K's first 512 columns): 16 to 128 query heads on one latent head, one
     * or two queries, pages, appends, masks */
    {"mla 576/512 h16 pages 64", FG_BF16, 576, FG_MASK_NONE, BR, -1, -1, 16, 1, 3, 1,
     {1000, 0, 129}, 0, 1100, 64, 1, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 576/512 h128 q2 causal append", FG_BF16, 576, FG_MASK_CAUSAL, BR, -1, -1, 128, 1, 2, 2,
     {700, 3}, 2, 720, 0, 1, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 576/512 h20 pages 1", FG_FP16, 576, FG_MASK_NONE, BR, -1, -1, 20, 1, 2, 1,
     {300, 77}, 0, 320, 1, 0, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 192/128 h16/2 window pages 3", FG_BF16, 192, FG_MASK_WINDOW, BR, 64, 0, 16, 2, 2, 3,
     {500, 40}, 1, 520, 3, 0, 0, 0, 0, 0.f, 0, 128, 1},
    {"mla 576/512 h64 q2 pages 256", FG_BF16, 576, FG_MASK_CAUSAL, BR, -1, -1, 64, 1, 2, 2,
     {3000, 257}, 0, 3072, 256, 0, 0, 0, 0, 0.f, 0, 512, 1},
    /* the warpgroup kernel on sm_90 (fwd_mla_sm90a) with its second row block
     * part full, an odd tile count, no keys, halves of O of 192 columns; widths
     * it does not take (fwd_mla) */
    {"mla 192/128 h64/2 window pages 3", FG_BF16, 192, FG_MASK_WINDOW, BR, 64, 0, 64, 2, 2, 3,
     {500, 40}, 1, 520, 3, 0, 0, 0, 0, 0.f, 0, 128, 1},
    {"mla 576/512 h40 pages 16", FG_FP16, 576, FG_MASK_NONE, BR, -1, -1, 40, 1, 3, 1,
     {2000, 0, 513}, 0, 2100, 16, 1, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 160/96 h24 pages 5", FG_FP16, 160, FG_MASK_CAUSAL, BR, -1, -1, 24, 1, 2, 2,
     {400, 61}, 1, 420, 5, 0, 0, 0, 0, 0.f, 0, 96, 1},
    {"mla 448/384 h72 pages 32", FG_BF16, 448, FG_MASK_NONE, BR, -1, -1, 72, 1, 2, 1,
     {900, 131}, 0, 960, 32, 0, 0, 0, 0, 0.f, 0, 384, 1},
    /* pages of 24 rows: bulk copies of 8 rows, runs of a tile over four pages */
    {"mla 576/512 h128 pages 24 append", FG_BF16, 576, FG_MASK_CAUSAL, BR, -1, -1, 128, 1, 3, 1,
     {1000, 5, 130}, 1, 1104, 24, 1, 0, 0, 0, 0.f, 0, 512, 1},
    /* at most 16 query rows a latent head: fwd_mla_sm90a's narrow kernel
     * (products transposed), with cp.async (pages of 1) and bulk copies
     * (contiguous, pages of 24), causal over two new queries, rows past the
     * call's in a block (12 of 16), two latent heads */
    {"mla 576/512 h8 q2 causal append pages 1", FG_FP16, 576, FG_MASK_CAUSAL, BR, -1, -1, 8, 1, 3, 2,
     {300, 0, 77}, 2, 400, 1, 1, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 576/512 h16 contiguous append", FG_BF16, 576, FG_MASK_NONE, BR, -1, -1, 16, 1, 2, 1,
     {1500, 63}, 1, 1600, 0, 1, 0, 0, 0, 0.f, 0, 512, 1},
    {"mla 192/128 h8/2 q3 window pages 24", FG_BF16, 192, FG_MASK_WINDOW, BR, 70, 0, 8, 2, 2, 3,
     {600, 45}, 3, 700, 24, 1, 0, 0, 0, 0.f, 0, 128, 1},
    /* wide tiles (128 keys, each warp's two sub-tiles side by side) on an
     * H100: one split of 80 units (a KV head of a sequence) over 132 SMs; a
     * sequence of no keys, a part tile, sinks, appends, two queries,
     * expressions */
    {"wide causal sinks append", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 64, 16, 5, 1,
     {4000, 1, 2500, 0, 3333}, 1, 4097, 0, 1, 1, 0, 1, 2.0f, 0, 0, 0},
    {"wide q2 window alibi", FG_FP16, 128, FG_MASK_WINDOW, BR, 700, 0, 32, 16, 5, 2,
     {2999, 64, 0, 1500, 2047}, 0, 3000, 0, 1, 0, 1, 0, 0.f, 0, 0, 0},
    {"wide expr append", FG_FP16, 128, FG_MASK_NONE, BR, -1, -1, 32, 16, 5, 1,
     {1100, 0, 2047, 1, 1500}, 1, 2048, 0, 1, 0, 0, 0, 0.f, 1, 0, 0},
    /* d 64: 96 units (6 sequences of 16 KV heads) */
    {"wide d64 causal append", FG_FP16, 64, FG_MASK_CAUSAL, BR, -1, -1, 64, 16, 6, 1,
     {1500, 0, 1024, 7, 1999, 1203}, 1, 2000, 0, 1, 0, 0, 1, 0.f, 0, 0, 0},
    /* d 64 past the SMs: 144 units (8 sequences of 18 KV heads) over 132 SMs,
     * 4k keys, at the chosen count wide tiles on an H100 (two stages, two
     * blocks on some SMs) and on an H200 (three stages); softcap and sinks */
    {"d64 past the SMs softcap sinks", FG_BF16, 64, FG_MASK_NONE, BR, -1, -1, 72, 18, 8, 1,
     {4000, 0, 1024, 7, 3999, 2203, 129, 4096}, 0, 4096, 0, 1, 1, 0, 1, 3.0f, 0, 0, 0},
    /* 200 units (8 sequences of 25 KV heads) over up to 2,048 keys: at the
     * chosen count wide tiles in three stages on an H200, two blocks on most
     * SMs; two queries appended, causal, ALiBi */
    {"d64 past 3/2 of the SMs q2 causal alibi append", FG_FP16, 64, FG_MASK_CAUSAL, BR, -1, -1,
     100, 25, 8, 2, {2000, 0, 1, 2046, 511, 1024, 64, 777}, 2, 2048, 0, 1, 0, 1, 0, 0.f, 0, 0, 0},
    /* d 128 past the SMs: 144 units (8 sequences of 18 KV heads) over up to
     * 2,048 keys, at the chosen count two splits of 64-key tiles, three blocks
     * an SM, on an H200; two queries appended, causal, softcap */
    {"d128 past the SMs q2 causal softcap append", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1, -1, 36,
     18, 8, 2, {2000, 0, 1, 2046, 511, 1024, 64, 777}, 2, 2048, 0, 1, 1, 0, 0, 20.0f, 0, 0, 0},
    /* the same tiles over pages of 64 rows and up to 4,000 keys, ALiBi and
     * sinks, two query heads a KV head */
    {"d128 past the SMs alibi sinks pages 64", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 36, 18, 8,
     1, {4000, 0, 1, 3999, 1024, 1025, 64, 2777}, 0, 4032, 64, 1, 0, 1, 1, 0.f, 0, 0, 0},
    /* d 128 past twice the SMs: 288 units (8 sequences of 36 KV heads), one
     * block an SM, over 1,100 keys; two queries appended, causal, ALiBi */
    {"wide d128 past twice the SMs q2 causal alibi append", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1,
     -1, 144, 36, 8, 2, {1000, 0, 1, 1097, 511, 1024, 64, 777}, 2, 1100, 0, 1, 0, 1, 0, 0.f, 0,
     0, 0},
};
#define CASE_COUNT ((int)(sizeof cases / sizeof cases[0]))

static const int split_counts[] = {1, 2, 7, 128, 0};
#define SPLIT_RUNS ((int)(sizeof split_counts / sizeof split_counts[0]))

/* The case on the device: its shapes, inputs from rng (the keys each
 * sequence sees: its cached ones, then its new rows), the cache as the call
 * finds it, pages shuffled by rng. */
static int call_make(const decode_case *c, fgh_rng *rng, fgh_paged *k) {
    fg_spec s = fg_spec_default(c->d, c->dtype);
    s.head_dim_v = c->dv;
    s.mask = c->mask, s.kv_cache = c->latent ? FG_KV_LATENT : 1;
    s.softcap = c->softcap, s.alibi = c->alibi, s.sinks = c->sinks;
    if (c->expr == 1) {
        s.score_mod = "s - 0.01 * (h + 1) * abs(q + (seqlen_k - seqlen_q) - k)";
        s.mask_mod = "k % 7 != 3 || b == 1";
    }
    fgh_shape sh = {.batch = c->batch, .heads_q = c->hq, .heads_kv = c->hkv, .seqlen_q = c->seqlen_q,
                    .seqlen_k = c->capacity, .align = c->align, .window_left = c->window_left,
                    .window_right = c->window_right, .softcap = c->cap};
    fgh_placement pl = {.order = FGH_BSHD, .pad = 8, .lead = LEAD, .guard = GUARD};
    if (!gpu_ok(fgh_paged_init(k, &s, &sh, c->cached, c->seqlen_new, c->page_size, &pl), c->name))
        return 0;
    fgh_fill_normal(rng, k->p.host.q, k->p.nq, c->dtype);
    fgh_fill_normal(rng, k->p.host.k, k->p.nk, c->dtype);
    fgh_fill_normal(rng, k->p.host.v, k->p.nv, c->dtype);
    return gpu_ok(fgh_paged_upload(&gpu_dev, k, rng), c->name);
}

/* A call's own workspace and turn counters (one a query row, zero, between
 * poisoned zones), for calls that do not take the context's. */
typedef struct own_memory {
    fgh_buffer workspace, counters;
    size_t bytes;
    int counted; /* 1: the counters are given too */
} own_memory;

/* One call with `splits` (own: NULL, or memory of the call's own): O (B, Hq,
 * Sq, Dv) into o and lse into lse, checked per sequence. */
static int run_with(fg_context *ctx, const decode_case *c, fgh_paged *k, int splits,
                    const own_memory *own, double *o, float *lse, double *worst) {
    if (!gpu_ok(fgh_buffer_poison(&gpu_dev, &k->p.o.mem), "o") ||
        !gpu_ok(fgh_buffer_poison(&gpu_dev, &k->p.lse), "lse"))
        return 0;
    fg_forward_args a = fgh_paged_forward_args(k, splits);
    if (own) {
        a.workspace = (void *)(uintptr_t)own->workspace.data;
        a.workspace_bytes = own->bytes;
        if (own->counted) a.split_counters = (int32_t *)(uintptr_t)own->counters.data;
    }
    fg_status st = fg_forward(ctx, &k->p.spec, &a);
    CHECK(st == FG_OK, "%s (splits %d): fg_forward: %s: %s", c->name, splits, fg_status_name(st),
          fg_context_message(ctx));
    fgh_written w;
    if (st || !gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "kernel"), c->name) ||
        !gpu_ok(fgh_tensor_take(&gpu_dev, &k->p.o, o, c->dtype, &w), c->name) ||
        !gpu_ok(fgh_buffer_pull(&gpu_dev, &k->p.lse), "lse"))
        return 0;
    CHECK(w.stray == 0 && w.nonfinite == 0, "%s (splits %d): o: %zu elements written outside, %zu "
          "not finite or not written", c->name, splits, w.stray, w.nonfinite);
    CHECK(fgh_buffer_zones_unpoisoned(&k->p.lse, 0) == 0, "%s: floats written outside lse", c->name);
    memcpy(lse, fgh_buffer_at(&k->p.lse, LEAD), k->p.rows * sizeof *lse);
    for (int b = 0; b < c->batch; b++) {
        fgh_forward_check r;
        if (!gpu_ok(fgh_paged_check_forward(k, b, o, lse, &r), c->name)) continue;
        /* a sequence that sees no key: O = 0 and lse = -inf, counted as rows */
        CHECK(r.err <= r.bound, "%s (splits %d): sequence %d: O error %.3e exceeds %.3e", c->name,
              splits, b, r.err, r.bound);
        CHECK(r.lse_bad == 0 && r.lse_bad_inf == 0 && r.zero_rows_bad == 0,
              "%s (splits %d): sequence %d (%d keys): %zu lse off (worst %g), %zu lse not -inf, %zu "
              "O rows not 0", c->name, splits, b, fgh_paged_keys(k, b), r.lse_bad, r.lse_worst,
              r.lse_bad_inf, r.zero_rows_bad);
        if (r.err / r.bound > *worst) *worst = r.err / r.bound;
    }
    return 1;
}

static int run_split(fg_context *ctx, const decode_case *c, fgh_paged *k, int splits, double *o,
                     float *lse, double *worst) {
    return run_with(ctx, c, k, splits, NULL, o, lse, worst);
}

/* The appended rows are in the cache, bit for bit. */
static void check_appended(const decode_case *c, fgh_paged *k) {
    size_t bad = 0;
    if (gpu_ok(fgh_paged_appended(&gpu_dev, k, &bad), "cache"))
        CHECK(bad == 0, "%s: %zu appended cache values differ from k_new/v_new", c->name, bad);
}

/* On sm_90 the calls of many queries run on the Hopper forward unless they
 * ask for splits (below, num_splits 1 and 0 do; the others run on
 * fwd_decode). So that a case cannot pass on fwd_decode alone, each runs
 * once more in a context that keeps to fwd_sm90a (FLASHGEN_FAMILIES):
 * checked where the family takes it, else refused for want of another. */
static fg_context *hopper_only;

/* Made with the first case, on sm_90 only. */
static void hopper_open(fg_context *ctx) {
    static int tried;
    if (tried || fg_context_arch(ctx) != 90) return;
    tried = 1;
    setenv("FLASHGEN_FAMILIES", "fwd_sm90a", 1);
    CHECK(fg_context_create(&hopper_only, NULL) == FG_OK, "fwd_sm90a context: %s",
          fg_last_message());
    unsetenv("FLASHGEN_FAMILIES");
}

/* fwd_sm90a's rule for the cases here, whose blocks make one wave: more
 * than 2800 query rows, pages of a multiple of 8 rows. */
static int hopper_takes(const decode_case *c) {
    return !c->latent && c->batch * c->hq * c->seqlen_q > 2800 && c->page_size % 8 == 0;
}

/* The call on hopper_only: checked like the others where fwd_sm90a takes
 * it, else refused naming the family. */
static int run_hopper(const decode_case *c, fgh_paged *k, double *o, float *lse, double *worst) {
    if (hopper_takes(c)) return run_split(hopper_only, c, k, 1, o, lse, worst);
    fg_forward_args a = fgh_paged_forward_args(k, 1);
    fg_status st = fg_forward(hopper_only, &k->p.spec, &a);
    CHECK(st == FG_ERR_UNSUPPORTED && strstr(fg_context_message(hopper_only), "fwd_sm90a cannot take"),
          "%s: on fwd_sm90a alone: %s: %s", c->name, fg_status_name(st),
          fg_context_message(hopper_only));
    return 0;
}

/* A split call gives the same bits every time and whichever way its parts
 * are added, in a fixed order: twice through the context (with its turn
 * counters: where the step is short, blocks of the step's kernel add them),
 * then with a workspace of its own and no counters (the combine kernel),
 * and with counters of its own too, which it leaves 0 (nothing written
 * beside them). */
static void check_repeatable(fg_context *ctx, const decode_case *c, fgh_paged *k, double *o[2],
                             float *lse, double *worst) {
    static const char *const ways[] = {"through the context", "with a workspace of its own",
                                       "with a workspace and counters of its own"};
    own_memory own;
    memset(&own, 0, sizeof own);
    fg_forward_args a = fgh_paged_forward_args(k, 7);
    size_t rows = (size_t)c->batch * c->hq * c->seqlen_q;
    int *zeros = calloc(rows, sizeof *zeros);
    fg_status st = fg_forward_workspace_size(ctx, &k->p.spec, &a, &own.bytes);
    CHECK(st == FG_OK && zeros, "%s: workspace size: %s", c->name, fg_context_message(ctx));
    int made = st == FG_OK && zeros &&
               gpu_ok(fgh_buffer_alloc(&gpu_dev, &own.workspace, 1, 256, own.bytes ? own.bytes : 1,
                                       256), "workspace") &&
               gpu_ok(fgh_buffer_ints(&gpu_dev, &own.counters, zeros, (int)rows, 16, 16), "counters");
    free(zeros);
    if (!made) goto done;
    for (int way = 0; way < 4; way++) {
        own.counted = way == 3;
        if (!run_with(ctx, c, k, 7, way < 2 ? NULL : &own, o[way > 0], lse, worst)) break;
        if (way == 0) continue;
        size_t differ = 0;
        for (size_t i = 0; i < k->p.no; i++) differ += o[0][i] != o[1][i];
        CHECK(differ == 0, "%s: 7 splits %s differ from the first call at %zu of %zu elements",
              c->name, ways[way - 1], differ, k->p.no);
    }
    if (gpu_ok(fgh_buffer_pull(&gpu_dev, &own.counters), "counters")) {
        size_t nonzero = 0;
        for (size_t i = 0; i < rows; i++) nonzero += *(int *)fgh_buffer_at(&own.counters, 16 + i) != 0;
        CHECK(nonzero == 0 && fgh_buffer_zones_unpoisoned(&own.counters, 0) == 0,
              "%s: the call's own counters: %zu of %zu not 0 after it, %zu written beside them",
              c->name, nonzero, rows, fgh_buffer_zones_unpoisoned(&own.counters, 0));
    }
done:
    fgh_buffer_free(&gpu_dev, &own.workspace);
    fgh_buffer_free(&gpu_dev, &own.counters);
}

/* A latent call of two splits gives the same bits every time (on sm_90 the
 * narrow kernel's pairs of blocks, one handing its half to the other). */
static void check_pair_repeatable(fg_context *ctx, const decode_case *c, fgh_paged *k, double *o[2],
                                  float *lse, double *worst) {
    if (!c->latent) return;
    for (int run = 0; run < 4; run++) {
        if (!run_with(ctx, c, k, 2, NULL, o[run > 0], lse, worst)) return;
        size_t differ = 0;
        for (size_t i = 0; run > 0 && i < k->p.no; i++) differ += o[0][i] != o[1][i];
        CHECK(differ == 0, "%s: 2 splits, call %d differs from the first at %zu of %zu elements", c->name,
              run + 1, differ, k->p.no);
    }
}

static void run_case(fg_context *ctx, const decode_case *c, uint64_t seed) {
    int failed_before = check_failed_count;
    double t0 = fgh_now_s(), worst = 0, spread = 0;
    hopper_open(ctx);
    fgh_rng rng;
    fgh_rng_seed(&rng, seed);
    fgh_paged k;
    if (call_make(c, &rng, &k)) {
        double *o[2] = {malloc(k.p.no * sizeof(double)), malloc(k.p.no * sizeof(double))};
        float *lse = malloc(k.p.rows * sizeof *lse);
        if (o[0] && o[1] && lse) {
            for (int s = 0; s <= SPLIT_RUNS; s++) {
                if (s < SPLIT_RUNS ? !run_split(ctx, c, &k, split_counts[s], o[s > 0], lse, &worst)
                                   : !hopper_only || c->latent || !run_hopper(c, &k, o[1], lse, &worst))
                    break;
                for (size_t i = 0; s > 0 && i < k.p.no; i++)
                    spread = fmax(spread, fabs(o[1][i] - o[0][i]));
            }
            check_repeatable(ctx, c, &k, o, lse, &worst);
            check_pair_repeatable(ctx, c, &k, o, lse, &worst);
            check_appended(c, &k);
        } else {
            CHECK(0, "%s: out of host memory", c->name);
        }
        free(o[0]), free(o[1]), free(lse);
    }
    printf("%-22s %s d%-3d dv%-3d H%d/%d seqs %d q %-2d page %-3d worst error/bound %.2f  largest "
           "difference to 1 split %.2e%s  %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->dv ? c->dv : c->d, c->hq, c->hkv, c->batch,
           c->seqlen_q, c->page_size, worst, spread,
           hopper_only && hopper_takes(c) ? " (and on fwd_sm90a alone)" : "",
           fgh_now_s() - t0,
           check_failed_count == failed_before ? "PASS" : "FAIL");
    fflush(stdout);
    fgh_paged_free(&gpu_dev, &k);
}

/* ---- bad input that only a live GPU can tell ---- */

static void check_bad_arrays(fg_context *ctx) {
    fgh_rng rng;
    fgh_rng_seed(&rng, 7);
    fgh_paged k;
    const decode_case *c = &cases[1];
    if (call_make(c, &rng, &k)) {
        fg_forward_args a = fgh_paged_forward_args(&k, 0);
        a.cache_seqlens = (const int32_t *)c->cached; /* host memory */
        gpu_expect_refused(ctx, &k.p.spec, a, "cache_seqlens on the host", "cache_seqlens");
        fg_context *dbg = gpu_debug_context();
        if (dbg) {
            fg_forward_args good = fgh_paged_forward_args(&k, 0);
            fg_status st = fg_forward(dbg, &k.p.spec, &good);
            CHECK(st == FG_OK, "debug checks refuse good arrays: %s", fg_context_message(dbg));
            /* turn counters one of which is not 0 */
            int turns[64] = {0};
            turns[5] = 1;
            fgh_buffer counters;
            memset(&counters, 0, sizeof counters);
            if (gpu_ok(fgh_buffer_ints(&gpu_dev, &counters, turns, c->batch * c->hq * c->seqlen_q, 0, 0),
                       "counters")) {
                fg_forward_args counted = fgh_paged_forward_args(&k, 7);
                counted.split_counters = (int32_t *)(uintptr_t)counters.data;
                gpu_expect_refused(dbg, &k.p.spec, counted, "a split counter not 0", "split_counters[5]");
            }
            fgh_buffer_free(&gpu_dev, &counters);
            int *table = fgh_buffer_at(&k.d_table, LEAD);
            int saved = table[0];
            table[0] = k.num_pages; /* past the pool */
            if (gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_table), "arrays"))
                gpu_expect_refused(dbg, &k.p.spec, fgh_paged_forward_args(&k, 0), "a page past the pool", "block_table[0][0]");
            table[0] = saved;
            int *cached = fgh_buffer_at(&k.d_cached, LEAD);
            cached[1] = c->capacity + 1;
            if (gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_table), "arrays") &&
                gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_cached), "arrays"))
                gpu_expect_refused(dbg, &k.p.spec, fgh_paged_forward_args(&k, 0), "a cached length past seqlen_k",
                               "cache_seqlens[1]");
            fg_context_destroy(dbg);
        }
    }
    fgh_paged_free(&gpu_dev, &k);
    /* a cached length within seqlen_k whose new rows are not */
    const decode_case *n = &cases[3];
    if (call_make(n, &rng, &k)) {
        fg_context *dbg = gpu_debug_context();
        if (dbg) {
            int *cached = fgh_buffer_at(&k.d_cached, LEAD);
            cached[0] = n->capacity - 1;
            if (gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_cached), "arrays"))
                gpu_expect_refused(dbg, &k.p.spec, fgh_paged_forward_args(&k, 0),
                                   "new rows past seqlen_k", "cache_seqlens[0]");
            fg_context_destroy(dbg);
        }
    }
    fgh_paged_free(&gpu_dev, &k);
}

static const char *case_name(int i) { return cases[i].name; }
static int case_quick(int i) { return cases[i].quick; }
static void run_numbered(fg_context *ctx, int i) { run_case(ctx, &cases[i], 0xdec0de00u + (uint64_t)i); }

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    const gpu_suite suite = {CASE_COUNT, case_name, case_quick, run_numbered, "bad arrays",
                             check_bad_arrays};
    if (!gpu_run_suite(argc, argv, &suite)) return 2;
    if (hopper_only) fg_context_destroy(hopper_only);
    return check_summary("gpu_decode");
}
