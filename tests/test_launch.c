/* The runtime's launch path, with no GPU: a live context on a stand-in
 * driver (fake_cuda.c, which reports an H100) plans, generates and compiles
 * as on the GPU, and its launches, tensor maps and memsets are recorded
 * instead of run. What a call hands the driver is checked against the
 * call: the kernel each pass takes, its grid, threads and shared memory,
 * the addresses, lengths and strides in its parameters, the maps' shapes,
 * the workspace a split decoding step uses and the memset the backward
 * clears its accumulators with. The kernels' results are the GPU tests'
 * business. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flashgen.h"
#include "gen/kernel_params.h"
#include "tests/check.h"
#include "tests/fake_cuda.h"

static const fake_cuda_record *(*record)(void);
static void (*clear)(void);
static int (*device_alloc)(unsigned long long *, size_t);

/* bytes of stand-in device memory (the driver knows it as the device's) */
static void *device(size_t bytes) {
    unsigned long long at = 0;
    if (device_alloc(&at, bytes)) {
        fprintf(stderr, "test_launch: the stand-in driver's allocation failed\n");
        exit(1);
    }
    return (void *)(uintptr_t)at;
}

static int starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* The parameters of launch i as the family's struct. */
#define PARAMS(type, i) (*(const type *)record()->launch[i].params)

/* The record of the call just made when it has these many launches (and
 * maps, where maps >= 0); else NULL, the mismatch reported. */
static const fake_cuda_record *recorded(const char *what, int launches, int maps) {
    const fake_cuda_record *r = record();
    if (r->launch_count == launches && (maps < 0 || r->map_count == maps)) return r;
    CHECK(0, "%s: %d launches, %d maps", what, r->launch_count, r->map_count);
    return NULL;
}

static fg_forward_args dense_call(int batch, int heads_q, int heads_kv, int seqlen_q,
                                  int seqlen_k, int d, int dv) {
    fg_forward_args a = fg_forward_args_default();
    a.batch = batch, a.heads_q = heads_q, a.heads_kv = heads_kv;
    a.seqlen_q = seqlen_q, a.seqlen_k = seqlen_k;
    size_t rows_q = (size_t)batch * seqlen_q, rows_k = (size_t)batch * seqlen_k;
    a.q = fg_tensor_bshd(device(rows_q * heads_q * d * 2), seqlen_q, heads_q, d);
    a.k = fg_tensor_bshd(device(rows_k * heads_kv * d * 2), seqlen_k, heads_kv, d);
    a.v = fg_tensor_bshd(device(rows_k * heads_kv * dv * 2), seqlen_k, heads_kv, dv);
    a.o = fg_tensor_bshd(device(rows_q * heads_q * dv * 2), seqlen_q, heads_q, dv);
    a.lse = device((size_t)batch * heads_q * seqlen_q * 4);
    return a;
}

/* The Hopper forward: one launch of (query blocks x heads x batch) thread
 * blocks, its four maps over q, k, v and o, and the call in its parameters. */
static void test_hopper_forward(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.mask = FG_MASK_CAUSAL;
    fg_forward_args a = dense_call(2, 4, 2, 300, 300, 128, 128);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "forward: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("forward", 1, 4);
    if (!r) return;
    const fake_cuda_launch *l = &r->launch[0];
    fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 0);
    CHECK(starts(l->entry, "fg_fwd_sm90a_bf16_d128_causal_m128"), "forward: %s", l->entry);
    CHECK(p.num_m_blocks == 3 && l->grid == 3u * 4 * 2 && l->threads == 384 &&
              l->smem > 0 && l->smem <= 232448,
          "forward: %d query blocks, grid %u, %u threads, %u bytes", p.num_m_blocks, l->grid,
          l->threads, l->smem);
    CHECK(p.q == (uintptr_t)a.q.data && p.k == (uintptr_t)a.k.data && p.v == (uintptr_t)a.v.data &&
              p.o == (uintptr_t)a.o.data && p.lse == (uintptr_t)a.lse,
          "forward: the addresses");
    CHECK(p.batch == 2 && p.heads_q == 4 && p.heads_kv == 2 && p.seqlen_q == 300 &&
              p.seqlen_k == 300 && p.q_ss == 4 * 128 && p.k_ss == 2 * 128 && p.o_sh == 128,
          "forward: sizes and strides");
    /* maps (D, S, H, B): q, k, v, o; boxes of 64 columns by Br, Bc, Bc, 64 rows */
    const uint32_t rows[4] = {128, r->map[1].box[1], r->map[1].box[1], 64};
    const uintptr_t at[4] = {(uintptr_t)a.q.data, (uintptr_t)a.k.data, (uintptr_t)a.v.data,
                             (uintptr_t)a.o.data};
    for (int i = 0; i < 4; i++)
        CHECK(r->map[i].rank == 4 && r->map[i].address == at[i] && r->map[i].dims[0] == 128 &&
                  r->map[i].dims[1] == 300 && r->map[i].dims[3] == 2 && r->map[i].box[0] == 64 &&
                  r->map[i].box[1] == rows[i],
              "forward map %d: dims %llu x %llu, box %u x %u", i,
              (unsigned long long)r->map[i].dims[0], (unsigned long long)r->map[i].dims[1],
              r->map[i].box[0], r->map[i].box[1]);
}

/* A window's sides as the kernels take them: a side wider than any key of
 * the call's tiles is from a query's diagonal (the longer length and a
 * tile, 256: 556 at top-left 200 x 300) clamped to that, so that no bound
 * the kernels add it to leaves 32 bits; others as given. */
static void test_window_sides(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.mask = FG_MASK_WINDOW;
    fg_forward_args a = dense_call(1, 2, 2, 200, 300, 128, 128);
    a.align = FG_ALIGN_TOP_LEFT;
    const int sides[3][4] = {{INT32_MAX, INT32_MAX, 556, 556}, {7, 555, 7, 555}, {-1, 557, -1, 556}};
    for (int i = 0; i < 3; i++) {
        a.window_left = sides[i][0], a.window_right = sides[i][1];
        clear();
        CHECK(fg_forward(ctx, &s, &a) == FG_OK && record()->launch_count == 1,
              "window %d/%d: %s", a.window_left, a.window_right, fg_context_message(ctx));
        if (record()->launch_count != 1) continue;
        fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 0);
        CHECK(p.window_left == sides[i][2] && p.window_right == sides[i][3],
              "window %d/%d: the kernel takes %d/%d, want %d/%d", a.window_left, a.window_right,
              p.window_left, p.window_right, sides[i][2], sides[i][3]);
    }
}

/* Packed sequences on the Hopper forward: the maps run over the packed
 * tensors (all rows, one batch), the grid over the longest sequence's query
 * blocks and the sequences, the arrays in the parameters. */
static void test_packed_forward(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.varlen = 1, s.mask = FG_MASK_CAUSAL;
    const int32_t lengths[4] = {0, 130, 131, 431}; /* three sequences, the longest 300 */
    int32_t *cu = device(sizeof lengths);
    memcpy(cu, lengths, sizeof lengths); /* the stand-in's memory is the host's */
    fg_forward_args a = dense_call(1, 4, 2, 431, 431, 128, 128);
    a.batch = 3, a.seqlen_q = a.seqlen_k = 300;
    a.cu_seqlens_q = a.cu_seqlens_k = cu;
    a.total_q = a.total_k = 431;
    a.lse = device((size_t)4 * 431 * 4);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "packed: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("packed", 1, 4);
    if (!r) return;
    fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 0);
    CHECK(starts(r->launch[0].entry, "fg_fwd_sm90a_bf16_d128_causal_varlen_"), "packed: %s",
          r->launch[0].entry);
    CHECK(p.num_m_blocks == 3 && r->launch[0].grid == 3u * 4 * 3 &&
              p.cu_seqlens_q == (uintptr_t)cu && p.total_q == 431 && p.batch == 3,
          "packed: %d query blocks, grid %u", p.num_m_blocks, r->launch[0].grid);
    for (int i = 0; i < 4; i++)
        CHECK(r->map[i].dims[1] == 431 && r->map[i].dims[3] == 1,
              "packed map %d: %llu rows, %llu batches", i, (unsigned long long)r->map[i].dims[1],
              (unsigned long long)r->map[i].dims[3]);
}

/* Packed tensors of no rows at all (every sequence empty of queries, or of
 * keys): a tensor map needs a row, so the Hopper families hand such calls
 * on, forward and backward, fast and deterministic (no slices to size). */
