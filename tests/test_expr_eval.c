/* The fp64 evaluator of score and mask expressions and the reference with
 * them: hand-computed values (wrapping ints, % 0, reads outside a tensor,
 * ints meeting floats, where, inf); dual-number derivatives against central
 * differences and against expr_derivative's conventions at the kinks; the
 * built-in variants and masks written as expressions give the built-in
 * problem's outputs and gradients; a document mask equals each document run
 * alone; the aux tensors' gradients and dq, dk against finite differences of
 * L = Σ dO∘O; the low-precision twins against fp64; refused problems. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen/expr.h"
#include "reference/expr_eval.h"
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/ref_problems.h"

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void *xmalloc(size_t bytes) {
    void *x = malloc(bytes ? bytes : 1);
    if (!x)
        abort();
    return x;
}

/* n values k / 2^frac_bits with |k| <= 2^frac_bits * range: x ± 2^-frac_bits
 * stays exact, as the finite differences need */
static float *grid_tensor(size_t n, int frac_bits, int range) {
    float *x = xmalloc(n * sizeof *x);
    const int64_t m = (int64_t)range << frac_bits;
    for (size_t t = 0; t < n; t++)
        x[t] = ldexpf((float)((int64_t)(rng_next() % (uint64_t)(2 * m + 1)) - m), -frac_bits);
    return x;
}

static double max_abs(const double *a, size_t n) {
    double m = 0;
    for (size_t t = 0; t < n; t++)
        m = fmax(m, fabs(a[t]));
    return m;
}

/* max |a − b| with equal infinities agreeing; NaN anywhere gives inf */
static double max_diff(const double *a, const double *b, size_t n) {
    double m = 0;
    for (size_t t = 0; t < n; t++) {
        if (a[t] == b[t])
            continue;
        const double d = fabs(a[t] - b[t]);
        m = isnan(d) ? INFINITY : fmax(m, d);
    }
    return m;
}

