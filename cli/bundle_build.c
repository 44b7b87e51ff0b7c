/* flashgen bundle build: precompiled kernel bundles to ship.
 *
 * It forks worker processes (one per core by default). Each takes the next
 * job index from a counter in shared memory, compiles it through its own
 * offline contexts (one per target) set to save every step into the bundle,
 * and sends its manifest lines and a progress line up one pipe; the parent
 * prints progress, collects the lines and writes the manifest last. Processes
 * rather than threads because NVRTC compiles one program per thread at a
 * time at best, and a crash in one compile then costs only that worker. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "runtime/tools.h"

#define MAX_TARGETS 8
#define MAX_STEPS 16 /* kernels one job may save: the kept ones and their spilled steps */

static const char *build_help =
    "usage: flashgen bundle build --out DIR --all [-j N]\n"
    "       flashgen bundle build --out DIR [--target NAME ... | --all-targets]\n"
    "                             [--head-dims LIST] [--head-dims-v LIST] [--dtypes LIST]\n"
    "                             [--masks LIST] [--dropout both|on|off] [--passes LIST]\n"
    "                             [--sparsity LIST] [--sparse-blocks LIST]\n"
    "                             [--butterfly-factors LIST] [--softcap both|on|off]\n"
    "                             [--alibi both|on|off] [--sinks both|on|off] [-j N]\n"
    "\n"
    "Compiles every combination of the options into DIR, a bundle to ship:\n"
    "DIR/<target>/<key>.fgc entries (target as NVRTC names it, e.g. sm_90) in the\n"
    "kernel cache's file format and DIR/manifest.tsv (pass, spec, kernel, plan,\n"
    "target, key, sha256, generator and NVRTC versions, format), written last.\n"
    "Needs NVRTC, no GPU. The user's kernel cache is neither read nor written.\n"
    "Options left out take their defaults, below; to build with no option choosing\n"
    "kernels, which is every default, say --all.\n"
    "\n"
    "  --out DIR          the bundle folder (created; entries already there are replaced)\n"
    "  --all              every default: all targets, head dims, dtypes, masks, dropout\n"
    "                     and passes (thousands of kernels, tens of minutes)\n"
    "  --target NAME      t4, rtx3090, a100, l4, h100 (repeatable); default: all of them\n"
    "  --all-targets      every named target\n"
    "  --head-dims LIST   head dims: N, FIRST:LAST or FIRST:LAST:STEP, comma-separated\n"
    "                     (default 8:256:8)\n"
    "  --head-dims-v LIST value head dims (V, O, dO, dV) in the same form, each with\n"
    "                     each head dim (default: the head dim's own; a pair of equal\n"
    "                     dims is the spec without one)\n"
    "  --dtypes LIST      fp16,bf16 (default both; a target that cannot run one, bf16 on\n"
    "                     t4, skips it with a note)\n"
    "  --masks LIST       none,causal,window (default all three)\n"
    "  --dropout WHICH    both, on or off (default both)\n"
    "  --passes LIST      forward,backward (default both)\n"
    "  --sparsity LIST    none,layout,butterfly (default none)\n"
    "  --sparse-blocks LIST  block sizes QxK of the sparse kinds, e.g. 64x64,128x64\n"
    "                     (default 64x64)\n"
    "  --butterfly-factors LIST  factor counts of the butterfly kind (default 2)\n"
    "  --softcap WHICH    the scores' cap compiled in: both, on or off (default off)\n"
    "  --alibi WHICH      ALiBi's bias: both, on or off (default off)\n"
    "  --sinks WHICH      a sink per head: both, on or off (default off)\n"
    "  --score-mod EXPR, --mask-mod EXPR, --aux NAME:TYPE:SIZES\n"
    "                     expressions every kernel of the bundle takes (docs/expressions.md)\n"
    "  -j N, --jobs N     worker processes (default: one per core)\n"
    "\n"
    "Programs find the bundle through FLASHGEN_BUNDLE_PATH or fg_context_add_bundle.\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- options ---- */

