/* The options of demo, plan, source, compile, check, bench and tune: the
 * spec (compiled into the kernel), the problem (launch arguments), targets,
 * and each command's own. A command refuses an option it would not use, and
 * the options are checked together before any work starts (so a command
 * that needs a GPU says what is wrong with them first), in messages that
 * name them as typed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* Which commands take an option. */
enum {
    FOR_DEMO = 1 << 0,
    FOR_PLAN = 1 << 1,
    FOR_SOURCE = 1 << 2,
    FOR_COMPILE = 1 << 3,
    FOR_CHECK = 1 << 4,
    FOR_BENCH = 1 << 5,
    FOR_TUNE = 1 << 6,
};
#define FOR_OFFLINE (FOR_PLAN | FOR_SOURCE | FOR_COMPILE)
#define FOR_SPEC (FOR_OFFLINE | FOR_CHECK | FOR_TUNE | FOR_DEMO)
#define FOR_PROBLEM (FOR_CHECK | FOR_DEMO)

static const char *const command_names[] = {"demo", "plan", "source", "compile",
                                             "check", "bench", "tune"};

typedef enum opt {
    /* spec */
    O_DTYPE, O_HEAD_DIM, O_HEAD_DIM_V, O_MASK, O_DROPOUT, O_SPARSITY, O_SPARSE_BLOCK, O_FACTORS,
    O_SOFTCAP, O_ALIBI, O_SINKS, /* the scores' variants */
    O_SCORE_MOD, O_MASK_MOD, O_AUX, /* expressions and their tensors */
    O_VARLEN, O_KV_CACHE,
    O_BACKWARD, O_BLOCK_MASK, O_DETERMINISTIC, O_TARGET, O_ALL_TARGETS,
    /* problem: O_BATCH..O_SPLITS */
    O_BATCH, O_HEADS, O_KV_HEADS, O_SEQLEN, O_SEQLEN_Q, O_SEQLEN_K, O_LAYOUT, O_ALIGN,
    O_WINDOW, O_DROPOUT_P, O_SCALE, O_SEED, O_DENSITY,
    O_LENGTHS, O_CACHE_LEN, O_NEW, O_PAGE_SIZE, O_SPLITS, /* packed sequences, a KV cache */
    /* bench and tune */
    O_CSV, O_QUICK, O_REPEATS, O_TUNED, O_PHILOX, O_VARIANTS, O_SHOW, O_STANDARD, O_SEQLENS,
    O_COUNT
} opt;

/* An option's value: none (a flag), required, or optional (taken only when
 * the next argument is one of its values, or given as --opt=value). */
enum { FLAG = 0, VALUE = 1, MAYBE_VALUE = 2 };

typedef struct option_def {
    const char *name, *alias;
    int takes_value; /* FLAG, VALUE or MAYBE_VALUE */
    unsigned commands; /* FOR_ bits */
} option_def;

static const option_def defs[O_COUNT] = {
    [O_DTYPE] = {"--dtype", NULL, 1, FOR_SPEC},
    [O_HEAD_DIM] = {"--head-dim", "-d", 1, FOR_SPEC | FOR_BENCH},
    [O_HEAD_DIM_V] = {"--head-dim-v", NULL, 1, FOR_SPEC | FOR_BENCH},
    [O_MASK] = {"--mask", NULL, 1, FOR_SPEC},
    [O_DROPOUT] = {"--dropout", NULL, 0, FOR_SPEC},
    [O_SPARSITY] = {"--sparsity", NULL, 1, FOR_SPEC},
    [O_SPARSE_BLOCK] = {"--sparse-block", NULL, 1, FOR_SPEC},
    [O_FACTORS] = {"--butterfly-factors", NULL, 1, FOR_SPEC},
    [O_SOFTCAP] = {"--softcap", NULL, 1, FOR_SPEC},
    [O_ALIBI] = {"--alibi", NULL, MAYBE_VALUE, FOR_SPEC},
    [O_SINKS] = {"--sinks", NULL, 0, FOR_SPEC},
    [O_SCORE_MOD] = {"--score-mod", NULL, 1, FOR_SPEC},
    [O_MASK_MOD] = {"--mask-mod", NULL, 1, FOR_SPEC},
    [O_AUX] = {"--aux", NULL, 1, FOR_SPEC},
    [O_VARLEN] = {"--varlen", NULL, 0, FOR_OFFLINE | FOR_CHECK | FOR_BENCH},
    [O_KV_CACHE] = {"--kv-cache", NULL, MAYBE_VALUE, FOR_OFFLINE | FOR_CHECK | FOR_BENCH},
    [O_BACKWARD] = {"--backward", NULL, 0, FOR_OFFLINE | FOR_CHECK | FOR_BENCH | FOR_TUNE},
    [O_BLOCK_MASK] = {"--block-mask", NULL, 0, FOR_OFFLINE},
    [O_DETERMINISTIC] = {"--deterministic", NULL, 0, FOR_CHECK},
    [O_TARGET] = {"--target", NULL, 1, FOR_OFFLINE},
    [O_ALL_TARGETS] = {"--all-targets", NULL, 0, FOR_OFFLINE},
    [O_BATCH] = {"--batch", NULL, 1, FOR_PROBLEM},
    [O_HEADS] = {"--heads", NULL, 1, FOR_PROBLEM},
    [O_KV_HEADS] = {"--kv-heads", NULL, 1, FOR_PROBLEM},
    [O_SEQLEN] = {"--seqlen", NULL, 1, FOR_PROBLEM | FOR_BENCH},
    [O_SEQLEN_Q] = {"--seqlen-q", NULL, 1, FOR_PROBLEM},
    [O_SEQLEN_K] = {"--seqlen-k", NULL, 1, FOR_PROBLEM},
    [O_LAYOUT] = {"--layout", NULL, 1, FOR_PROBLEM},
    [O_ALIGN] = {"--align", NULL, 1, FOR_PROBLEM},
    [O_WINDOW] = {"--window", NULL, 1, FOR_PROBLEM},
    [O_DROPOUT_P] = {"--dropout-p", NULL, 1, FOR_PROBLEM},
    [O_SCALE] = {"--scale", NULL, 1, FOR_PROBLEM},
    [O_SEED] = {"--seed", NULL, 1, FOR_PROBLEM},
    [O_DENSITY] = {"--density", NULL, 1, FOR_PROBLEM},
    [O_LENGTHS] = {"--lengths", NULL, 1, FOR_CHECK},
    [O_CACHE_LEN] = {"--cache-len", NULL, 1, FOR_CHECK},
    [O_NEW] = {"--new", NULL, 1, FOR_CHECK},
    [O_PAGE_SIZE] = {"--page-size", NULL, 1, FOR_CHECK | FOR_BENCH},
    [O_SPLITS] = {"--splits", NULL, 1, FOR_CHECK | FOR_BENCH},
    [O_CSV] = {"--csv", NULL, 0, FOR_BENCH},
    [O_QUICK] = {"--quick", NULL, 0, FOR_BENCH},
    [O_REPEATS] = {"--repeats", NULL, 1, FOR_BENCH},
    [O_TUNED] = {"--tuned", NULL, 0, FOR_BENCH},
    [O_PHILOX] = {"--philox", NULL, 0, FOR_BENCH},
    [O_VARIANTS] = {"--variants", NULL, 0, FOR_BENCH},
    [O_SHOW] = {"--show", NULL, 0, FOR_TUNE},
    [O_STANDARD] = {"--standard", NULL, 0, FOR_TUNE},
    [O_SEQLENS] = {"--seqlens", NULL, 1, FOR_TUNE},
};

