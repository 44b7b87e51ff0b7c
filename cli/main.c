/* flashgen: plan, emit, compile, check and benchmark attention kernels. */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/tools.h"

static const char *usage_text =
    "usage: flashgen <command> [options]\n"
    "\n"
    "commands:\n"
    "  demo      with a GPU: compile, run, check and time a default problem;\n"
    "            without one: plan and compile for every named target\n"
    "  plan      show the plan (tiles, warps, shared memory) and why\n"
    "  source    print the generated CUDA source\n"
    "  compile   compile into the cache; report registers, shared memory, spills\n"
    "  check     run a problem on the GPU and compare with the fp64 reference\n"
    "  bench     TFLOP/s over the standard shapes, and compile times\n"
    "  cache     list, stats, verify or clear the kernel cache\n"
    "  bundle    build or verify a bundle of precompiled kernels to ship\n"
    "  tune      time tilings around the derived plan on this GPU and keep the best\n"
    "\n"
    "Run 'flashgen <command> --help' for a command's options.\n"
    "FLASHGEN_COMPILE_LOG=1 prints a line on stderr for each kernel compiled.\n";

static const char *spec_help =
    "spec options (compiled into the kernel):\n"
    "  --dtype fp16|bf16          (default fp16)\n"
    "  --head-dim N, -d N         1..256 (default 64)\n"
    "  --mask none|causal|window  (default none)\n"
    "  --dropout                  compile dropout in\n"
    "  --sparsity none|layout|butterfly\n"
    "  --sparse-block QxK         sparse block size (default 64x64)\n"
    "  --butterfly-factors N      (default 2)\n";

static const char *pass_help =
    "  --backward                 the backward kernels (default: the forward)\n";

static const char *target_help =
    "target options:\n"
    "  --target NAME              t4, a100, rtx3090, l4, h100 (repeatable); default: live GPU\n"
    "  --all-targets              every named target\n";

static const char *problem_help =
    "problem options (launch arguments):\n"
    "  --batch N --heads N --kv-heads N\n"
    "  --seqlen N | --seqlen-q N --seqlen-k N\n"
    "  --layout bshd|bhsd         tensor layout (default bshd)\n"
    "  --align bottom-right|top-left   causal/window alignment (default bottom-right)\n"
    "  --window L,R               window sizes, -1 unbounded\n"
    "  --dropout-p P              (needs --dropout)\n"
    "  --scale X                  softmax scale (default 1/sqrt(d))\n"
    "  --seed N                   inputs and dropout seed\n"
    "  --density F                kept fraction of a random layout (default 0.5)\n";

static void print_help(const char *command) {
    if (strcmp(command, "plan") == 0 || strcmp(command, "source") == 0 ||
        strcmp(command, "compile") == 0) {
        printf("usage: flashgen %s [spec options] [--backward] [target options]\n\n%s%s\n%s",
               command, spec_help, pass_help, target_help);
    } else if (strcmp(command, "check") == 0) {
        printf("usage: flashgen check [spec options] [--backward [--deterministic]] [problem options]\n\n"
               "Runs one problem on the live GPU and compares O and the log-sum-exp with the\n"
               "fp64 reference; the error must be at most twice the naive input-precision one.\n"
               "--backward also runs the backward and compares dQ, dK and dV with the fp64\n"
               "gradients (at most 3x the naive error); --deterministic uses the reproducible\n"
               "schedule and checks two runs are bitwise identical.\n\n"
               "%s\n%s",
               spec_help, problem_help);
    } else if (strcmp(command, "bench") == 0) {
        printf("usage: flashgen bench [--backward] [--quick] [--head-dim N] [--seqlen N] [--csv]\n"
               "                      [--repeats N] [--tuned] [--philox]\n\n"
               "bf16 forward TFLOP/s for head dims 64, 128, 256 and sequence lengths 512..16384\n"
               "at 16k tokens and hidden size 2048, causal and not, dropout 0 and 0.1; then\n"
               "cold / disk-warm / memory-warm compile times and the host overhead of a call.\n"
               "--backward: forward+backward instead (3.5x the forward's FLOPs), fast and\n"
               "deterministic schedules, with the backward alone beside it.\n"
               "--quick: head dim 128 and lengths 2048 and 8192 only; --head-dim and --seqlen\n"
               "pick one head dim or length. --csv: machine-readable rows.\n"
               "--tuned: tune each shape first (flashgen tune; with --backward, the backward)\n"
               "and add its time with the tuned plan beside the derived plan's.\n"
               "--philox: what dropout's random numbers cost on this GPU. Times the MMAs of\n"
               "the forward's key tiles alone, their Philox4x32-10 calls alone, and both in\n"
               "the same warps; then, per shape, dropout's measured cost beside the time the\n"
               "shape's Philox calls take alone, which is its cost where they overlap nothing.\n");
    } else if (strcmp(command, "tune") == 0) {
        printf("usage: flashgen tune [spec options] [--backward] [--standard] [--seqlens N,N,...]\n"
               "                     [--show]\n\n"
               "Times tilings around the derived forward plan (--backward: the backward's,\n"
               "fast schedule) on this GPU for each sequence-length bucket and keeps one only\n"
               "if it beats the derived plan by more than the measured run-to-run spread;\n"
               "later calls of the spec use the choice with no timing. Choices are kept in\n"
               "tuning.tsv in the kernel cache folder, per GPU, pass, spec and bucket, and\n"
               "driver and NVRTC. FLASHGEN_TUNING=off makes calls ignore them.\n\n"
               "  --standard      the benchmark's specs (bf16, d 64/128/256, causal or not,\n"
               "                  dropout or not) instead of the one given\n"
               "  --seqlens LIST  lengths whose buckets to tune (default 512,...,16384)\n"
               "  --show          print the choices kept, without timing\n\n%s",
               spec_help);
    } else if (strcmp(command, "demo") == 0) {
        printf("usage: flashgen demo [spec options] [problem options]\n\n"
               "With a GPU: compile, run and check a default problem (bf16, d=128, causal,\n"
               "batch 4, 16 heads, 2048 tokens) and print its speed. Without one: plan and\n"
               "compile a set of specs for every named target and print plans and resources.\n");
    } else {
        fputs(usage_text, stdout);
    }
}

