#include "gen/spec.h"

#include <stdio.h>
#include <string.h>

fg_spec fg_spec_default(int head_dim, fg_dtype dtype) {
    fg_spec s;
    memset(&s, 0, sizeof s);
    s.dtype = dtype;
    s.head_dim = head_dim;
    s.mask = FG_MASK_NONE;
    s.sparsity = FG_SPARSE_NONE;
    return s;
}

const char *spec_dtype_name(fg_dtype dtype) { return dtype == FG_BF16 ? "bf16" : "fp16"; }

const char *spec_mask_name(fg_mask mask) {
    switch (mask) {
    case FG_MASK_CAUSAL: return "causal";
    case FG_MASK_WINDOW: return "window";
    default: return "none";
    }
}

static int valid_block(int b) { return b >= 16 && b <= 4096 && b % 16 == 0; }

int spec_canonicalize(const fg_spec *in, fg_spec *out, char *err, size_t err_len) {
    if (!in) {
        snprintf(err, err_len, "spec: null pointer");
        return -1;
    }
    fg_spec s;
    memset(&s, 0, sizeof s); /* padding too, so specs compare with memcmp */
    if (in->dtype != FG_FP16 && in->dtype != FG_BF16) {
        snprintf(err, err_len, "spec.dtype: %d is not FG_FP16 or FG_BF16", (int)in->dtype);
        return -1;
    }
    if (in->head_dim < 1 || in->head_dim > 256) {
        snprintf(err, err_len, "spec.head_dim: %d is outside 1..256", in->head_dim);
        return -1;
    }
    if (in->mask != FG_MASK_NONE && in->mask != FG_MASK_CAUSAL && in->mask != FG_MASK_WINDOW) {
        snprintf(err, err_len, "spec.mask: %d is not a mask kind", (int)in->mask);
        return -1;
    }
    if (in->sparsity != FG_SPARSE_NONE && in->sparsity != FG_SPARSE_LAYOUT &&
        in->sparsity != FG_SPARSE_BUTTERFLY) {
        snprintf(err, err_len, "spec.sparsity: %d is not a sparsity kind", (int)in->sparsity);
        return -1;
    }
    s.dtype = in->dtype;
    s.head_dim = in->head_dim;
    s.mask = in->mask;
    s.dropout = in->dropout != 0;
    s.varlen = in->varlen != 0;
    s.kv_cache = in->kv_cache != 0;
    s.sparsity = in->sparsity;
    s.softcap = in->softcap != 0;
    s.alibi = in->alibi != 0;
    s.sinks = in->sinks != 0;
    if (s.kv_cache && (s.varlen || s.dropout || s.sparsity != FG_SPARSE_NONE)) {
        snprintf(err, err_len, "spec.kv_cache: a decoding step takes no %s",
                 s.varlen ? "packed sequences (varlen)" : s.dropout ? "dropout" : "sparsity");
        return -1;
    }
    if (s.kv_cache && s.head_dim % 8 != 0) {
        snprintf(err, err_len, "spec.kv_cache: head dim %d; a decoding step needs a multiple of 8",
                 s.head_dim);
        return -1;
    }
    if (s.sparsity != FG_SPARSE_NONE) {
        if (!valid_block(in->sparse_block_q) || !valid_block(in->sparse_block_k)) {
            snprintf(err, err_len,
                     "spec.sparse_block_q/k: %d x %d; block sizes must be multiples of 16 "
                     "in 16..4096",
                     in->sparse_block_q, in->sparse_block_k);
            return -1;
        }
        s.sparse_block_q = in->sparse_block_q;
        s.sparse_block_k = in->sparse_block_k;
    }
    if (s.sparsity == FG_SPARSE_BUTTERFLY) {
        if (in->butterfly_factors < 0 || in->butterfly_factors > 30) {
            snprintf(err, err_len, "spec.butterfly_factors: %d is outside 0..30",
                     in->butterfly_factors);
            return -1;
        }
        s.butterfly_factors = in->butterfly_factors;
    }
    *out = s;
    return 0;
}

void spec_name(const fg_spec *s, char *buf, size_t len) {
    char sparse[64] = "";
    if (s->sparsity == FG_SPARSE_LAYOUT)
        snprintf(sparse, sizeof sparse, "_layout_b%dx%d", s->sparse_block_q, s->sparse_block_k);
    else if (s->sparsity == FG_SPARSE_BUTTERFLY)
        snprintf(sparse, sizeof sparse, "_bfly%d_b%dx%d", s->butterfly_factors,
                 s->sparse_block_q, s->sparse_block_k);
    snprintf(buf, len, "%s_d%d%s%s%s%s%s%s%s%s%s", spec_dtype_name(s->dtype), s->head_dim,
             s->mask == FG_MASK_NONE ? "" : "_", s->mask == FG_MASK_NONE ? "" : spec_mask_name(s->mask),
             s->softcap ? "_cap" : "", s->alibi ? "_alibi" : "", s->sinks ? "_sink" : "",
             s->dropout ? "_drop" : "", sparse, s->varlen ? "_varlen" : "",
             s->kv_cache ? "_kvcache" : "");
}

int spec_head_dim_padded(const fg_spec *s) { return (s->head_dim + 15) / 16 * 16; }