/* exact agreement, NaN agreeing with NaN */
static int same_value(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

static int parse_with(const char *text, expr_kind kind, const expr_aux *decl, int n, expr_tree *t) {
    char err[256];
    const int rc = expr_parse(text, kind, decl, n, t, err, sizeof err);
    CHECK(rc == 0, "'%s': %s", text, err);
    return rc;
}

/* The number node of value v in t (the first), or -1. */
static int number_node(const expr_tree *t, double v) {
    for (int i = 0; i < t->count; i++)
        if (t->nodes[i].op == EXPR_NUMBER && t->nodes[i].type == EXPR_FLOAT &&
            t->nodes[i].fval == v)
            return i;
    return -1;
}

/* text with its float 1.5 replaced by +inf, whether or not the parser spells
 * `inf` yet */
static int parse_with_inf(const char *text, expr_kind kind, const expr_aux *decl, int n,
                          expr_tree *t) {
    if (parse_with(text, kind, decl, n, t) != 0)
        return -1;
    const int at = number_node(t, 1.5);
    CHECK(at >= 0, "'%s' has a 1.5", text);
    if (at < 0)
        return -1;
    t->nodes[at].fval = INFINITY;
    return 0;
}

static expr_tree tree_a, tree_b, tree_c; /* large: kept off the stack */

/* ---- (a) values by hand --------------------------------------------------- */

static const expr_aux sem_decl[] = {
    {"doc", EXPR_INT, 1},
    {"bias", EXPR_FLOAT, 2},
    {"cube", EXPR_FLOAT, 3},
};
#define SEM_AUX 3

static const int32_t sem_doc[5] = {3, -7, 2147483647, 0, 9};
static float sem_bias[3 * 4]; /* (3, 4) contiguous */
/* (2, 3, 4) stored transposed: cube[a, b, c] = data[a + 2b + 6c] */
static float sem_cube[2 * 3 * 4];
static ref_aux sem_aux[SEM_AUX];

static expr_env sem_env(void) {
    /* not exact in binary: a read must give float32's value */
    for (int t = 0; t < 12; t++)
        sem_bias[t] = 0.1f * (float)(t + 1);
    for (int t = 0; t < 24; t++)
        sem_cube[t] = (float)t + 0.25f;
    sem_aux[0] = (ref_aux){sem_doc, {5, 0, 0}, {1, 0, 0}};
    sem_aux[1] = (ref_aux){sem_bias, {3, 4, 0}, {4, 1, 0}};
    sem_aux[2] = (ref_aux){sem_cube, {2, 3, 4}, {1, 2, 6}};
    expr_env e;
    memset(&e, 0, sizeof e);
    e.s = 1.25;
    e.b = 1, e.h = 2, e.q = 3, e.k = 5, e.seqlen_q = 7, e.seqlen_k = 11;
    e.decl = sem_decl, e.aux = sem_aux, e.aux_count = SEM_AUX;
    return e;
}

static void expect_value(const char *text, expr_kind kind, const expr_env *e, double want) {
    if (parse_with(text, kind, sem_decl, SEM_AUX, &tree_a) != 0)
        return;
    CHECK(expr_eval_ok(&tree_a, kind, e->decl, e->aux, e->aux_count), "'%s' evaluable", text);
    const double got = expr_eval(&tree_a, e);
    CHECK(same_value(got, want), "'%s' = %.17g, not %.17g", text, got, want);
    /* the dual pass gives the same value */
    double d;
    const double dual = expr_eval_dual(&tree_a, e, EXPR_WRT_S, &d, NULL);
    CHECK(same_value(dual, want), "'%s' dual value %.17g", text, dual);
}

static void test_values(void) {
    const expr_env e = sem_env();
    static const struct {
        const char *text;
        double want;
    } score[] = {
        /* 32-bit ints wrap on + - * and unary - */
        {"2147483647 + 1", -2147483648.0},
        {"-2147483647 - 2", 2147483647.0},
        {"q * 1000000 * 1000", 3000000000.0 - 4294967296.0},
        {"65536 * 65536 + k", 5.0},
        {"-(0 - 2147483647 - 1)", -2147483648.0},
        {"abs(0 - 2147483647 - 1)", -2147483648.0},
        {"doc[2] + 1", -2147483648.0},
        {"abs(q - k)", 2.0},
        {"abs(1.5 - q)", 1.5},
        /* % truncates; % 0 and INT_MIN % -1 give 0 */
        {"7 % 0", 0.0},
        {"k % 0", 0.0},
        {"-7 % 3", -1.0},
        {"7 % -3", 1.0},
        {"(0 - 2147483647 - 1) % -1", 0.0},
        {"(0 - 2147483647 - 1) % 3", -2.0},
        /* '/' divides as floats */
        {"7 / 2", 3.5},
        {"k / q", 5.0 / 3.0},
        {"q / 0", INFINITY},
        {"-q / 0", -INFINITY},
        {"0 / 0", NAN},
        /* ints meet floats as floats; abs min max of ints stay ints */
        {"q + 0.5", 3.5},
        {"min(q, k)", 3.0},
        {"max(q, 2.5)", 3.0},
        {"min(2.5, q)", 2.5},
        {"max(k, q) * 0.5", 2.5},
        {"s * q - k", 1.25 * 3 - 5},
        {"where(q < 3.5, 1, 2)", 1.0},
        {"where(q < 2.5, 1, 2)", 2.0},
        {"q == 3.0 ? s : -s", 1.25},
        {"select(q != k, 10, 20.5)", 10.0},
        {"where(q > k, 1, 2.5)", 2.5},
        /* the C double functions */
        {"log(q - 3)", -INFINITY},
        {"sqrt(q - 4)", NAN},
        {"floor(-1.5)", -2.0},
        {"floor(s)", 1.0},
        {"tanh(s)", tanh(1.25)},
        {"exp(s) * log(k)", exp(1.25) * log(5.0)},
        {"b + 10 * h + 100 * q + 1000 * k + 10000 * seqlen_q + 100000 * seqlen_k", 1175321.0},
        /* reads: inside, outside in each dimension (never a neighbour), strided */
        {"doc[0]", 3.0},
        {"doc[4]", 9.0},
        {"doc[5]", 0.0},
        {"doc[-1]", 0.0},
        {"doc[q - k]", 0.0},
        {"doc[doc[3]]", 3.0},
        {"bias[0, 0]", (double)0.1f}, /* float32's value widened, not 0.1 */
        {"bias[2, 3]", (double)(0.1f * 12.0f)},
        {"bias[1, 0]", (double)(0.1f * 5.0f)},
        {"bias[3, 0]", 0.0},
        {"bias[0, 4]", 0.0},
        {"bias[1, -1]", 0.0},
        {"bias[-1, 3]", 0.0},
        {"cube[1, 2, 3]", 23.25},
        {"cube[0, 1, 2]", 14.25},
        {"cube[1, 2, 4]", 0.0},
        {"cube[2, 0, 0]", 0.0},
        {"cube[0, 3, 0]", 0.0},
    };
    for (size_t t = 0; t < sizeof score / sizeof score[0]; t++)
        expect_value(score[t].text, EXPR_SCORE, &e, score[t].want);
    static const struct {
        const char *text;
        double want;
    } mask[] = {
        {"q > 1 && k > 1", 1.0},     {"!(q > k) || k == 3", 1.0},
        {"q > k || k == 3", 0.0},    {"q > k && 1 / 0 > 0", 0.0},
        {"doc[q - 3] == 3", 1.0},    {"!(doc[9] == 0)", 0.0},
        {"q < 3.5 && q > 2.5", 1.0}, {"q == 3.0", 1.0},
        {"2147483647 + 1 < 0", 1.0}, {"where(q < k, k <= 5, q == 0)", 1.0},
    };
    for (size_t t = 0; t < sizeof mask / sizeof mask[0]; t++)
        expect_value(mask[t].text, EXPR_MASK, &e, mask[t].want);

    /* inf: -inf as a score, inf in a comparison */
    if (parse_with_inf("s - 1.5", EXPR_SCORE, sem_decl, SEM_AUX, &tree_a) == 0)
        CHECK(expr_eval(&tree_a, &e) == -INFINITY, "s - inf");
    if (parse_with_inf("where(k > q, -1.5, s)", EXPR_SCORE, sem_decl, SEM_AUX, &tree_a) == 0) {
        double d = 7;
        CHECK(expr_eval_dual(&tree_a, &e, EXPR_WRT_S, &d, NULL) == -INFINITY && d == 0.0,
              "where(k > q, -inf, s): the constant branch, derivative %g", d);
    }
    if (parse_with_inf("k < 1.5", EXPR_MASK, sem_decl, SEM_AUX, &tree_a) == 0)
        CHECK(expr_eval(&tree_a, &e) == 1.0, "k < inf");
    /* the parser's own spelling, where it has one */
    char err[256];
    if (expr_parse("-inf", EXPR_SCORE, NULL, 0, &tree_a, err, sizeof err) == 0)
        CHECK(expr_eval(&tree_a, &e) == -INFINITY, "-inf parsed");
}

static void test_eval_ok(void) {
    sem_env(); /* fills the tensors */
    if (parse_with("s + bias[h, k] * doc[q]", EXPR_SCORE, sem_decl, SEM_AUX, &tree_a) != 0)
        return;
    CHECK(expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX), "good");
    CHECK(!expr_eval_ok(&tree_a, EXPR_MASK, sem_decl, sem_aux, SEM_AUX), "a score as a mask");
    CHECK(!expr_eval_ok(NULL, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX), "NULL");
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, sem_aux, 1), "bias undeclared");
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, NULL, SEM_AUX), "no tensors");
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, sem_aux, EXPR_MAX_AUX + 1), "9 tensors");
    expr_aux decl[SEM_AUX];
    memcpy(decl, sem_decl, sizeof decl);
    decl[1].rank = 1;
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, decl, sem_aux, SEM_AUX), "rank differs");
    memcpy(decl, sem_decl, sizeof decl);
    decl[0].elem = EXPR_FLOAT;
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, decl, sem_aux, SEM_AUX), "element type differs");
    ref_aux aux[SEM_AUX];
    memcpy(aux, sem_aux, sizeof aux);
    aux[2].data = NULL;
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, aux, SEM_AUX), "no data");
    aux[2].size[1] = 0; /* empty: no data needed */
    CHECK(expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, aux, SEM_AUX), "empty without data");
    memcpy(aux, sem_aux, sizeof aux);
    aux[1].size[0] = -1;
    CHECK(!expr_eval_ok(&tree_a, EXPR_SCORE, sem_decl, aux, SEM_AUX), "negative size");
    tree_b = tree_a;
    tree_b.nodes[tree_b.root].child[0] = tree_b.root;
    CHECK(!expr_eval_ok(&tree_b, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX),
          "a child after its parent");
    tree_b = tree_a;
    tree_b.nodes[tree_b.root].nchild = 3;
    CHECK(!expr_eval_ok(&tree_b, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX), "three operands of +");
    /* a float where an int32 is read: an index, an int sum's operand */
    tree_b = tree_a;
    for (int i = 0; i < tree_b.count; i++)
        if (tree_b.nodes[i].op == EXPR_VAR && tree_b.nodes[i].var == EXPR_VAR_K)
            tree_b.nodes[i].type = EXPR_FLOAT;
    CHECK(!expr_eval_ok(&tree_b, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX), "a float index");
    if (parse_with("s + (q - k)", EXPR_SCORE, sem_decl, SEM_AUX, &tree_b) == 0) {
        for (int i = 0; i < tree_b.count; i++)
            if (tree_b.nodes[i].op == EXPR_VAR && tree_b.nodes[i].var == EXPR_VAR_Q)
                tree_b.nodes[i].type = EXPR_FLOAT;
        CHECK(!expr_eval_ok(&tree_b, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX),
              "an int sum of a float");
    }
    tree_b = tree_a;
    tree_b.root = tree_b.count;
    CHECK(!expr_eval_ok(&tree_b, EXPR_SCORE, sem_decl, sem_aux, SEM_AUX), "root outside");
    /* float reads: bias only, in index order */
    int reads[EXPR_MAX_NODES];
    const int n = expr_eval_float_reads(&tree_a, reads);
    CHECK(n == 1 && tree_a.nodes[reads[0]].aux == 1, "float reads %d", n);
}

/* ---- (b) dual numbers against differences ------------------------------------ */

static const expr_aux fd_decl[] = {
    {"bias", EXPR_FLOAT, 2},
    {"slopes", EXPR_FLOAT, 1},
    {"cube", EXPR_FLOAT, 3},
    {"idx", EXPR_INT, 1},
};
#define FD_AUX 4

/* Tensors' values ±(0.25 .. 1.625) on a 2^-3 grid: never 0 (a divisor), and
 * x ± 2^-20 exact. */
static float fd_bias[4 * 12], fd_slopes[4], fd_cube[2 * 4 * 3];
static const int32_t fd_idx[7] = {0, 3, 1, 2, 9, -1, 2};
static ref_aux fd_aux[FD_AUX];

static void fill_nonzero(float *x, size_t n) {
    for (size_t t = 0; t < n; t++) {
        const uint64_t r = rng_next();
        x[t] = (float)((r & 1 ? -1.0 : 1.0) * (0.25 + 0.125 * (double)((r >> 1) % 12)));
    }
}

