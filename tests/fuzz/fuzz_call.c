/* Calls as a caller may shape them, on the stand-in driver (fake_cuda.c,
 * an H100 that records instead of running): the forward and the backward
 * of dense calls and packed sequences, and decoding steps over contiguous
 * and paged caches, every size, head count, layout and stride, length and
 * table entry from the input, each tensor given exactly the memory its
 * shape and strides describe. A call is refused with a message, or every
 * tensor map and memset it hands the driver lies inside one allocation:
 * nothing a kernel reads or writes through them is outside what the caller
 * gave (or the context's workspace).
 * Input: 32 bytes of fields. Run with the stand-in driver first on
 * LD_LIBRARY_PATH (tests/fake-cuda in the build). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "tests/fake_cuda.h"
#include "tests/fuzz/fuzz.h"

const fuzz_seed fuzz_seeds[] = {
    FUZZ_SEED("\x00\x00\x01\x40\x40\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
              "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x01\x01\x02\x81\x13\x10\x04\x01\x00\x01\x00\x02\x00\x01\x00\x00\x00\x01\x00\x00"
              "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x02\x00\x01\x05\xff\x06\x02\x02\x01\x00\x02\x00\x03\x00\x01\x00\x00\x00\x00\x00"
              "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x00\x01\x01\x21\x21\x08\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x01\x01\x00\x00"
              "\x28\x00\x40\x11\x30\x05\x41\x22\x00\x01\x00\x00"),
    FUZZ_SEED("\x01\x00\x00\x10\x10\x08\x04\x02\x00\x00\x02\x01\x01\x00\x00\x00\x04\x00\x00\x00"
              "\x64\x65\x0b\x1b\x2b\x06\x00\x01\x00\x00\x00\x00"),
    FUZZ_SEED("\x00\x01\x00\x02\x8c\x20\x08\x00\x00\x00\x00\x00\x03\x00\x00\x00\x02\x00\x00\x00"
              "\x00\x02\x11\x07\x22\x33\x01\x05\x03\x03\x00\x00"),
    FUZZ_SEED("\x01\x01\x01\xff\xff\x20\x08\x00\x00\x00\x00\x00\x01\x00\x00\x00\x05\x00\x00\x00"
              "\x03\x00\x09\x00\x00\x00\x01\x17\x02\x02\x00\x00"),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

static int (*mem_alloc)(unsigned long long *, size_t);
static int (*mem_free)(unsigned long long);
static const fake_cuda_record *(*record)(void);
static void (*clear)(void);
static int (*block_of)(uintptr_t, uintptr_t *, size_t *);

#define MAX_TENSORS 16
static unsigned long long held[MAX_TENSORS];
static int held_count;

/* a tensor of rows x heads x dim elements of `bytes` each in one of four
 * layouts (BSHD, BHSD, rows padded, heads padded), or, now and then, strides
 * the caller got wrong (overlapping or zero), with exactly the memory they
 * describe */
static fg_tensor tensor(int layout, int batch, int seq, int heads, int dim, int bytes) {
    fg_tensor t = {0};
    const int64_t pad = 8 * (layout >> 2 & 3);
    switch (layout & 3) {
    case 0: t = fg_tensor_bshd(NULL, seq, heads, dim); break;
    case 1: t = fg_tensor_bhsd(NULL, seq, heads, dim); break;
    case 2:
        t.stride_dim = 1, t.stride_head = dim + pad, t.stride_seq = heads * (dim + pad);
        t.stride_batch = seq * t.stride_seq;
        break;
    default:
        t.stride_dim = 1, t.stride_seq = dim, t.stride_head = (int64_t)seq * dim + pad;
        t.stride_batch = heads * t.stride_head;
        break;
    }
    if (layout & 16) t.stride_seq = layout & 32 ? 0 : dim / 2; /* wrong on purpose */
    if (layout & 64) t.stride_batch = 0;
    int64_t last = 0; /* the last element's offset */
    if (batch > 0 && seq > 0 && heads > 0 && dim > 0)
        last = (batch - 1) * llabs(t.stride_batch) + (int64_t)(seq - 1) * llabs(t.stride_seq) +
               (int64_t)(heads - 1) * llabs(t.stride_head) + (dim - 1);
    const size_t size = (size_t)(last + 1) * (size_t)bytes;
    unsigned long long at = 0;
    if (size > ((size_t)1 << 24) || held_count == MAX_TENSORS || mem_alloc(&at, size)) return t;
    held[held_count++] = at;
    t.data = (void *)(uintptr_t)at;
    return t;
}

