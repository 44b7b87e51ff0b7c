#include "gen/expr.h"

#include <errno.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const var_names[] = {"s", "b", "h", "q", "k", "seqlen_q", "seqlen_k"};
#define VAR_COUNT ((int)(sizeof var_names / sizeof var_names[0]))

static const struct {
    const char *name;
    int nargs;
} fn_info[] = {{"exp", 1}, {"log", 1}, {"tanh", 1}, {"sqrt", 1},
               {"floor", 1}, {"abs", 1}, {"min", 2}, {"max", 2}, {"floordiv", 2},
               {"int", 1}};
#define FN_COUNT ((int)(sizeof fn_info / sizeof fn_info[0]))

/* names longer than this are cut in messages, which the caller may print */
#define SHOWN_MAX 32

const char *expr_type_name(expr_type type) {
    switch (type) {
    case EXPR_INT: return "int";
    case EXPR_FLOAT: return "float";
    default: return "bool";
    }
}

/* ---- character classes: ASCII only, whatever the locale ------------------- */

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_name_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(int c) { return is_name_start(c) || is_digit(c); }

/* Bytes that may appear at all; anything else is refused before lexing, so a
 * `;` or a quote is reported wherever it is. */
static int is_allowed_byte(int c) {
    return is_name_char(c) || (c != 0 && strchr(" \t.+-*/%()[],?:=!<>&|^~", c) != NULL);
}

/* strtod and printf follow LC_NUMERIC ("1,5" in some locales); the
 * expression syntax and its canonical form must not. */
static locale_t c_numeric_begin(locale_t *old) {
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c) *old = uselocale(c);
    return c;
}

static void c_numeric_end(locale_t c, locale_t old) {
    if (c) {
        uselocale(old);
        freelocale(c);
    }
}

static int is_reserved(const char *name) {
    for (int i = 0; i < VAR_COUNT; i++)
        if (strcmp(name, var_names[i]) == 0) return 1;
    for (int i = 0; i < FN_COUNT; i++)
        if (strcmp(name, fn_info[i].name) == 0) return 1;
    return strcmp(name, "where") == 0 || strcmp(name, "select") == 0 || strcmp(name, "inf") == 0;
}

/* ---- lexer --------------------------------------------------------------- */

typedef enum {
    T_END, T_INT, T_FLOAT, T_NAME,
    T_PLUS, T_MINUS, T_STAR, T_SLASH, T_PERCENT,
    T_LPAREN, T_RPAREN, T_LBRACK, T_RBRACK, T_COMMA, T_QUESTION, T_COLON,
    T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_AND, T_OR, T_NOT
} token_kind;

typedef struct {
    token_kind kind;
    int col; /* 1-based */
    const char *start;
    int len;
    int64_t ival;
    double fval;
} token;

typedef struct {
    const char *text;
    int pos;
    token tok;
    expr_tree *tree;
    const expr_aux *aux;
    int aux_count;
    expr_kind kind;
    int depth;
    int start[EXPR_MAX_NODES]; /* column where each node's text begins */
    char *err;
    size_t err_len;
} parser;