/* The library's log also carries its warnings (an unusable cache folder):
 * those always show, once per process however many contexts report them;
 * compile lines only with FLASHGEN_COMPILE_LOG=1 (user non-NULL). */
static void log_to_stderr(const char *line, void *user) {
    static char last_warning[1024];
    if (strncmp(line, "flashgen: warning: ", 19) == 0) {
        if (strcmp(line, last_warning) == 0) return;
        snprintf(last_warning, sizeof last_warning, "%s", line);
    } else if (user == NULL) {
        return;
    }
    fprintf(stderr, "%s\n", line);
}

fg_status cli_context_create(fg_context **ctx, const char *target) {
    static int show_compiles = 1;
    fg_status st = fg_context_create(ctx, target);
    const char *env = getenv("FLASHGEN_COMPILE_LOG");
    int compiles = env != NULL && strcmp(env, "1") == 0;
    if (st == FG_OK)
        fg_context_set_compile_log(*ctx, log_to_stderr, compiles ? &show_compiles : NULL);
    return st;
}

static int parse_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < -2147483647L || v > 2147483647L) return -1;
    *out = (int)v;
    return 0;
}

static int enum_arg(const char *s, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

int cli_parse(int argc, char **argv, const char *command, cli_options *o) {
    static const char *const dtypes[] = {"fp16", "bf16"};
    static const char *const masks[] = {"none", "causal", "window"};
    static const char *const sparsities[] = {"none", "layout", "butterfly"};
    static const char *const layouts[] = {"bshd", "bhsd"};
    static const char *const aligns[] = {"bottom-right", "top-left"};
    memset(o, 0, sizeof *o);
    o->spec = fg_spec_default(64, FG_FP16);
    o->spec.sparse_block_q = o->spec.sparse_block_k = 64;
    o->spec.butterfly_factors = 2;
    cli_problem *p = &o->problem;
    fgh_shape *sh = &p->shape;
    sh->batch = 2, sh->heads_q = 8, sh->heads_kv = 0, sh->seqlen_q = 1000, sh->seqlen_k = 0;
    sh->window_left = sh->window_right = -1;
    sh->seed = 1;
    p->layout_density = 0.5;
    o->repeats = 20;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, used = 1, n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            print_help(command);
            return 1;
        } else if (strcmp(a, "--dropout") == 0) {
            o->spec.dropout = 1, used = 0;
        } else if (strcmp(a, "--all-targets") == 0) {
            o->all_targets = 1, used = 0;
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = 1, used = 0;
        } else if (strcmp(a, "--quick") == 0) {
            o->quick = 1, used = 0;
        } else if (strcmp(a, "--backward") == 0) {
            o->pass = FG_PASS_BACKWARD, used = 0;
        } else if (strcmp(a, "--deterministic") == 0) {
            o->deterministic = 1, used = 0;
        } else if (strcmp(a, "--show") == 0) {
            o->show = 1, used = 0;
        } else if (strcmp(a, "--standard") == 0) {
            o->standard = 1, used = 0;
        } else if (strcmp(a, "--tuned") == 0) {
            o->tuned = 1, used = 0;
        } else if (strcmp(a, "--philox") == 0) {
            o->philox = 1, used = 0;
        } else if (!v) {
            fprintf(stderr, "flashgen %s: unknown option or missing value: %s\n", command, a);
            return -1;
        } else if (strcmp(a, "--dtype") == 0) {
            bad = (n = enum_arg(v, dtypes, 2)) < 0, o->spec.dtype = (fg_dtype)n;
        } else if (strcmp(a, "--head-dim") == 0 || strcmp(a, "-d") == 0) {
            bad = parse_int(v, &o->spec.head_dim), o->head_dim_given = 1;
        } else if (strcmp(a, "--mask") == 0) {
            bad = (n = enum_arg(v, masks, 3)) < 0, o->spec.mask = (fg_mask)n;
        } else if (strcmp(a, "--sparsity") == 0) {
            bad = (n = enum_arg(v, sparsities, 3)) < 0, o->spec.sparsity = (fg_sparsity)n;
        } else if (strcmp(a, "--sparse-block") == 0) {
            bad = sscanf(v, "%dx%d", &o->spec.sparse_block_q, &o->spec.sparse_block_k) != 2;
        } else if (strcmp(a, "--butterfly-factors") == 0) {
            bad = parse_int(v, &o->spec.butterfly_factors);
        } else if (strcmp(a, "--target") == 0) {
            bad = o->target_count == 8 || !tools_target_cc(v);
            if (!bad) o->targets[o->target_count++] = v;
        } else if (strcmp(a, "--batch") == 0) {
            bad = parse_int(v, &sh->batch);
        } else if (strcmp(a, "--heads") == 0) {
            bad = parse_int(v, &sh->heads_q);
        } else if (strcmp(a, "--kv-heads") == 0) {
            bad = parse_int(v, &sh->heads_kv);
        } else if (strcmp(a, "--seqlen") == 0) {
            bad = parse_int(v, &sh->seqlen_q), sh->seqlen_k = sh->seqlen_q, o->seqlen_given = 1;
        } else if (strcmp(a, "--seqlen-q") == 0) {
            bad = parse_int(v, &sh->seqlen_q);
        } else if (strcmp(a, "--seqlen-k") == 0) {
            bad = parse_int(v, &sh->seqlen_k);
        } else if (strcmp(a, "--layout") == 0) {
            bad = (p->bhsd = enum_arg(v, layouts, 2)) < 0;
        } else if (strcmp(a, "--align") == 0) {
            bad = (n = enum_arg(v, aligns, 2)) < 0, sh->align = (fg_causal_align)n;
        } else if (strcmp(a, "--window") == 0) {
            bad = sscanf(v, "%d,%d", &sh->window_left, &sh->window_right) != 2;
        } else if (strcmp(a, "--dropout-p") == 0) {
            bad = sscanf(v, "%f", &sh->dropout_p) != 1;
        } else if (strcmp(a, "--scale") == 0) {
            bad = sscanf(v, "%f", &sh->scale) != 1;
        } else if (strcmp(a, "--seed") == 0) {
            unsigned long long s;
            bad = sscanf(v, "%llu", &s) != 1, sh->seed = s;
        } else if (strcmp(a, "--density") == 0) {
            bad = sscanf(v, "%lf", &p->layout_density) != 1;
        } else if (strcmp(a, "--seqlens") == 0) {
            o->seqlen_count = 0;
            for (const char *c = v; *c && !bad; c = strchr(c, ',') ? strchr(c, ',') + 1 : "") {
                int len = atoi(c);
                bad = len < 1 || o->seqlen_count == 16;
                if (!bad) o->seqlens[o->seqlen_count++] = len;
            }
        } else if (strcmp(a, "--repeats") == 0) {
            bad = parse_int(v, &o->repeats) || o->repeats < 1;
        } else {
            fprintf(stderr, "flashgen %s: unknown option %s (see --help)\n", command, a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "flashgen %s: bad value for %s: %s\n", command, a, v ? v : "");
            return -1;
        }
        i += used;
    }
    if (sh->heads_kv == 0) sh->heads_kv = sh->heads_q;
    if (sh->seqlen_k == 0) sh->seqlen_k = sh->seqlen_q;
    return 0;
}