static void fd_setup(void) {
    fill_nonzero(fd_bias, 48);
    fill_nonzero(fd_slopes, 4);
    fill_nonzero(fd_cube, 24);
    fd_aux[0] = (ref_aux){fd_bias, {4, 12, 0}, {12, 1, 0}};
    fd_aux[1] = (ref_aux){fd_slopes, {4, 0, 0}, {1, 0, 0}};
    fd_aux[2] = (ref_aux){fd_cube, {2, 4, 3}, {12, 3, 1}};
    fd_aux[3] = (ref_aux){fd_idx, {7, 0, 0}, {1, 0, 0}};
}

static float *fd_data(int aux) { return aux == 0 ? fd_bias : aux == 1 ? fd_slopes : fd_cube; }

/* Central differences in s and in every element a float read names; a
 * read's derivative is summed over the reads that name the same element, as
 * perturbing the element moves them all. Returns the worst error. */
static double fd_point(const char *text, const expr_env *e0) {
    const double hs = 1e-6, ha = 0x1p-20, tol = 1e-6;
    double worst = 0;
    expr_env e = *e0;
    double ds;
    const double t0 = expr_eval_dual(&tree_a, &e, EXPR_WRT_S, &ds, NULL);
    e.s = e0->s + hs;
    const double tp = expr_eval(&tree_a, &e);
    e.s = e0->s - hs;
    const double tm = expr_eval(&tree_a, &e);
    e.s = e0->s;
    const double fd = (tp - tm) / (2 * hs);
    CHECK(fabs(fd - ds) <= tol * (1 + fabs(ds)),
          "'%s' at s=%g q=%d k=%d: dt/ds %.12g, differences %.12g", text, e.s, e.q, e.k, ds, fd);
    worst = fmax(worst, fabs(fd - ds));
    CHECK(same_value(t0, expr_eval(&tree_a, &e)), "'%s' dual value", text);

    int reads[EXPR_MAX_NODES], at[EXPR_MAX_NODES];
    double d[EXPR_MAX_NODES];
    const int n = expr_eval_float_reads(&tree_a, reads);
    for (int r = 0; r < n; r++) {
        int64_t a;
        expr_eval_dual(&tree_a, &e, reads[r], &d[r], &a);
        at[r] = (int)a;
    }
    for (int r = 0; r < n; r++) {
        const int aux = tree_a.nodes[reads[r]].aux;
        if (at[r] < 0)
            continue;
        int first = 1;
        double want = 0;
        for (int u = 0; u < n; u++) {
            if (tree_a.nodes[reads[u]].aux == aux && at[u] == at[r]) {
                first &= u >= r;
                want += d[u];
            }
        }
        if (!first)
            continue;                    /* this element was checked with an earlier read */
        float *x = fd_data(aux) + at[r]; /* contiguous: the offset is the element */
        const float x0 = *x;
        *x = (float)(x0 + ha);
        const double ap = expr_eval(&tree_a, &e);
        *x = (float)(x0 - ha);
        const double am = expr_eval(&tree_a, &e);
        *x = x0;
        const double fa = (ap - am) / (2 * ha);
        CHECK(fabs(fa - want) <= tol * (1 + fabs(want)),
              "'%s' at s=%g q=%d k=%d: d/d(aux %d [%d]) %.12g, differences %.12g", text, e.s, e.q,
              e.k, aux, at[r], want, fa);
        worst = fmax(worst, fabs(fa - want));
    }
    return worst;
}

static void test_dual(void) {
    static const char *const exprs[] = {
        "30.0 * tanh(s / 30.0)",
        "s + bias[h, q - k + 4]",
        "exp(s / 4.0) - log(s * s + 1.0) + sqrt(s * s + 2.0) * bias[h, 1]",
        "where(s > 0.5, s * s, min(s, 0.25 * s) + max(s, -s))",
        "s * slopes[h] - abs(s - 1.0) * slopes[idx[k]]",
        "floor(s) + s / (1.0 + abs(s))",
        "s * cube[b, h, k % 3] + cube[b, h, 0] * cube[b, h, 0]",
        "bias[h, k] / (bias[h, q] + 3.0) + s / bias[h, k]",
        "max(bias[h, k], s) - min(bias[h, q], 2.0 * s) + tanh(bias[h, k] * s)",
        "(s - slopes[h]) * (s + slopes[h]) * bias[h, 11] / bias[h, 10]",
    };
    static const double svals[] = {-2.3, -0.7, 0.37, 1.9, 3.1};
    static const int pts[][4] = {{0, 0, 3, 5}, {1, 3, 7, 2}, {1, 2, 0, 6}, {0, 1, 9, 9}};
    fd_setup();
    double worst = 0;
    for (size_t x = 0; x < sizeof exprs / sizeof exprs[0]; x++) {
        if (parse_with(exprs[x], EXPR_SCORE, fd_decl, FD_AUX, &tree_a) != 0)
            continue;
        CHECK(expr_eval_ok(&tree_a, EXPR_SCORE, fd_decl, fd_aux, FD_AUX), "'%s'", exprs[x]);
        for (size_t sv = 0; sv < sizeof svals / sizeof svals[0]; sv++) {
            for (size_t pt = 0; pt < sizeof pts / sizeof pts[0]; pt++) {
                expr_env e;
                memset(&e, 0, sizeof e);
                e.s = svals[sv];
                e.b = pts[pt][0], e.h = pts[pt][1], e.q = pts[pt][2], e.k = pts[pt][3];
                e.seqlen_q = 10, e.seqlen_k = 12;
                e.decl = fd_decl, e.aux = fd_aux, e.aux_count = FD_AUX;
                worst = fmax(worst, fd_point(exprs[x], &e));
            }
        }
    }
    printf("dual numbers vs central differences: worst error %.3g\n", worst);

    /* a read outside the tensor: its element is -1, its value 0 */
    if (parse_with("s * bias[h, q - k]", EXPR_SCORE, fd_decl, FD_AUX, &tree_a) == 0) {
        expr_env e = {0.5, 0, 1, 2, 5, 10, 12, fd_decl, fd_aux, FD_AUX};
        int reads[EXPR_MAX_NODES];
        double d;
        int64_t at = 99;
        CHECK(expr_eval_float_reads(&tree_a, reads) == 1, "one read");
        CHECK(expr_eval_dual(&tree_a, &e, reads[0], &d, &at) == 0.0 && at == -1 && d == 0.5,
              "outside: at %lld, d %g", (long long)at, d);
        e.k = 0;
        CHECK(expr_eval_dual(&tree_a, &e, reads[0], &d, &at) == 0.5 * fd_bias[14] && at == 14 &&
                  d == 0.5,
              "inside: at %lld", (long long)at);
        /* not a read: no seed */
        CHECK(expr_eval_dual(&tree_a, &e, tree_a.root, &d, &at) == 0.5 * fd_bias[14] && d == 0.0 &&
                  at == -1,
              "the root is no read");
    }
}

/* At the kinks the documented conventions, and everywhere expr_derivative's
 * tree (evaluated here) agrees with the dual numbers. */