#define MAX_SEQLEN (1 << 30) /* the library's limit on lengths */
#define DEFAULT_SEQLEN 1000

/* --alibi's values: slopes per head (the default) or per batch and head. */
static const char *const alibi_values[] = {"head", "batch"};
static const char *const kv_cache_values[] = {"latent"};
static const char *const dtype_names[] = {"fp16", "bf16"};   /* fg_dtype's order */
static const char *const mask_names[] = {"none", "causal", "window"}; /* fg_mask's */

/* ---- help ---- */

/* The spec options; print_help fills in the command's defaults. */
static const char *spec_help_format =
    "spec options (compiled into the kernel):\n"
    "  --dtype fp16|bf16          (default %s)\n"
    "  --head-dim N, -d N         1..256, 1..576 with --kv-cache latent (default %d)\n"
    "  --head-dim-v N             the value head dim, of V, O, dO and dV, 1..256\n"
    "                             (default: the head dim; with --kv-cache a multiple of 8)\n"
    "  --mask none|causal|window  (default %s)\n"
    "  --dropout                  compile dropout in\n"
    "  --sparsity none|layout|butterfly   block sparsity (default none)\n"
    "  --sparse-block QxK         sparse block size, with --sparsity layout or butterfly\n"
    "                             (default 64x64); with --mask-mod a layout is the\n"
    "                             predicate's block mask (empty blocks skipped, full ones\n"
    "                             untested)\n"
    "  --butterfly-factors N      with --sparsity butterfly (default 2)\n"
    "  --softcap X                cap the scores: X*tanh(s/X), X > 0\n"
    "  --alibi [head|batch]       ALiBi's bias -slope*|i - j|: slopes per head (default), or\n"
    "                             per batch and head (check and demo only)\n"
    "  --sinks                    a sink logit per head in every row's softmax\n"
    "  --score-mod EXPR           each score rewritten: 's + bias[h, q - k + seqlen_k - 1]'\n"
    "  --mask-mod EXPR            keys hidden where false: 'doc[q] == doc[k]'\n"
    "  --aux NAME:TYPE:SIZES      a tensor the expressions read, TYPE f32 or i32, SIZES such\n"
    "                             as 16x8191 (repeatable; check fills floats uniform in\n"
    "                             [-1, 1), one-index ints with 8 runs 0..7, others 0..7)\n"
    "                             (docs/expressions.md)\n"
    "  --varlen                   packed sequences of their own lengths\n"
    "  --kv-cache [latent]        a decoding step over a KV cache (forward only); latent:\n"
    "                             over a latent cache, K alone, V its first --head-dim-v\n"
    "                             columns (multi-head latent attention, -d 576\n"
    "                             --head-dim-v 512)\n";

static const char *target_help =
    "target options:\n"
    "  --target NAME              t4, a100, rtx3090, l4, h100 (repeatable); default: the live GPU\n"
    "  --all-targets              every named target\n";

/* The problem options; print_help fills in the command's defaults. */
static const char *problem_help_format =
    "problem options (launch arguments):\n"
    "  --batch N --heads N --kv-heads N   (default %d, %d, as many as --heads)\n"
    "  --seqlen N | --seqlen-q N --seqlen-k N   (default %d)\n"
    "  --layout bshd|bhsd         tensor layout (default bshd)\n"
    "  --align bottom-right|top-left   alignment of a causal or window mask\n"
    "                             (default bottom-right)\n"
    "  --window L,R               with --mask window: keys visible left and right of the\n"
    "                             diagonal, -1 unbounded (required)\n"
    "  --dropout-p P              with --dropout: the dropout probability (default 0)\n"
    "  --scale X                  softmax scale (default 1/sqrt(d))\n"
    "  --seed N                   inputs and dropout seed (default 1)\n"
    "  --density F                with --sparsity layout and no --mask-mod: kept fraction\n"
    "                             of a random layout (default 0.5)\n";

