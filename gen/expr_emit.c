#include "gen/expr_emit.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a score's reads of float tensors that get a gradient each: every one adds
 * a derivative tree to the backward's source */
#define MAX_GRAD_READS 16

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} text;

static void emit(text *t, const char *fmt, ...) {
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        /* (no arithmetic on the first call's NULL buffer) */
        int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if (t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->failed = 1;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

static const char *const var_c[] = {"s", "b", "h", "q", "k", "seqlen_q", "seqlen_k"};

/* A float literal that reads back as the same float32: %.9g, with a '.' or
 * an exponent so that it is not an int, in the C locale. */
static void float_literal(double v, char *out, size_t len) {
    if (isinf(v)) {
        snprintf(out, len, "%s__int_as_float(0x7f800000)", v < 0 ? "-" : "");
        return;
    }
    expr_print_float(v, out, len);
    if (!strpbrk(out, ".en")) strncat(out, ".", len - strlen(out) - 1);
    strncat(out, "f", len - strlen(out) - 1);
}

/* node i's value as a C expression of its children's names (prefix + index) */
static void node_code(text *o, const expr_tree *t, int i, const char *px) {
    const expr_node *n = &t->nodes[i];
    const int a = n->child[0], b = n->child[1], c = n->child[2];
    const int fl = n->type == EXPR_FLOAT;
    /* children as floats where the result is float (an int child converts) */
#define F(x) (t->nodes[x].type == EXPR_INT ? "(float)" : ""), px, (x)
    static const char *const bin[] = {[EXPR_ADD] = "+", [EXPR_SUB] = "-", [EXPR_MUL] = "*",
                                      [EXPR_EQ] = "==", [EXPR_NE] = "!=", [EXPR_LT] = "<",
                                      [EXPR_LE] = "<=", [EXPR_GT] = ">", [EXPR_GE] = ">=",
                                      [EXPR_AND] = "&&", [EXPR_OR] = "||"};
    switch (n->op) {
    case EXPR_NUMBER:
        if (n->type == EXPR_INT) {
            emit(o, "%lld", (long long)n->ival);
        } else {
            char num[64];
            float_literal(n->fval, num, sizeof num);
            emit(o, "%s", num);
        }
        return;
    case EXPR_VAR: emit(o, "%s", var_c[n->var]); return;
    case EXPR_AUX_READ:
        emit(o, "fg_aux_read<%s>(p, %d, %d, %s%d, ", n->type == EXPR_FLOAT ? "float" : "int", n->aux,
             n->nchild, px, a);
        if (n->nchild > 1) emit(o, "%s%d, ", px, b); else emit(o, "0, ");
        if (n->nchild > 2) emit(o, "%s%d)", px, c); else emit(o, "0)");
        return;
    case EXPR_NEG:
        if (fl) emit(o, "-%s%d", px, a);
        else emit(o, "(int)(0u - (unsigned)%s%d)", px, a);
        return;
    case EXPR_NOT: emit(o, "!%s%d", px, a); return;
    case EXPR_ADD:
    case EXPR_SUB:
    case EXPR_MUL:
        if (fl) emit(o, "%s%s%d %s %s%s%d", F(a), bin[n->op], F(b));
        else emit(o, "(int)((unsigned)%s%d %s (unsigned)%s%d)", px, a, bin[n->op], px, b);
        return;
    case EXPR_DIV: emit(o, "(float)%s%d / (float)%s%d", px, a, px, b); return;
    case EXPR_MOD: emit(o, "fg_imod(%s%d, %s%d)", px, a, px, b); return;
    case EXPR_EQ:
    case EXPR_NE:
    case EXPR_LT:
    case EXPR_LE:
    case EXPR_GT:
    case EXPR_GE: {
        const int ints = t->nodes[a].type == EXPR_INT && t->nodes[b].type == EXPR_INT;
        if (ints) emit(o, "%s%d %s %s%d", px, a, bin[n->op], px, b);
        else emit(o, "%s%s%d %s %s%s%d", F(a), bin[n->op], F(b));
        return;
    }
    case EXPR_AND:
    case EXPR_OR: emit(o, "%s%d %s %s%d", px, a, bin[n->op], px, b); return;
    case EXPR_WHERE:
        if (fl) emit(o, "%s%d ? %s%s%d : %s%s%d", px, a, F(b), F(c));
        else emit(o, "%s%d ? %s%d : %s%d", px, a, px, b, px, c);
        return;
    case EXPR_CALL:
        switch (n->fn) {
        case EXPR_FN_EXP: emit(o, "expf(%s%s%d)", F(a)); return;
        case EXPR_FN_LOG: emit(o, "logf(%s%s%d)", F(a)); return;
        case EXPR_FN_TANH: emit(o, "tanhf(%s%s%d)", F(a)); return;
        case EXPR_FN_SQRT: emit(o, "sqrtf(%s%s%d)", F(a)); return;
        case EXPR_FN_FLOOR: emit(o, "floorf(%s%s%d)", F(a)); return;
        case EXPR_FN_ABS:
            if (fl) emit(o, "fabsf(%s%d)", px, a);
            else emit(o, "(int)(%s%d < 0 ? 0u - (unsigned)%s%d : (unsigned)%s%d)", px, a, px, a, px, a);
            return;
        case EXPR_FN_FLOORDIV: emit(o, "fg_ifloordiv(%s%d, %s%d)", px, a, px, b); return;
        case EXPR_FN_INT:
            if (t->nodes[a].type == EXPR_INT) emit(o, "%s%d", px, a);
            else emit(o, "fg_ftoi(%s%d)", px, a);
            return;
        case EXPR_FN_MIN:
        case EXPR_FN_MAX: {
            /* ties take the first argument, as the derivative does; a NaN
             * the other (fminf, fmaxf) */
            const char *cmp = n->fn == EXPR_FN_MIN ? "<=" : ">=";
            if (fl) emit(o, "(%s%s%d %s %s%s%d || %s%d != %s%d) ? %s%s%d : %s%s%d", F(a), cmp, F(b),
                         px, b, px, b, F(a), F(b));
            else emit(o, "%s%d %s %s%d ? %s%d : %s%d", px, a, cmp, px, b, px, a, px, b);
            return;
        }
        }
        break;
    }
#undef F
    o->failed = 1;
}

static const char *c_type(expr_type type) {
    return type == EXPR_INT ? "int" : type == EXPR_FLOAT ? "float" : "bool";
}

/* One `const T <px>i = ...;` line per node that the root uses, in index
 * order (children first). */
static void marked_lines(text *o, const expr_tree *t, const char *px, const char *indent,
                         const unsigned char *mark) {
    for (int i = 0; i < t->count; i++) {
        if (!mark[i]) continue;
        emit(o, "%sconst %s %s%d = ", indent, c_type(t->nodes[i].type), px, i);
        node_code(o, t, i, px);
        emit(o, ";\n");
    }
}

static void node_lines(text *o, const expr_tree *t, const char *px, const char *indent) {
    unsigned char mark[EXPR_MAX_NODES];
    expr_mark_reachable(t, mark);
    marked_lines(o, t, px, indent, mark);
}

/* `return` of the root, as float (an int score converts) */
static void float_return(text *o, const expr_tree *t, const char *px) {
    emit(o, "  return %s%s%d;\n}\n", t->nodes[t->root].type == EXPR_INT ? "(float)" : "", px, t->root);
}

#define SCORE_ARGS "const P& p, float s, int b, int h, int q, int k, int seqlen_q, int seqlen_k"
#define HEAD "template <class P>\n__device__ __forceinline__ "

/* The split of an expression for a tile, where each thread holds a few rows,
 * keys and diagonals: its costly subtrees of q alone (or of neither) are
 * computed once per row, those of k alone once per key, those of q - k
 * alone once per diagonal, and the rest per element from them. */
enum { SIDE_ELEM = 1, SIDE_ROW, SIDE_KEY, SIDE_DIAG };
static const char *const side_name[] = {[SIDE_ROW] = "row", [SIDE_KEY] = "key", [SIDE_DIAG] = "diag"};

/* side[i] for each node the root reaches: from the root down, the first
 * node on each path that reads a tensor or calls exp, log, tanh or sqrt and
 * needs one side's indices only goes to that side (cheap arithmetic stays
 * per element, where it costs no register per slot). */
static void split_sides(const expr_tree *t, unsigned char side[EXPR_MAX_NODES]) {
    unsigned char uses[EXPR_MAX_NODES], costly[EXPR_MAX_NODES];
    expr_index_uses(t, uses);
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        costly[i] = n->op == EXPR_AUX_READ ||
                    (n->op == EXPR_CALL && (n->fn == EXPR_FN_EXP || n->fn == EXPR_FN_LOG ||
                                            n->fn == EXPR_FN_TANH || n->fn == EXPR_FN_SQRT));
        for (int c = 0; c < n->nchild; c++) costly[i] |= costly[n->child[c]];
    }
    memset(side, 0, EXPR_MAX_NODES);
    side[t->root] = SIDE_ELEM;
    for (int i = t->count - 1; i >= 0; i--) {
        if (side[i] != SIDE_ELEM) continue;
        const unsigned u = uses[i];
        if (costly[i] && !(u & EXPR_USES_S)) {
            if (!(u & (EXPR_USES_K | EXPR_USES_D))) side[i] = SIDE_ROW;
            else if (u == EXPR_USES_K) side[i] = SIDE_KEY;
            else if (u == EXPR_USES_D) side[i] = SIDE_DIAG;
            if (side[i] != SIDE_ELEM) continue;
        }
        for (int c = 0; c < t->nodes[i].nchild; c++) side[t->nodes[i].child[c]] = SIDE_ELEM;
    }
}

/* One side's struct fg_<what>_<side> of its nodes and the function
 * fg_<what>_mod_<side> that computes them; args: its index arguments. */
static void emit_side(text *o, const expr_tree *t, const unsigned char *side, int which,
                      const char *what, const char *args, const char *voids) {
    const char *name = side_name[which];
    unsigned char mark[EXPR_MAX_NODES];
    emit(o, "struct fg_%s_%s {", what, name);
    for (int i = 0; i < t->count; i++) {
        mark[i] = side[i] == which;
        if (mark[i]) emit(o, " %s e%d;", c_type(t->nodes[i].type), i);
    }
    emit(o, " };\n" HEAD "fg_%s_%s fg_%s_mod_%s(const P& p, int b, int h, %s, int seqlen_q, int seqlen_k) {\n"
            "  (void)p; (void)b; (void)h; %s (void)seqlen_q; (void)seqlen_k;\n",
         what, name, what, name, args, voids);
    expr_mark_used(t, mark);
    marked_lines(o, t, "e", "  ", mark);
    emit(o, "  return fg_%s_%s{", what, name);
    const char *sep = "";
    for (int i = 0; i < t->count; i++)
        if (side[i] == which) {
            emit(o, "%se%d", sep, i);
            sep = ", ";
        }
    emit(o, "};\n}\n");
}

/* The split of t: the three sides and fg_<what>_mod_at, the value from
 * them (s among its arguments for a score). */
static void emit_split(text *o, const expr_tree *t, const char *what) {
    unsigned char side[EXPR_MAX_NODES];
    split_sides(t, side);
    const int score = t->kind == EXPR_SCORE;
    emit(o, "// the same split: its costly terms of q alone once per row, of k alone once per key,\n"
            "// of q - k alone once per diagonal (the diagonal's function reads q - k only)\n");
    emit_side(o, t, side, SIDE_ROW, what, "int q", "(void)q;");
    emit_side(o, t, side, SIDE_KEY, what, "int k", "(void)k;");
    emit_side(o, t, side, SIDE_DIAG, what, "int q, int k", "(void)q; (void)k;");
    emit(o, HEAD "%s fg_%s_mod_at(const P& p, %sint b, int h, int q, int k, int seqlen_q, int seqlen_k, "
            "const fg_%s_row& row, const fg_%s_key& key, const fg_%s_diag& diag) {\n"
            "  (void)p; (void)b; (void)h; (void)q; (void)k; (void)seqlen_q; (void)seqlen_k; (void)row; "
            "(void)key; (void)diag;%s\n",
         score ? "float" : "bool", what, score ? "float s, " : "", what, what, what, score ? " (void)s;" : "");
    for (int i = 0; i < t->count; i++) {
        if (!side[i]) continue;
        emit(o, "  const %s e%d = ", c_type(t->nodes[i].type), i);
        if (side[i] == SIDE_ELEM) node_code(o, t, i, "e");
        else emit(o, "%s.e%d", side_name[side[i]], i);
        emit(o, ";\n");
    }
    if (score) float_return(o, t, "e");
    else emit(o, "  return e%d;\n}\n", t->root);
}

static int emit_score(text *o, const expr_tree *t, const expr_aux *aux, expr_tree *work,
                      expr_source *out, char *err, size_t err_len) {
    expr_tree *d = work;
    char canonical[EXPR_CANONICAL_MAX];
    if (expr_canonical(t, aux, canonical, sizeof canonical) != 0) {
        snprintf(err, err_len, "score_mod: the tree is malformed");
        return -1;
    }
    emit(o, "// score modifier: t = %s\n" HEAD "float fg_score_mod(" SCORE_ARGS ") {\n"
            "  (void)p; (void)s; (void)b; (void)h; (void)q; (void)k; (void)seqlen_q; (void)seqlen_k;\n",
         canonical);
    node_lines(o, t, "e", "  ");
    float_return(o, t, "e");
    emit_split(o, t, "score");

    if (expr_derivative(t, d, err, err_len) != 0) return -1;
    emit(o, "// its derivative in s\n" HEAD "float fg_score_mod_ds(" SCORE_ARGS ") {\n"
            "  (void)p; (void)s; (void)b; (void)h; (void)q; (void)k; (void)seqlen_q; (void)seqlen_k;\n");
    node_lines(o, d, "e", "  ");
    float_return(o, d, "e");

    unsigned char mark[EXPR_MAX_NODES];
    expr_mark_reachable(t, mark);
    int reads = 0;
    for (int i = 0; i < t->count; i++)
        reads += mark[i] && t->nodes[i].op == EXPR_AUX_READ && t->nodes[i].type == EXPR_FLOAT;
    if (reads == 0) return 0;
    if (reads > MAX_GRAD_READS) {
        snprintf(err, err_len, "score_mod: %d reads of float tensors; at most %d get gradients",
                 reads, MAX_GRAD_READS);
        return -1;
    }
    out->aux_grad = 1;
    emit(o, "// the float tensors' gradients: dt·∂t/∂read at each read's indices\n" HEAD
            "void fg_score_mod_grad(float dt, " SCORE_ARGS ") {\n");
    /* the reads' indices from the value's nodes; each read's derivative its factor */
    unsigned char index_nodes[EXPR_MAX_NODES] = {0};
    for (int i = 0; i < t->count; i++)
        if (mark[i] && t->nodes[i].op == EXPR_AUX_READ && t->nodes[i].type == EXPR_FLOAT)
            for (int c = 0; c < t->nodes[i].nchild; c++) index_nodes[t->nodes[i].child[c]] = 1;
    expr_mark_used(t, index_nodes);
    marked_lines(o, t, "e", "  ", index_nodes);
    int g = 0;
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        if (!mark[i] || n->op != EXPR_AUX_READ || n->type != EXPR_FLOAT) continue;
        if (expr_derivative_of(t, i, d, err, err_len) != 0) return -1;
        char px[16];
        snprintf(px, sizeof px, "g%d_", g++);
        emit(o, "  if (p.d_aux[%d]) {\n", n->aux);
        node_lines(o, d, px, "    ");
        emit(o, "    fg_aux_add(p, %d, %d, e%d, %s%d, %s%d, dt * %s%s%d);\n  }\n", n->aux, n->nchild,
             n->child[0], n->nchild > 1 ? "e" : "", n->nchild > 1 ? n->child[1] : 0,
             n->nchild > 2 ? "e" : "", n->nchild > 2 ? n->child[2] : 0,
             d->nodes[d->root].type == EXPR_INT ? "(float)" : "", px, d->root);
    }
    emit(o, "  (void)s; (void)b; (void)h; (void)q; (void)k; (void)seqlen_q; (void)seqlen_k;\n}\n");
    return 0;
}