static void check_records(const char *what) {
    const fake_cuda_record *r = record();
    for (int i = 0; i < r->map_count; i++) {
        const fake_cuda_map *m = &r->map[i];
        uint64_t last = m->dims[0] * (uint64_t)m->elem_bytes - 1;
        for (int d = 1; d < m->rank; d++) last += (m->dims[d] - 1) * m->strides[d - 1];
        uintptr_t start;
        size_t bytes;
        FUZZ_CHECK(block_of(m->address, &start, &bytes) && m->address - start + last < bytes,
                   "%s: tensor map %d (rank %d, dims %llu x %llu x %llu x %llu) reaches %llu bytes past its "
                   "start, outside the memory given",
                   what, i, m->rank, (unsigned long long)m->dims[0], (unsigned long long)m->dims[1],
                   (unsigned long long)m->dims[2], (unsigned long long)m->dims[3], (unsigned long long)last);
    }
    for (int i = 0; i < r->memset_count; i++) {
        uintptr_t start;
        size_t bytes;
        const fake_cuda_memset *s = &r->memset[i];
        FUZZ_CHECK(!s->bytes || (block_of(s->address, &start, &bytes) && s->address - start + s->bytes <= bytes),
                   "%s: memset %d of %zu bytes outside the memory given", what, i, s->bytes);
    }
}

/* int32 values in stand-in device memory (the host's) */
static int32_t *device_ints(const int32_t *values, int n) {
    unsigned long long at = 0;
    if (n <= 0 || held_count == MAX_TENSORS || mem_alloc(&at, (size_t)n * 4)) return NULL;
    held[held_count++] = at;
    memcpy((void *)(uintptr_t)at, values, (size_t)n * 4);
    return (int32_t *)(uintptr_t)at;
}

/* Packed sequences: lengths from the input (a sequence may be empty), the
 * longest of them or a wrong figure as seqlen_q and seqlen_k, one array
 * for both now and then. */
static void packed(fg_spec *spec, fg_forward_args *a, const uint8_t *b) {
    spec->varlen = 1;
    const int n = a->batch > 0 && a->batch <= 4 ? a->batch : 1;
    int32_t cu_q[5] = {0}, cu_k[5] = {0};
    int max_q = 0, max_k = 0;
    for (int i = 0; i < n; i++) {
        const int lq = b[20 + i] % 2 ? 0 : b[20 + i] * 3, lk = b[24 + i] % 5 == 0 ? 0 : b[24 + i] * 2;
        cu_q[i + 1] = cu_q[i] + lq, cu_k[i + 1] = cu_k[i] + lk;
        if (lq > max_q) max_q = lq;
        if (lk > max_k) max_k = lk;
    }
    a->batch = n;
    a->total_q = cu_q[n], a->total_k = cu_k[n];
    a->seqlen_q = b[28] % 4 ? max_q : max_q / 2 + 1;
    a->seqlen_k = b[28] % 3 ? max_k : max_k + 7;
    a->cu_seqlens_q = device_ints(cu_q, n + 1);
    a->cu_seqlens_k = b[29] % 4 ? device_ints(cu_k, n + 1) : a->cu_seqlens_q;
    if (a->cu_seqlens_k == a->cu_seqlens_q) a->total_k = a->total_q, a->seqlen_k = a->seqlen_q;
}

