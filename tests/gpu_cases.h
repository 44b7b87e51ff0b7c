/* The case matrix the GPU tests run (gpu_forward, gpu_backward): every head
 * dim 8..256 step 8 plus odd ones, value head dims unlike the head dim
 * (names holding "dv"), head dims above 128 with masks, variants, sparsity
 * and waves (names holding "wide"), lengths 1..4097 with Sq != Sk, GQA/MQA,
 * both tensor layouts and row gaps, causal with both alignments, windows,
 * dropout, layout and butterfly block sparsity, fp16 and bf16, blocks of a
 * longer call (positions) with masks and dropout, the logits' variants
 * (softcap, ALiBi, sinks) made to bind and with each of those; and the spec
 * and the problem (harness/problem.h) of a case. */
#ifndef FG_TESTS_GPU_CASES_H
#define FG_TESTS_GPU_CASES_H

#include <stdint.h>

#include "flashgen.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "tests/gpu_common.h"

enum { CASE_SOFTCAP = 1, CASE_ALIBI = 2, CASE_SINKS = 4 };

/* Score and mask expressions (fg_spec.score_mod, mask_mod), each with the
 * aux tensors it reads, sized and filled from the case's shape. */
enum {
    EXPR_NONE,
    EXPR_REL_BIAS,  /* s + bias[h, q - k + Sk - 1]: a learned relative bias */
    EXPR_T5,        /* s + table[h, bucket[q - k + Sk - 1]]: T5's log buckets */
    EXPR_ALIBI,     /* ALiBi written out, bottom-right */
    EXPR_SOFTCAP,   /* 3·tanh(s/3) */
    EXPR_GAIN,      /* a float tensor times s, and a branch on the indices */
    EXPR_HIDE,      /* -inf from the score on every third diagonal */
    EXPR_DOCS,      /* docq[q] == dock[k]: documents packed in one sequence */
    EXPR_PREFIX,    /* prefix-LM: causal, or within the sequence's prefix */
    EXPR_WINDOW,    /* a window of 24 keys left of the diagonal, as a predicate */
    EXPR_BIAS_DOCS, /* the relative bias within documents */
    EXPR_DOCS_BH,   /* documents per batch row; odd heads also a band */
    EXPR_FLOORDIV,  /* floordiv and int(): a bias a third of the diagonals, blocks of 48 rows */
    EXPR_COUNT
};

struct gpu_case {
    const char *name;
    fg_dtype dtype;
    int d, batch, hq, hkv, sq, sk; /* hkv 0 means hq */
    int dv;                        /* the value head dim (V, O, dO, dV); 0 means d */
    int order;                     /* FGH_BSHD or FGH_BHSD */
    int pad;                       /* extra elements after each row: strides with gaps */
    fg_mask mask;
    fg_causal_align align;
    int wl, wr;                    /* window sizes, FG_MASK_WINDOW only */
    float scale;                   /* 0: 1/sqrt(d) */
    float dropout_p;
    uint64_t seed, offset;
    int probe;                     /* dropout keep-pattern inputs instead of random ones */
    fg_sparsity sparsity;
    int block_q, block_k;
    int factors;                   /* butterfly */
    int per_head_layout;           /* layout: one per query head, else shared */
    int block_mask;                /* layout: built from the mask predicate */
    int no_lse;                    /* the forward passes lse = NULL */
    int64_t pos_q, pos_k;          /* a block of a longer call: position_q, position_k */
    int variants;                  /* CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS */
    float softcap;                 /* the cap (CASE_SOFTCAP) */
    int alibi_per_batch;           /* slopes (B, Hq) instead of (Hq) */
    int expr;                      /* EXPR_*: score and mask expressions */
    int quick;                     /* part of --quick */
};

#define MAX_CASES 256
extern struct gpu_case gpu_cases[MAX_CASES];
extern int gpu_case_count;

/* Fills gpu_cases (once; later calls do nothing). */
void build_cases(void);
/* Whether --quick and the name filter (NULL: none) select the case. */
int case_selected(const struct gpu_case *c, int quick, const char *filter);
/* The seed of case i's inputs. */
uint64_t case_seed(int i);

fg_spec case_spec(const struct gpu_case *c);

/* The index of the case with this name, or -1. */
int case_index(const char *name);

/* The problem of a case, its inputs drawn from rng: q, k, v random normal
 * (or the dropout probe pattern, c->probe), then a layout case's random 0/1
 * block layout in which query block 1 of head 0 (0 when there is only one)
 * keeps no key block, so that its rows must come out 0 with lse -inf; then,
 * with grads, a random normal dO. Tensors lie in the case's order and
 * padding between LEAD and GUARD poisoned elements. CHECKs what fails; 0
 * then. Free the problem either way. */
int case_problem_make(fg_context *ctx, const struct gpu_case *c, fgh_rng *rng, int grads,
                      fgh_problem *p);

#endif
