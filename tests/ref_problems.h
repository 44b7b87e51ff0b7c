/* Building reference problems in the CPU tests of the reference. */
#ifndef FG_TESTS_REF_PROBLEMS_H
#define FG_TESTS_REF_PROBLEMS_H

#include <math.h>
#include <string.h>

#include "reference/reference.h"

/* A dense, unmasked problem with the default scale 1/sqrt(d). */
static inline ref_problem base_problem(int b, int hq, int hkv, int sq, int sk, int d) {
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.head_dim = d;
    p.scale = 1.0 / sqrt((double)d);
    p.window_left = -1;
    p.window_right = -1;
    p.layout_heads = 1;
    return p;
}

/* The width of v, o, dO and dV rows. */
static inline int dv_of(const ref_problem *p) { return p->head_dim_v ? p->head_dim_v : p->head_dim; }

/* Elements of q (and dQ; o and dO where Dv = D) and of k (and dK; v and dV
 * where Dv = D). */
static inline size_t q_elems(const ref_problem *p) {
    return (size_t)p->batch * p->heads_q * p->seqlen_q * p->head_dim;
}

static inline size_t kv_elems(const ref_problem *p) {
    return (size_t)p->batch * p->heads_kv * p->seqlen_k * p->head_dim;
}

/* Elements of o (and dO) and of v (and dV). */
static inline size_t o_elems(const ref_problem *p) {
    return (size_t)p->batch * p->heads_q * p->seqlen_q * dv_of(p);
}

static inline size_t v_elems(const ref_problem *p) {
    return (size_t)p->batch * p->heads_kv * p->seqlen_k * dv_of(p);
}

#endif
