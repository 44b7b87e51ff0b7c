/* What the sm_90a families share: see sm90a.h. */
#include "families/sm90a.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* __launch_bounds__(threads, 1) shares the 64K registers among the threads
 * in steps of 8 (168 for 384 threads, 128 for 512), and setmaxnreg can only
 * move these between warpgroups. */
int sm90a_register_pool(int consumers) {
    int threads = 128 * (consumers + 1);
    return 65536 / threads / 8 * 8 * (consumers + 1);
}

int sm90a_consumer_registers(int consumers, int producer_min) {
    /* what the producer gives up, shared by the consumers, at most 240 */
    int share = (sm90a_register_pool(consumers) - producer_min) / consumers / 8 * 8;
    return share < 240 ? share : 240;
}

int sm90a_producer_registers(int consumers, int producer_min) {
    if (consumers == 1) return sm90a_consumer_registers(1, producer_min);
    return sm90a_register_pool(consumers) -
           consumers * sm90a_consumer_registers(consumers, producer_min);
}

int sm90a_section_heads(int64_t head_bytes, int64_t heads) {
    int64_t n = SM90A_SECTION_BYTES / (head_bytes > 0 ? head_bytes : 1);
    return (int)(n < 1 ? 1 : n > heads ? heads : n);
}

/* a min-heap of thread blocks by (work so far, index) */
typedef struct {
    int64_t load;
    int block;
} block_load;
static int less_loaded(block_load a, block_load b) {
    return a.load < b.load || (a.load == b.load && a.block < b.block);
}
static void sift_down(block_load *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && less_loaded(h[l], h[m])) m = l;
        if (r < n && less_loaded(h[r], h[m])) m = r;
        if (m == i) return;
        block_load t = h[i];
        h[i] = h[m], h[m] = t, i = m;
    }
}

int sm90a_walk_lists(const int *weights, int units, int blocks, uint16_t *out, int cap) {
    if (units < 0 || units > UINT16_MAX || blocks < 1 || blocks > UINT16_MAX ||
        blocks + 1 + units > cap)
        return -1;
    int *owner = malloc(((size_t)units + 1) * sizeof *owner);
    int *next = malloc((size_t)blocks * sizeof *next);
    block_load *heap = malloc((size_t)blocks * sizeof *heap);
    int rc = -1;
    if (!owner || !next || !heap) goto done;
    for (int b = 0; b < blocks; b++) heap[b] = (block_load){0, b}; /* in order: a heap */
    for (int u = 0; u < units; u++) {
        owner[u] = heap[0].block;
        heap[0].load += weights[u];
        sift_down(heap, blocks, 0);
    }
    /* offsets: the blocks' counts summed; then each block's units in order */
    for (int b = 0; b <= blocks; b++) out[b] = 0;
    for (int u = 0; u < units; u++) out[owner[u] + 1]++;
    for (int b = 0; b < blocks; b++) out[b + 1] = (uint16_t)(out[b + 1] + out[b]);
    for (int b = 0; b < blocks; b++) next[b] = out[b];
    uint16_t *list = out + blocks + 1;
    for (int u = 0; u < units; u++) list[next[owner[u]]++] = (uint16_t)u;
    rc = blocks + 1 + units;
done:
    free(owner);
    free(next);
    free(heap);
    return rc;
}

sm90a_map_rows sm90a_map_rows_of(const fg_spec *spec, const fg_forward_args *a) {
    if (spec->varlen) return (sm90a_map_rows){1, a->total_q, 1, a->total_k};
    if (spec->kv_cache && a->block_table)
        return (sm90a_map_rows){a->batch, a->seqlen_q, a->num_pages, a->page_size};
    return (sm90a_map_rows){a->batch, a->seqlen_q, a->batch, a->seqlen_k};
}

/* The byte strides (seq, head, batch) of a tensor (B, S, H, D) as a 4-D map
 * (D, S, H, B). A dimension of one element keeps any valid stride: only its
 * coordinate 0 is read. */
static void map_strides(const fg_tensor *t, int batch, int seqlen, int heads, uint64_t dims[4],
                        uint64_t strides[3]) {
    const int64_t sizes[3] = {seqlen, heads, batch};
    const int64_t by[3] = {t->stride_seq, t->stride_head, t->stride_batch};
    for (int i = 0; i < 3; i++) {
        dims[i + 1] = (uint64_t)sizes[i];
        strides[i] = sizes[i] == 1 ? 16 : (uint64_t)by[i] * 2;
    }
}

int sm90a_tensor_mappable(const char *name, const fg_tensor *t, int batch, int seqlen, int heads,
                          char *why, size_t len) {
    static const char *const dim_names[3] = {"seq", "head", "batch"};
    uint64_t dims[4], strides[3];
    map_strides(t, batch, seqlen, heads, dims, strides);
    /* packed sequences may hold no rows at all; a map needs one */
    if (batch < 1 || seqlen < 1 || heads < 1)
        return snprintf(why, len, "%s has no rows (packed sequences of none): a tensor map "
                        "needs at least one", name), -1;
    if ((uintptr_t)t->data % 16)
        return snprintf(why, len, "%s.data %p is not 16-byte aligned", name, t->data), -1;
    for (int i = 0; i < 3; i++)
        if (strides[i] == 0 || strides[i] % 16 || strides[i] >= (uint64_t)1 << 40)
            return snprintf(why, len, "%s's %s stride of %llu bytes is not a nonzero multiple of "
                            "16 below 2^40", name, dim_names[i],
                            (unsigned long long)strides[i]), -1;
    return 0;
}

int sm90a_encode(const family_device *dev, void *map, const char *name, const fg_spec *spec,
                 const fg_tensor *t, int cols, int batch, int seqlen, int heads, int box_rows,
                 char *err, size_t err_len) {
    uint64_t dims[4] = {(uint64_t)cols}, strides[3];
    map_strides(t, batch, seqlen, heads, dims, strides);
    const uint32_t box[4] = {64, (uint32_t)box_rows, 1, 1};
    char why[256];
    family_map_type type = spec->dtype == FG_BF16 ? FAMILY_MAP_BF16 : FAMILY_MAP_F16;
    if (dev->encode_map(dev, map, type, 4, (uint64_t)(uintptr_t)t->data, dims, strides, box, why,
                        sizeof why) == 0)
        return 0;
    snprintf(err, err_len, "cuTensorMapEncodeTiled(%s): %s", name, why);
    return -1;
}

int sm90a_encode_accumulator(const family_device *dev, void *map, const char *name,
                             uint64_t address, int batch, int heads, int seqlen, int cols,
                             int box_rows, char *err, size_t err_len) {
    const uint64_t row = (uint64_t)cols * 4;
    const uint64_t dims[4] = {(uint64_t)cols, (uint64_t)seqlen, (uint64_t)heads, (uint64_t)batch};
    const uint64_t strides[3] = {row, row * dims[1], row * dims[1] * dims[2]};
    const uint32_t box[4] = {32, (uint32_t)box_rows, 1, 1};
    char why[256];
    if (dev->encode_map(dev, map, FAMILY_MAP_F32, 4, address, dims, strides, box, why,
                        sizeof why) == 0)
        return 0;
    snprintf(err, err_len, "cuTensorMapEncodeTiled(%s): %s", name, why);
    return -1;
}