static void test_packed_no_rows(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.varlen = 1, s.mask = FG_MASK_CAUSAL;
    const int32_t none[3] = {0, 0, 0}, some[3] = {0, 200, 300};
    int32_t *cu_none = device(sizeof none), *cu_some = device(sizeof some);
    memcpy(cu_none, none, sizeof none), memcpy(cu_some, some, sizeof some);
    for (int keyless = 0; keyless < 2; keyless++) {
        const int tq = keyless ? 300 : 0, tk = keyless ? 0 : 300; /* packed rows */
        fg_backward_args b;
        memset(&b, 0, sizeof b);
        fg_forward_args *a = &b.forward;
        *a = fg_forward_args_default();
        a->batch = 2, a->heads_q = 4, a->heads_kv = 2;
        a->seqlen_q = keyless ? 200 : 0, a->seqlen_k = keyless ? 0 : 200;
        a->cu_seqlens_q = keyless ? cu_some : cu_none;
        a->cu_seqlens_k = keyless ? cu_none : cu_some;
        a->total_q = tq, a->total_k = tk;
        const size_t q = (size_t)tq * 4 * 128 * 2 + 16, k = (size_t)tk * 2 * 128 * 2 + 16;
        a->q = fg_tensor_bshd(device(q), tq, 4, 128), a->o = fg_tensor_bshd(device(q), tq, 4, 128);
        a->k = fg_tensor_bshd(device(k), tk, 2, 128), a->v = fg_tensor_bshd(device(k), tk, 2, 128);
        a->lse = device((size_t)4 * tq * 4 + 16);
        b.d_o = fg_tensor_bshd(device(q), tq, 4, 128), b.d_q = fg_tensor_bshd(device(q), tq, 4, 128);
        b.d_k = fg_tensor_bshd(device(k), tk, 2, 128), b.d_v = fg_tensor_bshd(device(k), tk, 2, 128);
        const char *what = keyless ? "no key rows" : "no query rows";
        clear();
        CHECK(fg_forward(ctx, &s, a) == FG_OK, "%s: forward: %s", what, fg_context_message(ctx));
        for (int det = 0; det < 2; det++) {
            b.deterministic = det;
            clear();
            fg_status st = fg_backward(ctx, &s, &b);
            const fake_cuda_record *r = record();
            const char *last = r->launch_count ? r->launch[r->launch_count - 1].entry : "none";
            CHECK(st == FG_OK && r->map_count == 0 && starts(last, "fg_bwd_") && !strstr(last, "sm90a"),
                  "%s: backward (deterministic %d): %s, %d maps, the last launch %s", what, det,
                  fg_context_message(ctx), r->map_count, last);
        }
    }
}

/* A value head dim of its own on the Hopper forward: q and k mapped by the
 * head dim's columns, v and o by the value head dim's. */
static void test_value_head_dim(fg_context *ctx) {
    fg_spec s = fg_spec_default(192, FG_BF16);
    s.head_dim_v = 128;
    fg_forward_args a = dense_call(1, 8, 2, 77, 129, 192, 128);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "d192/128: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("d192/128", 1, 4);
    if (!r) return;
    fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 0);
    CHECK(starts(r->launch[0].entry, "fg_fwd_sm90a_bf16_d192v128_"), "d192/128: %s",
          r->launch[0].entry);
    CHECK(p.q_ss == 8 * 192 && p.k_ss == 2 * 192 && p.v_ss == 2 * 128 && p.o_ss == 8 * 128,
          "d192/128: strides q %lld k %lld v %lld o %lld", (long long)p.q_ss, (long long)p.k_ss,
          (long long)p.v_ss, (long long)p.o_ss);
    const uint64_t cols[4] = {192, 192, 128, 128}, rows[4] = {77, 129, 129, 77};
    for (int i = 0; i < 4; i++)
        CHECK(r->map[i].dims[0] == cols[i] && r->map[i].dims[1] == rows[i],
              "d192/128 map %d: dims %llu x %llu", i, (unsigned long long)r->map[i].dims[0],
              (unsigned long long)r->map[i].dims[1]);
}

/* A workspace of the caller's for call a, no turn counters. */
static void give_workspace(fg_context *ctx, const fg_spec *s, fg_forward_args *a) {
    size_t bytes = 0;
    CHECK(fg_forward_workspace_size(ctx, s, a, &bytes) == FG_OK && bytes > 0,
          "workspace size: %zu: %s", bytes, fg_context_message(ctx));
    uintptr_t at = (uintptr_t)device(bytes + 255);
    a->workspace = (void *)((at + 255) / 256 * 256); /* (the stand-in's memory is malloc's) */
    a->workspace_bytes = bytes;
}

/* A dense step's cache (keys a sequence a multiple of `page`) as pages of
 * `page` rows holding the same rows, every sequence's in order; d the head
 * dim of K and V. */
static void as_pages(fg_forward_args *a, int page, int d) {
    const int per_sequence = a->seqlen_k / page, pages = a->batch * per_sequence;
    int32_t *table = device(pages * sizeof *table);
    for (int j = 0; j < pages; j++) table[j] = j;
    a->k = fg_tensor_bshd(a->k.data, page, a->heads_kv, d);
    a->v = fg_tensor_bshd(a->v.data, page, a->heads_kv, d);
    a->block_table = table, a->block_table_stride = per_sequence, a->page_size = page;
    a->num_pages = pages;
}

/* A decoding step over a long cache splits its keys. Given a workspace and
 * no turn counters: the step (no append kernel without new rows), its parts
 * in the workspace, then the combine kernel, a thread block per query row,
 * as the step's programmatic dependent on sm_90; with one split the step
 * alone, in stream order. */