static int fail(parser *p, int col, const char *fmt, ...) {
    if (p->err && p->err_len) {
        int n = snprintf(p->err, p->err_len, "column %d: ", col);
        if (n >= 0 && (size_t)n < p->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

/* How a token reads in a message: its text, cut, or "the end". */
static void describe(const token *t, char *buf, size_t len) {
    if (t->kind == T_END)
        snprintf(buf, len, "the end of the expression");
    else if (t->kind == T_NAME)
        snprintf(buf, len, "name '%.*s%s'", t->len > SHOWN_MAX ? SHOWN_MAX : t->len, t->start,
                 t->len > SHOWN_MAX ? "..." : "");
    else if (t->kind == T_INT || t->kind == T_FLOAT)
        snprintf(buf, len, "number '%.*s%s'", t->len > SHOWN_MAX ? SHOWN_MAX : t->len, t->start,
                 t->len > SHOWN_MAX ? "..." : "");
    else
        snprintf(buf, len, "'%.*s'", t->len, t->start);
}

static int lex_number(parser *p, int i) {
    const char *s = p->text;
    token *t = &p->tok;
    int j = i, is_float = 0, nonzero = 0;
    while (is_digit(s[j])) nonzero |= s[j++] != '0';
    if (s[j] == '.') {
        is_float = 1;
        j++;
        while (is_digit(s[j])) nonzero |= s[j++] != '0';
    }
    if (s[j] == 'e' || s[j] == 'E') {
        int e = j + 1;
        if (s[e] == '+' || s[e] == '-') e++;
        if (is_digit(s[e])) {
            is_float = 1;
            for (j = e; is_digit(s[j]);) j++;
        }
    }
    if (is_name_char(s[j]) || s[j] == '.') {
        int end = j;
        while (is_name_char(s[end]) || s[end] == '.') end++;
        int shown = end - i > SHOWN_MAX ? SHOWN_MAX : end - i;
        const char *why = (s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X'))
                              ? "hexadecimal numbers are not supported"
                          : is_name_start(s[j]) ? "numbers take no suffixes or letters"
                                                : "malformed number";
        return fail(p, i + 1, "%s: '%.*s%s'", why, shown, s + i, end - i > shown ? "..." : "");
    }
    t->len = j - i;
    int shown = t->len > SHOWN_MAX ? SHOWN_MAX : t->len;
    const char *cut = t->len > shown ? "..." : "";
    if (!is_float) {
        if (t->len > 1 && s[i] == '0')
            return fail(p, i + 1, "integer '%.*s%s' has a leading zero (C would read it as octal)",
                        shown, s + i, cut);
        int64_t v = 0;
        for (int k = i; k < j; k++) {
            v = v * 10 + (s[k] - '0');
            if (v > INT32_MAX)
                return fail(p, i + 1, "integer '%.*s%s' does not fit in int32 (at most %d)", shown,
                            s + i, cut, INT32_MAX);
        }
        t->kind = T_INT;
        t->ival = v;
        return 0;
    }
    char buf[EXPR_MAX_TEXT + 1];
    memcpy(buf, s + i, (size_t)t->len);
    buf[t->len] = '\0';
    locale_t old = (locale_t)0, c = c_numeric_begin(&old);
    double d = strtod(buf, NULL);
    c_numeric_end(c, old);
    float f = (float)d;
    if (!isfinite(f))
        return fail(p, i + 1, "number '%.*s%s' is out of range for float32", shown, s + i, cut);
    if (f == 0.0f && nonzero)
        return fail(p, i + 1, "number '%.*s%s' is too small for float32 (it would be 0)", shown,
                    s + i, cut);
    t->kind = T_FLOAT;
    t->fval = f;
    return 0;
}

static int next(parser *p) {
    const char *s = p->text;
    int i = p->pos;
    while (s[i] == ' ' || s[i] == '\t') i++;
    token *t = &p->tok;
    memset(t, 0, sizeof *t);
    t->col = i + 1;
    t->start = s + i;
    char c = s[i], c1 = c ? s[i + 1] : '\0';
    if (!c) {
        t->kind = T_END;
    } else if (is_digit(c) || (c == '.' && is_digit(c1))) {
        if (lex_number(p, i) < 0) return -1;
    } else if (is_name_start(c)) {
        int j = i;
        while (is_name_char(s[j])) j++;
        t->kind = T_NAME;
        t->len = j - i;
    } else {
        static const struct {
            const char *text;
            token_kind kind;
            const char *refused; /* why, for operators C has and this grammar has not */
        } ops[] = {
            {"**", T_END, "there is no power operator (write s * s)"},
            {"<<", T_END, "bitwise operators are not supported"},
            {">>", T_END, "bitwise operators are not supported"},
            {"==", T_EQ, NULL}, {"!=", T_NE, NULL}, {"<=", T_LE, NULL}, {">=", T_GE, NULL},
            {"&&", T_AND, NULL}, {"||", T_OR, NULL},
            {"&", T_END, "bitwise operators are not supported (the logical and is '&&')"},
            {"|", T_END, "bitwise operators are not supported (the logical or is '||')"},
            {"^", T_END, "bitwise operators are not supported"},
            {"~", T_END, "bitwise operators are not supported"},
            {"=", T_END, "assignment is not supported (equality is '==')"},
            {"+", T_PLUS, NULL}, {"-", T_MINUS, NULL}, {"*", T_STAR, NULL}, {"/", T_SLASH, NULL},
            {"%", T_PERCENT, NULL}, {"(", T_LPAREN, NULL}, {")", T_RPAREN, NULL},
            {"[", T_LBRACK, NULL}, {"]", T_RBRACK, NULL}, {",", T_COMMA, NULL},
            {"?", T_QUESTION, NULL}, {":", T_COLON, NULL}, {"<", T_LT, NULL}, {">", T_GT, NULL},
            {"!", T_NOT, NULL},
        };
        int found = 0;
        for (size_t o = 0; o < sizeof ops / sizeof ops[0] && !found; o++) {
            size_t n = strlen(ops[o].text);
            if (strncmp(s + i, ops[o].text, n) != 0) continue;
            if (ops[o].refused)
                return fail(p, i + 1, "unsupported operator '%s': %s", ops[o].text, ops[o].refused);
            t->kind = ops[o].kind;
            t->len = (int)n;
            found = 1;
        }
        if (!found) return fail(p, i + 1, "unexpected character '%c'", c);
    }
    p->pos = i + t->len;
    return 0;
}

/* ---- tree building and type rules ---------------------------------------- */

static int add_node(parser *p, int col, int start, const expr_node *n) {
    expr_tree *t = p->tree;
    if (t->count >= EXPR_MAX_NODES)
        return fail(p, col, "the expression has more than %d nodes", EXPR_MAX_NODES);
    t->nodes[t->count] = *n;
    t->nodes[t->count].column = col;
    p->start[t->count] = start;
    return t->count++;
}

static expr_node node_of(expr_op op, expr_type type, int nchild, int a, int b, int c) {
    expr_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.type = type;
    n.nchild = nchild;
    n.child[0] = a, n.child[1] = b, n.child[2] = c;
    return n;
}

static int is_number(expr_type t) { return t == EXPR_INT || t == EXPR_FLOAT; }

static expr_type number_result(expr_type a, expr_type b) {
    return a == EXPR_INT && b == EXPR_INT ? EXPR_INT : EXPR_FLOAT;
}

static const char *op_spelling(expr_op op) {
    switch (op) {
    case EXPR_NEG: return "-";
    case EXPR_NOT: return "!";
    case EXPR_ADD: return "+";
    case EXPR_SUB: return "-";
    case EXPR_MUL: return "*";
    case EXPR_DIV: return "/";
    case EXPR_MOD: return "%";
    case EXPR_EQ: return "==";
    case EXPR_NE: return "!=";
    case EXPR_LT: return "<";
    case EXPR_LE: return "<=";
    case EXPR_GT: return ">";
    case EXPR_GE: return ">=";
    case EXPR_AND: return "&&";
    case EXPR_OR: return "||";
    default: return "?";
    }
}

static const char *type_words(expr_type t) {
    return t == EXPR_BOOL ? "bool (a condition)" : expr_type_name(t);
}

static int make_binary(parser *p, expr_op op, int col, int l, int r) {
    expr_type tl = p->tree->nodes[l].type, tr = p->tree->nodes[r].type, type;
    const char *need;
    int ok_l, ok_r;
    if (op == EXPR_AND || op == EXPR_OR) {
        ok_l = tl == EXPR_BOOL, ok_r = tr == EXPR_BOOL, need = "bool operands (conditions)";
        type = EXPR_BOOL;
    } else if (op == EXPR_MOD) {
        ok_l = tl == EXPR_INT, ok_r = tr == EXPR_INT, need = "int operands";
        type = EXPR_INT;
    } else {
        ok_l = is_number(tl), ok_r = is_number(tr), need = "number operands";
        type = op >= EXPR_EQ ? EXPR_BOOL : op == EXPR_DIV ? EXPR_FLOAT : number_result(tl, tr);
    }
    if (!ok_l || !ok_r)
        return fail(p, col, "'%s' needs %s; the %s operand is %s", op_spelling(op), need,
                    ok_l ? "right" : "left", type_words(ok_l ? tr : tl));
    expr_node n = node_of(op, type, 2, l, r, -1);
    return add_node(p, col, p->start[l], &n);
}

/* where(c, a, b), select(...) and c ? a : b */
static int make_where(parser *p, int col, const int arg[3], const int arg_col[3]) {
    const expr_node *nd = p->tree->nodes;
    expr_type tc = nd[arg[0]].type, ta = nd[arg[1]].type, tb = nd[arg[2]].type, type;
    if (tc != EXPR_BOOL)
        return fail(p, arg_col[0], "the condition must be bool, this is %s", type_words(tc));
    if (is_number(ta) && is_number(tb))
        type = number_result(ta, tb);
    else if (ta == EXPR_BOOL && tb == EXPR_BOOL)
        type = EXPR_BOOL;
    else
        return fail(p, arg_col[2], "the two choices must both be numbers or both be bool: "
                    "they are %s and %s", expr_type_name(ta), expr_type_name(tb));
    expr_node n = node_of(EXPR_WHERE, type, 3, arg[0], arg[1], arg[2]);
    return add_node(p, col, p->start[arg[0]], &n);
}

static int enter(parser *p) {
    if (++p->depth > EXPR_MAX_DEPTH)
        return fail(p, p->tok.col, "nested more than %d levels deep", EXPR_MAX_DEPTH);
    return 0;
}

static int expect(parser *p, token_kind kind, const char *what) {
    if (p->tok.kind != kind) {
        char found[SHOWN_MAX + 48];
        describe(&p->tok, found, sizeof found);
        return fail(p, p->tok.col, "expected %s, found %s", what, found);
    }
    return next(p);
}

/* ---- recursive descent ---------------------------------------------------- */

static int parse_expr(parser *p);

/* The comma-separated list after '(' or '[': up to 3 kept, all counted. */
static int parse_list(parser *p, token_kind close, const char *close_text, int arg[3],
                      int arg_col[3], int *count) {
    *count = 0;
    if (enter(p) < 0 || next(p) < 0) return -1;
    if (p->tok.kind != close) {
        for (;;) {
            int col = p->tok.col;
            int e = parse_expr(p);
            if (e < 0) return -1;
            if (*count < 3) arg[*count] = e, arg_col[*count] = col;
            (*count)++;
            if (p->tok.kind != T_COMMA) break;
            if (next(p) < 0) return -1;
        }
    }
    char what[40];
    snprintf(what, sizeof what, "',' or '%s'", close_text);
    if (expect(p, close, what) < 0) return -1;
    p->depth--;
    return 0;
}

static int token_is(const token *t, const char *text) {
    return (int)strlen(text) == t->len && strncmp(text, t->start, (size_t)t->len) == 0;
}

static int lookup_aux(const parser *p, const token *t) {
    for (int i = 0; i < p->aux_count; i++)
        if (token_is(t, p->aux[i].name)) return i;
    return -1;
}

static int parse_name(parser *p) {
    token name = p->tok;
    int col = name.col, shown = name.len > SHOWN_MAX ? SHOWN_MAX : name.len;
    const char *cut = name.len > shown ? "..." : "";
    int var = -1, fn = -1, is_where = 0;
    for (int i = 0; i < VAR_COUNT; i++)
        if (token_is(&name, var_names[i])) var = i;
    for (int i = 0; i < FN_COUNT; i++)
        if (token_is(&name, fn_info[i].name)) fn = i;
    is_where = token_is(&name, "where") || token_is(&name, "select");
    int aux = lookup_aux(p, &name), is_inf = token_is(&name, "inf");
    if (next(p) < 0) return -1;
    token_kind after = p->tok.kind;

    if (is_inf) {
        if (after == T_LPAREN || after == T_LBRACK)
            return fail(p, col, "'inf' is a number; it cannot be %s",
                        after == T_LPAREN ? "called" : "indexed");
        expr_node n = node_of(EXPR_NUMBER, EXPR_FLOAT, 0, -1, -1, -1);
        n.fval = INFINITY;
        return add_node(p, col, col, &n);
    }

    if (var >= 0) {
        if (var == EXPR_VAR_S && p->kind == EXPR_MASK)
            return fail(p, col, "'s' (the score) is not available in a mask expression");
        if (after == T_LPAREN || after == T_LBRACK)
            return fail(p, col, "'%s' is a variable; it cannot be %s", var_names[var],
                        after == T_LPAREN ? "called" : "indexed");
        expr_node n = node_of(EXPR_VAR, var == EXPR_VAR_S ? EXPR_FLOAT : EXPR_INT, 0, -1, -1, -1);
        n.var = (expr_var)var;
        return add_node(p, col, col, &n);
    }
    int arg[3] = {-1, -1, -1}, arg_col[3] = {0, 0, 0}, count;
    if (fn >= 0 || is_where) {
        const char *fname = is_where ? (name.len == 5 ? "where" : "select") : fn_info[fn].name;
        int want = is_where ? 3 : fn_info[fn].nargs;
        if (after != T_LPAREN)
            return fail(p, col, "'%s' is a function; call it as %s(...)", fname, fname);
        if (parse_list(p, T_RPAREN, ")", arg, arg_col, &count) < 0) return -1;
        if (count != want)
            return fail(p, col, "'%s' takes %d argument%s, not %d", fname, want, want == 1 ? "" : "s",
                        count);
        if (is_where) return make_where(p, col, arg, arg_col);
        const expr_node *nd = p->tree->nodes;
        int all_int = 1;
        for (int a = 0; a < count; a++) {
            if (!is_number(nd[arg[a]].type))
                return fail(p, arg_col[a], "argument %d of '%s' must be a number, this is %s", a + 1,
                            fname, type_words(nd[arg[a]].type));
            if (fn == EXPR_FN_FLOORDIV && nd[arg[a]].type != EXPR_INT)
                return fail(p, arg_col[a], "argument %d of '%s' must be int, this is %s (floats: "
                            "floor(a / b))", a + 1, fname, type_words(nd[arg[a]].type));
            all_int &= nd[arg[a]].type == EXPR_INT;
        }
        int keeps_int = fn == EXPR_FN_ABS || fn == EXPR_FN_MIN || fn == EXPR_FN_MAX ||
                        fn == EXPR_FN_FLOORDIV;
        expr_type type = (keeps_int && all_int) || fn == EXPR_FN_INT ? EXPR_INT : EXPR_FLOAT;
        expr_node n = node_of(EXPR_CALL, type, count, arg[0], arg[1], arg[2]);
        n.fn = (expr_fn)fn;
        return add_node(p, col, col, &n);
    }
    if (aux >= 0) {
        const expr_aux *a = &p->aux[aux];
        if (after != T_LBRACK)
            return fail(p, col, "'%s' is a tensor; read it as %s[...]", a->name, a->name);
        if (parse_list(p, T_RBRACK, "]", arg, arg_col, &count) < 0) return -1;
        if (count != a->rank)
            return fail(p, col, "'%s' has rank %d, so it takes %d index%s, not %d", a->name, a->rank,
                        a->rank, a->rank == 1 ? "" : "es", count);
        for (int i = 0; i < count; i++)
            if (p->tree->nodes[arg[i]].type != EXPR_INT)
                return fail(p, arg_col[i], "index %d of '%s' must be int, this is %s", i + 1, a->name,
                            type_words(p->tree->nodes[arg[i]].type));
        expr_node n = node_of(EXPR_AUX_READ, a->elem, count, arg[0], arg[1], arg[2]);
        n.aux = aux;
        return add_node(p, col, col, &n);
    }
    return fail(p, col, "unknown name '%.*s%s'", shown, name.start, cut);
}

static int parse_primary(parser *p) {
    token t = p->tok;
    if (t.kind == T_INT || t.kind == T_FLOAT) {
        expr_node n = node_of(EXPR_NUMBER, t.kind == T_INT ? EXPR_INT : EXPR_FLOAT, 0, -1, -1, -1);
        n.ival = t.ival;
        n.fval = t.fval;
        if (next(p) < 0) return -1;
        return add_node(p, t.col, t.col, &n);
    }
    if (t.kind == T_NAME) return parse_name(p);
    if (t.kind == T_LPAREN) {
        if (enter(p) < 0 || next(p) < 0) return -1;
        int e = parse_expr(p);
        if (e < 0 || expect(p, T_RPAREN, "')'") < 0) return -1;
        p->depth--;
        p->start[e] = t.col;
        return e;
    }
    char found[SHOWN_MAX + 48];
    describe(&t, found, sizeof found);
    return fail(p, t.col, "expected a number, a name or '(', found %s", found);
}

static int parse_unary(parser *p) {
    token t = p->tok;
    if (t.kind != T_MINUS && t.kind != T_NOT) return parse_primary(p);
    if (enter(p) < 0 || next(p) < 0) return -1;
    int a = parse_unary(p);
    if (a < 0) return -1;
    p->depth--;
    expr_type ta = p->tree->nodes[a].type;
    if (t.kind == T_MINUS && !is_number(ta))
        return fail(p, t.col, "'-' needs a number; the operand is %s", type_words(ta));
    if (t.kind == T_NOT && ta != EXPR_BOOL)
        return fail(p, t.col, "'!' needs bool (a condition); the operand is %s", expr_type_name(ta));
    expr_node n = node_of(t.kind == T_MINUS ? EXPR_NEG : EXPR_NOT, ta, 1, a, -1, -1);
    return add_node(p, t.col, t.col, &n);
}

static int parse_mul(parser *p) {
    int l = parse_unary(p);
    while (l >= 0 && (p->tok.kind == T_STAR || p->tok.kind == T_SLASH || p->tok.kind == T_PERCENT)) {
        expr_op op = p->tok.kind == T_STAR ? EXPR_MUL : p->tok.kind == T_SLASH ? EXPR_DIV : EXPR_MOD;
        int col = p->tok.col, r;
        if (next(p) < 0 || (r = parse_unary(p)) < 0) return -1;
        l = make_binary(p, op, col, l, r);
    }
    return l;
}

static int parse_add(parser *p) {
    int l = parse_mul(p);
    while (l >= 0 && (p->tok.kind == T_PLUS || p->tok.kind == T_MINUS)) {
        expr_op op = p->tok.kind == T_PLUS ? EXPR_ADD : EXPR_SUB;
        int col = p->tok.col, r;
        if (next(p) < 0 || (r = parse_mul(p)) < 0) return -1;
        l = make_binary(p, op, col, l, r);
    }
    return l;
}

static int comparison_op(token_kind k, expr_op *op) {
    switch (k) {
    case T_EQ: *op = EXPR_EQ; return 1;
    case T_NE: *op = EXPR_NE; return 1;
    case T_LT: *op = EXPR_LT; return 1;
    case T_LE: *op = EXPR_LE; return 1;
    case T_GT: *op = EXPR_GT; return 1;
    case T_GE: *op = EXPR_GE; return 1;
    default: return 0;
    }
}

static int parse_cmp(parser *p) {
    int l = parse_add(p);
    expr_op op;
    if (l < 0 || !comparison_op(p->tok.kind, &op)) return l;
    int col = p->tok.col, r;
    if (next(p) < 0 || (r = parse_add(p)) < 0) return -1;
    if (comparison_op(p->tok.kind, &op))
        /* C reads a < b < c as (a < b) < c, which is rarely meant */
        return fail(p, p->tok.col, "comparisons do not chain; join them with &&");
    return make_binary(p, op, col, l, r);
}

static int parse_and(parser *p) {
    int l = parse_cmp(p);
    while (l >= 0 && p->tok.kind == T_AND) {
        int col = p->tok.col, r;
        if (next(p) < 0 || (r = parse_cmp(p)) < 0) return -1;
        l = make_binary(p, EXPR_AND, col, l, r);
    }
    return l;
}

static int parse_or(parser *p) {
    int l = parse_and(p);
    while (l >= 0 && p->tok.kind == T_OR) {
        int col = p->tok.col, r;
        if (next(p) < 0 || (r = parse_and(p)) < 0) return -1;
        l = make_binary(p, EXPR_OR, col, l, r);
    }
    return l;
}

static int parse_expr(parser *p) {
    int cond_col = p->tok.col;
    int c = parse_or(p);
    if (c < 0 || p->tok.kind != T_QUESTION) return c;
    int q_col = p->tok.col, arg[3] = {c, -1, -1}, arg_col[3] = {cond_col, 0, 0};
    if (enter(p) < 0 || next(p) < 0) return -1;
    arg_col[1] = p->tok.col;
    if ((arg[1] = parse_expr(p)) < 0 || expect(p, T_COLON, "':' of '?:'") < 0) return -1;
    arg_col[2] = p->tok.col;
    if ((arg[2] = parse_expr(p)) < 0) return -1;
    p->depth--;
    return make_where(p, q_col, arg, arg_col);
}

static int check_aux(const expr_aux *aux, int aux_count, char *err, size_t err_len) {
    if (aux_count < 0 || aux_count > EXPR_MAX_AUX) {
        snprintf(err, err_len, "aux: %d tensors; at most %d", aux_count, EXPR_MAX_AUX);
        return -1;
    }
    if (aux_count > 0 && !aux) {
        snprintf(err, err_len, "aux: null pointer for %d tensors", aux_count);
        return -1;
    }
    for (int i = 0; i < aux_count; i++) {
        const expr_aux *a = &aux[i];
        const char *nul = memchr(a->name, '\0', sizeof a->name);
        int ok = nul && nul != a->name && is_name_start((unsigned char)a->name[0]);
        for (const char *c = a->name; ok && c < nul; c++) ok = is_name_char((unsigned char)*c);
        if (!ok) {
            snprintf(err, err_len, "aux[%d]: the name must be an identifier of 1 to %d characters "
                     "(letters, digits, '_', not starting with a digit)", i, EXPR_AUX_NAME_MAX);
            return -1;
        }
        if (is_reserved(a->name)) {
            snprintf(err, err_len, "aux[%d]: '%s' is a reserved name", i, a->name);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(aux[j].name, a->name) == 0) {
                snprintf(err, err_len, "aux[%d]: '%s' is declared twice", i, a->name);
                return -1;
            }
        if (a->elem != EXPR_INT && a->elem != EXPR_FLOAT) {
            snprintf(err, err_len, "aux[%d]: '%s' must hold int or float", i, a->name);
            return -1;
        }
        if (a->rank < 1 || a->rank > EXPR_MAX_RANK) {
            snprintf(err, err_len, "aux[%d]: '%s' has rank %d; 1 to %d are supported", i, a->name,
                     a->rank, EXPR_MAX_RANK);
            return -1;
        }
    }
    return 0;
}

static int canonical_depth(const expr_tree *t, int i, int base);

int expr_parse(const char *text, expr_kind kind, const expr_aux *aux, int aux_count,
               expr_tree *out, char *err, size_t err_len) {
    char scratch[1];
    if (!err || !err_len) err = scratch, err_len = sizeof scratch;
    err[0] = '\0';
    if (!out) {
        snprintf(err, err_len, "expr_parse: null output tree");
        return -1;
    }
    out->count = 0;
    out->root = -1;
    out->kind = kind;
    if (kind != EXPR_SCORE && kind != EXPR_MASK) {
        snprintf(err, err_len, "expr_parse: kind %d is not EXPR_SCORE or EXPR_MASK", (int)kind);
        return -1;
    }
    if (check_aux(aux, aux_count, err, err_len) < 0) return -1;
    parser p;
    memset(&p, 0, sizeof p);
    p.text = text, p.tree = out, p.aux = aux, p.aux_count = aux_count, p.kind = kind;
    p.err = err, p.err_len = err_len;
    if (!text) return fail(&p, 1, "no expression (null pointer)");
    size_t n = 0;
    while (n <= EXPR_MAX_TEXT && text[n]) n++;
    if (n > EXPR_MAX_TEXT)
        return fail(&p, EXPR_MAX_TEXT + 1, "the expression is longer than %d bytes", EXPR_MAX_TEXT);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (is_allowed_byte(c)) continue;
        if (c >= 0x20 && c < 0x7f) return fail(&p, (int)i + 1, "unexpected character '%c'", c);
        return fail(&p, (int)i + 1, "unexpected byte 0x%02x: only printable ASCII, spaces and tabs "
                    "are allowed", c);
    }
    int root = -1;
    if (next(&p) == 0) {
        if (p.tok.kind == T_END) {
            fail(&p, p.tok.col, "empty expression");
        } else if ((root = parse_expr(&p)) >= 0 && p.tok.kind != T_END) {
            char found[SHOWN_MAX + 48];
            describe(&p.tok, found, sizeof found);
            root = fail(&p, p.tok.col, "unexpected %s after a complete expression", found);
        }
    }
    if (root >= 0) {
        expr_type rt = out->nodes[root].type;
        if (kind == EXPR_SCORE && !is_number(rt))
            root = fail(&p, p.start[root], "a score expression must give a number, this gives bool");
        else if (kind == EXPR_MASK && rt != EXPR_BOOL)
            root = fail(&p, p.start[root], "a mask must give bool (a condition such as k <= q), "
                        "this gives %s", expr_type_name(rt));
    }
    /* a spec keeps the canonical text and parses it again, where where()
     * takes a level for ?:'s condition as well */
    if (root >= 0 && canonical_depth(out, root, 0) > EXPR_MAX_DEPTH)
        root = fail(&p, p.start[root], "nested more than %d levels deep once ?: is written as where()",
                    EXPR_MAX_DEPTH);
    if (root < 0) {
        out->count = 0;
        out->root = -1;
        return -1;
    }
    out->root = root;
    return 0;
}

/* ---- shared checks over trees -------------------------------------------- */

static int child_count_ok(const expr_node *n) {
    switch (n->op) {
    case EXPR_NUMBER:
    case EXPR_VAR: return n->nchild == 0;
    case EXPR_AUX_READ: return n->nchild >= 1 && n->nchild <= EXPR_MAX_RANK && n->aux >= 0 &&
                               n->aux < EXPR_MAX_AUX;
    case EXPR_NEG:
    case EXPR_NOT: return n->nchild == 1;
    case EXPR_CALL:
        return (int)n->fn >= 0 && (int)n->fn < FN_COUNT && n->nchild == fn_info[n->fn].nargs;
    case EXPR_WHERE: return n->nchild == 3;
    default: return n->op >= EXPR_ADD && n->op <= EXPR_OR && n->nchild == 2;
    }
}

/* Trees are trusted by what generates code from them, so a damaged one is
 * refused rather than walked. */
static int tree_ok(const expr_tree *t) {
    if (!t || t->count < 1 || t->count > EXPR_MAX_NODES || t->root < 0 || t->root >= t->count)
        return 0;
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        if (!child_count_ok(n)) return 0;
        if (n->op == EXPR_VAR && ((int)n->var < 0 || (int)n->var >= VAR_COUNT)) return 0;
        for (int c = 0; c < n->nchild; c++)
            if (n->child[c] < 0 || n->child[c] >= i) return 0;
    }
    return 1;
}

void expr_mark_used(const expr_tree *t, unsigned char mark[EXPR_MAX_NODES]) {
    for (int i = t->count - 1; i >= 0; i--)
        if (mark[i])
            for (int c = 0; c < t->nodes[i].nchild; c++) mark[t->nodes[i].child[c]] = 1;
}

void expr_mark_reachable(const expr_tree *t, unsigned char mark[EXPR_MAX_NODES]) {
    memset(mark, 0, EXPR_MAX_NODES);
    mark[t->root] = 1;
    expr_mark_used(t, mark);
}

void expr_print_float(double v, char *out, size_t len) {
    locale_t old = (locale_t)0, c = c_numeric_begin(&old);
    snprintf(out, len, "%.9g", v);
    c_numeric_end(c, old);
}

int expr_uses_var(const expr_tree *t, expr_var v) {
    unsigned char mark[EXPR_MAX_NODES];
    if (!tree_ok(t)) return 0;
    expr_mark_reachable(t, mark);
    for (int i = 0; i < t->count; i++)
        if (mark[i] && t->nodes[i].op == EXPR_VAR && t->nodes[i].var == v) return 1;
    return 0;
}

static int is_var(const expr_tree *t, int i, expr_var v) {
    return t->nodes[i].op == EXPR_VAR && t->nodes[i].var == v;
}

void expr_index_uses(const expr_tree *t, unsigned char uses[EXPR_MAX_NODES]) {
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        uses[i] = 0;
        if (n->op == EXPR_VAR)
            uses[i] = n->var == EXPR_VAR_Q ? EXPR_USES_Q : n->var == EXPR_VAR_K ? EXPR_USES_K
                    : n->var == EXPR_VAR_S ? EXPR_USES_S : 0;
        /* q - k and k - q: the diagonal alone */
        if (n->op == EXPR_SUB && ((is_var(t, n->child[0], EXPR_VAR_Q) && is_var(t, n->child[1], EXPR_VAR_K)) ||
                                  (is_var(t, n->child[0], EXPR_VAR_K) && is_var(t, n->child[1], EXPR_VAR_Q)))) {
            uses[i] = EXPR_USES_D;
            continue;
        }
        for (int c = 0; c < n->nchild; c++) uses[i] |= uses[n->child[c]];
    }
}

void expr_read_shape(const expr_tree *t, int *both, int *k_only) {
    unsigned char mark[EXPR_MAX_NODES], uses[EXPR_MAX_NODES];
    *both = *k_only = 0;
    if (!tree_ok(t)) return;
    expr_mark_reachable(t, mark);
    expr_index_uses(t, uses);
    for (int i = 0; i < t->count; i++) {
        if (!mark[i] || t->nodes[i].op != EXPR_AUX_READ) continue;
        const unsigned u = uses[i] & (EXPR_USES_Q | EXPR_USES_K | EXPR_USES_D);
        if (u == EXPR_USES_K) ++*k_only;
        else if (u & (EXPR_USES_K | EXPR_USES_D)) ++*both;
    }
}

int expr_math_calls(const expr_tree *t) {
    unsigned char mark[EXPR_MAX_NODES];
    int calls = 0;
    if (!tree_ok(t)) return 0;
    expr_mark_reachable(t, mark);
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        calls += mark[i] && n->op == EXPR_CALL &&
                 (n->fn == EXPR_FN_EXP || n->fn == EXPR_FN_LOG || n->fn == EXPR_FN_TANH ||
                  n->fn == EXPR_FN_SQRT);
    }
    return calls;
}