static const char *sequences_help =
    "with --varlen: a packed batch, each sequence checked against its own reference\n"
    "  --lengths L,L,...          the sequences' lengths, queries and keys alike, or Q:K\n"
    "                             for Q queries and K keys; their count is the batch\n"
    "                             (default: --batch sequences of lengths drawn from\n"
    "                             0..--seqlen-q and 0..--seqlen-k by --seed, one draw for\n"
    "                             both when the two are equal)\n"
    "with --kv-cache: a decoding step, --seqlen-q queries per sequence (default 1) over\n"
    "a cache of --seqlen-k rows per sequence (default 1000; with --cache-len, the most a\n"
    "sequence holds after the step)\n"
    "  --cache-len L,L,...        keys each sequence holds before the step; their count is\n"
    "                             the batch (default: --batch lengths drawn from\n"
    "                             0..--seqlen-k minus --new by --seed)\n"
    "  --new N                    rows each sequence appends, written into the cache by\n"
    "                             the step (default 0)\n"
    "  --page-size N              a pool of pages of N rows handed out in a shuffled order\n"
    "                             through a block table (default 0: a contiguous cache)\n"
    "  --splits N                 thread blocks sharing each sequence's keys (default 0:\n"
    "                             chosen from the GPU's size)\n";

static const char *offline_note =
    "\nplan, source and compile depend on the spec alone, so they take no problem\n"
    "options. They need no GPU: name a target. Options may be given as --opt=value.\n";

/* A command's FOR_ bit; 0 for none. */
static unsigned command_bit(const char *command) {
    for (int i = 0; i < (int)(sizeof command_names / sizeof command_names[0]); i++)
        if (strcmp(command, command_names[i]) == 0) return 1u << i;
    return 0;
}

/* What a command's options start from: its spec and problem before options
 * change them (the help prints them). */
static void set_defaults(unsigned bit, cli_options *o) {
    memset(o, 0, sizeof *o);
    o->spec = fg_spec_default(64, FG_FP16);
    o->spec.sparse_block_q = o->spec.sparse_block_k = 64;
    o->spec.butterfly_factors = 2;
    fgh_shape *sh = &o->problem.shape;
    sh->batch = 2, sh->heads_q = 8, sh->heads_kv = 0, sh->seqlen_q = DEFAULT_SEQLEN, sh->seqlen_k = 0;
    sh->window_left = sh->window_right = -1;
    sh->seed = 1;
    o->problem.layout_density = 0.5;
    o->repeats = 20;
    if (bit == FOR_DEMO) { /* the demo's own problem */
        o->spec.dtype = FG_BF16, o->spec.head_dim = 128, o->spec.mask = FG_MASK_CAUSAL;
        sh->batch = 4, sh->heads_q = 16, sh->seqlen_q = 2048;
    }
}