static void test_split_step(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.kv_cache = 1;
    fg_forward_args a = dense_call(1, 32, 8, 1, 8192, 128, 128);
    give_workspace(ctx, &s, &a);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "step: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("step", 2, -1);
    if (!r) return;
    fg_decode_params p = PARAMS(fg_decode_params, 0);
    CHECK(starts(r->launch[0].entry, "fg_decode_") && !strstr(r->launch[0].entry, "_append") &&
              strstr(r->launch[1].entry, "_combine"),
          "step: %s, %s", r->launch[0].entry, r->launch[1].entry);
    /* 32 rows of 16 splits combined a block a row (past 8 splits) */
    CHECK(p.num_splits > 1 && p.lse_part == (uintptr_t)a.workspace && p.o_part > p.lse_part &&
              p.append_items == 0 && p.seqlen_new == 0 && p.combine_blocks == 32 &&
              p.combine_row_warps == 0 && p.split_counters == 0,
          "step: %d splits, %d appended, %d combining blocks (a warp a row %d)", p.num_splits,
          p.append_items, p.combine_blocks, p.combine_row_warps);
    CHECK(r->launch[0].grid % (unsigned)p.num_splits == 0 && r->launch[1].grid == 32,
          "step: grids %u, %u, %d splits", r->launch[0].grid, r->launch[1].grid, p.num_splits);
    CHECK(!r->launch[0].programmatic && r->launch[1].programmatic,
          "step: programmatic launches %d, %d", r->launch[0].programmatic,
          r->launch[1].programmatic);
    /* 128 key tiles of 8 KV heads, 4 query rows each: splits of 8 tiles,
     * one block an SM (16 splits, not 32 of 4 tiles two blocks an SM: a
     * block of one warp's rows streams as fast alone), whose warps sharing
     * a row block's rows split the keys (the kernel of key_blocks) */
    CHECK(p.num_splits == 16, "32/8 step of 8192 keys: %d splits", p.num_splits);
    CHECK(!strstr(r->launch[0].entry, "_columns") && p.key_blocks == 16 * 8 &&
              p.column_blocks == 0,
          "step: %s, blocks %d, %d", r->launch[0].entry, p.key_blocks, p.column_blocks);
    /* up to 8 splits a warp a row, four rows a block, where the rows are at
     * most 128 columns: 8 splits of these 32 rows, 8 blocks; at d 256 a
     * block a row */
    const int asked_d[] = {128, 256};
    for (int i = 0; i < 2; i++) {
        fg_spec sd = fg_spec_default(asked_d[i], FG_BF16);
        sd.kv_cache = 1;
        fg_forward_args eight = dense_call(1, 32, 8, 1, 8192, asked_d[i], asked_d[i]);
        eight.num_splits = 8;
        give_workspace(ctx, &sd, &eight);
        clear();
        CHECK(fg_forward(ctx, &sd, &eight) == FG_OK, "8 splits: %s", fg_context_message(ctx));
        if (!recorded("8 splits", 2, -1)) continue;
        const fg_decode_params e = PARAMS(fg_decode_params, 0);
        const int warps = asked_d[i] <= 128;
        CHECK(e.num_splits == 8 && e.combine_row_warps == warps &&
                  e.combine_blocks == (warps ? 8 : 32) && record()->launch[1].grid == (warps ? 8u : 32u),
              "d %d, 8 splits: %d combining blocks (a warp a row %d), grid %u", asked_d[i],
              e.combine_blocks, e.combine_row_warps, record()->launch[1].grid);
    }
    /* one KV head over 4096 keys: 64 tiles of 64, fewer than the SMs, so a
     * short step's tiles of 32 keys (the derived plan's are 64): 128 tiles
     * of 32, a tile per split, in one wave (even shares), whose warps split
     * O's columns; the combine still the programmatic dependent of the
     * step (the launch before it in the list, the other step kernel, not
     * taken), a block a row for 128 splits */
    fg_forward_args one = dense_call(1, 8, 1, 1, 4096, 128, 128);
    give_workspace(ctx, &s, &one);
    clear();
    CHECK(fg_forward(ctx, &s, &one) == FG_OK && PARAMS(fg_decode_params, 0).num_splits == 128,
          "8/1 step of 4096 keys: %d splits", PARAMS(fg_decode_params, 0).num_splits);
    if ((r = recorded("8/1 step", 2, -1)))
        CHECK(strstr(r->launch[0].entry, "_n32r64s4_columns") && !r->launch[0].programmatic &&
                  r->launch[1].programmatic && PARAMS(fg_decode_params, 0).key_blocks == 0 &&
                  PARAMS(fg_decode_params, 0).column_blocks == 128 && r->launch[0].grid == 128 &&
                  PARAMS(fg_decode_params, 0).combine_row_warps == 0 && r->launch[1].grid == 8,
              "8/1 step: %s (grid %u), then programmatic %d (grid %u)", r->launch[0].entry,
              r->launch[0].grid, r->launch[1].programmatic, r->launch[1].grid);
    /* 32/8 over 1024 keys: 128 tiles of 64 (16 a KV head), fewer than the
     * SMs: tiles of 32 too, contiguous or in pages of 16 rows. Pages of 8
     * rows, 4096 keys (512 tiles), and 17 query rows a KV head: the
     * derived plan's tiles of 64 */
    const struct {
        int heads_q, heads_kv, keys, page;
        const char *tiles;
    } steps[] = {{32, 8, 1024, 0, "_n32r64s4"}, {32, 8, 1024, 16, "_n32r64s4"},
                 {32, 8, 1024, 8, "_n64r64s3"}, {32, 8, 4096, 0, "_n64r64s3"},
                 {17, 1, 1024, 0, "_n64r64s3"}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        fg_forward_args x = dense_call(1, steps[i].heads_q, steps[i].heads_kv, 1, steps[i].keys, 128,
                                       128);
        if (steps[i].page) as_pages(&x, steps[i].page, 128);
        give_workspace(ctx, &s, &x);
        clear();
        CHECK(fg_forward(ctx, &s, &x) == FG_OK, "short step %zu: %s", i, fg_context_message(ctx));
        if ((r = recorded("short step", 2, -1)))
            CHECK(strstr(r->launch[0].entry, steps[i].tiles) != NULL,
                  "%d/%d step over %d keys, pages of %d: %s", steps[i].heads_q, steps[i].heads_kv,
                  steps[i].keys, steps[i].page, r->launch[0].entry);
    }
    /* lengths in host memory: refused by name, nothing launched */
    int32_t host_lengths[1] = {100};
    fg_forward_args on_host = one;
    on_host.cache_seqlens = host_lengths;
    clear();
    CHECK(fg_forward(ctx, &s, &on_host) == FG_ERR_INVALID_ARGUMENT &&
              strstr(fg_context_message(ctx), "cache_seqlens") &&
              strstr(fg_context_message(ctx), "not device memory") && record()->launch_count == 0,
          "lengths in host memory: %s", fg_context_message(ctx));
    /* one split asked for: one launch, no workspace, in stream order */
    a.num_splits = 1;
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK && record()->launch_count == 1 &&
              PARAMS(fg_decode_params, 0).num_splits == 1 &&
              PARAMS(fg_decode_params, 0).lse_part == 0 &&
              PARAMS(fg_decode_params, 0).combine_blocks == 0 && !record()->launch[0].programmatic,
          "step, one split: %d launches", record()->launch_count);
}

/* A latent call's cache as pages of `page` rows, every sequence's in order. */
static void latent_pages(fg_forward_args *a, int batch, int keys, int page) {
    const int pages = batch * keys / page;
    int32_t *table = device(pages * sizeof *table);
    for (int j = 0; j < pages; j++) table[j] = j;
    a->k = fg_tensor_bshd(a->k.data, page, 1, 576);
    a->block_table = table, a->block_table_stride = keys / page, a->page_size = page;
    a->num_pages = pages;
}

/* A latent step on the H100 (fwd_mla_sm90a, DeepSeek's 576/512): a map of
 * the cache, contiguous or paged, whose boxes are the rows a page and a
 * tile of 64 share where that is a multiple of 8 (else no map, kv_box_rows
 * 0: the kernel's cp.async copies); a thread block per (split, 64-row block,
 * sequence). */
static void test_latent_step(fg_context *ctx) {
    fg_spec s = fg_spec_default(576, FG_BF16);
    s.head_dim_v = 512, s.kv_cache = FG_KV_LATENT;
    const struct {
        int heads, page; /* page 0: contiguous */
        unsigned box_rows;
    } steps[] = {{128, 0, 64}, {128, 64, 64}, {128, 256, 64}, {128, 24, 8}, {128, 16, 16},
                 {128, 12, 0}, {16, 64, 64}, {192, 64, 64}, {64, 1, 0}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        const int batch = 2, keys = 1536, heads = steps[i].heads, page = steps[i].page;
        fg_forward_args a = dense_call(batch, heads, 1, 1, keys, 576, 512);
        a.v = (fg_tensor){0};
        if (page) latent_pages(&a, batch, keys, page);
        give_workspace(ctx, &s, &a);
        clear();
        CHECK(fg_forward(ctx, &s, &a) == FG_OK, "latent step %zu: %s", i, fg_context_message(ctx));
        const fake_cuda_record *r = recorded("latent step", 2, steps[i].box_rows ? 1 : 0);
        if (!r) continue;
        const fg_decode_tma_params p = PARAMS(fg_decode_tma_params, 0);
        const fake_cuda_launch *l = &r->launch[0];
        const int blocks = p.num_splits * p.row_blocks * batch;
        CHECK(starts(l->entry, "fg_mla_sm90a_") && l->grid == (unsigned)blocks && p.num_splits > 1 &&
                  p.row_blocks == (heads + 63) / 64 && strstr(r->launch[1].entry, "_combine"),
              "%d heads, pages of %d: %s, grid %u, %d splits", heads, page, l->entry, l->grid,
              p.num_splits);
        CHECK(p.kv_box_rows == (int)steps[i].box_rows, "%d heads, pages of %d: boxes of %d rows",
              heads, page, p.kv_box_rows);
        /* the map: (576, rows a unit, 1, units), boxes of 64 columns */
        if (steps[i].box_rows)
            CHECK(r->map[0].address == (uintptr_t)a.k.data && r->map[0].dims[0] == 576 &&
                      r->map[0].dims[1] == (uint64_t)(page ? page : keys) &&
                      r->map[0].dims[3] == (uint64_t)(page ? batch * keys / page : batch) &&
                      r->map[0].box[0] == 64 && r->map[0].box[1] == steps[i].box_rows,
                  "%d heads, pages of %d: map %llu x %llu x %llu, box %u x %u", heads, page,
                  (unsigned long long)r->map[0].dims[0], (unsigned long long)r->map[0].dims[1],
                  (unsigned long long)r->map[0].dims[3], r->map[0].box[0], r->map[0].box[1]);
    }
    /* 16 heads of 64 sequences take two splits: the narrow kernel in
     * clusters of two, a sequence's splits each, which add their halves in
     * shared memory: no workspace, no combine kernel. Three splits asked
     * for: parts and the combine kernel again. */
    const int batch = 64, keys = 1536;
    fg_forward_args a = dense_call(batch, 16, 1, 1, keys, 576, 512);
    a.v = (fg_tensor){0};
    latent_pages(&a, batch, keys, 64);
    size_t bytes = 1;
    CHECK(fg_forward_workspace_size(ctx, &s, &a, &bytes) == FG_OK && bytes == 0,
          "latent step in pairs: a workspace of %zu bytes", bytes);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "latent step in pairs: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("latent step in pairs", 1, 1);
    if (r) {
        const fg_decode_tma_params p = PARAMS(fg_decode_tma_params, 0);
        CHECK(strstr(r->launch[0].entry, "_narrow") && r->launch[0].cluster == 2 &&
                  r->launch[0].grid == 2 * batch && p.num_splits == 2 && p.pair_blocks == 2 * batch &&
                  p.narrow_blocks == 0 && p.combine_blocks == 0 && p.o_part == 0,
              "latent step in pairs: %s, cluster %u, grid %u, %d splits", r->launch[0].entry,
              r->launch[0].cluster, r->launch[0].grid, p.num_splits);
    }
    a.num_splits = 3;
    give_workspace(ctx, &s, &a);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "latent step of 3 splits: %s", fg_context_message(ctx));
    if ((r = recorded("latent step of 3 splits", 2, 1)))
        CHECK(strstr(r->launch[0].entry, "_narrow") && r->launch[0].cluster == 1 &&
                  r->launch[0].grid == 3 * batch && strstr(r->launch[1].entry, "_combine"),
              "latent step of 3 splits: %s, cluster %u, grid %u", r->launch[0].entry,
              r->launch[0].cluster, r->launch[0].grid);
}

