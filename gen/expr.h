/* User score modifiers and mask predicates: text such as `30 * tanh(s / 30)`
 * or `doc[q] == doc[k]` parsed into a bounded, type-checked tree. Code is
 * later generated from the tree alone, so nothing a user writes reaches the
 * compiler as text.
 *
 * Grammar (C precedence, binary operators left-associative):
 *   expr    := or ('?' expr ':' expr)?
 *   or      := and ('||' and)*        and := cmp ('&&' cmp)*
 *   cmp     := add (('=='|'!='|'<'|'<='|'>'|'>=') add)?   (no chains: a < b < c)
 *   add     := mul (('+'|'-') mul)*   mul := unary (('*'|'/'|'%') unary)*
 *   unary   := ('-'|'!') unary | primary
 *   primary := number | name | name '(' args ')' | name '[' expr (',' expr)* ']'
 *            | '(' expr ')'
 * Numbers are decimal: integers (no leading zeros, within int32) and floats
 * (1.5, .5, 2., 1e-3; finite and nonzero-stays-nonzero in float32), and
 * `inf` (float infinity: `-inf` as a score hides the key).
 * Variables: s (float; score expressions only), b, h, q, k, seqlen_q, seqlen_k
 * (int). Functions: exp log tanh sqrt floor (number -> float), abs min max
 * (int when every argument is), where(cond, a, b) with `select` and `c ? a : b`
 * as other spellings. Auxiliary tensors are declared by the caller and read as
 * name[i, j]: one int index per dimension.
 *
 * Types: + - * give int on ints, float otherwise; '/' is always float (integer
 * division would silently truncate `q / 2`); '%' takes ints only;
 * comparisons take numbers and give bool; ! && || take bools. */
#ifndef FG_EXPR_H
#define FG_EXPR_H

#include <stddef.h>
#include <stdint.h>

#define EXPR_MAX_NODES 256
#define EXPR_MAX_DEPTH 32    /* nested brackets, arguments, branches and prefix operators */
#define EXPR_MAX_AUX 8
#define EXPR_MAX_RANK 3
#define EXPR_AUX_NAME_MAX 32
/* Enough for the canonical form of any tree expr_parse makes (the widest
 * node, a rank-3 read with a 32-character name, prints 38 characters). */
#define EXPR_CANONICAL_MAX (EXPR_MAX_NODES * 40 + 1)
/* Bytes of text: a spec keeps its expressions' canonical text and parses it
 * again, so every tree's canonical text must parse. */
#define EXPR_MAX_TEXT (EXPR_CANONICAL_MAX - 1)

typedef enum { EXPR_SCORE, EXPR_MASK } expr_kind;
typedef enum { EXPR_INT, EXPR_FLOAT, EXPR_BOOL } expr_type;

typedef enum {
    EXPR_NUMBER,   /* ival (EXPR_INT) or fval (EXPR_FLOAT); never negative from the parser */
    EXPR_VAR,      /* var */
    EXPR_AUX_READ, /* aux; the children are the indices */
    EXPR_NEG,
    EXPR_NOT,
    EXPR_ADD,
    EXPR_SUB,
    EXPR_MUL,
    EXPR_DIV,
    EXPR_MOD,
    EXPR_EQ,
    EXPR_NE,
    EXPR_LT,
    EXPR_LE,
    EXPR_GT,
    EXPR_GE,
    EXPR_AND,
    EXPR_OR,
    EXPR_CALL,  /* fn; the children are the arguments */
    EXPR_WHERE  /* children: condition, then, else */
} expr_op;

typedef enum {
    EXPR_VAR_S,
    EXPR_VAR_B,
    EXPR_VAR_H,
    EXPR_VAR_Q,
    EXPR_VAR_K,
    EXPR_VAR_SEQLEN_Q,
    EXPR_VAR_SEQLEN_K
} expr_var;

typedef enum {
    EXPR_FN_EXP,
    EXPR_FN_LOG,
    EXPR_FN_TANH,
    EXPR_FN_SQRT,
    EXPR_FN_FLOOR,
    EXPR_FN_ABS,
    EXPR_FN_MIN,
    EXPR_FN_MAX,
    EXPR_FN_FLOORDIV, /* ints only: the quotient rounded down (Python's //), 0 for / 0 */
    EXPR_FN_INT       /* to int, toward zero; NaN 0, past int32 the nearest end */
} expr_fn;

