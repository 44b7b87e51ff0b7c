#include "gen/spec.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- expressions ------------------------------------------------------------ */

/* Canonical specs compare with memcmp, so equal texts must be one pointer:
 * each distinct text is kept, once, for the life of the process. */
#define INTERN_MAX 65536
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;
static char **interned;
static int interned_count, interned_cap;

static const char *intern(const char *text) {
    const char *found = NULL;
    pthread_mutex_lock(&intern_lock);
    for (int i = 0; i < interned_count && !found; i++)
        if (strcmp(interned[i], text) == 0) found = interned[i];
    if (!found && interned_count < INTERN_MAX) {
        if (interned_count == interned_cap) {
            int cap = interned_cap ? 2 * interned_cap : 64;
            char **grown = realloc(interned, sizeof *grown * (size_t)cap);
            if (grown) interned = grown, interned_cap = cap;
        }
        size_t n = strlen(text) + 1;
        char *copy = interned_count < interned_cap ? malloc(n) : NULL;
        if (copy) {
            memcpy(copy, text, n);
            found = interned[interned_count++] = copy;
        }
    }
    pthread_mutex_unlock(&intern_lock);
    return found;
}

_Static_assert(FG_MAX_AUX == EXPR_MAX_AUX, "the spec's tensors are the parser's");

int spec_has_expr(const char *text) { return text && text[0]; }
#define has_text spec_has_expr

int spec_expr_aux(const fg_spec *spec, expr_aux *out, char *err, size_t err_len) {
    if (spec->aux_count < 0 || spec->aux_count > FG_MAX_AUX) {
        snprintf(err, err_len, "spec.aux_count: %d is outside 0..%d", spec->aux_count, FG_MAX_AUX);
        return -1;
    }
    for (int i = 0; i < spec->aux_count; i++) {
        const fg_aux_decl *a = &spec->aux[i];
        memset(&out[i], 0, sizeof out[i]);
        if (!a->name || strlen(a->name) > EXPR_AUX_NAME_MAX) {
            if (a->name)
                snprintf(err, err_len, "spec.aux[%d].name: longer than %d characters", i,
                         EXPR_AUX_NAME_MAX);
            else
                snprintf(err, err_len, "spec.aux[%d].name: NULL", i);
            return -1;
        }
        if (a->type != FG_AUX_F32 && a->type != FG_AUX_I32) {
            snprintf(err, err_len, "spec.aux[%d].type: %d is not FG_AUX_F32 or FG_AUX_I32", i,
                     (int)a->type);
            return -1;
        }
        memcpy(out[i].name, a->name, strlen(a->name) + 1);
        out[i].elem = a->type == FG_AUX_I32 ? EXPR_INT : EXPR_FLOAT;
        out[i].rank = a->rank;
    }
    return 0;
}

/* Parse text into t, a refusal's message after "spec.<field>: " in err. */
static int parse_field(const char *field, const char *text, expr_kind kind, const expr_aux *aux,
                       int aux_count, expr_tree *t, char *err, size_t err_len) {
    int n = snprintf(err, err_len, "spec.%s: ", field);
    if (n < 0 || (size_t)n >= err_len) return expr_parse(text, kind, aux, aux_count, t, NULL, 0);
    return expr_parse(text, kind, aux, aux_count, t, err + n, err_len - (size_t)n);
}

int spec_expr_trees(const fg_spec *spec, expr_tree *score, expr_tree *mask, char *err,
                    size_t err_len) {
    expr_aux aux[EXPR_MAX_AUX];
    if (spec_expr_aux(spec, aux, err, err_len) != 0) return -1;
    if (has_text(spec->score_mod) &&
        parse_field("score_mod", spec->score_mod, EXPR_SCORE, aux, spec->aux_count, score, err,
                    err_len) != 0)
        return -1;
    if (has_text(spec->mask_mod) &&
        parse_field("mask_mod", spec->mask_mod, EXPR_MASK, aux, spec->aux_count, mask, err,
                    err_len) != 0)
        return -1;
    return 0;
}