/* With turn counters a short split step is one launch: a counted kernel,
 * whose blocks after the splits' add the parts, one a query row
 * (split_counters set, combine_blocks 0). The counters are the caller's, or
 * where the workspace is the context's, the context's: zeroed when made or
 * grown (a memset of one int a query row on the call's stream), kept
 * after. Splits of more than eight tiles, and as many query rows as the GPU
 * has SMs or more, keep the combine kernel. */
static void test_split_step_one_launch(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.kv_cache = 1;
    /* 32/8 over 4096 keys: 16 splits of four tiles, the caller's counters */
    fg_forward_args a = dense_call(1, 32, 8, 1, 4096, 128, 128);
    give_workspace(ctx, &s, &a);
    a.split_counters = device(32 * 4);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "step with counters: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("step with counters", 1, -1);
    if (r) {
        fg_decode_params p = PARAMS(fg_decode_params, 0);
        CHECK(strstr(r->launch[0].entry, "_counted") && !strstr(r->launch[0].entry, "_columns") &&
                  r->memset_count == 0 && p.split_counters == (uintptr_t)a.split_counters &&
                  p.combine_blocks == 0 && p.num_splits == 16 && r->launch[0].grid == 16 * 8 + 32 &&
                  p.counted_key_blocks == 16 * 8 + 32 && p.key_blocks == 0,
              "step with counters: %s (grid %u), %d memsets, %d splits, %d rows combined apart",
              r->launch[0].entry, r->launch[0].grid, r->memset_count, p.num_splits, p.combine_blocks);
    }
    /* 16384 keys: splits of 16 tiles take the combine kernel, counters or not */
    fg_forward_args longer = dense_call(1, 32, 8, 1, 16384, 128, 128);
    give_workspace(ctx, &s, &longer);
    longer.split_counters = a.split_counters;
    clear();
    CHECK(fg_forward(ctx, &s, &longer) == FG_OK, "longer step: %s", fg_context_message(ctx));
    if ((r = recorded("longer step with counters", 2, -1)))
        CHECK(!strstr(r->launch[0].entry, "_counted") && strstr(r->launch[1].entry, "_combine") &&
                  PARAMS(fg_decode_params, 0).split_counters == 0,
              "longer step: %s, %s", r->launch[0].entry, r->launch[1].entry);
    /* 8/1 over 4096 keys, the context's counters: 128 splits of a 32-key
     * tile (the columns' way), counters made (zeroed) by the first call,
     * then kept */
    fg_forward_args c = dense_call(1, 8, 1, 1, 4096, 128, 128);
    for (int round = 0; round < 2; round++) {
        clear();
        CHECK(fg_forward(ctx, &s, &c) == FG_OK, "step, context's counters: %s",
              fg_context_message(ctx));
        if (!(r = recorded("step, context's counters", 1, -1))) return;
        fg_decode_params p = PARAMS(fg_decode_params, 0);
        CHECK(strstr(r->launch[0].entry, "_columns_counted") && p.num_splits == 128 &&
                  p.split_counters != 0 && p.combine_blocks == 0 && r->launch[0].grid == 128 + 8 &&
                  r->memset_count == (round == 0) &&
                  (round > 0 || (r->memset[0].address == p.split_counters &&
                                 r->memset[0].bytes == 8 * 4)),
              "step, context's counters (round %d): %s, %d splits, %d memsets", round,
              r->launch[0].entry, p.num_splits, r->memset_count);
    }
    /* 5 queries of 32 heads over 1024 keys: 160 rows, more than the GPU's
     * 132 SMs, combined apart */
    fg_forward_args many = dense_call(1, 32, 8, 5, 1024, 128, 128);
    give_workspace(ctx, &s, &many);
    many.split_counters = device(160 * 4);
    clear();
    CHECK(fg_forward(ctx, &s, &many) == FG_OK, "160 rows: %s", fg_context_message(ctx));
    if ((r = recorded("160 rows", 2, -1)))
        CHECK(strstr(r->launch[1].entry, "_combine") &&
                  PARAMS(fg_decode_params, 0).split_counters == 0 &&
                  PARAMS(fg_decode_params, 0).combine_blocks ==
                      (PARAMS(fg_decode_params, 0).num_splits <= 8 ? 40 : 160),
              "160 rows: %s, %d splits, %d combining blocks", r->launch[1].entry,
              PARAMS(fg_decode_params, 0).num_splits, PARAMS(fg_decode_params, 0).combine_blocks);
    /* counters off 4 bytes: refused by name, nothing launched */
    a.split_counters = (int32_t *)((char *)a.split_counters + 2);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_ERR_INVALID_ARGUMENT &&
              strstr(fg_context_message(ctx), "split_counters") && record()->launch_count == 0,
          "counters off 4 bytes: %s", fg_context_message(ctx));
}

/* A chunk of many queries over a paged cache on sm_90 (chunked prefill):
 * the append kernel, then the Hopper forward as its programmatic dependent,
 * K and V read through maps over the pages, a page's rows a box; pages of 3
 * rows go to fwd_decode. */
static void test_chunked_prefill(fg_context *ctx) {
    enum { B = 2, HQ = 32, HKV = 8, D = 128, SQ = 512, PAGE = 16, PER_SEQ = 96 };
    fg_spec s = fg_spec_default(D, FG_BF16);
    s.kv_cache = 1, s.mask = FG_MASK_CAUSAL;
    fg_forward_args a = dense_call(B, HQ, HKV, SQ, PER_SEQ * PAGE, D, D);
    const size_t pool = (size_t)B * PER_SEQ * PAGE * HKV * D * 2;
    a.k = fg_tensor_bshd(device(pool), PAGE, HKV, D);
    a.v = fg_tensor_bshd(device(pool), PAGE, HKV, D);
    /* room for the longer rows of pages of 3 below; every entry in the pool */
    int32_t *table = device(B * PER_SEQ * PAGE * sizeof *table), *cached = device(B * sizeof *cached);
    for (int i = 0; i < B * PER_SEQ * PAGE; i++) table[i] = i % (B * PER_SEQ);
    cached[0] = 1000, cached[1] = 7;
    a.block_table = table, a.block_table_stride = PER_SEQ, a.page_size = PAGE;
    a.num_pages = B * PER_SEQ, a.cache_seqlens = cached;
    a.k_new = fg_tensor_bshd(device((size_t)B * SQ * HKV * D * 2), SQ, HKV, D);
    a.v_new = fg_tensor_bshd(device((size_t)B * SQ * HKV * D * 2), SQ, HKV, D);
    a.seqlen_new = SQ;
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "prefill: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("prefill", 2, 4);
    if (r) {
        fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 1);
        CHECK(strstr(r->launch[0].entry, "_append") &&
                  starts(r->launch[1].entry, "fg_fwd_sm90a_bf16_d128_causal_kvcache_") &&
                  !r->launch[0].programmatic && r->launch[1].programmatic,
              "prefill: %s, %s", r->launch[0].entry, r->launch[1].entry);
        CHECK(p.block_table == (uintptr_t)table && p.cache_seqlens == (uintptr_t)cached &&
                  p.page_size == PAGE && p.page_shift == 4 && p.num_pages == B * PER_SEQ &&
                  p.seqlen_new == SQ && p.append_items == B * SQ * HKV &&
                  p.k_new == (uintptr_t)a.k_new.data && p.kn_ss == HKV * D,
              "prefill: the cache's arguments");
        /* k and v: (D, page, Hkv, pages) in boxes of 64 columns by a page's rows */
        for (int i = 1; i <= 2; i++)
            CHECK(r->map[i].dims[0] == D && r->map[i].dims[1] == PAGE && r->map[i].dims[2] == HKV &&
                      r->map[i].dims[3] == B * PER_SEQ && r->map[i].box[1] == PAGE,
                  "prefill map %d: dims %llu x %llu x %llu x %llu, box rows %u", i,
                  (unsigned long long)r->map[i].dims[0], (unsigned long long)r->map[i].dims[1],
                  (unsigned long long)r->map[i].dims[2], (unsigned long long)r->map[i].dims[3],
                  r->map[i].box[1]);
    }
    a.page_size = 3; /* the same pool as pages of 3 rows: not whole swizzle periods */
    a.block_table_stride = PER_SEQ * PAGE / 3;
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK && record()->launch_count >= 1 &&
              starts(record()->launch[record()->launch_count - 1].entry, "fg_decode_"),
          "prefill, pages of 3: %s", fg_context_message(ctx));
}