unsigned expr_aux_used(const expr_tree *t) {
    unsigned char mark[EXPR_MAX_NODES];
    unsigned used = 0;
    if (!tree_ok(t)) return 0;
    expr_mark_reachable(t, mark);
    for (int i = 0; i < t->count; i++)
        if (mark[i] && t->nodes[i].op == EXPR_AUX_READ) used |= 1u << t->nodes[i].aux;
    return used;
}

/* ---- canonical form ------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, pos;
    int overflow;
} writer;

static void put(writer *w, const char *s) {
    size_t n = strlen(s);
    if (w->overflow) return;
    if (w->pos + n >= w->len) {
        w->overflow = 1;
        return;
    }
    memcpy(w->buf + w->pos, s, n + 1);
    w->pos += n;
}

/* How tightly a node's text binds, the grammar's levels: || 1, && 2,
 * comparisons 3, + - 4, * / % 5, prefix operators (and numbers printed
 * negative) 6, the rest 7. The text has parentheses only where the tree
 * needs them, so it nests no deeper than any text that parses to the tree,
 * but for ?:'s condition, which where() puts a level deeper (expr_parse
 * refuses a tree whose canonical text would nest too deep to parse). */
static int binding(const expr_node *n) {
    switch (n->op) {
    case EXPR_OR: return 1;
    case EXPR_AND: return 2;
    case EXPR_EQ:
    case EXPR_NE:
    case EXPR_LT:
    case EXPR_LE:
    case EXPR_GT:
    case EXPR_GE: return 3;
    case EXPR_ADD:
    case EXPR_SUB: return 4;
    case EXPR_MUL:
    case EXPR_DIV:
    case EXPR_MOD: return 5;
    case EXPR_NEG:
    case EXPR_NOT: return 6;
    case EXPR_NUMBER: return (n->type == EXPR_INT ? n->ival < 0 : signbit(n->fval) != 0) ? 6 : 7;
    default: return 7;
    }
}