typedef struct build_options {
    const char *out;
    cli_arg all;    /* --all as given; .text NULL when not */
    cli_arg chosen; /* the first option that chooses kernels, as given; .text NULL when none */
    int targets[MAX_TARGETS]; /* indices into the named profiles */
    int target_count;
    int head_dims[256];
    int head_dim_count;
    int head_dims_v[256]; /* 0: the head dim's own */
    int head_dim_v_count;
    int dtypes[2], dtype_count;
    int masks[3], mask_count;
    int dropouts[2], dropout_count;
    int logits[3][2], logit_count[3]; /* the scores' variants: softcap, alibi, sinks; 0 and/or 1 */
    int passes[2], pass_count;
    int sparsities[3], sparsity_count;
    int sparse_blocks[16][2], sparse_block_count; /* (q, k) */
    int factors[31], factor_count;
    fg_spec exprs;     /* --score-mod, --mask-mod, --aux: given to every kernel */
    fgh_shape unused;  /* --aux's sizes (a bundle holds kernels, not tensors) */
    int workers;
} build_options;

static int add_unique(int *list, int *count, int max, int v) {
    for (int i = 0; i < *count; i++)
        if (list[i] == v) return 0;
    if (*count == max) return -1;
    list[(*count)++] = v;
    return 0;
}

static int parse_int_text(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    return 0;
}

/* "8:256:8", "64,128", "8:64:8,96": each item N, FIRST:LAST or FIRST:LAST:STEP,
 * into dims (--head-dims, --head-dims-v). */
static int parse_head_dims(const char *text, int *dims, int *count) {
    char buf[512];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    *count = 0;
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        char *second = strchr(item, ':'), *third = NULL;
        if (second) {
            *second++ = '\0';
            if ((third = strchr(second, ':')) != NULL) *third++ = '\0';
        }
        int first, last, step = 8; /* a fourth part fails to parse as a number */
        if (parse_int_text(item, &first) != 0) return -1;
        last = first;
        if (second && parse_int_text(second, &last) != 0) return -1;
        if (third && parse_int_text(third, &step) != 0) return -1;
        if (first < 1 || last > 256 || first > last || step < 1) return -1;
        for (int d = first; d <= last; d += step)
            if (add_unique(dims, count, 256, d) != 0) return -1;
    }
    return *count > 0 ? 0 : -1;
}

/* "64x64,128x64": sparse block sizes. */
static int parse_blocks(const char *text, build_options *o) {
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    o->sparse_block_count = 0;
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        int q, k;
        char tail;
        if (sscanf(item, "%dx%d%c", &q, &k, &tail) != 2 || o->sparse_block_count == 16) return -1;
        o->sparse_blocks[o->sparse_block_count][0] = q;
        o->sparse_blocks[o->sparse_block_count++][1] = k;
    }
    return o->sparse_block_count > 0 ? 0 : -1;
}

/* "1,2,3": butterfly factor counts. */
static int parse_factors(const char *text, build_options *o) {
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    o->factor_count = 0;
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        int f;
        if (parse_int_text(item, &f) != 0 || add_unique(o->factors, &o->factor_count, 31, f) != 0)
            return -1;
    }
    return o->factor_count > 0 ? 0 : -1;
}

/* "both", "on" or "off" into the values 0 and/or 1; -1 for anything else. */
static int parse_which(const char *text, int out[2], int *count) {
    *count = 0;
    if (strcmp(text, "both") == 0 || strcmp(text, "off") == 0) out[(*count)++] = 0;
    if (strcmp(text, "both") == 0 || strcmp(text, "on") == 0) out[(*count)++] = 1;
    return *count > 0 ? 0 : -1;
}

/* A comma-separated list of names into their indices. */
static int parse_names(const char *text, const char *const *names, int name_count, int *out,
                       int *count) {
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf) return -1;
    *count = 0;
    for (char *item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
        int found = -1;
        for (int i = 0; i < name_count; i++)
            if (strcmp(item, names[i]) == 0) found = i;
        if (found < 0 || add_unique(out, count, name_count, found) != 0) return -1;
    }
    return *count > 0 ? 0 : -1;
}

static int target_index(const char *name) {
    for (int i = 0; i < tools_target_count(); i++)
        if (strcmp(tools_target_name(i), name) == 0) return i;
    return -1;
}

