/* Score and mask expressions: the examples parse with the types the rules
 * give; precedence; every class of error with its column; hostile text;
 * canonical forms are fixed points that parse back to the same tree; the
 * derivative agrees with central differences, by an evaluator kept here so
 * that the library holds no interpreter. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gen/expr.h"
#include "tests/check.h"

/* the tensors the tests declare: bias[h, j], slopes[h], doc[i], prefix[b] */
static const expr_aux test_aux[] = {
    {"bias", EXPR_FLOAT, 2},
    {"slopes", EXPR_FLOAT, 1},
    {"doc", EXPR_INT, 1},
    {"prefix", EXPR_INT, 1},
    {"cube", EXPR_FLOAT, 3},
};
#define TEST_AUX_COUNT ((int)(sizeof test_aux / sizeof test_aux[0]))
#define AUX_DIM 16 /* every dimension of every test tensor */

static expr_tree tree, tree2, dtree, dtree2; /* large: kept off the stack */

static int parse(const char *text, expr_kind kind, expr_tree *t, char *err, size_t len) {
    return expr_parse(text, kind, test_aux, TEST_AUX_COUNT, t, err, len);
}

/* the canonical form of text, or "" after reporting the failure */
static const char *canonical_of(const char *text, expr_kind kind) {
    static char buf[EXPR_CANONICAL_MAX];
    char err[256];
    buf[0] = '\0';
    int rc = parse(text, kind, &tree, err, sizeof err);
    CHECK(rc == 0, "'%s': %s", text, err);
    if (rc == 0) CHECK(expr_canonical(&tree, test_aux, buf, sizeof buf) == 0, "'%s' canonical", text);
    return buf;
}

/* ---- an evaluator over trees, in index order ------------------------------ */

typedef struct {
    double s;
    int b, h, q, k, seqlen_q, seqlen_k;
} point;

static double aux_value(int aux, const int *idx, int rank) {
    /* smooth enough to tell indices apart; ints for the int tensors */
    int flat = 0;
    for (int i = 0; i < rank; i++) flat = flat * AUX_DIM + idx[i];
    if (test_aux[aux].elem == EXPR_INT) return (double)((flat * 7 + aux) % 5);
    return 0.25 * (double)(flat % 11) - 1.0 + 0.125 * aux;
}

/* Evaluates every node; returns the root's value, NaN on an index out of range. */
static double evaluate(const expr_tree *t, const point *pt) {
    double v[EXPR_MAX_NODES];
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        double a = n->nchild > 0 ? v[n->child[0]] : 0, b = n->nchild > 1 ? v[n->child[1]] : 0;
        double c = n->nchild > 2 ? v[n->child[2]] : 0;
        switch (n->op) {
        case EXPR_NUMBER: v[i] = n->type == EXPR_INT ? (double)n->ival : n->fval; break;
        case EXPR_VAR: {
            const double vars[] = {pt->s, pt->b, pt->h, pt->q, pt->k, pt->seqlen_q, pt->seqlen_k};
            v[i] = vars[n->var];
            break;
        }
        case EXPR_AUX_READ: {
            int idx[3];
            for (int d = 0; d < n->nchild; d++) {
                double x = v[n->child[d]];
                if (x < 0 || x >= AUX_DIM) return NAN;
                idx[d] = (int)x;
            }
            v[i] = aux_value(n->aux, idx, n->nchild);
            break;
        }
        case EXPR_NEG: v[i] = -a; break;
        case EXPR_NOT: v[i] = !a; break;
        case EXPR_ADD: v[i] = a + b; break;
        case EXPR_SUB: v[i] = a - b; break;
        case EXPR_MUL: v[i] = a * b; break;
        case EXPR_DIV: v[i] = a / b; break;
        case EXPR_MOD: v[i] = (double)((int64_t)a % (int64_t)b); break;
        case EXPR_EQ: v[i] = a == b; break;
        case EXPR_NE: v[i] = a != b; break;
        case EXPR_LT: v[i] = a < b; break;
        case EXPR_LE: v[i] = a <= b; break;
        case EXPR_GT: v[i] = a > b; break;
        case EXPR_GE: v[i] = a >= b; break;
        case EXPR_AND: v[i] = a != 0 && b != 0; break;
        case EXPR_OR: v[i] = a != 0 || b != 0; break;
        case EXPR_WHERE: v[i] = a != 0 ? b : c; break;
        case EXPR_CALL:
            switch (n->fn) {
            case EXPR_FN_EXP: v[i] = exp(a); break;
            case EXPR_FN_LOG: v[i] = log(a); break;
            case EXPR_FN_TANH: v[i] = tanh(a); break;
            case EXPR_FN_SQRT: v[i] = sqrt(a); break;
            case EXPR_FN_FLOOR: v[i] = floor(a); break;
            case EXPR_FN_ABS: v[i] = fabs(a); break;
            case EXPR_FN_MIN: v[i] = a < b ? a : b; break;
            case EXPR_FN_MAX: v[i] = a > b ? a : b; break;
            case EXPR_FN_FLOORDIV: v[i] = b == 0 ? 0 : floor(a / b); break;
            case EXPR_FN_INT: v[i] = trunc(a); break;
            }
            break;
        }
    }
    return v[t->root];
}

/* children come first and every node is used */
static int well_formed(const expr_tree *t) {
    unsigned char used[EXPR_MAX_NODES] = {0};
    if (t->root != t->count - 1) return 0;
    used[t->root] = 1;
    for (int i = t->count - 1; i >= 0; i--) {
        if (!used[i]) return 0;
        for (int c = 0; c < t->nodes[i].nchild; c++) {
            if (t->nodes[i].child[c] >= i) return 0;
            used[t->nodes[i].child[c]] = 1;
        }
    }
    return 1;
}

/* ---- tests ----------------------------------------------------------------- */