/* How tightly operand c of an operation must bind to go without
 * parentheses: a prefix operator's, tighter than * / %; a binary
 * operation's left operand, as tightly as the operation (comparisons do not
 * chain: tighter); its right one, tighter (the operations associate to the
 * left). */
static int operand_min(const expr_node *n, int c) {
    const int level = binding(n);
    if (n->op == EXPR_NEG || n->op == EXPR_NOT) return 6;
    return c == 0 && level != 3 ? level : level + 1;
}

static void put_number(writer *w, const expr_node *n) {
    char num[48];
    int negative = n->type == EXPR_INT ? n->ival < 0 : signbit(n->fval) != 0;
    if (n->type == EXPR_INT) {
        snprintf(num, sizeof num, "%lld", (long long)(negative ? -n->ival : n->ival));
    } else if (isinf(n->fval)) {
        snprintf(num, sizeof num, "inf");
    } else {
        expr_print_float(fabs(n->fval), num, sizeof num);
        /* "2" would read back as an int */
        if (!strpbrk(num, ".e")) strncat(num, ".0", sizeof num - strlen(num) - 1);
    }
    /* the parser makes no negative numbers; -x reads back as a negation */
    if (negative) put(w, "-");
    put(w, num);
}

static void put_node(writer *w, const expr_tree *t, const expr_aux *aux, int i);