/* Returns 0, 1 after --help, or -1 after an error was printed. */
static int parse_build(int argc, char **argv, build_options *o) {
    static const char *const dtypes[] = {"fp16", "bf16"};
    static const char *const masks[] = {"none", "causal", "window"};
    static const char *const passes[] = {"forward", "backward"};
    static const char *const sparsities[] = {"none", "layout", "butterfly"};
    memset(o, 0, sizeof *o);
    o->sparsities[0] = FG_SPARSE_NONE, o->sparsity_count = 1;
    o->sparse_blocks[0][0] = o->sparse_blocks[0][1] = 64, o->sparse_block_count = 1;
    o->factors[0] = 2, o->factor_count = 1;
    parse_head_dims("8:256:8", o->head_dims, &o->head_dim_count);
    o->head_dims_v[0] = 0, o->head_dim_v_count = 1;
    o->dtypes[0] = FG_FP16, o->dtypes[1] = FG_BF16, o->dtype_count = 2;
    o->masks[0] = FG_MASK_NONE, o->masks[1] = FG_MASK_CAUSAL, o->masks[2] = FG_MASK_WINDOW;
    o->mask_count = 3;
    o->dropouts[0] = 0, o->dropouts[1] = 1, o->dropout_count = 2;
    for (int v = 0; v < 3; v++) o->logits[v][0] = 0, o->logit_count[v] = 1;
    o->passes[0] = FG_PASS_FORWARD, o->passes[1] = FG_PASS_BACKWARD, o->pass_count = 2;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->workers = cores > 0 ? (int)cores : 1;
    static const char *const dropouts[] = {"both", "on", "off"};
    int all = 0;
    cli_arg blocks = {0}, factors = {0}, target = {0}; /* as given, to name them */
    cli_args s = {argc, argv, 0};
    cli_arg arg, *a = &arg;
    cli_seen seen = {0};
    while (cli_args_next(&s, a)) {
        const char *name = a->name, *v;
        char valid[128] = "";
        int bad = 0;
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            fputs(build_help, stdout);
            return 1;
        }
        if (strcmp(name, "--all-targets") == 0 || strcmp(name, "--all") == 0) {
            if (cli_arg_flag(a) != 0 || cli_once(&seen, name, a) != 0) return -1;
            if (strcmp(name, "--all") == 0) {
                o->all = *a;
                continue;
            }
            all = 1;
            if (!o->chosen.text) o->chosen = *a;
            continue;
        }
        if (name[0] != '-') {
            cli_error("bundle build: unexpected argument '%s' (see 'flashgen bundle build --help')",
                      a->text);
            return -1;
        }
        if (!cli_args_value(&s, a)) return -1;
        v = a->value;
        /* each option once (--target and --aux are repeatable); no white space in a value but
         * a path's and an expression's */
        const int expr = strcmp(name, "--score-mod") == 0 || strcmp(name, "--mask-mod") == 0;
        if ((strcmp(name, "--target") != 0 && strcmp(name, "--aux") != 0 &&
             cli_once(&seen, strcmp(name, "-j") == 0 ? "--jobs" : name, a) != 0) ||
            (strcmp(name, "--out") != 0 && !expr && cli_arg_unspaced(a) != 0))
            return -1;
        if (strcmp(name, "--out") != 0 && strcmp(name, "-j") != 0 && strcmp(name, "--jobs") != 0 &&
            !o->chosen.text)
            o->chosen = *a; /* an option that chooses kernels */
        if (strcmp(name, "--out") == 0) {
            o->out = v;
        } else if (strcmp(name, "--target") == 0) {
            int t = target_index(v);
            bad = t < 0 || add_unique(o->targets, &o->target_count, MAX_TARGETS, t) != 0;
            cli_target_list(valid, sizeof valid);
            target = *a;
        } else if (strcmp(name, "--head-dims") == 0 || strcmp(name, "--head-dims-v") == 0) {
            const int value = strcmp(name, "--head-dims-v") == 0;
            bad = parse_head_dims(v, value ? o->head_dims_v : o->head_dims,
                                  value ? &o->head_dim_v_count : &o->head_dim_count) != 0;
            snprintf(valid, sizeof valid, "N, FIRST:LAST or FIRST:LAST:STEP in 1..256, comma-separated");
        } else if (strcmp(name, "--dtypes") == 0) {
            bad = parse_names(v, dtypes, 2, o->dtypes, &o->dtype_count) != 0;
            cli_list(dtypes, 2, valid, sizeof valid);
        } else if (strcmp(name, "--masks") == 0) {
            bad = parse_names(v, masks, 3, o->masks, &o->mask_count) != 0;
            cli_list(masks, 3, valid, sizeof valid);
        } else if (strcmp(name, "--passes") == 0) {
            bad = parse_names(v, passes, 2, o->passes, &o->pass_count) != 0;
            cli_list(passes, 2, valid, sizeof valid);
        } else if (strcmp(name, "--sparsity") == 0) {
            bad = parse_names(v, sparsities, 3, o->sparsities, &o->sparsity_count) != 0;
            cli_list(sparsities, 3, valid, sizeof valid);
        } else if (strcmp(name, "--sparse-blocks") == 0) {
            bad = parse_blocks(v, o) != 0;
            snprintf(valid, sizeof valid, "QxK sizes, comma-separated, e.g. 64x64,128x64");
            blocks = *a;
        } else if (strcmp(name, "--butterfly-factors") == 0) {
            bad = parse_factors(v, o) != 0;
            snprintf(valid, sizeof valid, "factor counts, comma-separated, e.g. 1,2,3");
            factors = *a;
        } else if (strcmp(name, "--dropout") == 0) {
            bad = parse_which(v, o->dropouts, &o->dropout_count) != 0;
            cli_list(dropouts, 3, valid, sizeof valid);
        } else if (strcmp(name, "--softcap") == 0 || strcmp(name, "--alibi") == 0 ||
                   strcmp(name, "--sinks") == 0) {
            int which = name[2] == 's' ? (name[3] == 'o' ? 0 : 2) : 1;
            bad = parse_which(v, o->logits[which], &o->logit_count[which]) != 0;
            cli_list(dropouts, 3, valid, sizeof valid);
        } else if (expr) {
            *(name[2] == 's' ? &o->exprs.score_mod : &o->exprs.mask_mod) = v; /* checked per spec */
        } else if (strcmp(name, "--aux") == 0) {
            if (cli_aux_parse(v, &o->exprs, &o->unused) != 0) return -1;
        } else if (strcmp(name, "-j") == 0 || strcmp(name, "--jobs") == 0) {
            bad = parse_int_text(v, &o->workers) != 0 || o->workers < 1 || o->workers > 1024;
            snprintf(valid, sizeof valid, "1..1024");
        } else {
            /* the spec commands' single head dims, where a bundle takes lists */
            const int single = strcmp(name, "-d") == 0 || strcmp(name, "--head-dim") == 0 ||
                               strcmp(name, "--head-dim-v") == 0;
            cli_error("bundle build: unknown option %s%s (see 'flashgen bundle build --help')", name,
                      single ? "; it takes lists, --head-dims and --head-dims-v" : "");
            return -1;
        }
        if (bad) {
            cli_error("bundle build: %s: bad value; valid: %s", a->typed, valid);
            return -1;
        }
    }
    if (!o->out || !o->out[0]) {
        cli_error("bundle build: --out DIR is required (see 'flashgen bundle build --help')");
        return -1;
    }
    if (o->all.text && o->chosen.text) {
        cli_error("bundle build: --all and %s: --all builds every default; choose with options, "
                  "or say --all alone", o->chosen.typed);
        return -1;
    }
    if (all && target.text) {
        cli_error("bundle build: %s and --all-targets: name targets, or all of them, not both",
                  target.typed);
        return -1;
    }
    int sparse = 0, butterfly = 0;
    for (int i = 0; i < o->sparsity_count; i++) {
        sparse |= o->sparsities[i] != FG_SPARSE_NONE;
        butterfly |= o->sparsities[i] == FG_SPARSE_BUTTERFLY;
    }
    if (blocks.text && !sparse) {
        cli_error("bundle build: %s needs --sparsity layout or butterfly", blocks.typed);
        return -1;
    }
    if (factors.text && !butterfly) {
        cli_error("bundle build: %s needs --sparsity butterfly", factors.typed);
        return -1;
    }
    if (all || o->target_count == 0) {
        o->target_count = 0;
        for (int t = 0; t < tools_target_count() && t < MAX_TARGETS; t++)
            o->targets[o->target_count++] = t;
    }
    return 0;
}