void spec_expr_reads(const fg_spec *spec, int *both, int *k_only, int *calls) {
    *both = *k_only = *calls = 0;
    if (!has_text(spec->score_mod) && !has_text(spec->mask_mod)) return;
    expr_tree *trees = malloc(2 * sizeof *trees);
    char err[256];
    if (trees && spec_expr_trees(spec, &trees[0], &trees[1], err, sizeof err) == 0)
        for (int m = 0; m < 2; m++) {
            int b, k;
            if (!has_text(m == 0 ? spec->score_mod : spec->mask_mod)) continue;
            expr_read_shape(&trees[m], &b, &k);
            *both += b, *k_only += k;
            *calls += expr_math_calls(&trees[m]);
        }
    free(trees);
}

/* The expressions' fields of a canonical spec: each text parsed and
 * re-printed, the aux names kept, all interned. */
static int canonical_exprs(const fg_spec *in, fg_spec *s, char *err, size_t err_len) {
    if (!has_text(in->score_mod) && !has_text(in->mask_mod)) {
        if (in->aux_count != 0) {
            snprintf(err, err_len, "spec.aux_count: %d tensors, but no score_mod or mask_mod reads them",
                     in->aux_count);
            return -1;
        }
        return 0;
    }
    if (has_text(in->score_mod) && (in->softcap || in->alibi)) {
        snprintf(err, err_len, "spec.score_mod: a score modifier replaces %s; write it in the expression",
                 in->softcap ? "softcap" : "alibi");
        return -1;
    }
    expr_tree *trees = malloc(2 * sizeof *trees);
    char *text = malloc(EXPR_CANONICAL_MAX);
    expr_aux aux[EXPR_MAX_AUX];
    int rc = trees && text ? 0 : -1;
    if (rc) snprintf(err, err_len, "spec: out of memory");
    if (rc == 0) rc = spec_expr_trees(in, &trees[0], &trees[1], err, err_len);
    if (rc == 0) rc = spec_expr_aux(in, aux, err, err_len);
    for (int m = 0; m < 2 && rc == 0; m++) {
        const char *given = m == 0 ? in->score_mod : in->mask_mod;
        if (!has_text(given)) continue;
        const char *kept = NULL;
        if (expr_canonical(&trees[m], aux, text, EXPR_CANONICAL_MAX) == 0) kept = intern(text);
        if (!kept) {
            snprintf(err, err_len, "spec: out of memory (or %d distinct expressions)", INTERN_MAX);
            rc = -1;
        }
        *(m == 0 ? &s->score_mod : &s->mask_mod) = kept;
    }
    /* the declared tensors only: the rest stay zero, so equal specs compare equal */
    s->aux_count = in->aux_count;
    for (int i = 0; i < s->aux_count && rc == 0; i++) {
        s->aux[i].type = in->aux[i].type;
        s->aux[i].rank = in->aux[i].rank;
        if (!(s->aux[i].name = intern(in->aux[i].name))) {
            snprintf(err, err_len, "spec: out of memory");
            rc = -1;
        }
    }
    free(trees);
    free(text);
    return rc;
}

/* 64-bit FNV-1a of the canonical expressions, for names: kernels that differ
 * only in their expressions must not share a name (tuned tiles go by it). */