/* The deepest level the parser reaches reading node i's canonical text from
 * level base: a level for each parenthesis put_node writes, prefix operator
 * and list of arguments or indices, as the parser counts them. */
static int canonical_depth(const expr_tree *t, int i, int base) {
    const expr_node *n = &t->nodes[i];
    const int level = binding(n);
    switch (n->op) {
    case EXPR_NUMBER: return level == 6 ? base + 1 : base;
    case EXPR_VAR: return base;
    case EXPR_NEG:
    case EXPR_NOT: {
        const int c = n->child[0];
        return canonical_depth(t, c, base + 1 + (binding(&t->nodes[c]) < operand_min(n, 0)));
    }
    case EXPR_AUX_READ:
    case EXPR_CALL:
    case EXPR_WHERE: {
        int d = base + 1;
        for (int c = 0; c < n->nchild; c++) {
            const int dc = canonical_depth(t, n->child[c], base + 1);
            if (dc > d) d = dc;
        }
        return d;
    }
    default: {
        const int l = n->child[0], r = n->child[1];
        const int dl = canonical_depth(t, l, base + (binding(&t->nodes[l]) < operand_min(n, 0)));
        const int dr = canonical_depth(t, r, base + (binding(&t->nodes[r]) < operand_min(n, 1)));
        return dl > dr ? dl : dr;
    }
    }
}