/* ---- jobs ---- */

typedef struct job {
    int target;
    fg_pass pass;
    fg_spec spec;
} job;

/* The sparsity settings asked for: none once, a layout per block size, a
 * butterfly per block size and factor count. Returns the count. */
static int sparse_variants(const build_options *o, fg_spec *out, int max) {
    int n = 0;
    for (int i = 0; i < o->sparsity_count; i++) {
        fg_sparsity kind = (fg_sparsity)o->sparsities[i];
        int blocks = kind == FG_SPARSE_NONE ? 1 : o->sparse_block_count;
        int factors = kind == FG_SPARSE_BUTTERFLY ? o->factor_count : 1;
        for (int b = 0; b < blocks; b++)
            for (int f = 0; f < factors && n < max; f++) {
                fg_spec *v = &out[n++];
                memset(v, 0, sizeof *v);
                v->sparsity = kind;
                if (kind == FG_SPARSE_NONE) continue;
                v->sparse_block_q = o->sparse_blocks[b][0];
                v->sparse_block_k = o->sparse_blocks[b][1];
                if (kind == FG_SPARSE_BUTTERFLY) v->butterfly_factors = o->factors[f];
            }
    }
    return n;
}

/* A library message about a spec field ("spec.head_dim: ...") with the
 * option that set the field in its place ("--head-dims: ..."). */