static void print_help(const char *command) {
    cli_options d;
    set_defaults(command_bit(command), &d);
    const fgh_shape *dsh = &d.problem.shape;
    char spec_help[2048], problem_help[2048];
    snprintf(spec_help, sizeof spec_help, spec_help_format, dtype_names[d.spec.dtype],
             d.spec.head_dim, mask_names[d.spec.mask]);
    snprintf(problem_help, sizeof problem_help, problem_help_format, dsh->batch, dsh->heads_q,
             dsh->seqlen_q);
    if (strcmp(command, "plan") == 0) {
        printf("usage: flashgen plan [spec options] [--backward | --block-mask] [target options]\n\n"
               "Shows the plan of the kernel that runs (tiles, warps, shared memory) and how it\n"
               "was derived. The kernel is compiled, or found in the cache, so a re-plan after\n"
               "ptxas spills is shown; where NVRTC cannot be loaded the derived plan is shown\n"
               "with a note that compiling may change it. On a GPU, choices kept by\n"
               "'flashgen tune' replace it for the lengths they were tuned at.\n\n"
               "%s  --backward                 the backward's plan (default: the forward's)\n"
               "  --block-mask               the build of the spec's block mask (--sparsity layout\n"
               "                             and --mask-mod)\n\n%s%s",
               spec_help, target_help, offline_note);
    } else if (strcmp(command, "source") == 0 || strcmp(command, "compile") == 0) {
        int source = command[0] == 's';
        printf("usage: flashgen %s [spec options] [--backward | --block-mask] [target options]\n\n%s\n\n"
               "%s  --backward                 the backward's kernels (default: the forward's)\n"
               "  --block-mask               the build of the spec's block mask (--sparsity layout\n"
               "                             and --mask-mod)\n\n"
               "%s%s",
               command,
               source ? "Prints the generated CUDA source of the derived plan, one target after\n"
                        "another. If ptxas spills with it, compiling re-plans with smaller tiles:\n"
                        "'flashgen plan' shows the kernel that runs."
                      : "Compiles into the kernel cache and reports registers, spills, stack and\n"
                        "shared memory per target. Exits 1 if a kernel spills.",
               spec_help, target_help, offline_note);
    } else if (strcmp(command, "check") == 0) {
        printf("usage: flashgen check [spec options] [--backward [--deterministic]] [problem options]\n\n"
               "Runs one problem on the live GPU and compares O and the log-sum-exp with the\n"
               "fp64 reference; the error must be at most twice the naive input-precision one.\n"
               "--backward also runs the backward and compares dQ, dK and dV with the fp64\n"
               "gradients (at most 3x the naive error); --deterministic uses the reproducible\n"
               "schedule and checks two runs are bitwise identical. With --alibi the slopes\n"
               "are 2^(-8(h+1)/H) (times 1 + b/4 in batch b with --alibi batch), with --sinks\n"
               "the sink of head h is 0.5 + h %% 4, and --backward checks the sinks' gradient\n"
               "too. Needs a GPU (FLASHGEN_DEVICE picks which, default 0).\n\n"
               "%s\n%s\n%s",
               spec_help, problem_help, sequences_help);
    } else if (strcmp(command, "bench") == 0) {
        printf("usage: flashgen bench [--backward] [--quick] [--head-dim N] [--head-dim-v N]\n"
               "                      [--seqlen N] [--csv] [--repeats N] [--tuned]\n"
               "       flashgen bench --philox [--quick] [--head-dim N] [--seqlen N] [--repeats N]\n"
               "       flashgen bench --variants [--quick] [--head-dim N] [--head-dim-v N]\n"
               "                      [--seqlen N] [--csv] [--repeats N]\n"
               "       flashgen bench --varlen [--backward] [--quick] [--head-dim N]\n"
               "                      [--head-dim-v N] [--seqlen N] [--repeats N]\n"
               "       flashgen bench --kv-cache [--page-size N] [--splits N] [--quick]\n"
               "                      [--head-dim N] [--seqlen N] [--repeats N]\n\n"
               "bf16 forward TFLOP/s for head dims 64, 128, 256 and sequence lengths 512..16384\n"
               "at 16k tokens and hidden size 2048, causal and not, dropout 0 and 0.1; then\n"
               "cold / disk-warm / memory-warm compile times and the host overhead of a call.\n"
               "Needs a GPU.\n"
               "--backward: forward+backward instead (3.5x the forward's FLOPs), fast and\n"
               "deterministic schedules, with the backward alone beside it.\n"
               "--quick: head dim 128 and lengths 2048 and 8192 only; --head-dim (-d) and\n"
               "--seqlen pick one head dim or length. --head-dim-v N: the value head dim (V,\n"
               "O, dO, dV) N with each head dim d; the d column shows d/N, --csv adds a\n"
               "head_dim_v column, and a forward's FLOPs are 2*B*H*Sq*Sk*(d + N) (4*...*d\n"
               "without it), halved for causal. --csv: machine-readable rows.\n"
               "--repeats N: timed runs per shape (default 20).\n"
               "--tuned: tune each shape first (flashgen tune; with --backward, the backward)\n"
               "and add its time with the tuned plan beside the derived plan's.\n"
               "--variants: the logits' variants (softcap 50, ALiBi, sinks, all three) beside\n"
               "the plain kernel, causal and not, forward and forward+backward, as ratios of\n"
               "the plain kernel's time (--quick: d 128 and 256, lengths 2048 and 8192).\n"
               "--philox: what dropout's random numbers cost on this GPU. Times the MMAs of\n"
               "the forward's key tiles alone, their Philox4x32-10 calls alone, and both in\n"
               "the same warps; then, per shape, dropout's measured cost beside the time the\n"
               "shape's Philox calls take alone, which is its cost where they overlap nothing.\n"
               "It goes with --quick, --head-dim, --seqlen and --repeats only.\n"
               "--varlen: packed sequences, bf16, 64 sequences of lengths drawn from 128..8192\n"
               "(--seqlen sets the longest; --quick: 16 sequences), 16 heads, d 128, causal and\n"
               "not; TFLOP/s over the real work (4*L*L*H*d per sequence, 2*L*L*H*(d + N)\n"
               "with --head-dim-v N, halved for causal)\n"
               "beside the dense kernel on as many sequences of the mean length. --backward\n"
               "adds forward+backward (3.5x the forward's FLOPs).\n"
               "--kv-cache: decoding steps, bf16, d 128, 32 query heads on 8 KV heads, one\n"
               "query per sequence, batch 1, 4, 16, 64 and contexts 1024..131072 (--quick:\n"
               "batch 1, 8, 64 and contexts 4096, 131072; --seqlen: one context) up to 4M\n"
               "tokens, in pages of 16, 256 and 1 rows handed out shuffled and in a contiguous\n"
               "cache (--page-size N: pages of N rows only, 0 the contiguous cache; contexts\n"
               "the page size does not divide are left out); KV bytes read per second (K and V\n"
               "of every sequence once) and their share of a device-to-device copy's bandwidth\n"
               "(read + write) measured in the same run. --splits N: thread blocks per\n"
               "sequence (default chosen). Calls are timed back to back. --kv-cache latent:\n"
               "the same over a latent cache (d 576, value head dim 512, 16 query heads on\n"
               "one), bytes read counting the cache's rows once.\n");
    } else if (strcmp(command, "tune") == 0) {
        printf("usage: flashgen tune [spec options] [--backward] [--standard] [--seqlens N,N,...]\n"
               "                     [--show]\n\n"
               "Times tilings around the derived forward plan (--backward: the backward's,\n"
               "fast schedule) on this GPU for each sequence-length bucket and keeps one only\n"
               "if it beats the derived plan by more than the measured run-to-run spread;\n"
               "later calls of the spec use the choice with no timing. Choices are kept in\n"
               "tuning.tsv in the kernel cache folder, per GPU, pass, spec and bucket, and\n"
               "driver and NVRTC. FLASHGEN_TUNING=off makes calls ignore them. Needs a GPU.\n\n"
               "  --standard      the benchmark's specs (bf16, d 64/128/256, causal or not,\n"
               "                  dropout or not) instead of spec options\n"
               "  --seqlens LIST  lengths whose buckets to tune (default 512,...,16384)\n"
               "  --show          print the choices kept, without timing\n\n%s",
               spec_help);
    } else if (strcmp(command, "demo") == 0) {
        printf("usage: flashgen demo [spec options] [problem options]\n\n"
               "With a GPU: compile, run and check a problem against the fp64 reference and\n"
               "print its speed; by default %s, d=%d, %s, batch %d, %d heads, %d\n"
               "tokens, and options change that. Without one: plan and compile a fixed set\n"
               "of specs for every named target and print plans and resources (options are\n"
               "then refused). Either way it says where the kernel cache is.\n\n%s\n%s",
               dtype_names[d.spec.dtype], d.spec.head_dim, mask_names[d.spec.mask], dsh->batch,
               dsh->heads_q, dsh->seqlen_q, spec_help, problem_help);
    }
}

/* ---- values ---- */