typedef struct {
    char name[EXPR_AUX_NAME_MAX + 1];
    expr_type elem; /* EXPR_INT (int32) or EXPR_FLOAT (float32) */
    int rank;       /* 1..EXPR_MAX_RANK */
} expr_aux;

typedef struct {
    expr_op op;
    expr_type type;
    int nchild;
    int child[3]; /* each child's index is below its parent's */
    int64_t ival;
    double fval; /* a float32 value held exactly */
    expr_var var;
    expr_fn fn;
    int aux;    /* index into the caller's expr_aux array */
    int column; /* 1-based column of the node's token (its operator for operations) */
} expr_node;

/* Nodes come before the nodes that use them, so evaluating or emitting them
 * in index order needs no recursion. Derivative trees share nodes (a DAG):
 * walk them by index, not by expanding children. */
typedef struct {
    expr_node nodes[EXPR_MAX_NODES];
    int count;
    int root;
    expr_kind kind;
} expr_tree;

/* Parse and type-check. A score's result is a number (an int result is
 * converted to float where it is used); a mask's is bool. Returns 0, or -1
 * with err starting "column N: " (1-based) and saying what is wrong; errors
 * in the aux declarations start "aux[i]: ". */
int expr_parse(const char *text, expr_kind kind, const expr_aux *aux, int aux_count,
               expr_tree *out, char *err, size_t err_len);

/* One spelling per tree, parenthesized only where the tree needs it:
 * `s + bias[h, q - k]`, `(a - b) * c`, `a - (b - c)`; ints as ints, floats
 * with %.9g and always a '.' or an exponent, so the text parses back to the
 * same tree (expr_parse refuses a tree whose text would nest too deep);
 * where() for select and ?:. Numbers are printed in the C locale whatever the
 * program's. Returns 0, or -1 when buf is too small (EXPR_CANONICAL_MAX
 * suffices for parsed trees) or the tree is malformed. */
int expr_canonical(const expr_tree *t, const expr_aux *aux, char *buf, size_t len);

/* The score's derivative with respect to s as a new tree (of kind
 * EXPR_SCORE), simplified where trivial (0 and 1 terms); floor and the
 * conditions contribute nothing; abs, min, max, where select the derivative
 * of the branch taken. out must not be t. Returns 0, or -1 with err (a mask,
 * a malformed tree, more than EXPR_MAX_NODES nodes). */
int expr_derivative(const expr_tree *t, expr_tree *out, char *err, size_t err_len);

/* The same with respect to the value of one read of a float tensor (wrt:
 * the index of an EXPR_AUX_READ node of t), or s when wrt is -1: the
 * factor by which a read's gradient gathers dL/dt. */
int expr_derivative_of(const expr_tree *t, int wrt, expr_tree *out, char *err, size_t err_len);

/* 1 when the variable is read by the tree (from its root), else 0. */
int expr_uses_var(const expr_tree *t, expr_var v);

/* mark[i] = 1 for each node the nodes already marked use, directly or not
 * (children come before their parents); expr_mark_reachable marks the
 * root and what it uses, the rest 0. */
void expr_mark_used(const expr_tree *t, unsigned char mark[EXPR_MAX_NODES]);
void expr_mark_reachable(const expr_tree *t, unsigned char mark[EXPR_MAX_NODES]);

/* v printed "%.9g" in the C locale, whatever LC_NUMERIC says: the digits
 * that read back as the same float32. */
void expr_print_float(double v, char *out, size_t len);

/* uses[i]: what node i depends on, directly or through its children, as
 * bits: q, k, s, and q and k through their difference alone (q - k or
 * k - q, EXPR_USES_D, not counted as q or k). */
#define EXPR_USES_Q 1
#define EXPR_USES_K 2
#define EXPR_USES_S 4
#define EXPR_USES_D 8
void expr_index_uses(const expr_tree *t, unsigned char uses[EXPR_MAX_NODES]);

/* The tensor reads the tree makes (from its root), by what their indices
 * depend on: *both counts reads whose indices use q and k (one value per
 * score), *k_only those that use k and not q (one per key). A planner's
 * measure of what a kernel keeps in registers. */
void expr_read_shape(const expr_tree *t, int *both, int *k_only);

/* Calls of exp, log, tanh and sqrt the tree makes (from its root): each an
 * accurate library function of many instructions and registers. */
int expr_math_calls(const expr_tree *t);

/* Bit i set when aux tensor i is read. */
unsigned expr_aux_used(const expr_tree *t);

const char *expr_type_name(expr_type type);

#endif
