/* The backward's schedule (see backward_schedule.h). */
#include "families/backward_schedule.h"

#include <stdint.h>
#include <string.h>

/* The deterministic schedule's accumulator slices beyond the first take at
 * most 1/32 of the device's memory, and at least 1 GiB may always be used;
 * with less, fewer thread blocks share the work. */
#define DETERMINISTIC_EXTRA_MIN ((size_t)1 << 30)
#define DETERMINISTIC_EXTRA_SHARE 32

static size_t deterministic_extra_bytes(const family_device *dev) {
    size_t share = dev->memory / DETERMINISTIC_EXTRA_SHARE;
    return share > DETERMINISTIC_EXTRA_MIN ? share : DETERMINISTIC_EXTRA_MIN;
}

static size_t align_up(size_t x) {
    return (x + FAMILY_WORKSPACE_ALIGN - 1) / FAMILY_WORKSPACE_ALIGN * FAMILY_WORKSPACE_ALIGN;
}

void backward_schedule_of(const family_device *dev, const fg_forward_args *a, int deterministic,
                          int block_n, int head_dim_padded, int col_splits,
                          backward_schedule *s) {
    memset(s, 0, sizeof *s);
    s->n_blocks = (a->seqlen_k + block_n - 1) / block_n;
    size_t rows = (size_t)a->batch * a->heads_q * a->seqlen_q;
    s->delta_bytes = align_up(rows * sizeof(float));
    s->slice_bytes = align_up(rows * head_dim_padded * sizeof(float));
    if (!deterministic) {
        s->n_groups = s->n_blocks;
        s->slices = 1;
    } else {
        /* Time goes as (waves of thread blocks) x (key blocks per thread
         * block); take the fewest groups (slices to clear and sum) that
         * reach the least of it, within the memory cap. */
        int64_t blocks_per_group = (int64_t)col_splits * a->batch * a->heads_kv;
        int64_t sms = dev->profile->sm_count > 0 ? dev->profile->sm_count : 1;
        int64_t by_memory = 1 + (int64_t)(deterministic_extra_bytes(dev) / s->slice_bytes);
        int64_t best = 1, best_cost = INT64_MAX;
        for (int64_t g = 1; g <= s->n_blocks && g <= by_memory; g++) {
            int64_t waves = (blocks_per_group * g + sms - 1) / sms;
            int64_t cost = waves * ((s->n_blocks + g - 1) / g);
            if (cost < best_cost) best = g, best_cost = cost;
        }
        s->n_groups = (int)best;
        s->slices = s->n_groups;
    }
    s->total_bytes = s->delta_bytes + (size_t)s->slices * s->slice_bytes;
}