static int whole(const cli_arg *a, long long lo, long long hi, int *out) {
    char *end;
    errno = 0;
    long long v = strtoll(a->value, &end, 10);
    if (a->value[0] == '\0' || *end != '\0' || errno != 0) {
        cli_error("%s: '%s' is not a whole number", a->typed, a->value);
        return -1;
    }
    if (v < lo || v > hi) {
        cli_error("%s: must be in %lld..%lld", a->typed, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int real(const cli_arg *a, double *out) {
    char *end;
    double v = strtod(a->value, &end);
    if (a->value[0] == '\0' || *end != '\0' || !isfinite(v)) {
        cli_error("%s: '%s' is not a number", a->typed, a->value);
        return -1;
    }
    *out = v;
    return 0;
}

/* "L,R" or "QxK": two whole numbers around sep. */
static int pair(const cli_arg *a, char sep, const char *form, int *x, int *y) {
    char fmt[16], tail;
    snprintf(fmt, sizeof fmt, "%%d%c%%d%%c", sep);
    if (sscanf(a->value, fmt, x, y, &tail) != 2) {
        cli_error("%s: expected %s", a->typed, form);
        return -1;
    }
    return 0;
}

/* "N,N,..." into x, at most `most` lengths in lo..MAX_SEQLEN; with y, an
 * item may be "Q:K" (x Q, y K), and N puts N in both. */
static int length_list(const cli_arg *a, int lo, int most, int *x, int *y, int *count) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", a->value) >= (int)sizeof buf) {
        cli_error("%s: list too long", a->typed);
        return -1;
    }
    *count = 0;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (*count == most) {
            cli_error("%s: at most %d lengths", a->typed, most);
            return -1;
        }
        char *colon = y ? strchr(item, ':') : NULL;
        if (colon) *colon = '\0';
        cli_arg one = *a;
        one.value = item;
        if (whole(&one, lo, MAX_SEQLEN, &x[*count]) != 0) return -1;
        one.value = colon ? colon + 1 : item;
        if (y && whole(&one, lo, MAX_SEQLEN, &y[*count]) != 0) return -1;
        (*count)++;
    }
    if (*count == 0) {
        cli_error("%s: no lengths", a->typed);
        return -1;
    }
    return 0;
}

static int one_of(const char *text, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(text, names[i]) == 0) return 1;
    return 0;
}

/* One option's value into o. 0, or -1 after a message. */
static int take_value(opt id, const cli_arg *a, cli_options *o) {
    static const char *const sparsities[] = {"none", "layout", "butterfly"};
    static const char *const layouts[] = {"bshd", "bhsd"};
    static const char *const aligns[] = {"bottom-right", "top-left"};
    cli_problem *p = &o->problem;
    fgh_shape *sh = &p->shape;
    int n, rc = 0;
    double x;
    switch (id) {
    case O_DTYPE:
        if ((n = cli_enum(a, dtype_names, 2)) < 0) return -1;
        o->spec.dtype = (fg_dtype)n;
        return 0;
    case O_MASK:
        if ((n = cli_enum(a, mask_names, 3)) < 0) return -1;
        o->spec.mask = (fg_mask)n;
        return 0;
    case O_SPARSITY:
        if ((n = cli_enum(a, sparsities, 3)) < 0) return -1;
        o->spec.sparsity = (fg_sparsity)n;
        return 0;
    case O_LAYOUT:
        if ((n = cli_enum(a, layouts, 2)) < 0) return -1;
        p->bhsd = n;
        return 0;
    case O_ALIGN:
        if ((n = cli_enum(a, aligns, 2)) < 0) return -1;
        sh->align = (fg_causal_align)n;
        return 0;
    case O_HEAD_DIM:
        o->head_dim_given = 1;
        return whole(a, -2147483647LL, 2147483647LL, &o->spec.head_dim); /* range: the spec's */
    case O_HEAD_DIM_V:
        /* the spec's 0 (the head dim's) is the option left out, so refused here */
        if (whole(a, -2147483647LL, 2147483647LL, &n) != 0) return -1;
        if (n < 1 || n > 512) { /* above 256 for a latent cache only: the spec says */
            cli_error("%s: %d is outside 1..256 (1..512 with --kv-cache latent)", a->typed, n);
            return -1;
        }
        o->spec.head_dim_v = n;
        return 0;
    case O_FACTORS: return whole(a, -2147483647LL, 2147483647LL, &o->spec.butterfly_factors);
    case O_SPARSE_BLOCK:
        return pair(a, 'x', "QxK, e.g. 64x64", &o->spec.sparse_block_q, &o->spec.sparse_block_k);
    case O_SCORE_MOD: o->spec.score_mod = a->value; return 0; /* checked with the spec */
    case O_MASK_MOD: o->spec.mask_mod = a->value; return 0;
    case O_AUX: return cli_aux_parse(a->value, &o->spec, sh);
    case O_SOFTCAP:
        if (real(a, &x) != 0) return -1;
        if (!(x > 0) || !isfinite((float)x) || (float)x == 0.0f) {
            cli_error("%s: the cap must be a positive number", a->typed);
            return -1;
        }
        o->spec.softcap = 1;
        sh->softcap = (float)x;
        return 0;
    case O_KV_CACHE: /* a value only as typed: none is a KV cache */
        if (a->value && cli_enum(a, kv_cache_values, 1) < 0) return -1;
        o->spec.kv_cache = a->value ? FG_KV_LATENT : 1;
        return 0;
    case O_ALIBI: /* a value only as typed: none is per head */
        n = a->value ? cli_enum(a, alibi_values, 2) : 0;
        if (n < 0) return -1;
        o->spec.alibi = 1;
        sh->alibi_per_batch = n;
        return 0;
    case O_TARGET:
        if (!tools_target_cc(a->value)) {
            char valid[128];
            cli_error("%s: unknown target '%s'; valid: %s", a->typed, a->value,
                      cli_target_list(valid, sizeof valid));
            return -1;
        }
        if (o->target_count == 8) {
            cli_error("%s: at most 8 targets (--all-targets names every one)", a->typed);
            return -1;
        }
        o->targets[o->target_count++] = a->value;
        return 0;
    case O_BATCH: return whole(a, 1, 2147483647LL, &sh->batch);
    case O_HEADS: return whole(a, 1, 2147483647LL, &sh->heads_q);
    case O_KV_HEADS: return whole(a, 1, 2147483647LL, &sh->heads_kv);
    case O_SEQLEN:
        o->seqlen_given = 1;
        rc = whole(a, 1, MAX_SEQLEN, &sh->seqlen_q);
        sh->seqlen_k = sh->seqlen_q;
        return rc;
    case O_SEQLEN_Q: return whole(a, 1, MAX_SEQLEN, &sh->seqlen_q);
    case O_SEQLEN_K: return whole(a, 1, MAX_SEQLEN, &sh->seqlen_k);
    case O_WINDOW:
        if (pair(a, ',', "L,R, e.g. 128,0 (-1 unbounded)", &sh->window_left, &sh->window_right))
            return -1;
        if (sh->window_left < -1 || sh->window_right < -1) {
            cli_error("%s: sizes are 0 or more, or -1 for unbounded", a->typed);
            return -1;
        }
        return 0;
    case O_DROPOUT_P:
        if (real(a, &x) != 0) return -1;
        if (x < 0 || x > 1) {
            cli_error("%s: a probability is in [0, 1]", a->typed);
            return -1;
        }
        sh->dropout_p = (float)x;
        return 0;
    case O_SCALE:
        if (real(a, &x) != 0) return -1;
        if (!(x > 0) || !isfinite((float)x)) {
            cli_error("%s: the scale must be a positive number", a->typed);
            return -1;
        }
        sh->scale = (float)x;
        return 0;
    case O_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(a->value, &end, 10);
        if (a->value[0] < '0' || a->value[0] > '9' || *end != '\0' || errno != 0) {
            cli_error("%s: '%s' is not a whole number in 0..2^64-1", a->typed, a->value);
            return -1;
        }
        sh->seed = s;
        return 0;
    }
    case O_DENSITY:
        if (real(a, &p->layout_density) != 0) return -1;
        if (!(p->layout_density > 0 && p->layout_density <= 1)) {
            cli_error("%s: the kept fraction is in (0, 1]", a->typed);
            return -1;
        }
        return 0;
    case O_REPEATS: return whole(a, 1, 1000000, &o->repeats);
    case O_SEQLENS: return length_list(a, 1, 16, o->seqlens, NULL, &o->seqlen_count);
    case O_LENGTHS: return length_list(a, 0, CLI_MAX_SEQS, p->len_q, p->len_k, &p->length_count);
    case O_CACHE_LEN: return length_list(a, 0, CLI_MAX_SEQS, p->cached, NULL, &p->cached_count);
    case O_NEW: return whole(a, 0, MAX_SEQLEN, &p->seqlen_new);
    case O_PAGE_SIZE:
        o->page_size_given = 1;
        return whole(a, 0, MAX_SEQLEN, &p->page_size);
    case O_SPLITS: return whole(a, 0, MAX_SEQLEN, &p->splits);
    default: return -1;
    }
}