/* child c of node i, in parentheses where its text binds less tightly than
 * `min` asks */
static void put_operand(writer *w, const expr_tree *t, const expr_aux *aux, int c, int min) {
    const int paren = binding(&t->nodes[c]) < min;
    if (paren) put(w, "(");
    put_node(w, t, aux, c);
    if (paren) put(w, ")");
}

static void put_node(writer *w, const expr_tree *t, const expr_aux *aux, int i) {
    const expr_node *n = &t->nodes[i];
    if (w->overflow) return; /* also bounds the time spent on shared nodes */
    switch (n->op) {
    case EXPR_NUMBER: put_number(w, n); return;
    case EXPR_VAR: put(w, var_names[n->var]); return;
    case EXPR_AUX_READ:
        if (!aux || !memchr(aux[n->aux].name, '\0', sizeof aux[n->aux].name)) {
            w->overflow = 1;
            return;
        }
        put(w, aux[n->aux].name);
        put(w, "[");
        break;
    case EXPR_CALL:
        put(w, fn_info[n->fn].name);
        put(w, "(");
        break;
    case EXPR_WHERE: put(w, "where("); break;
    case EXPR_NEG:
    case EXPR_NOT:
        put(w, op_spelling(n->op));
        /* "- -x", not "--x"; an operand that binds less tightly in parentheses */
        if (binding(&t->nodes[n->child[0]]) == 6) put(w, " ");
        put_operand(w, t, aux, n->child[0], operand_min(n, 0));
        return;
    default:
        put_operand(w, t, aux, n->child[0], operand_min(n, 0));
        put(w, " ");
        put(w, op_spelling(n->op));
        put(w, " ");
        put_operand(w, t, aux, n->child[1], operand_min(n, 1));
        return;
    }
    for (int c = 0; c < n->nchild; c++) {
        if (c) put(w, ", ");
        put_node(w, t, aux, n->child[c]);
    }
    put(w, n->op == EXPR_AUX_READ ? "]" : ")");
}