/* The targets a command works on: --target names, every named target, or
 * the live GPU (NULL). */
static int target_list(const cli_options *o, const char **out) {
    if (o->all_targets) {
        for (int i = 0; i < tools_target_count(); i++) out[i] = tools_target_name(i);
        return tools_target_count();
    }
    if (o->target_count == 0) {
        out[0] = NULL;
        return 1;
    }
    for (int i = 0; i < o->target_count; i++) out[i] = o->targets[i];
    return o->target_count;
}

static fg_context *open_context(const char *target) {
    fg_context *ctx;
    if (cli_context_create(&ctx, target) != FG_OK) {
        fprintf(stderr, "flashgen: %s\n", fg_last_message());
        if (!target) fprintf(stderr, "flashgen: name a target with --target (t4, a100, rtx3090, l4, h100)\n");
        return NULL;
    }
    return ctx;
}

static int cmd_plan(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets), rc = 0;
    for (int i = 0; i < n; i++) {
        fg_context *ctx = open_context(targets[i]);
        if (!ctx) return 1;
        fg_plan_info info;
        if (fg_plan(ctx, &o->spec, o->pass, &info) != FG_OK) {
            fprintf(stderr, "flashgen plan: %s: %s\n", fg_context_target(ctx), fg_context_message(ctx));
            rc = 1;
        } else {
            printf("target   %s\nkernel   %s\nplan     Br=%d Bc=%d warps=%d threads=%d stages=%d "
                   "head dim padded %d, shared memory %d bytes\nwhy\n%s\n",
                   fg_context_target(ctx), info.kernel_name, info.block_m, info.block_n, info.warps,
                   info.threads, info.stages, info.head_dim_padded, info.smem_bytes, info.why);
        }
        fg_context_destroy(ctx);
    }
    return rc;
}