static void test_examples(void) {
    static const struct {
        const char *text;
        expr_kind kind;
        expr_type type;
    } cases[] = {
        {"s + bias[h, q - k]", EXPR_SCORE, EXPR_FLOAT},
        {"30 * tanh(s / 30)", EXPR_SCORE, EXPR_FLOAT},
        {"s - slopes[h] * abs(q - k)", EXPR_SCORE, EXPR_FLOAT},
        {"where(q - k > 128, s - 2, s)", EXPR_SCORE, EXPR_FLOAT},
        {"doc[q] == doc[k]", EXPR_MASK, EXPR_BOOL},
        {"k <= q || k < prefix[b]", EXPR_MASK, EXPR_BOOL},
        {"q - k < 256 && k <= q", EXPR_MASK, EXPR_BOOL},
        {"q - k", EXPR_SCORE, EXPR_INT}, /* an int score: converted where used */
        {"q / 2", EXPR_SCORE, EXPR_FLOAT},
        {"q % 2", EXPR_SCORE, EXPR_INT},
        {"q * k + 1", EXPR_SCORE, EXPR_INT},
        {"q * 1.5", EXPR_SCORE, EXPR_FLOAT},
        {"-q", EXPR_SCORE, EXPR_INT},
        {"abs(q - k)", EXPR_SCORE, EXPR_INT},
        {"abs(s)", EXPR_SCORE, EXPR_FLOAT},
        {"min(q, k)", EXPR_SCORE, EXPR_INT},
        {"max(q, 0.5)", EXPR_SCORE, EXPR_FLOAT},
        {"floor(q)", EXPR_SCORE, EXPR_FLOAT},
        {"floordiv(q - k, 4)", EXPR_SCORE, EXPR_INT},
        {"s + bias[h, floordiv(k, 16)]", EXPR_SCORE, EXPR_FLOAT}, /* an int: an index */
        {"int(s * 2.0)", EXPR_SCORE, EXPR_INT},
        {"int(q)", EXPR_SCORE, EXPR_INT},
        {"s + bias[h, int(log(q + 1.0) * 4.0)]", EXPR_SCORE, EXPR_FLOAT},
        {"exp(0)", EXPR_SCORE, EXPR_FLOAT},
        {"where(q > k, 1, 2)", EXPR_SCORE, EXPR_INT},
        {"select(q > k, 1, 2.0)", EXPR_SCORE, EXPR_FLOAT},
        {"q > k ? 1 : 2", EXPR_SCORE, EXPR_INT},
        {"where(q > k, k < q, !(q == k))", EXPR_MASK, EXPR_BOOL},
        {"doc[q]", EXPR_SCORE, EXPR_INT},
        {"cube[b, h, seqlen_q - seqlen_k + q]", EXPR_SCORE, EXPR_FLOAT},
        {"  s\t", EXPR_SCORE, EXPR_FLOAT},
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = parse(cases[i].text, cases[i].kind, &tree, err, sizeof err);
        CHECK(rc == 0, "'%s': %s", cases[i].text, err);
        if (rc) continue;
        CHECK(tree.nodes[tree.root].type == cases[i].type, "'%s' is %s", cases[i].text,
              expr_type_name(tree.nodes[tree.root].type));
        CHECK(well_formed(&tree), "'%s' nodes in order", cases[i].text);
        CHECK(tree.kind == cases[i].kind, "'%s' kind", cases[i].text);
    }
    CHECK(parse("s + bias[h, q - k] * slopes[h]", EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_uses_var(&tree, EXPR_VAR_S) && expr_uses_var(&tree, EXPR_VAR_K), "uses s, k");
    CHECK(!expr_uses_var(&tree, EXPR_VAR_B), "does not use b");
    CHECK(expr_aux_used(&tree) == 3u, "aux used %#x", expr_aux_used(&tree));
    CHECK(parse("doc[q] == doc[k]", EXPR_MASK, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(!expr_uses_var(&tree, EXPR_VAR_S) && expr_aux_used(&tree) == 4u, "mask uses doc only");
    /* no tensors at all */
    CHECK(expr_parse("k <= q", EXPR_MASK, NULL, 0, &tree, err, sizeof err) == 0, "%s", err);
    /* the error buffer is optional */
    CHECK(expr_parse("k <=", EXPR_MASK, NULL, 0, &tree, NULL, 0) == -1, "no buffer");
    CHECK(expr_parse("k <=", EXPR_MASK, NULL, 0, &tree, err, 1) == -1 && err[0] == '\0', "1 byte");
}

static void test_precedence(void) {
    static const struct {
        const char *text, *canonical;
        expr_kind kind;
    } cases[] = {
        {"1 + 2 * 3", "1 + 2 * 3", EXPR_SCORE},
        {"(1 + 2) * 3", "(1 + 2) * 3", EXPR_SCORE},
        {"1 + (2 + 3)", "1 + (2 + 3)", EXPR_SCORE},
        {"q - (k - 1)", "q - (k - 1)", EXPR_SCORE},
        {"q - k - 1", "q - k - 1", EXPR_SCORE},
        {"q / k / 2", "q / k / 2", EXPR_SCORE},
        {"q / (k * 2)", "q / (k * 2)", EXPR_SCORE},
        {"-q * k", "-q * k", EXPR_SCORE},
        {"-(q * k)", "-(q * k)", EXPR_SCORE},
        {"- -s", "- -s", EXPR_SCORE},
        {"-(-s)", "- -s", EXPR_SCORE},
        {"s--1", "s - -1", EXPR_SCORE},
        {"s - 2 * q % 4", "s - 2 * q % 4", EXPR_SCORE},
        {"s - 2 * (q % 4)", "s - 2 * (q % 4)", EXPR_SCORE},
        {"!(q < k) || k < q && q == k", "!(q < k) || k < q && q == k", EXPR_MASK},
        {"(q < k || k < q) && q == k", "(q < k || k < q) && q == k", EXPR_MASK},
        {"q < (k + 1)", "q < k + 1", EXPR_MASK},
        {"q + 1 < k * 2", "q + 1 < k * 2", EXPR_MASK},
        {"!!(q>=k)", "! !(q >= k)", EXPR_MASK},
        {"q > k ? 1 : q < k ? 2 : 3", "where(q > k, 1, where(q < k, 2, 3))", EXPR_SCORE},
        {"q > k || k > q ? s : s * 2", "where(q > k || k > q, s, s * 2)", EXPR_SCORE},
        {"select(q != k, s, 0.)", "where(q != k, s, 0.0)", EXPR_SCORE},
        {"s + bias[h, q - k]", "s + bias[h, q - k]", EXPR_SCORE},
        {"min(q,k)+max(s,1)*seqlen_k", "min(q, k) + max(s, 1) * seqlen_k", EXPR_SCORE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *c = canonical_of(cases[i].text, cases[i].kind);
        CHECK(strcmp(c, cases[i].canonical) == 0, "'%s' -> '%s', not '%s'", cases[i].text, c,
              cases[i].canonical);
    }
}

static void test_numbers(void) {
    static const struct {
        const char *text, *canonical;
    } good[] = {
        {"1", "1"}, {"0", "0"}, {"2147483647", "2147483647"}, {"2.5", "2.5"}, {".5", "0.5"},
        {"2.", "2.0"}, {"1e-3", "0.00100000005"}, {"1E+2", "100.0"}, {"0.1", "0.100000001"},
        {"1e20", "1.00000002e+20"}, {"3.4028234e38", "3.40282347e+38"}, {"0e-400", "0.0"},
        {"0.0", "0.0"}, {"1.17549435e-38", "1.17549435e-38"}, {"1e-45", "1.40129846e-45"},
        {"100000000.0", "100000000.0"}, {"123456789.0", "123456792.0"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const char *c = canonical_of(good[i].text, EXPR_SCORE);
        CHECK(strcmp(c, good[i].canonical) == 0, "'%s' -> '%s', not '%s'", good[i].text, c,
              good[i].canonical);
    }
    char err[256];
    CHECK(parse("2.5", EXPR_SCORE, &tree, err, sizeof err) == 0 && tree.nodes[0].type == EXPR_FLOAT &&
              tree.nodes[0].fval == 2.5, "2.5");
    CHECK(parse("7", EXPR_SCORE, &tree, err, sizeof err) == 0 && tree.nodes[0].type == EXPR_INT &&
              tree.nodes[0].ival == 7, "7");
}

/* Each refused text with the column its error names and words it must hold. */
static void test_errors(void) {
    static const struct {
        const char *text;
        expr_kind kind;
        int column;
        const char *words;
    } cases[] = {
        /* names */
        {"s + foo", EXPR_SCORE, 5, "unknown name 'foo'"},
        {"__syncthreads()", EXPR_SCORE, 1, "unknown name '__syncthreads'"},
        {"s", EXPR_MASK, 1, "'s' (the score) is not available in a mask"},
        {"k <= q && s > 0", EXPR_MASK, 11, "not available in a mask"},
        {"q(1)", EXPR_SCORE, 1, "'q' is a variable; it cannot be called"},
        {"s + k[1]", EXPR_SCORE, 5, "cannot be indexed"},
        {"tanh + 1", EXPR_SCORE, 1, "'tanh' is a function; call it as tanh(...)"},
        {"exp[s]", EXPR_SCORE, 1, "'exp' is a function"},
        {"s + bias", EXPR_SCORE, 5, "'bias' is a tensor; read it as bias[...]"},
        {"bias(h, q)", EXPR_SCORE, 1, "'bias' is a tensor"},
        /* operators */
        {"s ** 2", EXPR_SCORE, 3, "unsupported operator '**'"},
        {"q & k", EXPR_SCORE, 3, "unsupported operator '&'"},
        {"q | k", EXPR_SCORE, 3, "unsupported operator '|'"},
        {"q ^ k", EXPR_SCORE, 3, "unsupported operator '^'"},
        {"q << 2", EXPR_SCORE, 3, "unsupported operator '<<'"},
        {"q >> 2", EXPR_SCORE, 3, "unsupported operator '>>'"},
        {"~q", EXPR_SCORE, 1, "unsupported operator '~'"},
        {"q = k", EXPR_MASK, 3, "unsupported operator '='"},
        {"s += 1", EXPR_SCORE, 4, "unsupported operator '='"},
        {"q === k", EXPR_MASK, 5, "unsupported operator '='"},
        {"k < q < 5", EXPR_MASK, 7, "comparisons do not chain"},
        /* arity */
        {"tanh(s, 2)", EXPR_SCORE, 1, "'tanh' takes 1 argument, not 2"},
        {"tanh()", EXPR_SCORE, 1, "'tanh' takes 1 argument, not 0"},
        {"min(s)", EXPR_SCORE, 1, "'min' takes 2 arguments, not 1"},
        {"s + where(q > k, s)", EXPR_SCORE, 5, "'where' takes 3 arguments, not 2"},
        {"select(q > k, 1, 2, 3, 4)", EXPR_SCORE, 1, "'select' takes 3 arguments, not 5"},
        {"s + bias[h]", EXPR_SCORE, 5, "'bias' has rank 2, so it takes 2 indexes, not 1"},
        {"slopes[h, q]", EXPR_SCORE, 1, "'slopes' has rank 1, so it takes 1 index, not 2"},
        {"slopes[]", EXPR_SCORE, 1, "takes 1 index, not 0"},
        /* types */
        {"s && q", EXPR_SCORE, 3, "'&&' needs bool operands (conditions); the left operand is float"},
        {"k < q || 1", EXPR_MASK, 7, "the right operand is int"},
        {"doc[q] + (k < q)", EXPR_SCORE, 8, "'+' needs number operands; the right operand is bool"},
        {"s * (q > k)", EXPR_SCORE, 3, "the right operand is bool"},
        {"s % 2", EXPR_SCORE, 3, "'%' needs int operands; the left operand is float"},
        {"q % 1.5", EXPR_SCORE, 3, "the right operand is float"},
        {"floordiv(s, 2)", EXPR_SCORE, 10, "argument 1 of 'floordiv' must be int, this is float"},
        {"floordiv(q, 2.0)", EXPR_SCORE, 13, "argument 2 of 'floordiv' must be int"},
        {"floordiv(q)", EXPR_SCORE, 1, "'floordiv' takes 2 arguments, not 1"},
        {"int(q, k)", EXPR_SCORE, 1, "'int' takes 1 argument, not 2"},
        {"int(q > k)", EXPR_SCORE, 5, "argument 1 of 'int' must be a number, this is bool"},
        {"bias[s, q]", EXPR_SCORE, 6, "index 1 of 'bias' must be int, this is float"},
        {"bias[h, (q + 0.5)]", EXPR_SCORE, 9, "index 2 of 'bias' must be int"},
        {"slopes[k < q]", EXPR_SCORE, 8, "must be int, this is bool"},
        {"q - k", EXPR_MASK, 1, "a mask must give bool"},
        {"doc[q]", EXPR_MASK, 1, "this gives int"},
        {"k <= q", EXPR_SCORE, 1, "a score expression must give a number"},
        {"-(k < q)", EXPR_SCORE, 1, "'-' needs a number"},
        {"!q", EXPR_MASK, 1, "'!' needs bool"},
        {"tanh(k < q)", EXPR_SCORE, 6, "argument 1 of 'tanh' must be a number"},
        {"where(q, s, 1)", EXPR_SCORE, 7, "the condition must be bool, this is int"},
        {"where(q > k, s, k < q)", EXPR_SCORE, 17, "both be numbers or both be bool"},
        {"q + k ? 1 : 2", EXPR_SCORE, 1, "the condition must be bool"},
        {"q == (k < q)", EXPR_MASK, 3, "'==' needs number operands"},
        /* structure */
        {"", EXPR_SCORE, 1, "empty expression"},
        {"   \t ", EXPR_SCORE, 6, "empty expression"},
        {"s s", EXPR_SCORE, 3, "unexpected name 's' after a complete expression"},
        {"s + 1)", EXPR_SCORE, 6, "unexpected ')' after a complete expression"},
        {"(s + 1", EXPR_SCORE, 7, "expected ')', found the end of the expression"},
        {"s +", EXPR_SCORE, 4, "expected a number, a name or '(', found the end"},
        {"s + * 2", EXPR_SCORE, 5, "found '*'"},
        {"tanh(s", EXPR_SCORE, 7, "expected ',' or ')'"},
        {"bias[h, q", EXPR_SCORE, 10, "expected ',' or ']'"},
        {"q > k ? s", EXPR_SCORE, 10, "expected ':' of '?:'"},
        {"exp(s)(1)", EXPR_SCORE, 7, "unexpected '('"},
        {"+s", EXPR_SCORE, 1, "found '+'"},
        {".", EXPR_SCORE, 1, "unexpected character '.'"},
        /* numbers */
        {"s + 2147483648", EXPR_SCORE, 5, "does not fit in int32"},
        {"99999999999999999999999", EXPR_SCORE, 1, "does not fit in int32"},
        {"s * 3.5e38", EXPR_SCORE, 5, "out of range for float32"},
        {"1e999", EXPR_SCORE, 1, "out of range for float32"},
        {"s + 1e-50", EXPR_SCORE, 5, "too small for float32"},
        {"0x10", EXPR_SCORE, 1, "hexadecimal numbers are not supported"},
        {"s * 2.0f", EXPR_SCORE, 5, "numbers take no suffixes"},
        {"1u", EXPR_SCORE, 1, "numbers take no suffixes"},
        {"1e", EXPR_SCORE, 1, "numbers take no suffixes"},
        {"2x", EXPR_SCORE, 1, "numbers take no suffixes"},
        {"1.2.3", EXPR_SCORE, 1, "malformed number: '1.2.3'"},
        {"s + 010", EXPR_SCORE, 5, "leading zero"},
        /* characters */
        {"s; 1", EXPR_SCORE, 2, "unexpected character ';'"},
        {"s); asm(\"trap\"); (s", EXPR_SCORE, 3, "unexpected character ';'"},
        {"s /* */", EXPR_SCORE, 4, "found '*'"},
        {"s // note", EXPR_SCORE, 4, "found '/'"},
        {"s\n+1", EXPR_SCORE, 2, "unexpected byte 0x0a"},
        {"s\r", EXPR_SCORE, 2, "unexpected byte 0x0d"},
        {"#include <x>", EXPR_SCORE, 1, "unexpected character '#'"},
        {"'s'", EXPR_SCORE, 1, "unexpected character '''"},
        {"{s}", EXPR_SCORE, 1, "unexpected character '{'"},
        {"s \\ 2", EXPR_SCORE, 3, "unexpected character '\\'"},
        {"s + $x", EXPR_SCORE, 5, "unexpected character '$'"},
        {"s @ 2", EXPR_SCORE, 3, "unexpected character '@'"},
        {"s \xc3\x97 2", EXPR_SCORE, 3, "unexpected byte 0xc3"},
        {"\xef\xbb\xbfs", EXPR_SCORE, 1, "unexpected byte 0xef"},
        {"s\x7f", EXPR_SCORE, 2, "unexpected byte 0x7f"},
        {"s + 1 /* \x01 */", EXPR_SCORE, 10, "unexpected byte 0x01"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&tree, 0x5a, sizeof tree);
        int rc = parse(cases[i].text, cases[i].kind, &tree, err, sizeof err);
        int column = -1;
        CHECK(rc == -1, "'%s' was accepted", cases[i].text);
        if (rc != -1) continue;
        CHECK(sscanf(err, "column %d:", &column) == 1 && column == cases[i].column,
              "'%s': column %d, not %d: %s", cases[i].text, column, cases[i].column, err);
        CHECK(strstr(err, cases[i].words) != NULL, "'%s': '%s' lacks '%s'", cases[i].text, err,
              cases[i].words);
        CHECK(tree.count == 0 && tree.root == -1, "'%s' left a tree", cases[i].text);
    }
    CHECK(expr_parse(NULL, EXPR_SCORE, NULL, 0, &tree, err, sizeof err) == -1 &&
              strstr(err, "null"), "%s", err);
    CHECK(expr_parse("s", EXPR_SCORE, NULL, 0, NULL, err, sizeof err) == -1, "null tree");
    CHECK(expr_parse("s", (expr_kind)7, NULL, 0, &tree, err, sizeof err) == -1 && strstr(err, "kind"),
          "%s", err);
}

static void test_aux_declarations(void) {
    static const struct {
        expr_aux aux;
        const char *words;
    } bad[] = {
        {{"exp", EXPR_FLOAT, 1}, "reserved"},
        {{"s", EXPR_FLOAT, 1}, "reserved"},
        {{"select", EXPR_FLOAT, 1}, "reserved"},
        {{"seqlen_k", EXPR_INT, 1}, "reserved"},
        {{"", EXPR_FLOAT, 1}, "identifier"},
        {{"2d", EXPR_FLOAT, 1}, "identifier"},
        {{"my bias", EXPR_FLOAT, 1}, "identifier"},
        {{"a;b", EXPR_FLOAT, 1}, "identifier"},
        {{"bias", EXPR_BOOL, 1}, "int or float"},
        {{"bias", EXPR_FLOAT, 0}, "rank 0"},
        {{"bias", EXPR_FLOAT, 4}, "rank 4"},
    };
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(expr_parse("s", EXPR_SCORE, &bad[i].aux, 1, &tree, err, sizeof err) == -1 &&
                  strncmp(err, "aux[0]: ", 8) == 0 && strstr(err, bad[i].words),
              "'%s': %s", bad[i].aux.name, err);
    }
    expr_aux long_name = {"", EXPR_FLOAT, 1};
    memset(long_name.name, 'a', sizeof long_name.name); /* 33 letters, no terminator */
    CHECK(expr_parse("s", EXPR_SCORE, &long_name, 1, &tree, err, sizeof err) == -1 &&
              strstr(err, "identifier"), "%s", err);
    long_name.name[EXPR_AUX_NAME_MAX] = '\0'; /* 32: the most */
    char text[64];
    snprintf(text, sizeof text, "s + %s[q]", long_name.name);
    CHECK(expr_parse(text, EXPR_SCORE, &long_name, 1, &tree, err, sizeof err) == 0, "%s", err);
    expr_aux two[2] = {{"doc", EXPR_INT, 1}, {"doc", EXPR_INT, 1}};
    CHECK(expr_parse("s", EXPR_SCORE, two, 2, &tree, err, sizeof err) == -1 &&
              strstr(err, "aux[1]") && strstr(err, "twice"), "%s", err);
    expr_aux nine[9];
    for (int i = 0; i < 9; i++) {
        snprintf(nine[i].name, sizeof nine[i].name, "t%d", i);
        nine[i].elem = EXPR_FLOAT, nine[i].rank = 1;
    }
    CHECK(expr_parse("s", EXPR_SCORE, nine, 9, &tree, err, sizeof err) == -1 && strstr(err, "at most 8"),
          "%s", err);
    CHECK(expr_parse("s + t7[q]", EXPR_SCORE, nine, 8, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_aux_used(&tree) == 0x80u, "t7 read");
    CHECK(expr_parse("s", EXPR_SCORE, NULL, 2, &tree, err, sizeof err) == -1 && strstr(err, "null"),
          "%s", err);
    CHECK(expr_parse("s", EXPR_SCORE, nine, -1, &tree, err, sizeof err) == -1, "negative count");
}

static void test_hostile(void) {
    static char text[EXPR_MAX_TEXT + 64];
    char err[256], want[64];
    /* length: EXPR_MAX_TEXT bytes pass, one more does not */
    memset(text, ' ', EXPR_MAX_TEXT);
    text[0] = 's';
    text[EXPR_MAX_TEXT] = '\0';
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == 0, "%d bytes: %s", EXPR_MAX_TEXT, err);
    text[EXPR_MAX_TEXT] = ' ';
    text[EXPR_MAX_TEXT + 1] = '\0';
    snprintf(want, sizeof want, "column %d: the expression is longer than %d bytes", EXPR_MAX_TEXT + 1,
             EXPR_MAX_TEXT);
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, want), "%s", err);
    /* a long text with a bad byte past the limit is refused for its length */
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "longer than"), "%s",
          err);
    /* a long unknown name is cut in the message */
    memset(text, 'y', 1000);
    text[1000] = '\0';
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "unknown name") &&
              strstr(err, "...") && strlen(err) < 100, "%s", err);
    /* nesting: 32 levels pass, 33 do not; the error points at the 33rd '(' */
    for (int depth = 32; depth <= 33; depth++) {
        int n = 0;
        for (int i = 0; i < depth; i++) text[n++] = '(';
        text[n++] = 's';
        for (int i = 0; i < depth; i++) text[n++] = ')';
        text[n] = '\0';
        int rc = parse(text, EXPR_SCORE, &tree, err, sizeof err);
        if (depth == 32)
            CHECK(rc == 0 && tree.count == 1, "32 levels: %s", err);
        else
            CHECK(rc == -1 && strstr(err, "column 33:") && strstr(err, "nested more than 32"), "%s", err);
    }
    /* prefix operators and calls nest too */
    memset(text, '-', 40);
    strcpy(text + 40, "s");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "column 33:"), "%s", err);
    text[0] = '\0';
    for (int i = 0; i < 40; i++) strcat(text, "exp(");
    strcat(text, "s");
    for (int i = 0; i < 40; i++) strcat(text, ")");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "nested"), "%s", err);
    text[0] = '\0';
    for (int i = 0; i < 40; i++) strcat(text, "q > k ? s : ");
    strcat(text, "s");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "nested"), "%s", err);
    /* nodes: s+s+...+s with 150 terms has 299; node 257 is the '+' at column 256 */
    strcpy(text, "s");
    for (int i = 1; i < 150; i++) strcat(text, "+s");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "column 256:") &&
              strstr(err, "more than 256 nodes"), "%s", err);
    /* ?:'s condition takes a level once written as where(): 32 prefix
     * operators in it pass as typed, not in the canonical text, so they are
     * refused; 31 pass both ways */
    text[0] = '\0';
    for (int i = 0; i < 32; i++) strcat(text, "-");
    strcat(text, "q > k ? s : 1.0");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "written as where()"), "%s", err);
    CHECK(parse(text + 1, EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    {
        static char c1[EXPR_CANONICAL_MAX];
        CHECK(expr_canonical(&tree, test_aux, c1, sizeof c1) == 0 &&
                  parse(c1, EXPR_SCORE, &tree2, err, sizeof err) == 0,
              "31 prefix operators in a condition, canonical: %s", err);
    }
    /* 128 terms, 255 nodes: accepted, and its canonical form, no deeper,
     * parses back to the same text */
    strcpy(text, "s");
    for (int i = 1; i < 128; i++) strcat(text, "+s");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == 0 && tree.count == 255, "%s", err);
    {
        static char c1[EXPR_CANONICAL_MAX], c2[EXPR_CANONICAL_MAX];
        CHECK(expr_canonical(&tree, test_aux, c1, sizeof c1) == 0 &&
                  parse(c1, EXPR_SCORE, &tree2, err, sizeof err) == 0 &&
                  expr_canonical(&tree2, test_aux, c2, sizeof c2) == 0 && strcmp(c1, c2) == 0,
              "128 terms' canonical text parsed again: %s", err);
    }
    /* the widest node everywhere: no text parses to 256 reads of a
     * 32-character rank-3 tensor (their indices are nodes); build the worst
     * tree by hand */
    static const expr_aux wide = {"abcdefghijklmnopqrstuvwxyzabcdef", EXPR_FLOAT, 3};
    memset(&tree2, 0, sizeof tree2);
    tree2.kind = EXPR_SCORE;
    tree2.nodes[0].op = EXPR_NUMBER, tree2.nodes[0].type = EXPR_FLOAT, tree2.nodes[0].fval = 1.17549435e-38;
    for (int i = 1; i < EXPR_MAX_NODES; i++) {
        expr_node *n = &tree2.nodes[i];
        n->op = EXPR_AUX_READ, n->type = EXPR_FLOAT, n->nchild = 3, n->aux = 0;
        n->child[0] = n->child[1] = n->child[2] = i - 1;
    }
    tree2.count = 2; /* a shared child printed thrice per level: kept small */
    tree2.root = 1;
    static char big[EXPR_CANONICAL_MAX];
    CHECK(expr_canonical(&tree2, &wide, big, sizeof big) == 0, "wide read");
    /* a DAG whose expansion is enormous: refused quickly for the buffer */
    tree2.count = EXPR_MAX_NODES;
    tree2.root = EXPR_MAX_NODES - 1;
    CHECK(expr_canonical(&tree2, &wide, big, sizeof big) == -1 && big[0] == '\0', "huge expansion");
    /* malformed trees are refused, not walked */
    CHECK(parse("s + 1", EXPR_SCORE, &tree2, err, sizeof err) == 0, "%s", err);
    tree2.nodes[2].child[0] = 2;
    CHECK(expr_canonical(&tree2, test_aux, big, sizeof big) == -1, "self loop");
    CHECK(expr_derivative(&tree2, &dtree, err, sizeof err) == -1 && strstr(err, "malformed"), "%s", err);
    tree2.nodes[2].child[0] = 0;
    tree2.root = 7;
    CHECK(expr_canonical(&tree2, test_aux, big, sizeof big) == -1, "root out of range");
    CHECK(!expr_uses_var(&tree2, EXPR_VAR_S) && expr_aux_used(&tree2) == 0, "malformed: nothing used");
}