int expr_canonical(const expr_tree *t, const expr_aux *aux, char *buf, size_t len) {
    if (!buf || !len) return -1;
    buf[0] = '\0';
    if (!tree_ok(t)) return -1;
    writer w = {buf, len, 0, 0};
    put_node(&w, t, aux, t->root);
    if (w.overflow) {
        buf[0] = '\0';
        return -1;
    }
    return 0;
}

/* ---- derivative with respect to s ----------------------------------------- */

/* Derivatives are node indices in the output, or one of these. Zero and one
 * stay symbolic so that x * 1 and x + 0 never become nodes. */
#define D_FAIL (-1)
#define D_ZERO (-2)
#define D_ONE (-3)
#define D_UNSET (-4)

typedef struct {
    const expr_tree *in;
    expr_tree *out;
    int copy_of[EXPR_MAX_NODES];  /* input node -> its copy in out */
    int deriv_of[EXPR_MAX_NODES]; /* input node -> its derivative */
    unsigned char has_s[EXPR_MAX_NODES]; /* depends on the variable */
    unsigned char is_x[EXPR_MAX_NODES];  /* is the variable */
    char *err;
    size_t err_len;
} deriv;

static int d_new(deriv *d, expr_op op, expr_type type, int col, int nchild, int a, int b, int c) {
    expr_tree *o = d->out;
    if (o->count >= EXPR_MAX_NODES) {
        snprintf(d->err, d->err_len, "the derivative needs more than %d nodes", EXPR_MAX_NODES);
        return D_FAIL;
    }
    expr_node n = node_of(op, type, nchild, a, b, c);
    n.column = col;
    o->nodes[o->count] = n;
    return o->count++;
}

static int d_const(deriv *d, double v) {
    for (int i = 0; i < d->out->count; i++) {
        const expr_node *n = &d->out->nodes[i];
        if (n->op == EXPR_NUMBER && n->type == EXPR_FLOAT && n->fval == v) return i;
    }
    int i = d_new(d, EXPR_NUMBER, EXPR_FLOAT, 0, 0, -1, -1, -1);
    if (i >= 0) d->out->nodes[i].fval = v;
    return i;
}

/* a symbolic zero or one made a node, where one is needed */
static int d_node(deriv *d, int x) {
    return x == D_ZERO ? d_const(d, 0.0) : x == D_ONE ? d_const(d, 1.0) : x;
}

static int d_copy(deriv *d, int i) {
    if (d->copy_of[i] != D_UNSET) return d->copy_of[i];
    expr_node n = d->in->nodes[i];
    for (int c = 0; c < n.nchild; c++)
        if ((n.child[c] = d_copy(d, n.child[c])) < 0) return D_FAIL;
    int k = d_new(d, n.op, n.type, n.column, 0, -1, -1, -1);
    if (k < 0) return D_FAIL;
    d->out->nodes[k] = n;
    return d->copy_of[i] = k;
}

static expr_type d_type(deriv *d, int x) {
    return x < 0 ? EXPR_FLOAT : d->out->nodes[x].type;
}

static int d_binary(deriv *d, expr_op op, int col, int x, int y) {
    if (x == D_FAIL || (x = d_node(d, x)) < 0 || y == D_FAIL || (y = d_node(d, y)) < 0) return D_FAIL;
    expr_type type = op == EXPR_DIV ? EXPR_FLOAT
                     : op >= EXPR_EQ ? EXPR_BOOL
                                     : number_result(d_type(d, x), d_type(d, y));
    return d_new(d, op, type, col, 2, x, y, -1);
}

static int d_neg(deriv *d, int col, int x) {
    if (x == D_FAIL || x == D_ZERO) return x;
    if ((x = d_node(d, x)) < 0) return D_FAIL;
    return d_new(d, EXPR_NEG, d_type(d, x), col, 1, x, -1, -1);
}

static int d_add(deriv *d, int col, int x, int y) {
    if (x == D_FAIL || y == D_FAIL) return D_FAIL;
    if (x == D_ZERO) return y;
    if (y == D_ZERO) return x;
    return d_binary(d, EXPR_ADD, col, x, y);
}

static int d_sub(deriv *d, int col, int x, int y) {
    if (x == D_FAIL || y == D_FAIL) return D_FAIL;
    if (y == D_ZERO) return x;
    if (x == D_ZERO) return d_neg(d, col, y);
    return d_binary(d, EXPR_SUB, col, x, y);
}

static int d_mul(deriv *d, int col, int x, int y) {
    if (x == D_FAIL || y == D_FAIL) return D_FAIL;
    if (x == D_ZERO || y == D_ZERO) return D_ZERO;
    if (x == D_ONE) return y;
    if (y == D_ONE) return x;
    return d_binary(d, EXPR_MUL, col, x, y);
}