/* A backward call over dense_call's tensors (heads_q = heads_kv, d = dv),
 * with its gradients' own. */
static fg_backward_args backward_call(int batch, int heads, int seqlen, int d) {
    fg_backward_args b;
    memset(&b, 0, sizeof b);
    b.forward = dense_call(batch, heads, heads, seqlen, seqlen, d, d);
    size_t n = (size_t)batch * seqlen * heads * d * 2;
    b.d_o = fg_tensor_bshd(device(n), seqlen, heads, d);
    b.d_q = fg_tensor_bshd(device(n), seqlen, heads, d);
    b.d_k = fg_tensor_bshd(device(n), seqlen, heads, d);
    b.d_v = fg_tensor_bshd(device(n), seqlen, heads, d);
    return b;
}

/* The Hopper backward clears its fp32 dQ accumulator (and its counters)
 * before it runs; D's kernel first in stream order, every kernel after it
 * as its predecessor's programmatic dependent. */
static void test_hopper_backward(fg_context *ctx) {
    fg_spec s = fg_spec_default(64, FG_FP16);
    fg_backward_args b = backward_call(2, 4, 200, 64);
    size_t n = (size_t)2 * 200 * 4 * 64;
    clear();
    CHECK(fg_backward(ctx, &s, &b) == FG_OK, "backward: %s", fg_context_message(ctx));
    const fake_cuda_record *r = record();
    const char *last = r->launch_count ? r->launch[r->launch_count - 1].entry : "none";
    CHECK(starts(last, "fg_bwd_sm90a_fp16_d64"), "backward: %d launches, the last %s",
          r->launch_count, last);
    CHECK(r->launch_count >= 2 && strstr(r->launch[0].entry, "_pre") && !r->launch[0].programmatic,
          "backward: the first of %d launches %s, programmatic %d", r->launch_count,
          r->launch_count ? r->launch[0].entry : "none", r->launch_count ? r->launch[0].programmatic : 0);
    for (int i = 1; i < r->launch_count; i++)
        CHECK(r->launch[i].programmatic, "backward: launch %d (%s) in stream order", i, r->launch[i].entry);
    CHECK(r->memset_count == 1 && r->memset[0].bytes >= n * 4 / 2,
          "backward: %d memsets of %zu bytes (dQ's fp32 rows: %zu)", r->memset_count,
          r->memset_count ? r->memset[0].bytes : 0, n * 4 / 2);
    CHECK(PARAMS(fg_bwd_tma_params, 0).section_heads == 1, "backward: sections of %d",
          PARAMS(fg_bwd_tma_params, 0).section_heads);
}

/* Under a causal mask the fast backward orders the key blocks of sections
 * of (key/value head, sequence) pairs together: as many pairs as keep their
 * Q, dO and fp32 dQ rows within 24 MiB (4 MiB each here: 6 of 8), one pair
 * a section in the deterministic schedule. */
static void test_backward_sections(fg_context *ctx) {
    enum { H = 8, S = 4096, D = 128 };
    fg_spec s = fg_spec_default(D, FG_BF16);
    s.mask = FG_MASK_CAUSAL;
    fg_backward_args b = backward_call(1, H, S, D);
    clear();
    CHECK(fg_backward(ctx, &s, &b) == FG_OK && record()->launch_count > 0 &&
              PARAMS(fg_bwd_tma_params, 0).section_heads == 6,
          "causal backward: %s, sections of %d", fg_context_message(ctx),
          record()->launch_count ? PARAMS(fg_bwd_tma_params, 0).section_heads : -1);
    b.deterministic = 1;
    clear();
    CHECK(fg_backward(ctx, &s, &b) == FG_OK && record()->launch_count > 0 &&
              PARAMS(fg_bwd_tma_params, 0).section_heads == 1,
          "deterministic causal backward: %s, sections of %d", fg_context_message(ctx),
          record()->launch_count ? PARAMS(fg_bwd_tma_params, 0).section_heads : -1);
}

/* The deterministic backward without a mask wraps its key blocks round
 * their query blocks (wrap) where a sequence's key blocks fit one an SM
 * (132 here); not beyond, not under a causal mask. A fast call without a
 * mask takes that schedule, wrapped or not, where the consumers split the
 * columns and Q and dO have one stage (d 256; not d 192, two stages); the
 * fast kernel never wraps. */
static int wrap_of(fg_context *ctx, int d, int seqlen, fg_mask mask, int deterministic) {
    fg_spec s = fg_spec_default(d, FG_BF16);
    s.mask = mask;
    fg_backward_args b = backward_call(1, 1, seqlen, d);
    b.deterministic = deterministic;
    clear();
    if (fg_backward(ctx, &s, &b) != FG_OK || record()->launch_count == 0) return -1;
    return PARAMS(fg_bwd_tma_params, 0).wrap;
}

/* the deterministic main kernel's key blocks in the last call (0: the fast one's) */
static int det_blocks(void) {
    const fg_bwd_tma_params *p = &PARAMS(fg_bwd_tma_params, 0);
    return p->det_n_blocks > 0 && p->fast_n_blocks == 0 ? p->det_n_blocks
                                                         : p->fast_n_blocks > 0 ? 0 : -1;
}

static void test_backward_wrap(fg_context *ctx) {
    const int lengths[] = {2048, 132 * 128, 132 * 128 + 1};
    const int wraps[] = {1, 1, 0};
    for (int i = 0; i < 3; i++) {
        const int S = lengths[i];
        int w = wrap_of(ctx, 64, S, FG_MASK_NONE, 1);
        CHECK(w == wraps[i], "deterministic backward of %d keys: wrap %d", S, w);
        w = wrap_of(ctx, 64, S, FG_MASK_NONE, 0);
        CHECK(w == 0 && det_blocks() == 0, "fast backward of %d keys: wrap %d", S, w);
        w = wrap_of(ctx, 64, S, FG_MASK_CAUSAL, 1);
        CHECK(w == 0, "causal deterministic backward of %d keys: wrap %d", S, w);
    }
    int w = wrap_of(ctx, 256, 2048, FG_MASK_NONE, 0);
    CHECK(w == 1 && det_blocks() == 32,
          "fast backward at d 256 (split, one stage): wrap %d, %d deterministic key blocks", w,
          det_blocks());
    /* 133 key blocks of 64 are not resident together: unwrapped */
    w = wrap_of(ctx, 256, 133 * 64, FG_MASK_NONE, 0);
    CHECK(w == 0 && det_blocks() == 133,
          "fast backward at d 256 over 133 key blocks: wrap %d, %d deterministic key blocks", w,
          det_blocks());
    w = wrap_of(ctx, 256, 2048, FG_MASK_CAUSAL, 0);
    CHECK(w == 0 && det_blocks() == 0, "causal fast backward at d 256: wrap %d, %d", w,
          det_blocks());
    w = wrap_of(ctx, 192, 2048, FG_MASK_NONE, 0);
    CHECK(w == 0 && det_blocks() == 0, "fast backward at d 192 (split, two stages): wrap %d, %d",
          w, det_blocks());
}