static void name_option(const char *message, char *out, size_t len) {
    static const char *const fields[][2] = {{"spec.dtype: ", "--dtypes"},
                                            {"spec.head_dim: ", "--head-dims"},
                                            {"spec.head_dim_v: ", "--head-dims-v"},
                                            {"spec.sparse_block_q/k: ", "--sparse-blocks"},
                                            {"spec.butterfly_factors: ", "--butterfly-factors"},
                                            {"spec.softcap: ", "--softcap"},
                                            {"spec.alibi: ", "--alibi"},
                                            {"spec.sinks: ", "--sinks"}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        size_t n = strlen(fields[i][0]);
        if (strncmp(message, fields[i][0], n) == 0) {
            snprintf(out, len, "%s: %s", fields[i][1], message + n);
            return;
        }
    }
    snprintf(out, len, "%s", message);
}

/* Combinations a target cannot run (bf16 on t4), left out with a note. */
typedef struct skips {
    int count[MAX_TARGETS];
    char why[MAX_TARGETS][512]; /* the first reason per target */
} skips;

/* Every combination, target-major; those a target cannot run are left out
 * and counted in *skipped. A combination that is not a valid spec (a sparse
 * block that is not a multiple of 16, too many butterfly factors) is named
 * in err, *invalid set, and nothing is built. */
static job *make_jobs(const build_options *o, int *count, skips *skipped, int *invalid, char *err,
                      size_t err_len) {
    fg_spec variants[3 * 16 * 31];
    int nv = sparse_variants(o, variants, (int)(sizeof variants / sizeof variants[0]));
    const size_t nvar = (size_t)o->logit_count[0] * o->logit_count[1] * o->logit_count[2];
    size_t max = (size_t)o->target_count * o->pass_count * o->dtype_count * o->head_dim_count *
                 o->head_dim_v_count * o->mask_count * o->dropout_count * (size_t)nv * nvar;
    job *jobs = calloc(max ? max : 1, sizeof *jobs);
    *count = 0;
    *invalid = 0;
    memset(skipped, 0, sizeof *skipped);
    if (!jobs) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    for (int t = 0; t < o->target_count; t++) {
        fg_context *ctx;
        if (fg_context_create(&ctx, tools_target_name(o->targets[t])) != FG_OK) {
            snprintf(err, err_len, "%s", fg_last_message());
            free(jobs);
            return NULL;
        }
        for (int p = 0; p < o->pass_count; p++)
            for (int dt = 0; dt < o->dtype_count; dt++)
                for (int h = 0; h < o->head_dim_count * o->head_dim_v_count; h++)
                    for (int m = 0; m < o->mask_count; m++)
                        for (int dr = 0; dr < o->dropout_count; dr++)
                            for (size_t va = 0; va < nv * nvar; va++) {
                                const int sv = (int)(va / nvar), var = (int)(va % nvar);
                                /* each head dim with each value head dim */
                                fg_spec s = fg_spec_default(o->head_dims[h / o->head_dim_v_count],
                                                            (fg_dtype)o->dtypes[dt]);
                                s.head_dim_v = o->head_dims_v[h % o->head_dim_v_count];
                                s.mask = (fg_mask)o->masks[m];
                                s.dropout = o->dropouts[dr];
                                const int *n = o->logit_count;
                                s.softcap = o->logits[0][var % n[0]];
                                s.alibi = o->logits[1][var / n[0] % n[1]];
                                s.sinks = o->logits[2][var / (n[0] * n[1])];
                                s.score_mod = o->exprs.score_mod, s.mask_mod = o->exprs.mask_mod;
                                s.aux_count = o->exprs.aux_count;
                                memcpy(s.aux, o->exprs.aux, sizeof s.aux);
                                s.sparsity = variants[sv].sparsity;
                                if (s.sparsity != FG_SPARSE_NONE) {
                                    s.sparse_block_q = variants[sv].sparse_block_q;
                                    s.sparse_block_k = variants[sv].sparse_block_k;
                                    s.butterfly_factors = variants[sv].butterfly_factors;
                                }
                                fg_status st = tools_check_spec(ctx, &s, (fg_pass)o->passes[p]);
                                if (st == FG_ERR_UNSUPPORTED) {
                                    if (skipped->count[t]++ == 0)
                                        name_option(fg_context_message(ctx), skipped->why[t],
                                                    sizeof skipped->why[t]);
                                    continue;
                                }
                                if (st != FG_OK) {
                                    *invalid = st == FG_ERR_INVALID_ARGUMENT;
                                    name_option(fg_context_message(ctx), err, err_len);
                                    fg_context_destroy(ctx);
                                    free(jobs);
                                    return NULL;
                                }
                                job *j = &jobs[(*count)++];
                                j->target = o->targets[t];
                                j->pass = (fg_pass)o->passes[p];
                                j->spec = s;
                            }
        fg_context_destroy(ctx);
    }
    return jobs;
}