static void test_conventions(void) {
    static const struct {
        const char *text;
        double s, want;
    } kinks[] = {
        {"abs(s)", 0.0, 1.0},
        {"abs(s - 1.0)", 1.0, 1.0},
        {"abs(s)", -0.5, -1.0},
        {"min(s, 0.0)", 0.0, 1.0},
        {"min(0.0, s)", 0.0, 0.0},
        {"max(s, 0.0)", 0.0, 1.0},
        {"max(0.0, s)", 0.0, 0.0},
        {"min(s, 2.0 * s)", 0.0, 1.0},
        {"max(2.0 * s, s)", 0.0, 2.0},
        {"max(3.0 * s, q)", 1.0, 3.0},
        {"max(3.0 * s, q)", 0.5, 0.0},
        {"where(s >= 0.0, 4.0 * s, s)", 0.0, 4.0},
        {"floor(s) + q % 2", 0.5, 0.0},
        {"where(q > k, exp(1000.0) * s, s - 2)", 0.3, 1.0}, /* the branch not taken is inf */
        {"exp(1000.0) * 0.0 + s", 0.3, 1.0},                /* no 0·inf: nothing to chain */
    };
    fd_setup();
    expr_env e;
    memset(&e, 0, sizeof e);
    e.b = 1, e.h = 2, e.q = 3, e.k = 5, e.seqlen_q = 10, e.seqlen_k = 12;
    e.decl = fd_decl, e.aux = fd_aux, e.aux_count = FD_AUX;
    char err[256];
    for (size_t t = 0; t < sizeof kinks / sizeof kinks[0]; t++) {
        if (parse_with(kinks[t].text, EXPR_SCORE, fd_decl, FD_AUX, &tree_a) != 0)
            continue;
        e.s = kinks[t].s;
        double d;
        expr_eval_dual(&tree_a, &e, EXPR_WRT_S, &d, NULL);
        CHECK(d == kinks[t].want, "'%s' at %g: %g, not %g", kinks[t].text, e.s, d, kinks[t].want);
        if (expr_derivative(&tree_a, &tree_b, err, sizeof err) == 0 &&
            expr_eval_ok(&tree_b, EXPR_SCORE, fd_decl, fd_aux, FD_AUX))
            CHECK(expr_eval(&tree_b, &e) == d, "'%s': expr_derivative gives %g", kinks[t].text,
                  expr_eval(&tree_b, &e));
        else
            CHECK(0, "'%s': no derivative: %s", kinks[t].text, err);
    }
    /* smooth expressions at many points: the two derivatives agree closely */
    static const char *const smooth[] = {
        "30.0 * tanh(s / 30.0) + bias[h, k] * s",
        "exp(s / 4.0) - log(s * s + 1.0) + sqrt(s * s + 2.0)",
        "s / (1.0 + s * s) - cube[b, h, 2] * s * s",
        "where(q > k, s * s, min(s, 0.25 * s)) + max(s, slopes[h])",
    };
    double worst = 0;
    for (size_t t = 0; t < sizeof smooth / sizeof smooth[0]; t++) {
        if (parse_with(smooth[t], EXPR_SCORE, fd_decl, FD_AUX, &tree_a) != 0 ||
            expr_derivative(&tree_a, &tree_b, err, sizeof err) != 0) {
            CHECK(0, "'%s'", smooth[t]);
            continue;
        }
        for (int u = 0; u < 40; u++) {
            e.s = -4.0 + 0.2137 * u;
            e.q = u % 7, e.k = u % 5;
            double d;
            expr_eval_dual(&tree_a, &e, EXPR_WRT_S, &d, NULL);
            const double sym = expr_eval(&tree_b, &e);
            CHECK(fabs(sym - d) <= 1e-13 * (1 + fabs(d)), "'%s' at %g: %.17g vs %.17g", smooth[t],
                  e.s, d, sym);
            worst = fmax(worst, fabs(sym - d));
        }
    }
    printf("dual numbers vs expr_derivative: worst difference %.3g\n", worst);
}

/* ---- (c) the reference with expressions ---------------------------------------- */

typedef struct {
    float *q, *k, *v, *g;
} inputs;

static inputs make_inputs(const ref_problem *p, float qscale) {
    inputs in;
    in.q = grid_tensor(q_elems(p), 10, 1);
    in.k = grid_tensor(kv_elems(p), 10, 1);
    in.v = grid_tensor(kv_elems(p), 10, 1);
    in.g = grid_tensor(q_elems(p), 10, 1);
    for (size_t t = 0; t < q_elems(p); t++)
        in.q[t] *= qscale;
    return in;
}

static void free_inputs(inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->g);
}

typedef struct {
    double *o, *lse, *dq, *dk, *dv, *dsinks;
} outputs;

static outputs make_outputs(const ref_problem *p) {
    outputs r;
    r.o = xmalloc(q_elems(p) * sizeof(double));
    r.lse = xmalloc(q_elems(p) / (size_t)p->head_dim * sizeof(double));
    r.dq = xmalloc(q_elems(p) * sizeof(double));
    r.dk = xmalloc(kv_elems(p) * sizeof(double));
    r.dv = xmalloc(kv_elems(p) * sizeof(double));
    r.dsinks = xmalloc((size_t)p->heads_q * sizeof(double));
    return r;
}

static void free_outputs(outputs *r) {
    free(r->o);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->dsinks);
}

static int run_all(const ref_problem *p, const inputs *in, outputs *r) {
    if (ref_attention_fp64(p, in->q, in->k, in->v, r->o, r->lse) != 0 ||
        ref_attention_backward_fp64(p, in->q, in->k, in->v, in->g, r->dq, r->dk, r->dv) != 0)
        return -1;
    if (p->sinks && ref_sinks_backward_fp64(p, in->q, in->k, in->v, in->g, r->dsinks) != 0)
        return -1;
    return 0;
}

/* a (expressions) and b (built in) agree within tol·(1 + max |b|) on O, lse,
 * dq, dk, dv and d_sinks; and b differs from plain by more than 1e-3 when
 * plain is given (the expression changes something). */
static void expect_same(const char *what, const ref_problem *a, const ref_problem *b,
                        const ref_problem *plain, const inputs *in, double tol) {
    outputs ra = make_outputs(b), rb = make_outputs(b);
    const int rc_a = run_all(a, in, &ra), rc_b = run_all(b, in, &rb);
    CHECK(rc_a == 0 && rc_b == 0, "%s: rc %d %d", what, rc_a, rc_b);
    if (rc_a == 0 && rc_b == 0) {
        const size_t nq = q_elems(b), nkv = kv_elems(b), nl = nq / (size_t)b->head_dim;
        const struct {
            const char *name;
            const double *x, *y;
            size_t n;
        } cmp[] = {{"o", ra.o, rb.o, nq},
                   {"lse", ra.lse, rb.lse, nl},
                   {"dq", ra.dq, rb.dq, nq},
                   {"dk", ra.dk, rb.dk, nkv},
                   {"dv", ra.dv, rb.dv, nkv},
                   {"d_sinks", ra.dsinks, rb.dsinks, b->sinks ? (size_t)b->heads_q : 0}};
        for (size_t c = 0; c < sizeof cmp / sizeof cmp[0]; c++) {
            /* lse may hold -inf (rows with no key): compare the finite part's scale */
            double scale = 0;
            for (size_t t = 0; t < cmp[c].n; t++)
                if (isfinite(cmp[c].y[t]))
                    scale = fmax(scale, fabs(cmp[c].y[t]));
            const double d = max_diff(cmp[c].x, cmp[c].y, cmp[c].n);
            CHECK(d <= tol * (1 + scale), "%s: %s differs by %.3g", what, cmp[c].name, d);
        }
        if (plain) {
            outputs rp = make_outputs(plain);
            CHECK(run_all(plain, in, &rp) == 0, "%s: plain", what);
            const double d = fmax(max_diff(rp.o, rb.o, nq), max_diff(rp.dq, rb.dq, nq));
            CHECK(d > 1e-3, "%s: the built-in problem is hardly the plain one (%.3g)", what, d);
            free_outputs(&rp);
        }
    }
    free_outputs(&ra);
    free_outputs(&rb);
}

static const expr_aux alibi_decl[] = {{"slopes", EXPR_FLOAT, 1}, {"slopes2", EXPR_FLOAT, 2}};

