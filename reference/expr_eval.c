/* Evaluation in index order: children come before their parents, so one
 * pass over the nodes the root reaches computes every value (and tangent)
 * with no recursion. Ints are held in doubles, exactly (they are int32). */
#include "reference/expr_eval.h"

#include <math.h>
#include <string.h>

/* ---- checks ---------------------------------------------------------------- */

static int nargs_of(expr_fn fn) {
    switch (fn) {
    case EXPR_FN_EXP:
    case EXPR_FN_LOG:
    case EXPR_FN_TANH:
    case EXPR_FN_SQRT:
    case EXPR_FN_FLOOR:
    case EXPR_FN_ABS:
    case EXPR_FN_INT:
        return 1;
    case EXPR_FN_MIN:
    case EXPR_FN_MAX:
    case EXPR_FN_FLOORDIV:
        return 2;
    default:
        return -1;
    }
}

static int node_ok(const expr_node *n, const expr_aux *decl, int aux_count) {
    if ((int)n->type < EXPR_INT || (int)n->type > EXPR_BOOL)
        return 0;
    switch (n->op) {
    case EXPR_NUMBER:
        return n->nchild == 0 && n->type != EXPR_BOOL;
    case EXPR_VAR:
        return n->nchild == 0 && (int)n->var >= EXPR_VAR_S && (int)n->var <= EXPR_VAR_SEQLEN_K;
    case EXPR_AUX_READ:
        return n->aux >= 0 && n->aux < aux_count && n->nchild == decl[n->aux].rank &&
               n->type == decl[n->aux].elem;
    case EXPR_NEG:
    case EXPR_NOT:
        return n->nchild == 1;
    case EXPR_CALL:
        return n->nchild == nargs_of(n->fn);
    case EXPR_WHERE:
        return n->nchild == 3;
    default:
        return n->op >= EXPR_ADD && n->op <= EXPR_OR && n->nchild == 2;
    }
}

int expr_eval_ok(const expr_tree *t, expr_kind kind, const expr_aux *decl, const ref_aux *aux,
                 int aux_count) {
    if (!t || t->kind != kind || t->count < 1 || t->count > EXPR_MAX_NODES || t->root < 0 ||
        t->root >= t->count || aux_count < 0 || aux_count > EXPR_MAX_AUX ||
        (aux_count > 0 && (!decl || !aux)))
        return 0;
    for (int a = 0; a < aux_count; a++) {
        if (decl[a].rank < 1 || decl[a].rank > EXPR_MAX_RANK ||
            (decl[a].elem != EXPR_INT && decl[a].elem != EXPR_FLOAT))
            return 0;
        int empty = 0;
        for (int d = 0; d < decl[a].rank; d++) {
            if (aux[a].size[d] < 0)
                return 0;
            empty |= aux[a].size[d] == 0;
        }
        if (!empty && !aux[a].data)
            return 0;
    }
    for (int i = 0; i < t->count; i++) {
        const expr_node *n = &t->nodes[i];
        if (!node_ok(n, decl, aux_count))
            return 0;
        for (int c = 0; c < n->nchild; c++) {
            if (n->child[c] < 0 || n->child[c] >= i)
                return 0;
            /* what is read as an int32 must be one: indices, % and the
             * operands of int results (a where's condition and int()'s
             * float aside) */
            const int int_operand = n->op == EXPR_AUX_READ || n->op == EXPR_MOD ||
                                    (n->type == EXPR_INT && !(n->op == EXPR_WHERE && c == 0) &&
                                     !(n->op == EXPR_CALL && n->fn == EXPR_FN_INT));
            if (int_operand && t->nodes[n->child[c]].type != EXPR_INT)
                return 0;
        }
    }
    expr_type rt = t->nodes[t->root].type;
    return kind == EXPR_MASK ? rt == EXPR_BOOL : rt != EXPR_BOOL;
}

/* ---- evaluation ------------------------------------------------------------- */

static void mark_reachable(const expr_tree *t, unsigned char *mark) {
    memset(mark, 0, (size_t)t->count);
    mark[t->root] = 1;
    for (int i = t->root; i >= 0; i--)
        if (mark[i])
            for (int c = 0; c < t->nodes[i].nchild; c++)
                mark[t->nodes[i].child[c]] = 1;
}

