/* Score and mask expressions, text a user writes: parsed, printed back and
 * parsed again (the same tree's text), differentiated, emitted as device
 * code and evaluated by the reference, none of which may crash or read out
 * of bounds whatever the text.
 * Input: the first byte picks the kind (bit 0: mask) and the variables'
 * values; the rest is the text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/expr.h"
#include "gen/expr_emit.h"
#include "reference/expr_eval.h"
#include "tests/fuzz/fuzz.h"

static const expr_aux aux_decl[] = {
    {"bias", EXPR_FLOAT, 2}, {"doc", EXPR_INT, 1}, {"t3", EXPR_FLOAT, 3}, {"slope", EXPR_FLOAT, 1}};
#define AUX_COUNT ((int)(sizeof aux_decl / sizeof aux_decl[0]))

const fuzz_seed fuzz_seeds[] = {
    FUZZ_SEED("\x00s"), FUZZ_SEED("\x02" "30 * tanh(s / 30)"), FUZZ_SEED("\x04s + bias[h, q - k]"),
    FUZZ_SEED("\x01" "doc[q] == doc[k]"), FUZZ_SEED("\x03q >= k && (q - k) < 128"),
    FUZZ_SEED("\x06where(q > k, s - slope[h] * (q - k), -inf)"),
    FUZZ_SEED("\x08max(s, 0.5) + floor(t3[b, h, k % 4])"),
    FUZZ_SEED("\x0a" "abs(q - k) % 7 != 0 ? s : exp(s) - log(1.5)"),
    FUZZ_SEED("\x0cselect(k <= q, sqrt(abs(s)), min(s, 2e-3))"),
    FUZZ_SEED("\x05!(q < k) || seqlen_q - seqlen_k > 3"),
    FUZZ_SEED("\x10s - -(q - (k - 1)) * -2 / (3 * q % 5)"),
    FUZZ_SEED("\x0e" "bias[h, floordiv(q - k, -3)] + log(int(s * 2.5))"),
    FUZZ_SEED("\x07" "floordiv(k, 4) == doc[int(q / 2.0)]"),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0];
    char text[EXPR_MAX_TEXT + 64];
    size_t n = size - 1 < sizeof text - 1 ? size - 1 : sizeof text - 1;
    memcpy(text, data + 1, n);
    text[n] = '\0';
    const expr_kind kind = mode & 1 ? EXPR_MASK : EXPR_SCORE;

    static expr_tree tree, again, deriv;
    char err[256];
    if (expr_parse(text, kind, aux_decl, AUX_COUNT, &tree, err, sizeof err) != 0) {
        FUZZ_CHECK(strlen(err) > 0, "a refusal without a message: %s", text);
        return 0;
    }
    /* the canonical text parses to a tree with the same text */
    static char canon[EXPR_CANONICAL_MAX], canon2[EXPR_CANONICAL_MAX];
    FUZZ_CHECK(expr_canonical(&tree, aux_decl, canon, sizeof canon) == 0, "no canonical text: %s", text);
    if (strlen(canon) <= EXPR_MAX_TEXT) {
        FUZZ_CHECK(expr_parse(canon, kind, aux_decl, AUX_COUNT, &again, err, sizeof err) == 0,
                   "canonical text refused (%s): %s -> %s", err, text, canon);
        FUZZ_CHECK(expr_canonical(&again, aux_decl, canon2, sizeof canon2) == 0 && !strcmp(canon, canon2),
                   "canonical text changed: %s -> %s -> %s", text, canon, canon2);
    }
    /* the derivative (a DAG: its text may outgrow any buffer, so only run) */
    if (kind == EXPR_SCORE && expr_derivative(&tree, &deriv, err, sizeof err) == 0)
        (void)expr_canonical(&deriv, aux_decl, canon2, sizeof canon2);

    expr_source src;
    if (expr_emit(kind == EXPR_SCORE ? &tree : NULL, kind == EXPR_MASK ? &tree : NULL, aux_decl, &src, err,
                  sizeof err) == 0)
        expr_source_free(&src);
    else
        FUZZ_CHECK(strlen(err) > 0, "emit refused without a message: %s", text);

    /* the reference at a point the first byte picks, over small tensors */
    static float bias[3 * 5], t3[2 * 3 * 4], slope[4];
    static int32_t doc[7];
    for (int i = 0; i < 15; i++) bias[i] = (float)(i - 7) * 0.25f;
    for (int i = 0; i < 24; i++) t3[i] = (float)i * 0.5f - 3.f;
    for (int i = 0; i < 4; i++) slope[i] = 0.125f * (float)(i + 1);
    for (int i = 0; i < 7; i++) doc[i] = i / 3;
    const ref_aux aux[AUX_COUNT] = {{bias, {3, 5}, {5, 1}},
                                    {doc, {7}, {1}},
                                    {t3, {2, 3, 4}, {12, 4, 1}},
                                    {slope, {4}, {1}}};
    FUZZ_CHECK(expr_eval_ok(&tree, kind, aux_decl, aux, AUX_COUNT), "a parsed tree the reference refuses: %s", text);
    const int v = mode >> 1;
    const expr_env env = {.s = (double)(v % 7) - 3.5, .b = v % 2, .h = v % 3, .q = v % 9 - 1, .k = v % 11 - 2,
                          .seqlen_q = 9, .seqlen_k = 11, .decl = aux_decl, .aux = aux, .aux_count = AUX_COUNT};
    (void)expr_eval(&tree, &env);
    double tangent;
    if (kind == EXPR_SCORE) (void)expr_eval_dual(&tree, &env, EXPR_WRT_S, &tangent, NULL);
    return 0;
}