static int cmd_source(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets);
    if (n != 1) {
        fprintf(stderr, "flashgen source: name one target\n");
        return 1;
    }
    fg_context *ctx = open_context(targets[0]);
    if (!ctx) return 1;
    const char *src;
    int rc = 0;
    if (fg_source(ctx, &o->spec, o->pass, &src) != FG_OK) {
        fprintf(stderr, "flashgen source: %s\n", fg_context_message(ctx));
        rc = 1;
    } else {
        fputs(src, stdout);
    }
    fg_context_destroy(ctx);
    return rc;
}

int cli_compile(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets), rc = 0;
    printf("%-10s %-56s %5s %6s %6s %7s %9s  %s\n", "target", "kernel", "regs", "spill", "stack",
           "smem", "compile", "from");
    for (int i = 0; i < n; i++) {
        fg_context *ctx = open_context(targets[i]);
        if (!ctx) return 1;
        fg_kernel_info info;
        if (fg_compile(ctx, &o->spec, o->pass, &info) != FG_OK) {
            fprintf(stderr, "flashgen compile: %s: %s\n", fg_context_target(ctx), fg_context_message(ctx));
            rc = 1;
        } else {
            static const char *const from[] = {"nvrtc", "disk cache", "memory", "bundle"};
            printf("%-10s %-56s %5d %6d %6d %7d %7.0fms  %s\n", targets[i] ? targets[i] : "live",
                   info.plan.kernel_name, info.registers, info.spill_bytes, info.stack_bytes,
                   info.plan.smem_bytes, info.compile_ms, from[info.from_cache]);
            if (info.spill_bytes) rc = 1;
        }
        fg_context_destroy(ctx);
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("flashgen %s\n", FLASHGEN_VERSION);
        return 0;
    }
    const char *command = argv[1];
    static const char *const commands[] = {"demo",  "plan",  "source", "compile", "check",
                                           "bench", "cache", "bundle", "tune"};
    int which = enum_arg(command, commands, 9);
    if (which < 0) {
        fprintf(stderr, "flashgen: unknown command '%s'\n\n%s", command, usage_text);
        return 2;
    }
    /* cache has its own options (cli/cache.c), not the spec and problem ones */
    if (which == 6) return cli_cache(argc - 2, argv + 2);
    if (which == 7) return cli_bundle(argc - 2, argv + 2); /* cli/bundle.c, likewise */
    cli_options o;
    int r = cli_parse(argc - 2, argv + 2, command, &o);
    if (r != 0) return r > 0 ? 0 : 2;
    switch (which) {
    case 0: return cli_demo(&o);
    case 1: return cmd_plan(&o);
    case 2: return cmd_source(&o);
    case 3: return cli_compile(&o);
    case 4: return cli_check(&o);
    case 8: return cli_tune(&o);
    default: return cli_bench(&o);
    }
}