static uint64_t expr_digest(const fg_spec *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    const char *parts[2 + FG_MAX_AUX] = {s->score_mod, s->mask_mod};
    char types[FG_MAX_AUX * 2 + 1] = "";
    for (int i = 0; i < s->aux_count; i++) {
        parts[2 + i] = s->aux[i].name;
        types[2 * i] = (char)('0' + s->aux[i].type);
        types[2 * i + 1] = (char)('0' + s->aux[i].rank);
    }
    for (int i = 0; i < 2 + s->aux_count + 1; i++) {
        const char *p = i < 2 + s->aux_count ? parts[i] : types;
        for (; p && *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        h = (h ^ 0xff) * 0x100000001b3ull; /* a separator no text holds */
    }
    return h;
}

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
    if (in->kv_cache < 0 || in->kv_cache > FG_KV_LATENT) {
        snprintf(err, err_len, "spec.kv_cache: %d is not 0, 1 or FG_KV_LATENT (2)", in->kv_cache);
        return -1;
    }
    /* a latent cache's rows are wider: DeepSeek's 576, 512 of them V */
    const int latent = in->kv_cache == FG_KV_LATENT, widest = latent ? 576 : 256;
    if (in->head_dim < 1 || in->head_dim > widest) {
        snprintf(err, err_len, "spec.head_dim: %d is outside 1..%d%s", in->head_dim, widest,
                 latent ? " (a latent cache's)" : "");
        return -1;
    }
    if (in->head_dim_v < 0 || in->head_dim_v > (latent ? 512 : 256)) {
        snprintf(err, err_len, "spec.head_dim_v: %d is outside 1..%d (0: the same as head_dim)",
                 in->head_dim_v, latent ? 512 : 256);
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
    /* 0 where it equals head_dim, so such specs are the specs they were */
    s.head_dim_v = in->head_dim_v == in->head_dim ? 0 : in->head_dim_v;
    s.mask = in->mask;
    s.dropout = in->dropout != 0;
    s.varlen = in->varlen != 0;
    s.kv_cache = in->kv_cache;
    s.sparsity = in->sparsity;
    s.softcap = in->softcap != 0;
    s.alibi = in->alibi != 0;
    s.sinks = in->sinks != 0;
    if (canonical_exprs(in, &s, err, err_len) != 0) return -1;
    if (s.kv_cache && (s.varlen || s.dropout || s.sparsity != FG_SPARSE_NONE)) {
        snprintf(err, err_len, "spec.kv_cache: a decoding step takes no %s",
                 s.varlen ? "packed sequences (varlen)" : s.dropout ? "dropout" : "sparsity");
        return -1;
    }
    if (latent && (s.head_dim % 16 || spec_head_dim_v(&s) % 32 || spec_head_dim_v(&s) > s.head_dim)) {
        snprintf(err, err_len, "spec.kv_cache: a latent cache of head dim %d and value head dim %d; "
                 "it needs a head dim that is a multiple of 16 and a value head dim that is a "
                 "multiple of 32, at most the head dim (V is K's first columns)",
                 s.head_dim, spec_head_dim_v(&s));
        return -1;
    }
    if (latent && (s.softcap || s.alibi || s.sinks || has_text(s.score_mod) || has_text(s.mask_mod))) {
        snprintf(err, err_len, "spec.kv_cache: a latent cache takes no softcap, alibi, sinks or "
                 "expressions");
        return -1;
    }
    if (s.kv_cache && (s.head_dim % 8 != 0 || spec_head_dim_v(&s) % 8 != 0)) {
        snprintf(err, err_len, "spec.kv_cache: %s %d; a decoding step needs a multiple of 8",
                 s.head_dim % 8 ? "head dim" : "value head dim",
                 s.head_dim % 8 ? s.head_dim : spec_head_dim_v(&s));
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
    char exprs[32] = "";
    if (s->score_mod || s->mask_mod)
        snprintf(exprs, sizeof exprs, "_%s%016llx", s->score_mod ? (s->mask_mod ? "sm" : "s") : "m",
                 (unsigned long long)expr_digest(s));
    char value[16] = "";
    if (s->head_dim_v) snprintf(value, sizeof value, "v%d", s->head_dim_v);
    snprintf(buf, len, "%s_d%d%s%s%s%s%s%s%s%s%s%s%s", spec_dtype_name(s->dtype), s->head_dim,
             value, s->mask == FG_MASK_NONE ? "" : "_", s->mask == FG_MASK_NONE ? "" : spec_mask_name(s->mask),
             s->softcap ? "_cap" : "", s->alibi ? "_alibi" : "", s->sinks ? "_sink" : "", exprs,
             s->dropout ? "_drop" : "", sparse, s->varlen ? "_varlen" : "",
             s->kv_cache == FG_KV_LATENT ? "_kvlatent" : s->kv_cache ? "_kvcache" : "");
}

int spec_head_dim_padded(const fg_spec *s) { return (s->head_dim + 15) / 16 * 16; }

int spec_head_dim_v(const fg_spec *s) { return s->head_dim_v ? s->head_dim_v : s->head_dim; }

int spec_head_dim_v_padded(const fg_spec *s) { return (spec_head_dim_v(s) + 15) / 16 * 16; }

/* head_dim_v took what was padding: bindings that mirror the struct as it
 * was (its size, every other offset) keep working, passing 0 there */
_Static_assert(sizeof(void *) != 8 || (offsetof(fg_spec, head_dim_v) == 52 &&
                                       offsetof(fg_spec, score_mod) == 56),
               "fg_spec's layout moved");