static void test_alibi(void) {
    ref_problem plain = base_problem(2, 4, 2, 37, 53, 19);
    plain.mask = REF_MASK_CAUSAL;
    plain.diag_offset = plain.seqlen_k - plain.seqlen_q;
    float slopes[4], slopes2[3 * 4], sinks[4] = {0.5f, -1.25f, 2.0f, 0.0f};
    for (int h = 0; h < 4; h++)
        slopes[h] = ldexpf(1.0f, -(h + 1)) * 1.5f;
    for (int t = 0; t < 12; t++)
        slopes2[t] = 0.0625f * (float)(t % 5 + 1);
    const ref_aux aux[2] = {{slopes, {4, 0, 0}, {1, 0, 0}}, {slopes2, {3, 4, 0}, {4, 1, 0}}};
    inputs in = make_inputs(&plain, 2.0f);

    ref_problem built = plain, expr = plain;
    built.alibi_slopes = slopes;
    if (parse_with("s - slopes[h] * abs(q + (seqlen_k - seqlen_q) - k)", EXPR_SCORE, alibi_decl, 2,
                   &tree_a) == 0) {
        expr.score_mod = &tree_a;
        expr.aux_decl = alibi_decl, expr.aux = aux, expr.aux_count = 2;
        expect_same("alibi", &expr, &built, &plain, &in, 1e-12);
        /* with sinks and dropout on both sides */
        ref_problem b2 = built, e2 = expr, p2 = plain;
        b2.sinks = e2.sinks = p2.sinks = sinks;
        b2.dropout_p = e2.dropout_p = p2.dropout_p = 0.17;
        b2.seed = e2.seed = p2.seed = 0x1234567887654321ull;
        b2.offset = e2.offset = p2.offset = 96;
        expect_same("alibi, sinks, dropout", &e2, &b2, &p2, &in, 1e-12);
        /* refused beside the built-in variants */
        ref_problem bad = expr;
        bad.alibi_slopes = slopes;
        outputs r = make_outputs(&plain);
        CHECK(ref_attention_fp64(&bad, in.q, in.k, in.v, r.o, r.lse) == -1, "score_mod + alibi");
        CHECK(ref_attention_backward_fp64(&bad, in.q, in.k, in.v, in.g, r.dq, r.dk, r.dv) == -1,
              "score_mod + alibi, backward");
        bad = expr;
        bad.softcap = 30.0;
        CHECK(ref_attention_fp64(&bad, in.q, in.k, in.v, r.o, r.lse) == -1, "score_mod + softcap");
        float *lo = xmalloc(q_elems(&plain) * sizeof(float));
        CHECK(ref_attention_lowp(&bad, 0, in.q, in.k, in.v, lo) == -1, "lowp score_mod + softcap");
        free(lo);
        free_outputs(&r);
    }
    /* per-batch slopes, a later sequence of a packed call, a block at positions */
    ref_problem pb = base_problem(1, 4, 2, 37, 53, 19);
    pb.mask = REF_MASK_WINDOW;
    pb.window_left = 20, pb.window_right = 9;
    pb.batch0 = 2, pb.position_q = 16, pb.position_k = 32;
    pb.diag_offset = pb.seqlen_k - pb.seqlen_q + pb.position_q - pb.position_k;
    ref_problem bb = pb, eb = pb;
    bb.alibi_slopes = slopes2, bb.alibi_stride_batch = 4;
    if (parse_with("s - slopes2[b, h] * abs(q + (seqlen_k - seqlen_q) - k)", EXPR_SCORE, alibi_decl,
                   2, &tree_b) == 0) {
        eb.score_mod = &tree_b;
        eb.aux_decl = alibi_decl, eb.aux = aux, eb.aux_count = 2;
        expect_same("alibi per batch at positions", &eb, &bb, &pb, &in, 1e-12);
    }
    free_inputs(&in);
}

static void test_softcap(void) {
    ref_problem plain = base_problem(2, 4, 2, 37, 53, 19);
    plain.scale = 3.0; /* scores of tens: the cap bends them */
    inputs in = make_inputs(&plain, 2.0f);
    ref_problem built = plain, expr = plain;
    built.softcap = 30.0;
    if (parse_with("30.0 * tanh(s / 30.0)", EXPR_SCORE, NULL, 0, &tree_a) == 0) {
        expr.score_mod = &tree_a;
        expect_same("softcap 30", &expr, &built, &plain, &in, 1e-12);
        built.mask = expr.mask = plain.mask = REF_MASK_CAUSAL;
        built.sinks = expr.sinks = plain.sinks = (const float[4]){1.0f, 3.0f, -2.0f, 0.5f};
        expect_same("softcap 30, causal top-left, sinks", &expr, &built, &plain, &in, 1e-12);
    }
    built = plain, expr = plain;
    built.softcap = 5.0;
    built.mask = expr.mask = REF_MASK_NONE;
    built.sinks = expr.sinks = NULL;
    if (parse_with("5.0 * tanh(s / 5.0)", EXPR_SCORE, NULL, 0, &tree_a) == 0) {
        expr.score_mod = &tree_a;
        expect_same("softcap 5", &expr, &built, NULL, &in, 1e-12);
    }
    free_inputs(&in);
}