static void job_label(const job *j, char *buf, size_t len) {
    char spec[96];
    tools_spec_name(&j->spec, spec, sizeof spec, NULL, 0);
    snprintf(buf, len, "%s %s %s", tools_target_name(j->target),
             j->pass == FG_PASS_BACKWARD ? "backward" : "forward", spec);
}

/* ---- workers ---- */

/* One write per line, at most PIPE_BUF bytes: the kernel never interleaves
 * such writes to a pipe, so the workers need no lock. */
__attribute__((format(printf, 2, 3))) static void send_line(int fd, const char *fmt, ...) {
    char buf[PIPE_BUF];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    for (;;) {
        ssize_t w = write(fd, buf, (size_t)n);
        if (w >= 0 || errno != EINTR) break;
    }
}

/* Messages travel as one line: newlines and tabs become spaces. */
static void flatten(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\t' || *s == '\r') *s = ' ';
}

typedef struct worker_steps {
    bundle_entry entry[MAX_STEPS];
    int count, overflow;
} worker_steps;

static void on_saved(const bundle_entry *e, void *user) {
    worker_steps *w = user;
    if (w->count == MAX_STEPS) {
        w->overflow = 1;
        return;
    }
    w->entry[w->count++] = *e;
}

static void run_worker(int fd, atomic_int *next, const job *jobs, int job_count, const char *out) {
    fg_context *ctx[MAX_TARGETS + 8] = {0};
    worker_steps steps;
    /* Bundles are built from NVRTC output alone, never from the user's cache. */
    setenv("FLASHGEN_CACHE", "off", 1);
    for (;;) {
        int i = atomic_fetch_add(next, 1);
        if (i >= job_count) break;
        const job *j = &jobs[i];
        char msg[3000] = "";
        fg_status st = FG_OK;
        if (!ctx[j->target]) {
            st = fg_context_create(&ctx[j->target], tools_target_name(j->target));
            if (st == FG_OK)
                st = tools_bundle_build_into(ctx[j->target], out, on_saved, &steps);
            if (st != FG_OK) {
                snprintf(msg, sizeof msg, "%s",
                         ctx[j->target] ? fg_context_message(ctx[j->target]) : fg_last_message());
                fg_context_destroy(ctx[j->target]);
                ctx[j->target] = NULL;
            }
        }
        memset(&steps, 0, sizeof steps);
        fg_kernel_info info;
        memset(&info, 0, sizeof info);
        double t0 = now_s();
        if (st == FG_OK) {
            st = fg_compile(ctx[j->target], &j->spec, j->pass, &info);
            if (st != FG_OK) snprintf(msg, sizeof msg, "%s", fg_context_message(ctx[j->target]));
        }
        double ms = (now_s() - t0) * 1e3;
        if (st == FG_OK && steps.overflow) {
            st = FG_ERR_INTERNAL;
            snprintf(msg, sizeof msg, "more than %d compile steps", MAX_STEPS);
        }
        if (st == FG_OK) {
            /* a family's last step is its kept kernel (the derived family's
             * is info's; a bundle also holds the families a call may be
             * handed to), the steps before it spilled and are replayed */
            int replayed = 0;
            char also[512] = "";
            for (int s = 0; s < steps.count; s++) {
                bundle_entry *e = &steps.entry[s];
                int last = 1;
                size_t family = strcspn(e->plan, ":");
                for (int later = s + 1; later < steps.count && last; later++)
                    last = strncmp(steps.entry[later].plan, e->plan, family + 1) != 0;
                snprintf(e->step, sizeof e->step, "%s", last ? "kept" : "replayed");
                replayed += !last;
                if (last && strcmp(e->kernel, info.plan.kernel_name) != 0) {
                    size_t n = strlen(also);
                    snprintf(also + n, sizeof also - n, " + %s", e->kernel);
                }
                char line[2048];
                if (bundle_entry_format(e, line, sizeof line) == 0)
                    send_line(fd, "E\t%d\t%s", i, line);
            }
            send_line(fd, "D\t%d\t0\t%.0f\t%d\t%s%s", i, ms, replayed, info.plan.kernel_name,
                      also);
        } else {
            flatten(msg);
            send_line(fd, "D\t%d\t%d\t%.0f\t0\t%s", i, (int)st, ms, msg);
        }
    }
    for (int t = 0; t < MAX_TARGETS + 8; t++) fg_context_destroy(ctx[t]);
}

