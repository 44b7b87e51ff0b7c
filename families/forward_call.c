#include "families/forward_call.h"

#include <math.h>
#include <string.h>

void forward_call_values_of(const fg_spec *s, const fg_forward_args *a, forward_call_values *out) {
    memset(out, 0, sizeof *out);
    out->diag_offset = forward_call_diag_offset(a);
    const int64_t reach = forward_call_reach(a);
    out->window_left = a->window_left < 0 ? -1 : (int32_t)(a->window_left < reach ? a->window_left : reach);
    out->window_right = a->window_right < 0 ? -1 : (int32_t)(a->window_right < reach ? a->window_right : reach);
    float scale = a->softmax_scale != 0.f ? a->softmax_scale : 1.f / sqrtf((float)s->head_dim);
    out->softmax_scale = scale;
    out->scale_log2 = scale * 1.4426950408889634f;
    /* keep iff an 8-bit draw >= threshold; the kept scale matches the
     * threshold actually used, so E[output] is exact */
    uint32_t threshold = s->dropout ? (uint32_t)lround((double)a->dropout_p * 256.0) : 0;
    if (threshold > 256) threshold = 256;
    /* the kernels compare four draws at once against the threshold in every
     * byte; p = 1 clamps to 255, which still keeps draws of 255, and
     * out_scale 0 zeroes those */
    out->drop_threshold4 = (threshold >= 256 ? 255u : threshold) * 0x01010101u;
    out->out_scale = threshold >= 256 ? 0.f : (float)(256.0 / (256.0 - threshold));
    /* Dropout counts row i in word 1 as (i/16)*8 + i%8 and key j in word 0
     * as (j/32)*4 + ..: positions that are multiples of 16 and 32 add to
     * them */
    if (s->softcap) {
        out->softcap_in = scale / a->softcap;
        out->softcap_out = a->softcap * 1.4426950408889634f;
    }
    out->drop_row_counter = (uint32_t)(a->position_q / 2);
    out->drop_key_counter = (uint32_t)(a->position_k / 8);
    if (s->dropout) {
        /* Philox4x32-10's key schedule: key (seed_lo, seed_hi ^ offset_hi),
         * bumped by the Weyl constants each round */
        uint32_t k0 = (uint32_t)a->seed, k1 = (uint32_t)(a->seed >> 32) ^ (uint32_t)(a->offset >> 32);
        for (int r = 0; r < 10; r++, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
            out->philox_keys[2 * r] = k0;
            out->philox_keys[2 * r + 1] = k1;
        }
    }
}