static void test_mask_predicates(void) {
    static const struct {
        int sq, sk, mask, left, right, top_left;
        const char *pred;
        int64_t pq, pk; /* a block of a longer call: q and k count from these */
    } cases[] = {
        {37, 53, REF_MASK_CAUSAL, -1, 0, 0, "k <= q + (seqlen_k - seqlen_q)", 0, 0},
        {37, 53, REF_MASK_CAUSAL, -1, 0, 0, "k <= q + (seqlen_k - seqlen_q)", 16, 64},
        {37, 53, REF_MASK_WINDOW, 2, 6, 0, "abs(q + (seqlen_k - seqlen_q) + 2 - k) <= 4", 48, 32},
        {53, 37, REF_MASK_CAUSAL, -1, 0, 0, "k <= q + (seqlen_k - seqlen_q)", 0,
         0}, /* rows with no key */
        {37, 53, REF_MASK_CAUSAL, -1, 0, 1, "k <= q", 0, 0},
        {37, 53, REF_MASK_WINDOW, 7, 3, 0,
         "k >= q + (seqlen_k - seqlen_q) - 7 && k <= q + (seqlen_k - seqlen_q) + 3", 0, 0},
        {41, 29, REF_MASK_WINDOW, 5, -1, 0, "q + (seqlen_k - seqlen_q) - k <= 5", 0, 0},
        {37, 53, REF_MASK_WINDOW, 0, 0, 1, "q == k", 0, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ref_problem plain = base_problem(2, 4, 2, cases[c].sq, cases[c].sk, 19);
        plain.position_q = cases[c].pq, plain.position_k = cases[c].pk;
        inputs in = make_inputs(&plain, 1.0f);
        ref_problem built = plain, expr = plain;
        built.mask = cases[c].mask;
        built.window_left = cases[c].left, built.window_right = cases[c].right;
        built.diag_offset =
            cases[c].top_left ? 0 : cases[c].sk - cases[c].sq + cases[c].pq - cases[c].pk;
        expr.diag_offset = built.diag_offset; /* unused without a mask kind */
        if (parse_with(cases[c].pred, EXPR_MASK, NULL, 0, &tree_a) == 0) {
            expr.mask_mod = &tree_a;
            expect_same(cases[c].pred, &expr, &built, &plain, &in, 1e-12);
            /* visibility agrees key by key */
            int differ = 0;
            for (int64_t i = 0; i < cases[c].sq; i++)
                for (int64_t j = 0; j < cases[c].sk; j++)
                    differ += ref_visible(&expr, 3, i, j) != ref_visible(&built, 3, i, j) ||
                              ref_visible_in(&expr, 1, 3, i, j) != ref_visible(&built, 3, i, j);
            CHECK(differ == 0, "%s: %d keys' visibility differs", cases[c].pred, differ);
            /* as a -inf score on visible keys: hidden exactly as the mask hides */
            char text[256];
            snprintf(text, sizeof text, "where(%s, s, -1.5)", cases[c].pred);
            if (parse_with_inf(text, EXPR_SCORE, NULL, 0, &tree_b) == 0) {
                ref_problem as_score = plain;
                as_score.score_mod = &tree_b;
                expect_same(text, &as_score, &built, NULL, &in, 1e-12);
            }
        }
        /* a predicate beside a mask kind: both hide */
        ref_problem both = plain, window = plain;
        both.mask = REF_MASK_CAUSAL;
        both.diag_offset = cases[c].sk - cases[c].sq + cases[c].pq - cases[c].pk;
        window.mask = REF_MASK_WINDOW, window.diag_offset = both.diag_offset;
        window.window_left = 4, window.window_right = 0;
        if (parse_with("q + (seqlen_k - seqlen_q) - k <= 4", EXPR_MASK, NULL, 0, &tree_a) == 0) {
            both.mask_mod = &tree_a;
            expect_same("causal and a left window predicate", &both, &window, NULL, &in, 1e-12);
        }
        free_inputs(&in);
    }
    /* an invalid predicate: refused, and it hides every key from ref_visible */
    ref_problem p = base_problem(1, 2, 1, 5, 7, 3);
    if (parse_with("q - k", EXPR_SCORE, NULL, 0, &tree_a) == 0) {
        p.mask_mod = &tree_a; /* a score tree as a mask */
        float x[5 * 3 * 2 + 7 * 3 * 2];
        double o[5 * 3 * 2];
        memset(x, 0, sizeof x);
        CHECK(ref_attention_fp64(&p, x, x, x, o, NULL) == -1, "a score as a mask predicate");
        CHECK(!ref_visible(&p, 0, 3, 1), "ref_visible of an invalid predicate");
        p.mask_mod = NULL;
        p.score_mod = &tree_a;
        CHECK(ref_attention_fp64(&p, x, x, x, o, NULL) == 0, "an int score");
        p.aux_count = 1; /* declared, but no declarations */
        CHECK(ref_attention_fp64(&p, x, x, x, o, NULL) == -1, "aux_count without aux");
    }
}

/* doc[b, q] == doc[b, k] && k <= q with a score modifier equals every
 * document of every batch run as its own causal problem. */
static void test_documents(void) {
    enum { B = 2, HQ = 4, HKV = 2, S = 45, D = 19 };
    static const int lens[B][4] = {{13, 1, 20, 11}, {7, 29, 9, 0}};
    int32_t doc[B * S];
    for (int b = 0; b < B; b++)
        for (int d = 0, at = 0; d < 4; d++)
            for (int t = 0; t < lens[b][d]; t++)
                doc[b * S + at++] = 100 + d;
    static const expr_aux decl[] = {{"doc", EXPR_INT, 2}};
    const ref_aux aux[1] = {{doc, {B, S, 0}, {S, 1, 0}}};
    ref_problem full = base_problem(B, HQ, HKV, S, S, D);
    inputs in = make_inputs(&full, 1.5f);
    if (parse_with("doc[b, q] == doc[b, k] && k <= q", EXPR_MASK, decl, 1, &tree_a) != 0 ||
        parse_with("s - 0.125 * abs(q - k) + 0.25 * tanh(s)", EXPR_SCORE, decl, 1, &tree_b) != 0) {
        free_inputs(&in);
        return;
    }
    full.mask_mod = &tree_a, full.score_mod = &tree_b;
    full.aux_decl = decl, full.aux = aux, full.aux_count = 1;
    outputs rf = make_outputs(&full);
    CHECK(run_all(&full, &in, &rf) == 0, "documents");
    double worst = 0;
    int segments = 0;
    for (int b = 0; b < B; b++) {
        for (int d = 0, st = 0; d < 4; st += lens[b][d], d++) {
            const int n = lens[b][d];
            if (!n)
                continue;
            ref_problem one = base_problem(1, HQ, HKV, n, n, D);
            one.mask = REF_MASK_CAUSAL;
            one.score_mod = &tree_b;
            one.aux_decl = decl, one.aux = aux, one.aux_count = 1;
            inputs sub;
            sub.q = xmalloc((size_t)HQ * n * D * sizeof(float));
            sub.g = xmalloc((size_t)HQ * n * D * sizeof(float));
            sub.k = xmalloc((size_t)HKV * n * D * sizeof(float));
            sub.v = xmalloc((size_t)HKV * n * D * sizeof(float));
            for (int h = 0; h < HQ; h++) {
                const size_t from = (((size_t)b * HQ + h) * S + st) * D, to = (size_t)h * n * D;
                memcpy(sub.q + to, in.q + from, (size_t)n * D * sizeof(float));
                memcpy(sub.g + to, in.g + from, (size_t)n * D * sizeof(float));
            }
            for (int h = 0; h < HKV; h++) {
                const size_t from = (((size_t)b * HKV + h) * S + st) * D, to = (size_t)h * n * D;
                memcpy(sub.k + to, in.k + from, (size_t)n * D * sizeof(float));
                memcpy(sub.v + to, in.v + from, (size_t)n * D * sizeof(float));
            }
            outputs ro = make_outputs(&one);
            CHECK(run_all(&one, &sub, &ro) == 0, "document %d of batch %d", d, b);
            for (int h = 0; h < HQ; h++) {
                const size_t from = (((size_t)b * HQ + h) * S + st), to = (size_t)h * n;
                worst = fmax(worst, max_diff(rf.o + from * D, ro.o + to * D, (size_t)n * D));
                worst = fmax(worst, max_diff(rf.dq + from * D, ro.dq + to * D, (size_t)n * D));
                worst = fmax(worst, max_diff(rf.lse + from, ro.lse + to, (size_t)n));
            }
            for (int h = 0; h < HKV; h++) {
                const size_t from = (((size_t)b * HKV + h) * S + st) * D, to = (size_t)h * n * D;
                worst = fmax(worst, max_diff(rf.dk + from, ro.dk + to, (size_t)n * D));
                worst = fmax(worst, max_diff(rf.dv + from, ro.dv + to, (size_t)n * D));
            }
            segments++;
            free_outputs(&ro);
            free_inputs(&sub);
        }
    }
    CHECK(segments == 7, "documents run: %d", segments);
    CHECK(worst <= 1e-12, "documents vs each alone: %.3g", worst);
    /* ref_visible_in reads b: key 13 is in query 14's document in batch 1 only */
    CHECK(!ref_visible_in(&full, 0, 0, 14, 13) && ref_visible_in(&full, 1, 0, 14, 13),
          "ref_visible_in's batch");
    free_outputs(&rf);
    free_inputs(&in);
}

/* The low-precision twins: an expression's error against its fp64 is the
 * built-in variant's error against its own, and a lowp problem ignoring the
 * expression would be far off. */
static void test_lowp(void) {
    ref_problem plain = base_problem(2, 4, 2, 37, 53, 19);
    plain.mask = REF_MASK_CAUSAL;
    plain.diag_offset = 16;
    plain.scale = 2.0;
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const ref_aux aux[2] = {{slopes, {4, 0, 0}, {1, 0, 0}}, {slopes, {1, 4, 0}, {4, 1, 0}}};
    inputs in = make_inputs(&plain, 1.0f);
    const size_t nq = q_elems(&plain), nkv = kv_elems(&plain);
    float *o = xmalloc(nq * sizeof(float)), *dq = xmalloc(nq * sizeof(float));
    float *dk = xmalloc(nkv * sizeof(float)), *dv = xmalloc(nkv * sizeof(float));
    float *o2 = xmalloc(nq * sizeof(float)), *dq2 = xmalloc(nq * sizeof(float));
    float *dk2 = xmalloc(nkv * sizeof(float)), *dv2 = xmalloc(nkv * sizeof(float));
    outputs r = make_outputs(&plain);
    static const struct {
        const char *text;
        double cap;
        int alibi;
    } cases[] = {
        {"20.0 * tanh(s / 20.0)", 20.0, 0},
        {"s - slopes[h] * abs(q + (seqlen_k - seqlen_q) - k)", 0.0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (parse_with(cases[c].text, EXPR_SCORE, alibi_decl, 2, &tree_a) != 0)
            continue;
        ref_problem expr = plain, built = plain;
        expr.score_mod = &tree_a;
        expr.aux_decl = alibi_decl, expr.aux = aux, expr.aux_count = 2;
        built.softcap = cases[c].cap;
        built.alibi_slopes = cases[c].alibi ? slopes : NULL;
        CHECK(run_all(&expr, &in, &r) == 0, "%s fp64", cases[c].text);
        for (int dtype = 0; dtype < 2; dtype++) {
            const double tol = dtype == 0 ? 4e-3 : 3e-2;
            CHECK(ref_attention_lowp(&expr, dtype, in.q, in.k, in.v, o) == 0 &&
                      ref_attention_backward_lowp(&expr, dtype, in.q, in.k, in.v, in.g, dq, dk,
                                                  dv) == 0 &&
                      ref_attention_lowp(&built, dtype, in.q, in.k, in.v, o2) == 0 &&
                      ref_attention_backward_lowp(&built, dtype, in.q, in.k, in.v, in.g, dq2, dk2,
                                                  dv2) == 0,
                  "%s lowp", cases[c].text);
            const double eo = ref_rel_error_f(o, r.o, nq), edq = ref_rel_error_f(dq, r.dq, nq);
            const double edk = ref_rel_error_f(dk, r.dk, nkv), edv = ref_rel_error_f(dv, r.dv, nkv);
            CHECK(eo < tol && edq < tol && edk < tol && edv < tol,
                  "%s dtype %d vs fp64: o %.3g dq %.3g dk %.3g dv %.3g", cases[c].text, dtype, eo,
                  edq, edk, edv);
            /* the built-in lowp against the same fp64: errors of one size */
            const double bo = ref_rel_error_f(o2, r.o, nq), bdq = ref_rel_error_f(dq2, r.dq, nq);
            CHECK(eo < 2 * bo + 1e-4 && edq < 2 * bdq + 1e-4,
                  "%s dtype %d: o %.3g (built in %.3g), dq %.3g (built in %.3g)", cases[c].text,
                  dtype, eo, bo, edq, bdq);
            printf("lowp %s, dtype %d vs fp64: o %.3g dq %.3g dk %.3g dv %.3g (built in: o %.3g dq "
                   "%.3g)\n",
                   cases[c].text, dtype, eo, edq, edk, edv, bo, bdq);
        }
    }
    /* the plain lowp is far from the expressions' fp64: the test can tell */
    CHECK(ref_attention_lowp(&plain, 0, in.q, in.k, in.v, o) == 0 &&
              ref_rel_error_f(o, r.o, nq) > 0.05,
          "plain lowp vs the alibi expression: %.3g", ref_rel_error_f(o, r.o, nq));
    /* a mask predicate in lowp: the built-in mask's result up to fp32 summation order */
    ref_problem pred = plain, built = plain;
    pred.mask = REF_MASK_NONE;
    if (parse_with("k <= q + (seqlen_k - seqlen_q)", EXPR_MASK, NULL, 0, &tree_b) == 0) {
        pred.mask_mod = &tree_b;
        CHECK(ref_attention_lowp(&pred, 0, in.q, in.k, in.v, o) == 0 &&
                  ref_attention_lowp(&built, 0, in.q, in.k, in.v, o2) == 0,
              "lowp predicate");
        CHECK(ref_attention_backward_lowp(&pred, 0, in.q, in.k, in.v, in.g, dq, dk, dv) == 0 &&
                  ref_attention_backward_lowp(&built, 0, in.q, in.k, in.v, in.g, dq2, dk2, dv2) ==
                      0,
              "lowp predicate backward");
        double *od = xmalloc(nq * sizeof(double)), *dqd = xmalloc(nq * sizeof(double));
        for (size_t t = 0; t < nq; t++)
            od[t] = o2[t], dqd[t] = dq2[t];
        CHECK(ref_rel_error_f(o, od, nq) < 2e-3 && ref_rel_error_f(dq, dqd, nq) < 4e-3,
              "lowp predicate vs causal: o %.3g dq %.3g", ref_rel_error_f(o, od, nq),
              ref_rel_error_f(dq, dqd, nq));
        free(od);
        free(dqd);
    }
    free_outputs(&r);
    free(o), free(dq), free(dk), free(dv), free(o2), free(dq2), free(dk2), free(dv2);
    free_inputs(&in);
}

/* ---- (d) gradients against finite differences ---------------------------------- */

/* L = Σ dO∘O from the fp64 forward */
static double loss(const ref_problem *p, const inputs *in, double *o) {
    if (ref_attention_fp64(p, in->q, in->k, in->v, o, NULL) != 0)
        return NAN;
    double l = 0;
    for (size_t t = 0; t < q_elems(p); t++)
        l += (double)in->g[t] * o[t];
    return l;
}

/* As test_reference_backward: values on a 2^-10 grid, h = 2^-10 (x ± 2h
 * exact), the fourth-order central stencil; its error is ~1e-11 where a
 * wrong gradient is off by percents. */
#define FD_H 0x1p-10
#define FD_TOL 1e-8

static double fd_worst;

/* Every stride-th element of x (n long) against grad; returns the misses. */
static int fd_check(const ref_problem *p, const inputs *in, float *x, size_t n, size_t stride,
                    const double *grad, double *o) {
    static const double steps[4] = {1, -1, 2, -2};
    int bad = 0;
    for (size_t t = 0; t < n; t += stride) {
        const float x0 = x[t];
        double f[4];
        for (int s = 0; s < 4; s++) {
            x[t] = (float)((double)x0 + steps[s] * FD_H);
            if ((double)x[t] != (double)x0 + steps[s] * FD_H)
                bad++;
            f[s] = loss(p, in, o);
        }
        x[t] = x0;
        const double fd = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * FD_H);
        const double err = fabs(fd - grad[t]);
        if (!(err <= FD_TOL * (1 + fabs(grad[t]))))
            bad++;
        if (!(err <= fd_worst))
            fd_worst = err;
    }
    return bad;
}

/* an additive relative bias, wider than the causal mask reads and narrower
 * than its far end (reads past it give 0 and no gradient) */
static void test_grad_relative_bias(void) {
    ref_problem p = base_problem(2, 4, 2, 37, 53, 24);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = p.seqlen_k - p.seqlen_q;
    const int W = 37 + 53 - 1 - 10;
    static const expr_aux decl[] = {{"rel", EXPR_FLOAT, 2}};
    float *rel = grid_tensor((size_t)4 * W, 10, 2);
    const ref_aux aux[1] = {{rel, {4, W, 0}, {W, 1, 0}}};
    if (parse_with("s + rel[h, q - k + seqlen_k - 1]", EXPR_SCORE, decl, 1, &tree_a) != 0) {
        free(rel);
        return;
    }
    p.score_mod = &tree_a;
    p.aux_decl = decl, p.aux = aux, p.aux_count = 1;
    inputs in = make_inputs(&p, 1.0f);
    double *o = xmalloc(q_elems(&p) * sizeof(double)), *g = xmalloc((size_t)4 * W * sizeof(double));
    double *const d_aux[1] = {g};
    CHECK(ref_aux_backward_fp64(&p, in.q, in.k, in.v, in.g, d_aux) == 0, "relative bias backward");
    int bad = fd_check(&p, &in, rel, (size_t)4 * W, 4, g, o);
    CHECK(bad == 0, "relative bias: %d elements off the differences", bad);
    /* the elements that no visible key reads get nothing; the ones read do */
    int unread = 0, read = 0;
    for (int h = 0; h < 4; h++)
        for (int c = 0; c < W; c++) {
            unread += c < 52 - 16 && g[h * W + c] != 0.0;
            read += c >= 52 - 16 && fabs(g[h * W + c]) > 1e-6;
        }
    CHECK(unread == 0 && read > 4 * (W - 36) / 2, "gradient where read: %d unread, %d read", unread,
          read);
    CHECK(ref_aux_backward_fp64(&p, in.q, in.k, in.v, in.g, NULL) == -1, "NULL d_aux");
    free(o);
    free(g);
    free(rel);
    free_inputs(&in);
}

/* a multiplicative gain gathered through an int tensor and read twice, with
 * dropout, sinks and a mask predicate; the int tensor gets no gradient */
static void test_grad_gain(void) {
    ref_problem p = base_problem(2, 4, 2, 37, 53, 24);
    static const expr_aux decl[] = {{"gain", EXPR_FLOAT, 2}, {"idx", EXPR_INT, 1}};
    float *gain = grid_tensor(2 * 7, 10, 2);
    const int32_t idx[9] = {0, 3, 6, 2, 8, 1, 5, 4, -3}; /* 8 and -3 read outside */
    const ref_aux aux[2] = {{gain, {2, 7, 0}, {7, 1, 0}}, {idx, {9, 0, 0}, {1, 0, 0}}};
    float sinks[4];
    for (int h = 0; h < 4; h++)
        sinks[h] = ldexpf((float)(h * 3 - 4), -2);
    if (parse_with("s * gain[b, idx[k % 9]] + 0.25 * gain[b, (q + k) % 5]", EXPR_SCORE, decl, 2,
                   &tree_a) != 0 ||
        parse_with("k <= q + 20", EXPR_MASK, decl, 2, &tree_b) != 0) {
        free(gain);
        return;
    }
    p.score_mod = &tree_a, p.mask_mod = &tree_b;
    p.aux_decl = decl, p.aux = aux, p.aux_count = 2;
    p.dropout_p = 0.2, p.seed = 77, p.offset = 5;
    p.sinks = sinks;
    inputs in = make_inputs(&p, 1.0f);
    double *o = xmalloc(q_elems(&p) * sizeof(double)), g[14], untouched[9];
    for (int t = 0; t < 9; t++)
        untouched[t] = 42.0;
    double *const d_aux[2] = {g, untouched};
    CHECK(ref_aux_backward_fp64(&p, in.q, in.k, in.v, in.g, d_aux) == 0, "gain backward");
    int bad = fd_check(&p, &in, gain, 14, 1, g, o);
    CHECK(bad == 0, "gain: %d elements off the differences", bad);
    CHECK(max_abs(g, 14) > 1e-3, "gain gradient %g", max_abs(g, 14));
    int kept = 1;
    for (int t = 0; t < 9; t++)
        kept &= untouched[t] == 42.0;
    CHECK(kept, "the int tensor's buffer is left alone");
    /* the sinks' gradient with a score modifier */
    double ds[4];
    CHECK(ref_sinks_backward_fp64(&p, in.q, in.k, in.v, in.g, ds) == 0, "sinks backward");
    ref_problem ps = p;
    float sk[4];
    memcpy(sk, sinks, sizeof sk);
    ps.sinks = sk;
    static const double steps[4] = {1, -1, 2, -2};
    for (int h = 0; h < 4; h++) {
        double f[4];
        for (int s = 0; s < 4; s++) {
            sk[h] = (float)(sinks[h] + steps[s] * FD_H);
            f[s] = loss(&ps, &in, o);
        }
        sk[h] = sinks[h];
        const double fd = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * FD_H);
        CHECK(fabs(fd - ds[h]) <= FD_TOL * (1 + fabs(ds[h])), "d_sinks[%d] %.12g vs %.12g", h,
              ds[h], fd);
    }
    free(o);
    free(gain);
    free_inputs(&in);
}