/* ---- the parent ---- */

typedef struct collector {
    bundle_entry *entries;
    size_t count, cap;
    int done, failed, total;
    double start;
    cli_progress progress; /* elapsed and time left, on a terminal */
} collector;

static int entry_cmp(const void *a, const void *b) {
    const bundle_entry *x = a, *y = b;
    int c = cache_target_cmp(x->target, y->target);
    if (!c) c = strcmp(x->pass, y->pass);
    if (!c) c = strcmp(x->spec, y->spec);
    if (!c) c = strcmp(x->step, y->step);
    if (!c) c = strcmp(x->kernel, y->kernel);
    return c;
}

static void handle_line(collector *c, const job *jobs, char *line) {
    char *rest;
    long index = strtol(line + 2, &rest, 10);
    if (line[0] == 'E' && line[1] == '\t' && *rest == '\t') {
        bundle_entry e;
        char why[256];
        if (bundle_entry_parse(rest + 1, &e, why, sizeof why) != 0) {
            cli_error("bundle build: bad entry from a worker (%s)", why);
            return;
        }
        if (c->count == c->cap) {
            size_t cap = c->cap ? 2 * c->cap : 256;
            bundle_entry *grown = realloc(c->entries, cap * sizeof *grown);
            if (!grown) {
                cli_error("bundle build: out of memory");
                exit(1);
            }
            c->entries = grown, c->cap = cap;
        }
        c->entries[c->count++] = e;
        return;
    }
    int status = 0, steps = 0;
    double ms = 0;
    char text[PIPE_BUF] = "";
    if (line[0] != 'D' || index < 0 || index >= c->total ||
        sscanf(rest, "\t%d\t%lf\t%d\t%4095[^\n]", &status, &ms, &steps, text) < 3)
        return;
    c->done++;
    cli_progress_hide(&c->progress);
    int width = snprintf(NULL, 0, "%d", c->total);
    if (status == 0) {
        char more[32] = "";
        if (steps > 0) snprintf(more, sizeof more, "  (+%d spilled step%s)", steps, steps > 1 ? "s" : "");
        printf("[%*d/%d] %-56s %6.0f ms%s\n", width, c->done, c->total, text, ms, more);
    } else {
        char label[256];
        job_label(&jobs[index], label, sizeof label);
        c->failed++;
        printf("[%*d/%d] FAILED %s: %s\n", width, c->done, c->total, label, text);
    }
    fflush(stdout);
    cli_progress_step(&c->progress, 1, NULL);
}

static uint64_t bundle_bytes(const char *out, const bundle_entry *e, size_t n) {
    uint64_t total = 0;
    char path[4096];
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s/%s.fgc", out, e[i].target, e[i].key);
        if (stat(path, &st) == 0) total += (uint64_t)st.st_size;
    }
    return total;
}