/* two's complement without relying on the implementation's conversion */
static int32_t wrap32(uint32_t u) {
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

static int32_t as_i32(double x) { return (int32_t)x; } /* an int node's value, exact */

static double int_arith(expr_op op, double a, double b) {
    const int32_t x = as_i32(a), y = as_i32(b);
    const uint32_t ux = (uint32_t)x, uy = (uint32_t)y;
    switch (op) {
    case EXPR_ADD:
        return wrap32(ux + uy);
    case EXPR_SUB:
        return wrap32(ux - uy);
    case EXPR_MUL:
        return wrap32(ux * uy);
    case EXPR_MOD:
        return y == 0 || (x == INT32_MIN && y == -1) ? 0 : x % y;
    default:
        return 0;
    }
}

/* floordiv(x, y): x / y rounded down, 0 for y = 0; INT32_MIN / -1 wraps */
static double int_floordiv(double a, double b) {
    const int64_t x = as_i32(a), y = as_i32(b);
    if (y == 0)
        return 0;
    const int64_t q = x / y;
    return wrap32((uint32_t)(q - (q * y != x && (x < 0) != (y < 0))));
}

/* The element a read names, as a row-major offset in the tensor's sizes, and
 * its offset in memory; 0 when an index falls outside. */
static int locate(const ref_aux *a, int rank, const int32_t *idx, int64_t *flat, int64_t *mem) {
    int64_t f = 0, m = 0;
    for (int d = 0; d < rank; d++) {
        if (idx[d] < 0 || idx[d] >= a->size[d])
            return 0;
        f = f * a->size[d] + idx[d];
        m += idx[d] * a->stride[d];
    }
    *flat = f;
    *mem = m;
    return 1;
}

/* Every reachable node's value and its derivative with respect to wrt; the
 * root's derivative into *dout (when not NULL), *at as expr_eval_dual's.
 * Returns the root's value. */
static double run(const expr_tree *t, const expr_env *env, int wrt, double *dout, int64_t *at) {
    double v[EXPR_MAX_NODES], dv[EXPR_MAX_NODES];
    unsigned char mark[EXPR_MAX_NODES];
    mark_reachable(t, mark);
    if (at)
        *at = -1;
    for (int i = 0; i < t->count; i++) {
        if (!mark[i])
            continue;
        const expr_node *n = &t->nodes[i];
        const int is_int = n->type == EXPR_INT;
        const double a = n->nchild > 0 ? v[n->child[0]] : 0.0;
        const double b = n->nchild > 1 ? v[n->child[1]] : 0.0;
        const double c = n->nchild > 2 ? v[n->child[2]] : 0.0;
        const double da = n->nchild > 0 ? dv[n->child[0]] : 0.0;
        const double db = n->nchild > 1 ? dv[n->child[1]] : 0.0;
        const double dc = n->nchild > 2 ? dv[n->child[2]] : 0.0;
        double x = 0.0, dx = 0.0;
        switch (n->op) {
        case EXPR_NUMBER:
            x = is_int ? (double)wrap32((uint32_t)n->ival) : n->fval;
            break;
        case EXPR_VAR:
            switch (n->var) {
            case EXPR_VAR_S:
                x = env->s;
                dx = wrt == EXPR_WRT_S;
                break;
            case EXPR_VAR_B:
                x = env->b;
                break;
            case EXPR_VAR_H:
                x = env->h;
                break;
            case EXPR_VAR_Q:
                x = env->q;
                break;
            case EXPR_VAR_K:
                x = env->k;
                break;
            case EXPR_VAR_SEQLEN_Q:
                x = env->seqlen_q;
                break;
            case EXPR_VAR_SEQLEN_K:
                x = env->seqlen_k;
                break;
            }
            break;
        case EXPR_AUX_READ: {
            const ref_aux *ta = &env->aux[n->aux];
            int32_t idx[EXPR_MAX_RANK];
            int64_t flat, mem;
            for (int d = 0; d < n->nchild; d++)
                idx[d] = as_i32(v[n->child[d]]);
            if (locate(ta, n->nchild, idx, &flat, &mem)) {
                x = env->decl[n->aux].elem == EXPR_INT ? (double)((const int32_t *)ta->data)[mem]
                                                       : (double)((const float *)ta->data)[mem];
                if (i == wrt && at)
                    *at = flat;
            }
            dx = i == wrt && n->type == EXPR_FLOAT; /* outside: a constant 0, seeded all the same */
            break;
        }
        case EXPR_NEG:
            x = is_int ? wrap32(0u - (uint32_t)as_i32(a)) : -a;
            dx = -da;
            break;
        case EXPR_NOT:
            x = a == 0.0;
            break;
        case EXPR_ADD:
            x = is_int ? int_arith(n->op, a, b) : a + b;
            dx = da + db;
            break;
        case EXPR_SUB:
            x = is_int ? int_arith(n->op, a, b) : a - b;
            dx = da - db;
            break;
        case EXPR_MUL:
            x = is_int ? int_arith(n->op, a, b) : a * b;
            dx = da * b + a * db;
            break;
        case EXPR_DIV:
            x = a / b;
            dx = (da - x * db) / b;
            break;
        case EXPR_MOD:
            x = int_arith(n->op, a, b);
            break;
        /* ints meet floats as floats; ints held in doubles compare exactly */
        case EXPR_EQ:
            x = a == b;
            break;
        case EXPR_NE:
            x = a != b;
            break;
        case EXPR_LT:
            x = a < b;
            break;
        case EXPR_LE:
            x = a <= b;
            break;
        case EXPR_GT:
            x = a > b;
            break;
        case EXPR_GE:
            x = a >= b;
            break;
        case EXPR_AND:
            x = a != 0.0 && b != 0.0;
            break;
        case EXPR_OR:
            x = a != 0.0 || b != 0.0;
            break;
        case EXPR_WHERE:
            x = a != 0.0 ? b : c;
            dx = a != 0.0 ? db : dc;
            break;
        case EXPR_CALL:
            switch (n->fn) {
            case EXPR_FN_EXP:
                x = exp(a);
                dx = x * da;
                break;
            case EXPR_FN_LOG:
                x = log(a);
                dx = da / a;
                break;
            case EXPR_FN_TANH:
                x = tanh(a);
                if (da != 0.0) { /* 1/cosh² stays exact where tanh saturates */
                    const double ch = cosh(a);
                    dx = da / (ch * ch);
                }
                break;
            case EXPR_FN_SQRT:
                x = sqrt(a);
                dx = da / (2.0 * x);
                break;
            case EXPR_FN_FLOOR:
                x = floor(a);
                break;
            case EXPR_FN_ABS:
                x = is_int ? (a < 0 ? wrap32(0u - (uint32_t)as_i32(a)) : a) : fabs(a);
                dx = a < 0 ? -da : da;
                break;
            case EXPR_FN_MIN:
                x = is_int ? (a <= b ? a : b) : fmin(a, b);
                dx = a <= b ? da : db;
                break;
            case EXPR_FN_MAX:
                x = is_int ? (a >= b ? a : b) : fmax(a, b);
                dx = a >= b ? da : db;
                break;
            case EXPR_FN_FLOORDIV:
                x = int_floordiv(a, b);
                break;
            case EXPR_FN_INT: /* toward zero; NaN 0, saturated at int32's ends */
                x = isnan(a) ? 0.0 : a >= 2147483648.0 ? 2147483647.0
                    : a <= -2147483648.0 ? -2147483648.0 : trunc(a);
                break;
            }
            break;
        }
        /* the chain rule with nothing to chain: keeps 0·inf out (exp(inf)·0);
         * a read's children are its indices, not its operands */
        if (n->op != EXPR_AUX_READ && n->nchild > 0 && da == 0.0 && db == 0.0 && dc == 0.0)
            dx = 0.0;
        v[i] = x;
        dv[i] = dx;
    }
    if (dout)
        *dout = dv[t->root];
    return v[t->root];
}

/* a wrt that seeds nothing: the tangents stay 0 and cost little */
#define WRT_NONE (-2)

double expr_eval(const expr_tree *t, const expr_env *env) {
    return run(t, env, WRT_NONE, NULL, NULL);
}

double expr_eval_dual(const expr_tree *t, const expr_env *env, int wrt, double *tangent,
                      int64_t *at) {
    double d;
    const double x = run(t, env, wrt, &d, at);
    if (tangent)
        *tangent = d;
    return x;
}

int expr_eval_float_reads(const expr_tree *t, int *nodes) {
    unsigned char mark[EXPR_MAX_NODES];
    int count = 0;
    mark_reachable(t, mark);
    for (int i = 0; i < t->count; i++)
        if (mark[i] && t->nodes[i].op == EXPR_AUX_READ && t->nodes[i].type == EXPR_FLOAT)
            nodes[count++] = i;
    return count;
}