/* ∂t/∂s through the backward: dq and dk against differences in q and k */
static void test_grad_qk(void) {
    ref_problem p = base_problem(2, 4, 2, 37, 53, 24);
    p.scale = 0.5;
    static const expr_aux decl[] = {{"rel", EXPR_FLOAT, 2}};
    float *rel = grid_tensor(4 * 89, 10, 1);
    const ref_aux aux[1] = {{rel, {4, 89, 0}, {89, 1, 0}}};
    if (parse_with("where(q > k, 0.5 * s * s + s, exp(s) - 1.0) + rel[h, q - k + seqlen_k - 1]"
                   " - 0.25 * sqrt(s * s + 1.0) + 2.0 * tanh(s / 2.0)",
                   EXPR_SCORE, decl, 1, &tree_a) != 0) {
        free(rel);
        return;
    }
    p.score_mod = &tree_a;
    p.aux_decl = decl, p.aux = aux, p.aux_count = 1;
    if (parse_with("q - k < 30", EXPR_MASK, decl, 1, &tree_b) == 0)
        p.mask_mod = &tree_b;
    inputs in = make_inputs(&p, 1.0f);
    const size_t nq = q_elems(&p), nkv = kv_elems(&p);
    double *o = xmalloc(nq * sizeof(double)), *dq = xmalloc(nq * sizeof(double));
    double *dk = xmalloc(nkv * sizeof(double)), *dv = xmalloc(nkv * sizeof(double));
    CHECK(ref_attention_backward_fp64(&p, in.q, in.k, in.v, in.g, dq, dk, dv) == 0, "backward");
    int bad = fd_check(&p, &in, in.q, nq, 89, dq, o);
    CHECK(bad == 0, "dq: %d elements off the differences", bad);
    bad = fd_check(&p, &in, in.k, nkv, 97, dk, o);
    CHECK(bad == 0, "dk: %d elements off the differences", bad);
    /* without dt/ds (the plain derivative) dq would be wrong: the test can tell */
    ref_problem lin = p;
    if (parse_with("s + rel[h, q - k + seqlen_k - 1]", EXPR_SCORE, decl, 1, &tree_c) == 0) {
        lin.score_mod = &tree_c;
        double *dq2 = xmalloc(nq * sizeof(double));
        CHECK(ref_attention_backward_fp64(&lin, in.q, in.k, in.v, in.g, dq2, NULL, NULL) == 0,
              "linear backward");
        CHECK(max_diff(dq, dq2, nq) > 1e-2, "dt/ds matters: %.3g", max_diff(dq, dq2, nq));
        free(dq2);
    }
    free(o), free(dq), free(dk), free(dv);
    free(rel);
    free_inputs(&in);
}

int main(void) {
    test_values();
    test_eval_ok();
    test_dual();
    test_conventions();
    test_alibi();
    test_softcap();
    test_mask_predicates();
    test_documents();
    test_lowp();
    test_grad_relative_bias();
    test_grad_gain();
    test_grad_qk();
    printf("finite differences of L: worst error %.3g\n", fd_worst);
    return check_summary("test_expr_eval");
}