/* dx * (input node j), copying j only when the product is not zero */
static int d_mul_copy(deriv *d, int col, int dx, int j) {
    if (dx == D_FAIL || dx == D_ZERO) return dx;
    return d_mul(d, col, dx, d_copy(d, j));
}

static int d_div(deriv *d, int col, int x, int y) {
    if (x == D_FAIL || y == D_FAIL) return D_FAIL;
    if (x == D_ZERO) return D_ZERO;
    if (y == D_ONE) return x;
    return d_binary(d, EXPR_DIV, col, x, y);
}

/* where(cond, x, y) over derivatives; cond is an output node */
static int d_where(deriv *d, int col, int cond, int x, int y) {
    if (cond == D_FAIL || x == D_FAIL || y == D_FAIL) return D_FAIL;
    if ((x = d_node(d, x)) < 0 || (y = d_node(d, y)) < 0) return D_FAIL;
    return d_new(d, EXPR_WHERE, number_result(d_type(d, x), d_type(d, y)), col, 3, cond, x, y);
}

static int d_of(deriv *d, int i) {
    if (d->deriv_of[i] != D_UNSET) return d->deriv_of[i];
    const expr_node *n = &d->in->nodes[i];
    int col = n->column, a = n->child[0], b = n->child[1], r = D_ZERO;
    if (d->is_x[i]) return d->deriv_of[i] = D_ONE;
    if (d->has_s[i] && n->type != EXPR_BOOL) {
        int da = n->nchild > 0 ? d_of(d, a) : D_ZERO;
        int db = n->nchild > 1 ? d_of(d, b) : D_ZERO;
        int dc = n->nchild > 2 ? d_of(d, n->child[2]) : D_ZERO;
        if (da == D_FAIL || db == D_FAIL || dc == D_FAIL) return D_FAIL;
        /* an operation's derivative scales its children's: none, none
         * (and no node is made that nothing would use) */
        if (n->nchild > 0 && da == D_ZERO && db == D_ZERO && dc == D_ZERO)
            return d->deriv_of[i] = D_ZERO;
        switch (n->op) {
        case EXPR_NEG: r = d_neg(d, col, da); break;
        case EXPR_ADD: r = d_add(d, col, da, db); break;
        case EXPR_SUB: r = d_sub(d, col, da, db); break;
        /* nested builders are sequenced through locals: C leaves the order
         * of a call's arguments open, and the node numbering must not
         * depend on the compiler */
        case EXPR_MUL: {
            int x = d_mul_copy(d, col, da, b);
            int y = d_mul_copy(d, col, db, a);
            r = d_add(d, col, x, y);
            break;
        }
        case EXPR_DIV: {
            /* (a/b)' = (a' - (a/b) b') / b, reusing the quotient itself */
            int x = d_mul_copy(d, col, db, i);
            x = d_sub(d, col, da, x);
            r = d_div(d, col, x, d_copy(d, b));
            break;
        }
        case EXPR_WHERE: /* the condition is child 0, the branches 1 and 2 */
            r = db == dc ? db : d_where(d, col, d_copy(d, a), db, dc);
            break;
        case EXPR_CALL:
            switch (n->fn) {
            case EXPR_FN_EXP: r = d_mul_copy(d, col, da, i); break;
            case EXPR_FN_LOG: r = da == D_ZERO ? D_ZERO : d_div(d, col, da, d_copy(d, a)); break;
            case EXPR_FN_TANH:
                if (da != D_ZERO) {
                    int t = d_copy(d, i);
                    int x = d_mul(d, col, t, t);
                    x = d_sub(d, col, D_ONE, x);
                    r = d_mul(d, col, da, x);
                }
                break;
            case EXPR_FN_SQRT:
                if (da != D_ZERO) {
                    int two = d_const(d, 2.0);
                    int x = d_mul(d, col, two, d_copy(d, i));
                    r = d_div(d, col, da, x);
                }
                break;
            case EXPR_FN_ABS:
                if (da != D_ZERO) {
                    int cond = d_binary(d, EXPR_LT, col, d_copy(d, a), D_ZERO);
                    int neg = d_neg(d, col, da);
                    r = d_where(d, col, cond, neg, da);
                }
                break;
            case EXPR_FN_MIN:
            case EXPR_FN_MAX:
                /* ties take the first argument's derivative */
                if (da != db) {
                    int x = d_copy(d, a);
                    int y = d_copy(d, b);
                    int cond = d_binary(d, n->fn == EXPR_FN_MIN ? EXPR_LE : EXPR_GE, col, x, y);
                    r = d_where(d, col, cond, da, db);
                } else {
                    r = da;
                }
                break;
            default: break; /* floor, int: piecewise constant; floordiv: ints */
            }
            break;
        default: break; /* numbers, tensors, %: no s, or no slope */
        }
    }
    return d->deriv_of[i] = r;
}

int expr_derivative(const expr_tree *t, expr_tree *out, char *err, size_t err_len) {
    return expr_derivative_of(t, -1, out, err, err_len);
}

int expr_derivative_of(const expr_tree *t, int wrt, expr_tree *out, char *err, size_t err_len) {
    char scratch[1];
    if (!err || !err_len) err = scratch, err_len = sizeof scratch;
    err[0] = '\0';
    if (!out || out == t) {
        snprintf(err, err_len, "expr_derivative: the output tree must be another tree");
        return -1;
    }
    out->count = 0;
    out->root = -1;
    out->kind = EXPR_SCORE;
    if (!tree_ok(t)) {
        snprintf(err, err_len, "expr_derivative: the tree is malformed");
        return -1;
    }
    if (t->kind != EXPR_SCORE) {
        snprintf(err, err_len, "expr_derivative: a mask has no derivative");
        return -1;
    }
    if (wrt >= t->count ||
        (wrt >= 0 && (t->nodes[wrt].op != EXPR_AUX_READ || t->nodes[wrt].type != EXPR_FLOAT))) {
        snprintf(err, err_len, "expr_derivative: node %d is not a read of a float tensor", wrt);
        return -1;
    }
    deriv d;
    d.in = t, d.out = out, d.err = err, d.err_len = err_len;
    for (int i = 0; i < EXPR_MAX_NODES; i++) d.copy_of[i] = d.deriv_of[i] = D_UNSET;
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        d.is_x[i] = wrt < 0 ? n->op == EXPR_VAR && n->var == EXPR_VAR_S : i == wrt;
        d.has_s[i] = d.is_x[i];
        for (int c = 0; c < n->nchild; c++) d.has_s[i] |= d.has_s[n->child[c]];
    }
    int root = d_node(&d, d_of(&d, t->root));
    if (root < 0) {
        out->count = 0;
        return -1;
    }
    out->root = root;
    return 0;
}