/* A decoding step: few queries, a cache contiguous or in pages (table
 * entries and lengths from the input, some past the pool or the cache),
 * new rows appended or not. *cache_rows: the cache tensor's rows a batch
 * (the pages' rows with pages). */
static void decoding(fg_spec *spec, fg_forward_args *a, const uint8_t *b, int *cache_rows) {
    static const int page_sizes[] = {0, 1, 16, 64, 256, 3};
    spec->kv_cache = 1;
    a->seqlen_q = 1 + b[20] % 16;
    a->page_size = page_sizes[b[21] % 6];
    const int n = a->batch > 0 && a->batch <= 4 ? a->batch : 1;
    a->batch = n;
    if (a->page_size) {
        a->block_table_stride = a->seqlen_k > 0 ? (a->seqlen_k + a->page_size - 1) / a->page_size : 1;
        if (a->block_table_stride > 8) a->block_table_stride = 8, a->seqlen_k = 8 * a->page_size;
        a->num_pages = 1 + b[27] % 24;
        int32_t table[4 * 8];
        for (int i = 0; i < n * a->block_table_stride; i++)
            table[i] = (b[28] + 5 * i) % (a->num_pages + (b[29] & 1));
        a->block_table = device_ints(table, n * a->block_table_stride);
        *cache_rows = a->page_size;
    } else {
        *cache_rows = a->seqlen_k;
    }
    int32_t lengths[4];
    for (int i = 0; i < n; i++)
        lengths[i] = b[22 + i] % 8 == 7 ? a->seqlen_k + 5 : a->seqlen_k > 0 ? b[22 + i] * 3 % (a->seqlen_k + 1) : 0;
    a->cache_seqlens = b[26] % 3 ? device_ints(lengths, n) : NULL;
    a->seqlen_new = b[29] & 2 ? 1 + b[29] % 5 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fg_context *ctx;
    if (!ctx) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW);
        FUZZ_CHECK(driver, "no libcuda.so.1: put the build's tests/fake-cuda first on LD_LIBRARY_PATH");
        record = (const fake_cuda_record *(*)(void))dlsym(driver, "fake_cuda_get");
        clear = (void (*)(void))dlsym(driver, "fake_cuda_clear");
        block_of = (int (*)(uintptr_t, uintptr_t *, size_t *))dlsym(driver, "fake_cuda_block_of");
        mem_alloc = (int (*)(unsigned long long *, size_t))dlsym(driver, "cuMemAlloc_v2");
        mem_free = (int (*)(unsigned long long))dlsym(driver, "cuMemFree_v2");
        FUZZ_CHECK(record && clear && block_of && mem_alloc && mem_free, "libcuda.so.1 is not the stand-in driver");
        FUZZ_CHECK(fg_context_create(&ctx, NULL) == FG_OK, "no context: %s", fg_last_message());
    }
    if (size < 32) return 0;
    const uint8_t *b = data;
    static const int dims[] = {64, 128, 96, 72};
    fg_spec spec = fg_spec_default(dims[b[0] % 4], b[1] & 1 ? FG_BF16 : FG_FP16);
    spec.mask = (fg_mask)(b[2] % 3);
    const int dv = spec.head_dim;
    const int bytes = 2;
    fg_forward_args a = fg_forward_args_default();
    a.batch = b[12] & 0x80 ? (int8_t)b[12] : 1 + b[12] % 4;
    a.seqlen_q = b[3] & 0x80 ? (b[3] & 0x7f) * 37 : b[3];
    a.seqlen_k = b[4] & 0x80 ? (b[4] & 0x7f) * 41 : b[4];
    /* heads: groups that divide (most of the time), or any counts */
    a.heads_kv = b[5] & 0x80 ? b[6] % 17 : 1 + b[6] % 8;
    a.heads_q = b[5] & 0x80 ? b[5] % 17 : a.heads_kv * (1 + b[5] % 4);
    if (b[13] & 1) a.window_left = b[14] % 70, a.window_right = b[15] % 70;
    if (b[13] & 4) a.window_left = INT32_MAX - b[14] % 3; /* wider than any call: clamped */
    if (b[13] & 8) /* blocks of a longer call, near the positions' limits too */
        a.position_q = b[14] & 1 ? INT32_MAX - 4096 - 37 * b[15] : 16 * b[15],
        a.position_k = b[14] & 2 ? INT32_MAX - 4096 - 41 * b[15] : 32 * b[14];
    a.align = (fg_causal_align)(b[13] >> 1 & 1);
    held_count = 0;
    /* dense, packed or a decoding step; then the tensors as the call
     * describes them */
    const int mode = b[16] % 3;
    int rows_q = a.seqlen_q, rows_k = a.seqlen_k, batch_q = a.batch, batch_k = a.batch;
    if (mode == 1) {
        packed(&spec, &a, b);
        rows_q = a.total_q, rows_k = a.total_k, batch_q = batch_k = 1;
    } else if (mode == 2) {
        decoding(&spec, &a, b, &rows_k);
        rows_q = a.seqlen_q, batch_q = batch_k = a.batch;
        if (a.page_size) batch_k = a.num_pages;
    }
    a.q = tensor(b[7], batch_q, rows_q, a.heads_q, spec.head_dim, bytes);
    a.k = tensor(b[8], batch_k, rows_k, a.heads_kv, spec.head_dim, bytes);
    a.v = tensor(b[9], batch_k, rows_k, a.heads_kv, dv, bytes);
    a.o = tensor(b[10], batch_q, rows_q, a.heads_q, dv, bytes);
    if (mode == 2 && a.seqlen_new) {
        a.k_new = tensor(b[7], a.batch, a.seqlen_new, a.heads_kv, spec.head_dim, bytes);
        a.v_new = tensor(b[10], a.batch, a.seqlen_new, a.heads_kv, dv, bytes);
    }
    unsigned long long lse = 0;
    const size_t lse_bytes = (size_t)(batch_q > 0 ? batch_q : 0) * (size_t)(a.heads_q > 0 ? a.heads_q : 0) *
                             (size_t)(rows_q > 0 ? rows_q : 0) * 4;
    if ((b[11] & 1 || b[17] & 1) && lse_bytes && lse_bytes < ((size_t)1 << 24) && held_count < MAX_TENSORS &&
        !mem_alloc(&lse, lse_bytes)) {
        held[held_count++] = lse;
        a.lse = (float *)(uintptr_t)lse;
    }
    clear();
    if (fg_forward(ctx, &spec, &a) == FG_OK)
        check_records("forward");
    else
        FUZZ_CHECK(strlen(fg_context_message(ctx)) > 0, "a forward refused without a message");
    if (b[17] & 1 && a.lse && mode != 2) {
        fg_backward_args g = {0};
        g.forward = a;
        g.d_o = tensor(b[10], batch_q, rows_q, a.heads_q, dv, bytes);
        g.d_q = tensor(b[7] ^ (b[18] & 3), batch_q, rows_q, a.heads_q, spec.head_dim, bytes);
        g.d_k = tensor(b[8], batch_k, rows_k, a.heads_kv, spec.head_dim, bytes);
        g.d_v = tensor(b[9] ^ (b[19] & 3), batch_k, rows_k, a.heads_kv, dv, bytes);
        g.deterministic = b[18] >> 7;
        clear();
        if (fg_backward(ctx, &spec, &g) == FG_OK)
            check_records("backward");
        else
            FUZZ_CHECK(strlen(fg_context_message(ctx)) > 0, "a backward refused without a message");
    }
    for (int i = 0; i < held_count; i++) mem_free(held[i]);
    held_count = 0;
    return 0;
}