/* canonical(x) parses back to the same nodes and prints the same text */
static void test_round_trips(void) {
    static const char *const scores[] = {
        "s + bias[h, q - k]", "30 * tanh(s / 30)", "s - slopes[h] * abs(q - k)",
        "where(q - k > 128, s - 2, s)", "q > k ? s : -s * 0.125", "s * 1e-3 + 2.",
        "log(1 + exp(s)) - floor(s / 7.5)", "max(min(s, 50), -50)", "floor(sqrt(s*s + 1)) + q % 3 + 0",
        "- - - s", "cube[b % 2, h, (q - k) % 16] * .1", "select(!(q < k) && q != k, s, 3.4e38)",
    };
    static const char *const masks[] = {
        "doc[q] == doc[k]", "k <= q || k < prefix[b]", "q - k < 256 && k <= q",
        "!(k > q) && (doc[q] != 0 || q < 4)", "where(q > 3, k < q, k >= q - 1)", "q / 2 > k",
    };
    static char c1[EXPR_CANONICAL_MAX], c2[EXPR_CANONICAL_MAX];
    char err[256];
    for (int m = 0; m < 2; m++) {
        const char *const *list = m ? masks : scores;
        size_t count = m ? sizeof masks / sizeof masks[0] : sizeof scores / sizeof scores[0];
        expr_kind kind = m ? EXPR_MASK : EXPR_SCORE;
        for (size_t i = 0; i < count; i++) {
            int rc = parse(list[i], kind, &tree, err, sizeof err);
            CHECK(rc == 0, "'%s': %s", list[i], err);
            if (rc) continue;
            CHECK(expr_canonical(&tree, test_aux, c1, sizeof c1) == 0, "'%s'", list[i]);
            rc = parse(c1, kind, &tree2, err, sizeof err);
            CHECK(rc == 0, "'%s' -> '%s': %s", list[i], c1, err);
            if (rc) continue;
            CHECK(expr_canonical(&tree2, test_aux, c2, sizeof c2) == 0 && strcmp(c1, c2) == 0,
                  "'%s' -> '%s' -> '%s'", list[i], c1, c2);
            int same = tree.count == tree2.count && tree.root == tree2.root;
            for (int n = 0; same && n < tree.count; n++) {
                const expr_node *a = &tree.nodes[n], *b = &tree2.nodes[n];
                same = a->op == b->op && a->type == b->type && a->nchild == b->nchild &&
                       memcmp(a->child, b->child, sizeof a->child) == 0 && a->ival == b->ival &&
                       a->fval == b->fval && a->var == b->var && a->fn == b->fn && a->aux == b->aux;
            }
            CHECK(same, "'%s' and '%s' differ as trees", list[i], c1);
            point pt = {0.75, 1, 2, 9, 4, 12, 12};
            double v1 = evaluate(&tree, &pt), v2 = evaluate(&tree2, &pt);
            CHECK(v1 == v2 || (isnan(v1) && isnan(v2)), "'%s' evaluates %g and %g", list[i], v1, v2);
        }
    }
    /* too small a buffer: -1, and the buffer is left empty */
    CHECK(parse("s + bias[h, q - k]", EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_canonical(&tree, test_aux, c1, 19) == 0 && strlen(c1) == 18, "exact fit: %s", c1);
    CHECK(expr_canonical(&tree, test_aux, c1, 18) == -1 && c1[0] == '\0', "one byte short");
    CHECK(expr_canonical(&tree, NULL, c1, sizeof c1) == -1, "tensor names needed");
    CHECK(expr_canonical(&tree, test_aux, NULL, 10) == -1, "null buffer");
    /* the precedence spelled differently gives one canonical form */
    CHECK(strcmp(canonical_of("((s)) + (bias[(h), ((q) - k)])", EXPR_SCORE), "s + bias[h, q - k]") == 0,
          "redundant parentheses");
    char a[128];
    snprintf(a, sizeof a, "%s", canonical_of("q>k?s:1", EXPR_SCORE));
    CHECK(strcmp(a, canonical_of("select(q > k, s, 1)", EXPR_SCORE)) == 0, "?: and select: %s", a);
}

/* d/ds of the expression against central differences at several points */
static void check_derivative(const char *text, const double *s_values, int n_s) {
    char err[256];
    int rc = parse(text, EXPR_SCORE, &tree, err, sizeof err);
    CHECK(rc == 0, "'%s': %s", text, err);
    if (rc) return;
    rc = expr_derivative(&tree, &dtree, err, sizeof err);
    CHECK(rc == 0, "'%s' derivative: %s", text, err);
    if (rc) return;
    CHECK(well_formed(&dtree), "'%s' derivative nodes in order and used", text);
    CHECK(dtree.kind == EXPR_SCORE && dtree.nodes[dtree.root].type != EXPR_BOOL, "'%s' kind", text);
    static const point where[] = {{0, 0, 1, 5, 3, 8, 8}, {0, 1, 3, 2, 7, 8, 8}, {0, 0, 0, 9, 9, 16, 16}};
    for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
        for (int i = 0; i < n_s; i++) {
            point p = where[w], lo = p, hi = p;
            const double step = 1e-5;
            p.s = s_values[i], lo.s = p.s - step, hi.s = p.s + step;
            double fd = (evaluate(&tree, &hi) - evaluate(&tree, &lo)) / (2 * step);
            double d = evaluate(&dtree, &p);
            CHECK(fabs(d - fd) <= 1e-5 * (1 + fabs(fd)), "'%s' at s=%g q=%d k=%d: %.9g, differences %.9g",
                  text, p.s, p.q, p.k, d, fd);
        }
    }
}