/* Wide tiles on an H100: a step of one split whose units (a KV head of a
 * sequence) fill between half and 5/8 of the 132 SMs at d 128 (10
 * sequences of 8 KV heads) or more than twice them to 16/5 (48 sequences),
 * 8/11 of them to three times them at d 64 over 4,096 keys (12 to 48
 * sequences), takes tiles of 128 keys in one split of 4 warps, with no
 * workspace, in three stages (two at d 64 past the SMs); at d 128 96, 256
 * and 432 units (12 sequences; 32 and 54 over 1,024 keys), 3 splits asked
 * for, at d 64 80 and 400 units, 160 over 1,024 keys, or pages keep the
 * derived plan. */
static void test_wide_tiles(fg_context *ctx) {
    const struct {
        int batch, d;
    } wide[] = {{10, 128}, {48, 128}, {12, 64}, {16, 64}, {20, 64}, {32, 64}, {48, 64}};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        fg_spec s = fg_spec_default(wide[i].d, FG_BF16);
        s.kv_cache = 1;
        fg_forward_args a = dense_call(wide[i].batch, 32, 8, 1, 4096, wide[i].d, wide[i].d);
        clear();
        CHECK(fg_forward(ctx, &s, &a) == FG_OK, "wide step: %s", fg_context_message(ctx));
        const fake_cuda_record *r = recorded("wide step", 1, -1);
        if (!r) continue;
        fg_decode_params p = PARAMS(fg_decode_params, 0);
        const unsigned units = (unsigned)wide[i].batch * 8;
        const char *tiles = wide[i].d == 64 && units > 132 ? "_n128r16s2" : "_n128r16s3";
        CHECK(strstr(r->launch[0].entry, tiles) && !strstr(r->launch[0].entry, "_columns") &&
                  r->launch[0].threads == 128 && r->launch[0].grid == units && p.num_splits == 1 &&
                  p.key_blocks == (int)units && p.combine_blocks == 0,
              "wide step %d x 4096 at d %d: %s, %u threads, grid %u, %d splits", wide[i].batch,
              wide[i].d, r->launch[0].entry, r->launch[0].threads, r->launch[0].grid, p.num_splits);
    }
    const struct {
        int batch, keys, splits, d, page;
    } others[] = {{12, 4096, 0, 128, 0}, {32, 1024, 0, 128, 0}, {54, 1024, 0, 128, 0},
                  {10, 4096, 3, 128, 0}, {10, 4096, 0, 64, 0},   {50, 4096, 0, 64, 0},
                  {20, 1024, 0, 64, 0},  {10, 4096, 0, 128, 256}};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        fg_spec t = fg_spec_default(others[i].d, FG_BF16);
        t.kv_cache = 1;
        fg_forward_args x = dense_call(others[i].batch, 32, 8, 1, others[i].keys, others[i].d,
                                       others[i].d);
        x.num_splits = others[i].splits;
        if (others[i].page) { /* the same rows as pages, in order */
            const int per = others[i].keys / others[i].page, pages = others[i].batch * per;
            int32_t *table = device(pages * sizeof *table);
            for (int j = 0; j < pages; j++) table[j] = j;
            x.k = fg_tensor_bshd(x.k.data, others[i].page, 8, 128);
            x.v = fg_tensor_bshd(x.v.data, others[i].page, 8, 128);
            x.block_table = table, x.block_table_stride = per, x.page_size = others[i].page;
            x.num_pages = pages;
        }
        clear();
        CHECK(fg_forward(ctx, &t, &x) == FG_OK, "step %zu: %s", i, fg_context_message(ctx));
        if (record()->launch_count >= 1)
            CHECK(!strstr(record()->launch[0].entry, "_n128r16") && record()->launch[0].threads == 128,
                  "%d x %d keys, %d splits asked for, d %d: %s", others[i].batch, others[i].keys,
                  others[i].splits, others[i].d, record()->launch[0].entry);
    }
}

/* A context on the fake driver with an H200's memory (its DRAM bandwidth,
 * on the same SMs); h200_release destroys it and the setting. */
static fg_context *h200_context(void) {
    setenv("FAKE_CUDA_MEMORY", "h200", 1);
    fg_context *ctx = NULL;
    CHECK(fg_context_create(&ctx, NULL) == FG_OK, "context: %s", fg_last_message());
    return ctx;
}
static void h200_release(fg_context *ctx) {
    fg_context_destroy(ctx);
    unsetenv("FAKE_CUDA_MEMORY");
}

/* A bf16 decoding step of one query at head dim d (batch sequences of
 * `keys` keys, heads_q on heads_kv heads; in pages of `page` rows unless 0;
 * `splits` asked) on ctx; whether it launched anything to check. */
static int h200_step(fg_context *ctx, int d, int heads_q, int heads_kv, int batch, int keys,
                     int page, int splits) {
    fg_spec s = fg_spec_default(d, FG_BF16);
    s.kv_cache = 1;
    fg_forward_args a = dense_call(batch, heads_q, heads_kv, 1, keys, d, d);
    a.num_splits = splits;
    if (page) as_pages(&a, page, d);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "h200 step: %s", fg_context_message(ctx));
    return record()->launch_count >= 1;
}

/* Wide tiles with an H200's DRAM bandwidth on the same SMs: d 128 steps of
 * one split whose units fill more than half the SMs up to all of them,
 * over up to 4,096 keys (9 sequences of 8 KV heads over 1,024, 12 over
 * 4,096) or any keys from 3/4 of them (16 over 8,192 and 16,384); 10
 * sequences of 8,192 keys (80 units) and 8 sequences (64 units) keep the
 * derived plan, 20 (160 units) takes 64-key tiles (test_two_splits_h200). d
 * 64 from 8/11 of the SMs to all over up to 2,048 keys (12 sequences) or any
 * keys from 3/4 of them (14 over 16,384), in three stages; past them in
 * three stages up to 5/3 of them over up to 2,048 keys (27 sequences, 216
 * units), 4/3 over up to 4,096 (18 and 22), and from 7/6 to 4/3 over more
 * (20 over 8,192 and 22 over 16,384); past 5/4 of them to three times over
 * 4,096 keys or more in two (24 sequences over 4,096, 192 units; 40 over
 * 8,192); 9 sequences over 2,048 keys, 12 over 4,096, 28 over 1,024 and 18
 * and 19 over 8,192 keep the derived plan. */
static void test_wide_tiles_h200(void) {
    const struct {
        int d, batch, keys, stages; /* stages 0: the derived plan */
    } calls[] = {{128, 9, 1024, 3},  {128, 12, 4096, 3}, {128, 16, 8192, 3},  {128, 16, 16384, 3},
                 {128, 10, 8192, 0}, {128, 8, 4096, 0},  {128, 20, 4096, 0},  {64, 12, 2048, 3},
                 {64, 14, 16384, 3}, {64, 27, 2048, 3},  {64, 18, 4096, 3},   {64, 22, 4096, 3},
                 {64, 20, 8192, 3},  {64, 22, 16384, 3}, {64, 24, 4096, 2},   {64, 40, 8192, 2},
                 {64, 9, 2048, 0},   {64, 12, 4096, 0},  {64, 28, 1024, 0},   {64, 18, 8192, 0},
                 {64, 19, 8192, 0}};
    fg_context *ctx = h200_context();
    for (size_t i = 0; ctx && i < sizeof calls / sizeof calls[0]; i++) {
        if (!h200_step(ctx, calls[i].d, 32, 8, calls[i].batch, calls[i].keys, 0, 0)) continue;
        const char *wide = strstr(record()->launch[0].entry, "_n128r16s");
        const int stages = wide ? wide[9] - '0' : 0;
        CHECK(stages == calls[i].stages &&
                  (!wide || (record()->launch[0].grid == (unsigned)calls[i].batch * 8 &&
                             PARAMS(fg_decode_params, 0).num_splits == 1)),
              "h200 memory: 32/8 step of %d x %d keys at d %d: %s, grid %u, %d splits",
              calls[i].batch, calls[i].keys, calls[i].d, record()->launch[0].entry,
              record()->launch[0].grid, PARAMS(fg_decode_params, 0).num_splits);
    }
    h200_release(ctx);
}

/* One split with an H200's DRAM bandwidth at d 128 where the units are
 * past 5/4 of the 132 SMs (test_two_splits_h200 below it) to 3/2 of them over
 * up to 4,096 keys: 32/8 heads, 22 sequences over 4,096 keys, 24 over 2,048,
 * 8/1 heads 176 over 4,096 (the derived tiles, a block a unit); the split
 * model's count over 8,192 keys (20 and 22 sequences), more than one. */
