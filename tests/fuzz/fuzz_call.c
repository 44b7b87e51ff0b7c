/* Calls as a caller may shape them, on the stand-in driver (fake_cuda.c,
 * an H100 that records instead of running): the forward and the backward
 * of dense calls, every size, head count, layout and stride from the
 * input, each tensor given exactly the memory its shape and strides
 * describe. A call is refused with a message, or every tensor map and
 * memset it hands the driver lies inside one allocation: nothing a kernel
 * reads or writes through them is outside what the caller gave (or the
 * context's workspace).
 * Input: 20 bytes of fields. Run with the stand-in driver first on
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
    FUZZ_SEED("\x00\x00\x01\x40\x40\x08\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x01\x01\x02\x81\x13\x10\x04\x01\x00\x01\x00\x02\x00\x01\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x02\x00\x01\x05\xff\x06\x02\x02\x01\x00\x02\x00\x03\x00\x01\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x03\x01\x03\x21\x21\x08\x01\x00\x02\x02\x01\x01\x00\x00\x00\x01\x00\x00\x00\x00"),
    FUZZ_SEED("\x04\x00\x02\x7f\x80\x04\x04\x01\x03\x03\x03\x03\x01\x01\x01\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x05\x01\x01\x01\x01\x02\x02\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00"),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

static int (*mem_alloc)(unsigned long long *, size_t);
static int (*mem_free)(unsigned long long);
static const fake_cuda_record *(*record)(void);
static void (*clear)(void);
static int (*block_of)(uintptr_t, uintptr_t *, size_t *);

#define MAX_TENSORS 10
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
    if (size < 20) return 0;
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
    a.heads_q = b[5] % 17;
    a.heads_kv = b[6] % 17;
    if (b[13] & 1) a.window_left = b[14] % 70, a.window_right = b[15] % 70;
    a.align = (fg_causal_align)(b[13] >> 1 & 1);
    /* the tensors as the call describes them */
    held_count = 0;
    a.q = tensor(b[7], a.batch, a.seqlen_q, a.heads_q, spec.head_dim, bytes);
    a.k = tensor(b[8], a.batch, a.seqlen_k, a.heads_kv, spec.head_dim, bytes);
    a.v = tensor(b[9], a.batch, a.seqlen_k, a.heads_kv, dv, bytes);
    a.o = tensor(b[10], a.batch, a.seqlen_q, a.heads_q, dv, bytes);
    unsigned long long lse = 0;
    const size_t lse_bytes = (size_t)(a.batch > 0 ? a.batch : 0) * (size_t)a.heads_q * (size_t)a.seqlen_q * 4;
    if ((b[11] & 1 || b[17] & 1) && lse_bytes && lse_bytes < ((size_t)1 << 24) && !mem_alloc(&lse, lse_bytes)) {
        held[held_count++] = lse;
        a.lse = (float *)(uintptr_t)lse;
    }
    clear();
    if (fg_forward(ctx, &spec, &a) == FG_OK) {
        check_records("forward");
    } else {
        FUZZ_CHECK(strlen(fg_context_message(ctx)) > 0, "a forward refused without a message");
    }
    if (b[17] & 1 && a.lse) {
        fg_backward_args g = {0};
        g.forward = a;
        g.d_o = tensor(b[10], a.batch, a.seqlen_q, a.heads_q, dv, bytes);
        g.d_q = tensor(b[7] ^ (b[18] & 3), a.batch, a.seqlen_q, a.heads_q, spec.head_dim, bytes);
        g.d_k = tensor(b[8], a.batch, a.seqlen_k, a.heads_kv, spec.head_dim, bytes);
        g.d_v = tensor(b[9] ^ (b[19] & 3), a.batch, a.seqlen_k, a.heads_kv, dv, bytes);
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