int cli_bundle_build(int argc, char **argv) {
    build_options o;
    int r = parse_build(argc, argv, &o);
    if (r != 0) return r > 0 ? 0 : 2;
    char err[1200];
    int total = 0;
    skips skipped;
    int invalid;
    job *jobs = make_jobs(&o, &total, &skipped, &invalid, err, sizeof err);
    if (!jobs) {
        cli_error("bundle build: %s", err);
        return invalid ? CLI_EXIT_USAGE : CLI_EXIT_FAILED;
    }
    if (!o.chosen.text && !o.all.text) { /* the whole set is asked for by name, not by default */
        cli_error("bundle build: no option chooses the kernels, so this would build every "
                  "default: %d kernels for %d targets, which takes tens of minutes; say --all for "
                  "that, or choose with --target, --head-dims, --dtypes, --masks, --dropout, "
                  "--passes (see 'flashgen bundle build --help')",
                  total, o.target_count);
        free(jobs);
        return CLI_EXIT_USAGE;
    }
    if (total == 0) { /* before --out is made: nothing to build is no bundle */
        cli_error("bundle build: the options select no kernel to build");
        for (int t = 0; t < o.target_count; t++)
            if (skipped.count[t])
                cli_error("%d combination%s skipped on %s: %s", skipped.count[t],
                          skipped.count[t] == 1 ? "" : "s", tools_target_name(o.targets[t]),
                          skipped.why[t]);
        free(jobs);
        return CLI_EXIT_USAGE;
    }
    if (nvrtc_lib_load(err, sizeof err) != 0) {
        cli_error("bundle build: building needs NVRTC: %s", err);
        free(jobs);
        return 1;
    }
    if (bundle_make_dir(o.out, err, sizeof err) != 0) {
        cli_error("bundle build: %s", err);
        free(jobs);
        return 1;
    }
    for (int t = 0; t < o.target_count; t++)
        if (skipped.count[t])
            printf("note: %d combination%s skipped on %s: %s\n", skipped.count[t],
                   skipped.count[t] == 1 ? "" : "s", tools_target_name(o.targets[t]),
                   skipped.why[t]);
    int workers = o.workers < total ? o.workers : total;
    int major = 0, minor = 0;
    nvrtc_lib_version(&major, &minor);
    printf("building %d kernel%s into %s with %d worker%s (NVRTC %d.%d)\n", total,
           total == 1 ? "" : "s", o.out, workers, workers == 1 ? "" : "s", major, minor);
    fflush(stdout);

    atomic_int *next = mmap(NULL, sizeof *next, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
    int fds[2];
    if (next == MAP_FAILED || pipe(fds) != 0) {
        cli_error("bundle build: %s", strerror(errno));
        free(jobs);
        return 1;
    }
    atomic_init(next, 0);
    collector c = {NULL, 0, 0, 0, 0, total, now_s(), {0}};
    cli_progress_start(&c.progress, "bundle build", total);
    cli_progress_step(&c.progress, 0, NULL);
    pid_t *pids = calloc((size_t)(workers > 0 ? workers : 1), sizeof *pids);
    int started = 0;
    for (int w = 0; w < workers && pids; w++) {
        pid_t pid = fork();
        if (pid < 0) {
            cli_error("bundle build: fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) {
            close(fds[0]);
            run_worker(fds[1], next, jobs, total, o.out);
            close(fds[1]);
            _exit(0);
        }
        pids[started++] = pid;
    }
    close(fds[1]);

    /* Lines until every worker has closed its end. */
    char buf[1 << 16];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fds[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            handle_line(&c, jobs, line);
            line = nl + 1;
        }
        have = (size_t)(buf + have - line);
        memmove(buf, line, have);
    }
    close(fds[0]);
    cli_progress_end(&c.progress);
    int crashed = 0;
    for (int w = 0; w < started; w++) {
        int status = 0;
        if (waitpid(pids[w], &status, 0) == pids[w] &&
            !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            crashed++;
            if (WIFSIGNALED(status))
                cli_error("bundle build: worker %d died of signal %d", w,
                        WTERMSIG(status));
        }
    }
    free(pids);
    munmap(next, sizeof *next);

    qsort(c.entries, c.count, sizeof *c.entries, entry_cmp);
    int rc = 0;
    if (bundle_manifest_write(o.out, c.entries, c.count, err, sizeof err) != 0) {
        cli_error("bundle build: %s", err);
        rc = 1;
    }
    int missing = total - c.done;
    double seconds = now_s() - c.start;
    uint64_t bytes = bundle_bytes(o.out, c.entries, c.count);
    printf("bundle %s: %d of %d kernels (%zu files, %.1f MiB) in %.1f s with %d worker%s\n",
           o.out, c.done - c.failed, total, c.count, (double)bytes / (1 << 20), seconds, workers,
           workers == 1 ? "" : "s");
    if (c.failed || missing || crashed) {
        cli_error("bundle build: %d failed, %d not built%s", c.failed, missing,
                crashed ? " (a worker died)" : "");
        rc = 1;
    }
    free(c.entries);
    free(jobs);
    return rc;
}