static void test_one_split_h200(void) {
    const struct {
        int heads_q, heads_kv, batch, keys, one;
    } calls[] = {{32, 8, 22, 4096, 1}, {32, 8, 24, 2048, 1}, {8, 1, 176, 4096, 1},
                 {32, 8, 20, 8192, 0}, {32, 8, 22, 8192, 0}};
    fg_context *ctx = h200_context();
    for (size_t i = 0; ctx && i < sizeof calls / sizeof calls[0]; i++) {
        if (!h200_step(ctx, 128, calls[i].heads_q, calls[i].heads_kv, calls[i].batch,
                       calls[i].keys, 0, 0))
            continue;
        const int splits = PARAMS(fg_decode_params, 0).num_splits;
        const unsigned units = (unsigned)(calls[i].batch * calls[i].heads_kv);
        CHECK(calls[i].one ? splits == 1 && record()->launch_count == 1 &&
                                 record()->launch[0].grid == units &&
                                 !strstr(record()->launch[0].entry, "_n128r16")
                           : splits > 1,
              "h200 memory: %d/%d step of %d x %d keys: %s, grid %u, %d splits",
              calls[i].heads_q, calls[i].heads_kv, calls[i].batch, calls[i].keys,
              record()->launch[0].entry, record()->launch[0].grid, splits);
    }
    h200_release(ctx);
}

/* Two splits of 64-key tiles for 16 rows in two stages, three blocks an
 * SM, with an H200's DRAM bandwidth at d 128 where the units are more than
 * the 132 SMs and at most 5/4 of them, over 1k to 16,384 keys, contiguous
 * or in pages of 16 rows or more: 32/8 heads, 17 to 20 sequences, 8/1 heads
 * 160. Not over 32,768 keys, in pages of 8 rows, at 128 units (wide tiles),
 * at 176 (one split), where a count is asked for, nor at d 64 (wide tiles
 * in three stages past the SMs; over 8,192 keys at 144 units, and over pages
 * of 64, the derived plan). */
static void test_two_splits_h200(void) {
    const struct {
        int d, heads_q, heads_kv, batch, keys, page, asked, two;
    } calls[] = {{64, 32, 8, 18, 1024, 0, 0, 0},   {64, 32, 8, 20, 4096, 0, 0, 0},
                 {64, 8, 1, 160, 2048, 0, 0, 0},   {128, 32, 8, 17, 4096, 0, 0, 1},
                 {128, 32, 8, 20, 2048, 0, 0, 1},  {128, 8, 1, 160, 4096, 0, 0, 1},
                 {128, 32, 8, 18, 8192, 0, 0, 1},  {128, 32, 8, 17, 16384, 0, 0, 1},
                 {128, 32, 8, 18, 4096, 16, 0, 1}, {128, 32, 8, 17, 8192, 256, 0, 1},
                 {64, 32, 8, 18, 8192, 0, 0, 0},   {128, 32, 8, 17, 32768, 0, 0, 0},
                 {128, 32, 8, 18, 4096, 8, 0, 0},  {64, 32, 8, 18, 4096, 64, 0, 0},
                 {64, 32, 8, 16, 4096, 0, 0, 0},   {64, 32, 8, 22, 4096, 0, 0, 0},
                 {128, 32, 8, 22, 4096, 0, 0, 0},  {64, 32, 8, 18, 4096, 0, 3, 0}};
    fg_context *ctx = h200_context();
    for (size_t i = 0; ctx && i < sizeof calls / sizeof calls[0]; i++) {
        if (!h200_step(ctx, calls[i].d, calls[i].heads_q, calls[i].heads_kv, calls[i].batch,
                       calls[i].keys, calls[i].page, calls[i].asked))
            continue;
        const int splits = PARAMS(fg_decode_params, 0).num_splits;
        const int tiles = strstr(record()->launch[0].entry, "_n64r16s") != NULL;
        const unsigned units = (unsigned)(calls[i].batch * calls[i].heads_kv);
        CHECK(calls[i].two ? tiles && splits == 2 && record()->launch[0].grid == 2 * units
                           : !tiles && (calls[i].asked == 0 || splits == calls[i].asked),
              "h200 memory: d %d %d/%d step of %d x %d keys, pages of %d (%d splits asked): %s, "
              "grid %u, %d splits",
              calls[i].d, calls[i].heads_q, calls[i].heads_kv, calls[i].batch, calls[i].keys,
              calls[i].page, calls[i].asked, record()->launch[0].entry, record()->launch[0].grid,
              splits);
    }
    h200_release(ctx);
}

/* On sm_90 a step of two splits runs them in pairs: the step's kernel
 * alone, in clusters of two (a row block's splits), which add their rows in
 * shared memory and write o and lse: no workspace, no parts, no combine
 * kernel. Not with three splits, nor where two splits of one tile take the
 * kernel that splits O's columns, nor on an A100 (no clusters): there the
 * combine kernel follows the step. */
static void test_two_splits_in_pairs(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.kv_cache = 1;
    fg_forward_args a = dense_call(4, 32, 8, 1, 8192, 128, 128);
    a.num_splits = 2;
    size_t bytes = 1;
    CHECK(fg_forward_workspace_size(ctx, &s, &a, &bytes) == FG_OK && bytes == 0,
          "pairs: workspace %zu bytes: %s", bytes, fg_context_message(ctx));
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "pairs: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("pairs", 1, -1);
    if (r) {
        const fg_decode_params p = PARAMS(fg_decode_params, 0);
        CHECK(r->launch[0].cluster == 2 && r->launch[0].grid == 64 && p.num_splits == 2 &&
                  p.pair_blocks == 64 && p.key_blocks == 0 && p.combine_blocks == 0 &&
                  p.lse_part == 0 && p.o_part == 0 && !strstr(r->launch[0].entry, "_columns"),
              "pairs: %s, cluster %u, grid %u, %d splits, pair blocks %d, key blocks %d, "
              "combining blocks %d", r->launch[0].entry, r->launch[0].cluster, r->launch[0].grid,
              p.num_splits, p.pair_blocks, p.key_blocks, p.combine_blocks);
    }
    /* three splits; two of one tile (128 keys: the columns' kernel) */
    const int splits[] = {3, 2}, keys[] = {8192, 128};
    for (int i = 0; i < 2; i++) {
        fg_forward_args b = dense_call(4, 32, 8, 1, keys[i], 128, 128);
        b.num_splits = splits[i];
        give_workspace(ctx, &s, &b);
        clear();
        CHECK(fg_forward(ctx, &s, &b) == FG_OK, "unpaired: %s", fg_context_message(ctx));
        if (!(r = recorded("unpaired", 2, -1))) continue;
        CHECK(r->launch[0].cluster == 1 && PARAMS(fg_decode_params, 0).pair_blocks == 0 &&
                  strstr(r->launch[1].entry, "_combine"),
              "%d splits over %d keys: %s (cluster %u), %s", splits[i], keys[i],
              r->launch[0].entry, r->launch[0].cluster, r->launch[1].entry);
    }
    setenv("FAKE_CUDA_ARCH", "80", 1);
    fg_context *a100 = NULL;
    CHECK(fg_context_create(&a100, NULL) == FG_OK, "context: %s", fg_last_message());
    if (a100) {
        give_workspace(a100, &s, &a);
        clear();
        CHECK(fg_forward(a100, &s, &a) == FG_OK, "a100 step: %s", fg_context_message(a100));
        if ((r = recorded("a100 step", 2, -1)))
            CHECK(r->launch[0].cluster == 1 && strstr(r->launch[1].entry, "_combine"),
                  "a100, two splits: %s (cluster %u), %s", r->launch[0].entry, r->launch[0].cluster,
                  r->launch[1].entry);
        fg_context_destroy(a100);
    }
    unsetenv("FAKE_CUDA_ARCH");
}

/* Two splits in pairs with an H200's DRAM bandwidth at d 128 where the
 * units are 5/12 to half the 132 SMs, over a contiguous cache of 1k to 16k
 * keys: 32/8 heads, 7 and 8 sequences; 8/1 heads 64. Not at 48 units, 80,
 * over 32,768 keys nor in pages. */