/* A flag into o. */
static void take_flag(opt id, cli_options *o) {
    switch (id) {
    case O_DROPOUT: o->spec.dropout = 1; break;
    case O_SINKS: o->spec.sinks = 1; break;
    case O_VARLEN: o->spec.varlen = 1; break;
    case O_BACKWARD: o->pass = FG_PASS_BACKWARD; break;
    case O_BLOCK_MASK: o->pass = FG_PASS_BLOCK_MASK; break;
    case O_DETERMINISTIC: o->deterministic = 1; break;
    case O_ALL_TARGETS: o->all_targets = 1; break;
    case O_CSV: o->csv = 1; break;
    case O_QUICK: o->quick = 1; break;
    case O_TUNED: o->tuned = 1; break;
    case O_PHILOX: o->philox = 1; break;
    case O_VARIANTS: o->variants = 1; break;
    case O_SHOW: o->show = 1; break;
    case O_STANDARD: o->standard = 1; break;
    default: break;
    }
}

/* ---- checks of the options together ---- */

_Static_assert(O_COUNT <= CLI_MAX_OPTIONS, "cli_options.typed holds every option");

void cli_spec_error(const cli_options *o, const char *where, const char *message) {
    static const struct {
        const char *field;
        opt id;
    } fields[] = {{"spec.dtype: ", O_DTYPE},
                  {"spec.head_dim: ", O_HEAD_DIM},
                  {"spec.head_dim_v: ", O_HEAD_DIM_V},
                  {"spec.sparse_block_q/k: ", O_SPARSE_BLOCK},
                  {"spec.butterfly_factors: ", O_FACTORS},
                  {"spec.softcap: ", O_SOFTCAP},
                  {"spec.alibi: ", O_ALIBI},
                  {"spec.sinks: ", O_SINKS},
                  {"spec.score_mod: ", O_SCORE_MOD},
                  {"spec.mask_mod: ", O_MASK_MOD},
                  {"spec.varlen: ", O_VARLEN},
                  {"spec.kv_cache: ", O_KV_CACHE}};
    const char *prefix = where ? where : "", *colon = where ? ": " : "";
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        size_t n = strlen(fields[i].field);
        if (strncmp(message, fields[i].field, n) == 0 && o->typed[fields[i].id][0]) {
            cli_error("%s%s%s: %s", prefix, colon, o->typed[fields[i].id], message + n);
            return;
        }
    }
    cli_error("%s%s%s", prefix, colon, message);
}

/* The spec through the library's own rules. */
static int check_spec(const cli_options *o, const fg_spec *spec) {
    char name[96], err[512];
    if (tools_spec_name(spec, name, sizeof name, err, sizeof err) == 0) return 0;
    cli_spec_error(o, NULL, err);
    return -1;
}