static void test_derivative(void) {
    static const double s_values[] = {-3.7, -1.2, -0.3, 0.2, 0.9, 1.6, 4.4};
    const int n = (int)(sizeof s_values / sizeof s_values[0]);
    static const char *const texts[] = {
        "30 * tanh(s / 30)", "s * s", "exp(s) / 2", "where(q > k, s * 2, s)", "abs(s - 1)",
        "max(s, 0.5)", "sqrt(s * s + 1)", "log(1 + exp(s))", "s + bias[h, abs(q - k)]",
        "s - slopes[h] * abs(q - k)", "where(q - k > 2, s - 2, s)", "1 / (1 + exp(-s))",
        "(s * s + q) / (s * s * s * s + 1)", "min(s * 3, s + 1) - max(-s, 2 * s)", "floor(s) + s",
        "q > k ? tanh(s) * slopes[h] : exp(s / seqlen_k)", "s * h - s / (q + 1)", "abs(s) * abs(q - k)",
        "where(s > 0, s, 0.01 * s)", "- -s * -s", "log(sqrt(exp(s) + 1)) * cube[b, h, q]",
        "exp(tanh(tanh(tanh(s))))",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) check_derivative(texts[i], s_values, n);

    /* simplification: no 0 or 1 terms left */
    static const struct {
        const char *text, *derivative;
    } simple[] = {
        {"s", "1.0"}, {"s + bias[h, q - k]", "1.0"}, {"q - k", "0.0"}, {"s * s", "s + s"},
        {"2 * s", "2"}, {"s * h", "h"}, {"-s", "-1.0"}, {"s - q", "1.0"}, {"q - s", "-1.0"},
        {"exp(s)", "exp(s)"}, {"floor(s) * 3", "0.0"}, {"where(s > 0, 1.5, 2)", "0.0"},
        {"where(q > k, s, s)", "1.0"}, {"where(q > k, s, 0)", "where(q > k, 1.0, 0.0)"},
        {"30 * tanh(s / 30)", "1.0 / 30 * (1.0 - tanh(s / 30) * tanh(s / 30)) * 30"},
        {"log(s)", "1.0 / s"}, {"s / q", "1.0 / q"}, {"max(s, 0)", "where(s >= 0, 1.0, 0.0)"},
        {"abs(s)", "where(s < 0.0, -1.0, 1.0)"}, {"sqrt(s)", "1.0 / (2.0 * sqrt(s))"},
    };
    static char buf[EXPR_CANONICAL_MAX];
    char err[256];
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++) {
        int rc = parse(simple[i].text, EXPR_SCORE, &tree, err, sizeof err);
        if (rc == 0) rc = expr_derivative(&tree, &dtree, err, sizeof err);
        CHECK(rc == 0, "'%s': %s", simple[i].text, err);
        if (rc) continue;
        CHECK(expr_canonical(&dtree, test_aux, buf, sizeof buf) == 0 &&
                  strcmp(buf, simple[i].derivative) == 0,
              "d '%s' = '%s', not '%s'", simple[i].text, buf, simple[i].derivative);
        CHECK(well_formed(&dtree), "'%s' derivative used nodes", simple[i].text);
    }
    /* shared nodes: tanh(s / 30) is one node used twice */
    CHECK(parse("tanh(s)", EXPR_SCORE, &tree, err, sizeof err) == 0 &&
              expr_derivative(&tree, &dtree, err, sizeof err) == 0 && dtree.count == 5,
          "tanh': %d nodes", dtree.count);
    /* second derivative of s^3 is 6s */
    CHECK(parse("s * s * s", EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_derivative(&tree, &dtree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_derivative(&dtree, &dtree2, err, sizeof err) == 0, "%s", err);
    point p = {1.25, 0, 0, 0, 0, 1, 1};
    CHECK(fabs(evaluate(&dtree2, &p) - 7.5) < 1e-12, "(s^3)'' at 1.25: %g", evaluate(&dtree2, &p));
    /* masks have none; the output may not be the input */
    CHECK(parse("k <= q", EXPR_MASK, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_derivative(&tree, &dtree, err, sizeof err) == -1 && strstr(err, "mask"), "%s", err);
    CHECK(parse("s", EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_derivative(&tree, &tree, err, sizeof err) == -1 && strstr(err, "another"), "%s", err);
    /* a derivative beyond the node limit is refused: the product rule over
     * a long product keeps every partial product */
    static char text[1100];
    strcpy(text, "s");
    for (int i = 1; i < 100; i++) strcat(text, "*s");
    CHECK(parse(text, EXPR_SCORE, &tree, err, sizeof err) == 0, "%s", err);
    CHECK(expr_derivative(&tree, &dtree, err, sizeof err) == -1 && strstr(err, "more than 256 nodes") &&
              dtree.count == 0 && dtree.root == -1, "%s", err);
}

/* inf, derivatives in a tensor's read, and the reads' shapes */
static void test_reads_and_inf(void) {
    char err[256];
    CHECK(strcmp(canonical_of("where(q < k, -inf, s)", EXPR_SCORE), "where(q < k, -inf, s)") == 0,
          "-inf's canonical form");
    CHECK(strcmp(canonical_of("inf", EXPR_SCORE), "inf") == 0, "inf reads back");
    CHECK(parse("inf(2)", EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "column 1"),
          "inf called: %s", err);
    CHECK(parse("s + inf[1]", EXPR_SCORE, &tree, err, sizeof err) == -1 && strstr(err, "column 5"),
          "inf indexed: %s", err);

    /* t = s·bias[h, q] + bias[h, k]·bias[h, k]: each read its own factor */
    static char buf[EXPR_CANONICAL_MAX];
    int rc = parse("s * bias[h, q] + bias[h, k] * 2.5", EXPR_SCORE, &tree, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    int found = 0;
    for (int i = 0; rc == 0 && i < tree.count; i++) {
        if (tree.nodes[i].op != EXPR_AUX_READ) continue;
        const char *want = found++ == 0 ? "s" : "2.5";
        CHECK(expr_derivative_of(&tree, i, &dtree, err, sizeof err) == 0 &&
                  expr_canonical(&dtree, test_aux, buf, sizeof buf) == 0 && strcmp(buf, want) == 0,
              "d/d(read %d) = '%s', not '%s' (%s)", found, buf, want, err);
    }
    CHECK(found == 2, "two reads");
    CHECK(expr_derivative_of(&tree, 0, &dtree, err, sizeof err) == -1 && strstr(err, "not a read"),
          "wrt a node that is not a read: %s", err);
    rc = parse("s + doc[q]", EXPR_SCORE, &tree, err, sizeof err);
    CHECK(rc == 0 && expr_derivative_of(&tree, 2, &dtree, err, sizeof err) == -1,
          "wrt a read of an int tensor: %s", err);

    static const struct {
        const char *text;
        expr_kind kind;
        int both, k_only;
    } shapes[] = {
        {"s + bias[h, q - k]", EXPR_SCORE, 1, 0}, {"doc[q] == doc[k]", EXPR_MASK, 0, 1},
        {"k < prefix[b]", EXPR_MASK, 0, 0},       {"s * slopes[h] + bias[doc[k], q]", EXPR_SCORE, 1, 1},
        {"s", EXPR_SCORE, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int both = -1, k_only = -1;
        rc = parse(shapes[i].text, shapes[i].kind, &tree, err, sizeof err);
        if (rc == 0) expr_read_shape(&tree, &both, &k_only);
        CHECK(rc == 0 && both == shapes[i].both && k_only == shapes[i].k_only,
              "'%s': reads by q and k %d, by k %d", shapes[i].text, both, k_only);
    }
}

int main(void) {
    test_examples();
    test_precedence();
    test_numbers();
    test_errors();
    test_aux_declarations();
    test_hostile();
    test_round_trips();
    test_derivative();
    test_reads_and_inf();
    return check_summary("test_expr");
}
