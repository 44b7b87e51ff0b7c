/* Expressions whose generated device code test_expr_emit runs on the host
 * against the fp64 evaluator: every operation, int wrap-around, % 0, reads
 * outside their tensors, -inf, and float tensors in sums and products. All
 * read the same four tensors (some none). */
#ifndef FG_TESTS_EXPR_EMIT_CASES_H
#define FG_TESTS_EXPR_EMIT_CASES_H

#include "flashgen.h"

static const fg_aux_decl emit_aux[] = {
    {"bias", FG_AUX_F32, 2}, /* (4, 60): [h or b, q - k + 8] */
    {"doc", FG_AUX_I32, 1},  /* (50) */
    {"gain", FG_AUX_F32, 1}, /* (4) */
    {"tab", FG_AUX_F32, 3},  /* (3, 4, 4) */
};
#define EMIT_AUX_COUNT 4
static const int emit_aux_size[EMIT_AUX_COUNT][3] = {{4, 60, 1}, {50, 1, 1}, {4, 1, 1}, {3, 4, 4}};

static const struct emit_case {
    const char *score, *mask;
} emit_cases[] = {
    {"s", NULL},
    {"s + bias[h, q - k + 8]", "doc[q] == doc[k]"},
    {"30.0 * tanh(s / 30.0)", NULL},
    {"s * gain[h] + where(q % 2 == k % 3, 0.5 * s, max(s, -1.0))", NULL},
    {"where(abs(q - k) % 3 == 1, -inf, s)", "k <= q + (seqlen_k - seqlen_q) || k < doc[b]"},
    {"exp(s / 4.0) - log(abs(s) + 1.0) + sqrt(abs(s)) * floor(s)", NULL},
    {"min(s, 2.0) * max(q - k, 0) + (q * k - 7) % 5 - k / 3 + min(q, k) - abs(k - 2 * q)", NULL},
    {"s / (1.0 + abs(bias[b, k])) + tab[b, h, q % 4] * s * s", NULL},
    {"(q * 1000003 * 2147 + k) % 1000 + s + -(q * 2147483647)", NULL},
    {"s - 0.25 * abs(q + (seqlen_k - seqlen_q) - k) + bias[h, q - k + 8] * bias[b, k - q + 8]", NULL},
    {NULL, "!(q % 7 == 3) && (k - q) % 0 == 0 && (q * k) % -1 == 0"},
    {NULL, "bias[h, q - k + 8] > 0.0 || q == k || q / 2 >= k"},
    {"select(s > 0.5, s, 0.5) + (q > k ? 1.0 : 2)", NULL},
    /* masks whose split puts subtrees on each side, on one only, or the root on one */
    {NULL, "where(doc[q] > 2, doc[k] == doc[q] || doc[k] < 0, abs(k - q) <= doc[b] + 1)"},
    {NULL, "doc[k % 50] < doc[h] + 3"},
    /* floordiv rounds down: negative dividends and divisors, 0, and -1 */
    {"s + floordiv(q - k, 3) + floordiv(k - q, -4) * 2 + floordiv(q, 0) + "
     "floordiv(q * -2147483647 - 1, -1)",
     "floordiv(k - q, 7) == floordiv(-q, 5) || doc[floordiv(k, 2)] == 1"},
    /* int() toward zero, of NaN (log of a negative score) 0, past int32 saturated */
    {"s + int(s * 0.5) + bias[h, int(q * 0.5) + 8] + int(log(s)) * 0.25 + int(s * 1.0e9) * 1.0e-9",
     "int(q / 3.0) == floordiv(q, 3) && int(-2.5) == -2 && int(q) == q"},
    {NULL, "(q + doc[b]) % 4 != 1"},
    {NULL, "bias[h, doc[q] + 8] * gain[h] > bias[b, doc[k]]"},
    {"s * exp(-abs(k - q) / 8.0) + tab[b, h, (q - k) % 4] + bias[h, doc[q]] * gain[h]",
     "bias[h, q - k + 8] < 0.5 || doc[k] == 1"},
    /* NaN from log and sqrt of negative scores: min and max take the other */
    {"min(log(s), 1.0) + max(sqrt(s), -2.0) + min(0.5, log(s))", NULL},
};
#define EMIT_CASE_COUNT ((int)(sizeof emit_cases / sizeof emit_cases[0]))

/* Case i's spec: its expressions over the four tensors. */
static inline fg_spec emit_case_spec(int i) {
    fg_spec s = fg_spec_default(64, FG_BF16);
    s.score_mod = emit_cases[i].score;
    s.mask_mod = emit_cases[i].mask;
    s.aux_count = EMIT_AUX_COUNT;
    for (int t = 0; t < EMIT_AUX_COUNT; t++) s.aux[t] = emit_aux[t];
    return s;
}

#endif