static void test_pairs_near_half_sms_h200(void) {
    const struct {
        int heads_q, heads_kv, batch, keys, page, pairs;
    } calls[] = {{32, 8, 8, 4096, 0, 1},  {32, 8, 7, 1024, 0, 1},  {32, 8, 8, 16384, 0, 1},
                 {8, 1, 64, 4096, 0, 1},  {32, 8, 6, 4096, 0, 0},  {32, 8, 10, 8192, 0, 0},
                 {32, 8, 8, 32768, 0, 0}, {32, 8, 8, 4096, 16, 0}};
    fg_context *ctx = h200_context();
    for (size_t i = 0; ctx && i < sizeof calls / sizeof calls[0]; i++) {
        if (!h200_step(ctx, 128, calls[i].heads_q, calls[i].heads_kv, calls[i].batch,
                       calls[i].keys, calls[i].page, 0))
            continue;
        const fg_decode_params p = PARAMS(fg_decode_params, 0);
        const int paired = record()->launch[0].cluster == 2 && p.num_splits == 2 &&
                           p.pair_blocks == 2 * calls[i].batch * calls[i].heads_kv &&
                           record()->launch_count == 1;
        CHECK(paired == calls[i].pairs && (paired || p.pair_blocks == 0),
              "h200 memory: %d/%d step of %d x %d keys, pages of %d: %s, cluster %u, %d splits",
              calls[i].heads_q, calls[i].heads_kv, calls[i].batch, calls[i].keys, calls[i].page,
              record()->launch[0].entry, record()->launch[0].cluster, p.num_splits);
    }
    h200_release(ctx);
}

/* The splits of 32/8 steps over 16,384 keys (256 tiles) and of 16
 * sequences of 8,192 (128 blocks without splits): on an H100 16 splits of 16
 * tiles and none, one block an SM; with an H200's DRAM bandwidth on the same
 * SMs, 32, two blocks an SM (decode-notes, "v12"), and one split of wide
 * tiles (test_wide_tiles_h200). Mid batches, whose
 * blocks fill part of the SMs' places: 10 sequences of 8,192 (80 blocks)
 * one split of wide tiles on an H100 (test_wide_tiles), 3 splits on an
 * H200, 240 blocks on 264 places (not 8, 640 blocks: two generations and a
 * short third); 20 of 16,384 (160 blocks) 8 on an H100 (not 1: 28 SMs of
 * two blocks after the others are done), 2 of three blocks an SM on an H200
 * (test_two_splits_h200). At d 64 a block's ring holds 64 KB
 * (four stages of 64 keys), which alone reads about two thirds of what an SM
 * can: 6 sequences of 1,024 (48 blocks) take 4 splits on either, on an
 * H100 the fastest count measured (10.8 us; 1 split 15.2, the old rule's 8
 * 11.3; decode-notes, "v19"). */
static void test_split_counts(void) {
    const int head_dim[] = {128, 128, 128, 128, 64};
    const fg_forward_args calls[] = {
        dense_call(1, 32, 8, 1, 16384, 128, 128), dense_call(16, 32, 8, 1, 8192, 128, 128),
        dense_call(10, 32, 8, 1, 8192, 128, 128), dense_call(20, 32, 8, 1, 16384, 128, 128),
        dense_call(6, 32, 8, 1, 1024, 64, 64)};
    const char *memory[] = {"h100", "h200"};
    const int want[2][5] = {{16, 1, 1, 8, 4}, {32, 1, 3, 2, 4}};
    for (int m = 0; m < 2; m++) {
        setenv("FAKE_CUDA_MEMORY", memory[m], 1);
        fg_context *ctx = NULL;
        CHECK(fg_context_create(&ctx, NULL) == FG_OK, "context: %s", fg_last_message());
        if (!ctx) continue;
        for (int c = 0; c < 5; c++) {
            fg_spec s = fg_spec_default(head_dim[c], FG_BF16);
            s.kv_cache = 1;
            clear();
            CHECK(fg_forward(ctx, &s, &calls[c]) == FG_OK, "%s step: %s", memory[m],
                  fg_context_message(ctx));
            if (record()->launch_count >= 1)
                CHECK(PARAMS(fg_decode_params, 0).num_splits == want[m][c],
                      "%s memory: 32/8 step of %d x %d keys at d %d: %d splits, not %d",
                      memory[m], calls[c].batch, calls[c].seqlen_k, head_dim[c],
                      PARAMS(fg_decode_params, 0).num_splits, want[m][c]);
        }
        fg_context_destroy(ctx);
    }
    unsetenv("FAKE_CUDA_MEMORY");
}

/* A causal call whose thread blocks walk (d = 128, 2048 keys: Bc 160) takes
 * its units from lists the family made, kept on the device by the context:
 * copied once and waited for (calls on other streams read them too), every
 * unit once, and the same lists for the same call again. */
static void test_walk_lists(fg_context *ctx) {
    fg_spec s = fg_spec_default(128, FG_BF16);
    s.mask = FG_MASK_CAUSAL;
    fg_forward_args a = dense_call(2, 8, 8, 2048, 2048, 128, 128);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK, "walk: %s", fg_context_message(ctx));
    const fake_cuda_record *r = recorded("walk", 1, 4);
    if (!r) return;
    fg_fwd_tma_params p = PARAMS(fg_fwd_tma_params, 0);
    CHECK(r->copy_count == 1 && r->copies_in_flight == 0, "walk: %d copies, %d in flight",
          r->copy_count, r->copies_in_flight);
    CHECK(p.walk_lists != 0 && p.unit_blocks == 1 && p.units == 256 && r->launch[0].grid < 256 &&
              (int)r->launch[0].grid == p.blocks,
          "walk: lists %llu, %d a unit, %d units, grid %u", (unsigned long long)p.walk_lists,
          p.unit_blocks, p.units, r->launch[0].grid);
    if (!p.walk_lists) return;
    const uint16_t *lists = (const uint16_t *)(uintptr_t)p.walk_lists;
    int seen[256] = {0};
    CHECK(lists[0] == 0 && lists[p.blocks] == 256, "walk: offsets %d..%d", lists[0],
          lists[p.blocks]);
    for (int i = 0; i < 256 && lists[p.blocks] == 256; i++) seen[lists[p.blocks + 1 + i]]++;
    for (int u = 0; u < 256; u++) CHECK(seen[u] == 1, "walk: unit %d listed %d times", u, seen[u]);
    clear();
    CHECK(fg_forward(ctx, &s, &a) == FG_OK && record()->launch_count == 1 &&
              record()->copy_count == 0 && PARAMS(fg_fwd_tma_params, 0).walk_lists == p.walk_lists,
          "walk again: the same lists");
}

/* A block layout's lists are on the device when fg_layout_create returns:
 * its four uploads waited for, so calls on any stream may read them. */
static void test_layout_upload(fg_context *ctx) {
    const uint8_t mask[2 * 3] = {1, 0, 1, 0, 1, 1};
    fg_layout *layout = NULL;
    clear();
    CHECK(fg_layout_create(ctx, mask, 1, 2, 3, &layout) == FG_OK && layout, "layout: %s",
          fg_context_message(ctx));
    CHECK(record()->copy_count == 4 && record()->copies_in_flight == 0,
          "layout: %d copies, %d in flight", record()->copy_count, record()->copies_in_flight);
    fg_layout_destroy(layout);
}

int main(void) {
    char dir[] = "/tmp/fg-test-launch-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    setenv("FLASHGEN_CACHE_DIR", dir, 1);
    /* the driver the runtime loads (by name), and its records */
    void *driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver) {
        record = (const fake_cuda_record *(*)(void))dlsym(driver, "fake_cuda_get");
        clear = (void (*)(void))dlsym(driver, "fake_cuda_clear");
        device_alloc = (int (*)(unsigned long long *, size_t))dlsym(driver, "cuMemAlloc_v2");
    }
    if (!record || !clear || !device_alloc)
        check_skip("libcuda.so.1 is not the stand-in driver (run with tests/fake-cuda first on "
                   "LD_LIBRARY_PATH)");
    fg_context *ctx = NULL;
    if (fg_context_create(&ctx, NULL) != FG_OK) {
        CHECK(0, "context: %s", fg_last_message());
        return check_summary("test_launch");
    }
    test_hopper_forward(ctx);
    test_window_sides(ctx);
    test_walk_lists(ctx);
    test_layout_upload(ctx);
    test_packed_forward(ctx);
    test_packed_no_rows(ctx);
    test_value_head_dim(ctx);
    test_split_step(ctx);
    test_split_step_one_launch(ctx);
    test_wide_tiles(ctx);
    test_wide_tiles_h200();
    test_one_split_h200();
    test_two_splits_h200();
    test_two_splits_in_pairs(ctx);
    test_pairs_near_half_sms_h200();
    test_latent_step(ctx);
    test_chunked_prefill(ctx);
    test_hopper_backward(ctx);
    test_backward_sections(ctx);
    test_backward_wrap(ctx);
    fg_context_destroy(ctx);
    test_split_counts();
    char rm[64];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) fprintf(stderr, "test_launch: %s failed\n", rm);
    return check_summary("test_launch");
}