static int most_of(const int *x, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The options of packed sequences and of a KV cache. */
static int check_sequences(const cli_options *o, unsigned command) {
    const char(*typed)[128] = o->typed;
    const fg_spec *s = &o->spec;
    const cli_problem *p = &o->problem;
    if (s->kv_cache && o->pass == FG_PASS_BACKWARD) {
        cli_error("--kv-cache is a decoding step, forward only: it takes no --backward");
        return -1;
    }
    if (typed[O_LENGTHS][0] && !s->varlen) {
        cli_error("%s needs --varlen", typed[O_LENGTHS]);
        return -1;
    }
    static const opt cache_only[] = {O_CACHE_LEN, O_NEW, O_PAGE_SIZE, O_SPLITS};
    for (int i = 0; i < 4; i++)
        if (typed[cache_only[i]][0] && !s->kv_cache) {
            cli_error("%s needs --kv-cache", typed[cache_only[i]]);
            return -1;
        }
    const opt list = typed[O_LENGTHS][0] ? O_LENGTHS : O_CACHE_LEN;
    if (typed[list][0] && typed[O_BATCH][0]) {
        cli_error("%s and %s: the lengths listed are the batch", typed[O_BATCH], typed[list]);
        return -1;
    }
    static const opt maxima[] = {O_SEQLEN, O_SEQLEN_Q, O_SEQLEN_K};
    for (int i = 0; typed[O_LENGTHS][0] && i < 3; i++)
        if (typed[maxima[i]][0]) {
            cli_error("%s and %s: the longest of the lengths listed is the maximum",
                      typed[maxima[i]], typed[O_LENGTHS]);
            return -1;
        }
    if (s->kv_cache && command == FOR_CHECK) {
        if (typed[O_SEQLEN][0]) {
            cli_error("%s: a decoding step takes --seqlen-q (queries per sequence, default 1) and "
                      "--seqlen-k (the rows a sequence may hold)", typed[O_SEQLEN]);
            return -1;
        }
        int held = most_of(p->cached, p->cached_count) + p->seqlen_new;
        if (held > p->shape.seqlen_k) {
            if (p->cached_count)
                cli_error("%s: fewer rows than the %d keys a sequence holds after the step "
                          "(%s and %d new rows)", typed[O_SEQLEN_K], held, typed[O_CACHE_LEN],
                          p->seqlen_new);
            else
                cli_error("%s: more rows than the %d a sequence may hold (--seqlen-k)",
                          typed[O_NEW], p->shape.seqlen_k);
            return -1;
        }
    }
    static const opt table_options[] = {O_TUNED, O_CSV, O_PHILOX};
    for (int i = 0; command == FOR_BENCH && (s->varlen || s->kv_cache) && i < 3; i++)
        if (typed[table_options[i]][0]) {
            cli_error("bench %s has a table of its own: it takes no %s",
                      s->varlen ? "--varlen" : "--kv-cache", typed[table_options[i]]);
            return -1;
        }
    return 0;
}

/* Options that do not go with the others, or that would change nothing. */
static int check_together(const cli_options *o, unsigned command) {
    const char(*typed)[128] = o->typed;
    const fg_spec *s = &o->spec;
    const fgh_shape *sh = &o->problem.shape;
    if (typed[O_TARGET][0] && o->all_targets) {
        cli_error("%s and --all-targets: name targets, or all of them, not both", typed[O_TARGET]);
        return -1;
    }
    if (o->deterministic && o->pass != FG_PASS_BACKWARD) {
        cli_error("--deterministic picks the backward's schedule: it needs --backward");
        return -1;
    }
    if (typed[O_SPARSE_BLOCK][0] && s->sparsity == FG_SPARSE_NONE) {
        cli_error("%s needs --sparsity layout or butterfly", typed[O_SPARSE_BLOCK]);
        return -1;
    }
    if (typed[O_FACTORS][0] && s->sparsity != FG_SPARSE_BUTTERFLY) {
        cli_error("%s needs --sparsity butterfly", typed[O_FACTORS]);
        return -1;
    }
    if (o->standard)
        for (int i = O_DTYPE; i <= O_SINKS; i++)
            if (typed[i][0]) {
                cli_error("tune --standard tunes the benchmark's specs: it takes no %s", typed[i]);
                return -1;
            }
    if (sh->alibi_per_batch && !(command & FOR_PROBLEM)) {
        cli_error("%s: slopes per batch are launch arguments, and kernels do not depend on them: "
                  "give --alibi ('flashgen check' takes %s)", typed[O_ALIBI], typed[O_ALIBI]);
        return -1;
    }
    if (typed[O_BACKWARD][0] && typed[O_BLOCK_MASK][0]) {
        cli_error("%s and %s: one pass at a time", typed[O_BACKWARD], typed[O_BLOCK_MASK]);
        return -1;
    }
    static const opt not_with_variants[] = {O_BACKWARD, O_TUNED, O_PHILOX};
    for (int i = 0; o->variants && i < 3; i++)
        if (typed[not_with_variants[i]][0]) {
            cli_error("bench --variants times forward and forward+backward of each variant: it "
                      "takes no %s", typed[not_with_variants[i]]);
            return -1;
        }
    static const opt not_with_philox[] = {O_BACKWARD, O_TUNED, O_CSV, O_HEAD_DIM_V};
    for (int i = 0; o->philox && i < 4; i++)
        if (typed[not_with_philox[i]][0]) {
            cli_error("bench --philox times the forward's parts alone: it takes no %s",
                      typed[not_with_philox[i]]);
            return -1;
        }
    if (typed[O_SEQLEN][0] && (typed[O_SEQLEN_Q][0] || typed[O_SEQLEN_K][0])) {
        cli_error("%s and %s: --seqlen sets both lengths; give it, or --seqlen-q and --seqlen-k",
                  typed[O_SEQLEN], typed[typed[O_SEQLEN_Q][0] ? O_SEQLEN_Q : O_SEQLEN_K]);
        return -1;
    }
    if (command & FOR_PROBLEM) {
        if (s->mask == FG_MASK_WINDOW && !typed[O_WINDOW][0]) {
            cli_error("--mask window needs --window L,R (keys visible left and right of the "
                      "diagonal, -1 unbounded)");
            return -1;
        }
        if (typed[O_WINDOW][0] && s->mask != FG_MASK_WINDOW) {
            cli_error("%s needs --mask window", typed[O_WINDOW]);
            return -1;
        }
        if (typed[O_ALIGN][0] && s->mask == FG_MASK_NONE) {
            cli_error("%s aligns a causal or window mask: it needs --mask causal or window",
                      typed[O_ALIGN]);
            return -1;
        }
        if (typed[O_DROPOUT_P][0] && !s->dropout) {
            cli_error("%s needs --dropout (which compiles dropout in)", typed[O_DROPOUT_P]);
            return -1;
        }
        if (typed[O_DENSITY][0] && s->sparsity != FG_SPARSE_LAYOUT) {
            cli_error("%s needs --sparsity layout", typed[O_DENSITY]);
            return -1;
        }
        if (sh->heads_q % sh->heads_kv != 0) {
            if (typed[O_HEADS][0])
                cli_error("%s: %s is not a multiple of it", typed[O_KV_HEADS], typed[O_HEADS]);
            else
                cli_error("%s: the query heads (%d by default) are not a multiple of it",
                          typed[O_KV_HEADS], sh->heads_q);
            return -1;
        }
    }
    if (check_sequences(o, command) != 0) return -1;
    if ((command & FOR_SPEC) && !o->standard) return check_spec(o, s);
    if (command == FOR_BENCH &&
        (o->head_dim_given || typed[O_HEAD_DIM_V][0] || s->varlen || s->kv_cache)) {
        const int latent = s->kv_cache == FG_KV_LATENT; /* its dims set with the defaults */
        fg_spec b = fg_spec_default(o->head_dim_given || latent ? o->spec.head_dim : 128, FG_BF16);
        b.head_dim_v = s->head_dim_v;
        b.varlen = s->varlen, b.kv_cache = s->kv_cache;
        return check_spec(o, &b);
    }
    return 0;
}

/* Why an option the command does not take is refused. */
static void refuse(opt id, const char *typed, const char *command, unsigned bit) {
    if (id >= O_BATCH && id <= O_SPLITS && (bit & FOR_OFFLINE))
        cli_error("%s does not take %s: problem options are launch arguments, and kernels do "
                  "not depend on them ('flashgen check' takes them)",
                  command, typed);
    else if ((id == O_TARGET || id == O_ALL_TARGETS) && !(bit & FOR_OFFLINE))
        cli_error("%s does not take %s: it runs on the live GPU (FLASHGEN_DEVICE picks which); "
                  "plan, source and compile take targets",
                  command, typed);
    else
        cli_error("%s does not take %s (see 'flashgen %s --help')", command, typed, command);
}

int cli_parse(int argc, char **argv, const char *command, cli_options *o) {
    unsigned bit = command_bit(command);
    set_defaults(bit, o);
    cli_problem *p = &o->problem;
    fgh_shape *sh = &p->shape;
    char(*typed)[128] = o->typed;
    cli_args s = {argc, argv, 0};
    cli_arg a;
    while (cli_args_next(&s, &a)) {
        if (strcmp(a.name, "--help") == 0 || strcmp(a.name, "-h") == 0) {
            print_help(command);
            return 1;
        }
        int id = -1;
        for (int i = 0; i < O_COUNT && id < 0; i++)
            if (strcmp(a.name, defs[i].name) == 0 || (defs[i].alias && strcmp(a.name, defs[i].alias) == 0))
                id = i;
        if (id < 0) {
            if (a.name[0] == '-')
                cli_error("unknown option %s for %s (see 'flashgen %s --help')", a.name, command,
                          command);
            else
                cli_error("unexpected argument '%s' (see 'flashgen %s --help')", a.typed, command);
            return -1;
        }
        /* an optional value (--alibi's, --kv-cache's) is the next argument only when it
         * is one of its values */
        const int value =
            defs[id].takes_value == VALUE ||
            (defs[id].takes_value == MAYBE_VALUE &&
             (a.inline_value ||
              (s.next < s.argc && (id == O_ALIBI ? one_of(s.argv[s.next], alibi_values, 2)
                                                 : one_of(s.argv[s.next], kv_cache_values, 1)))));
        if (!(defs[id].commands & bit)) {
            if (value && !a.inline_value && s.next < s.argc)
                cli_args_value(&s, &a); /* to name it as typed */
            refuse((opt)id, a.typed, command, bit);
            return -1;
        }
        /* an expression is spaced as its writer likes */
        const int spaced = id == O_SCORE_MOD || id == O_MASK_MOD;
        if (value && (!cli_args_value(&s, &a) || (!spaced && cli_arg_unspaced(&a) != 0))) return -1;
        if (typed[id][0] && id != O_TARGET && id != O_AUX) { /* which one counts would be a guess */
            cli_error("%s and %s: the same option twice; give it once", typed[id], a.typed);
            return -1;
        }
        if (defs[id].takes_value != FLAG ? take_value((opt)id, &a, o) != 0 : cli_arg_flag(&a) != 0)
            return -1;
        if (defs[id].takes_value == FLAG) take_flag((opt)id, o);
        snprintf(typed[id], sizeof typed[id], "%s", a.typed);
        o->given++;
    }
    if (o->spec.kv_cache == FG_KV_LATENT) { /* DeepSeek's latent attention unless told */
        if (!o->head_dim_given) o->spec.head_dim = 576;
        if (!typed[O_HEAD_DIM_V][0]) o->spec.head_dim_v = 512;
        if (!typed[O_HEADS][0]) sh->heads_q = 16;
        if (!typed[O_KV_HEADS][0]) sh->heads_kv = 1;
    }
    if (sh->heads_kv == 0) sh->heads_kv = sh->heads_q;
    if (sh->seqlen_k == 0) sh->seqlen_k = sh->seqlen_q;
    if (p->length_count) { /* the longest listed */
        sh->batch = p->length_count;
        sh->seqlen_q = most_of(p->len_q, p->length_count);
        sh->seqlen_k = most_of(p->len_k, p->length_count);
    }
    if (o->spec.kv_cache && bit == FOR_CHECK) { /* a decoding step's own defaults */
        if (!typed[O_SEQLEN_Q][0]) sh->seqlen_q = 1;
        if (p->cached_count) sh->batch = p->cached_count;
        int held = most_of(p->cached, p->cached_count) + p->seqlen_new;
        if (!typed[O_SEQLEN_K][0]) sh->seqlen_k = !p->cached_count ? DEFAULT_SEQLEN : held > 0 ? held : 1;
    }
    return check_together(o, bit) == 0 ? 0 : -1;
}