static int emit_mask(text *o, const expr_tree *t, const expr_aux *aux, char *err, size_t err_len) {
    char canonical[EXPR_CANONICAL_MAX];
    if (expr_canonical(t, aux, canonical, sizeof canonical) != 0) {
        snprintf(err, err_len, "mask_mod: the tree is malformed");
        return -1;
    }
    emit(o, "// mask predicate: key k visible to query q iff %s\n" HEAD
            "bool fg_mask_mod(const P& p, int b, int h, int q, int k, int seqlen_q, int seqlen_k) {\n"
            "  (void)p; (void)b; (void)h; (void)q; (void)k; (void)seqlen_q; (void)seqlen_k;\n",
         canonical);
    node_lines(o, t, "e", "  ");
    emit(o, "  return e%d;\n}\n", t->root);
    emit_split(o, t, "mask");
    return 0;
}

int expr_emit(const expr_tree *score, const expr_tree *mask, const expr_aux *aux,
              expr_source *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!score && !mask) return 0;
    text o = {NULL, 0, 0, 0};
    int rc = 0;
    if (score) {
        expr_tree *work = malloc(sizeof *work); /* a derivative's tree: large for the stack */
        out->score_mod = 1;
        rc = work ? emit_score(&o, score, aux, work, out, err, err_len) : -1;
        if (!work) snprintf(err, err_len, "expressions: out of memory");
        free(work);
    }
    if (rc == 0 && mask) {
        out->mask_mod = 1;
        rc = emit_mask(&o, mask, aux, err, err_len);
    }
    if (rc == 0 && o.failed) {
        snprintf(err, err_len, "expressions: out of memory, or a malformed tree");
        rc = -1;
    }
    if (rc != 0) {
        free(o.buf);
        memset(out, 0, sizeof *out);
        return -1;
    }
    out->text = o.buf;
    return 0;
}

void expr_source_free(expr_source *s) {
    free(s->text);
    s->text = NULL;
}
