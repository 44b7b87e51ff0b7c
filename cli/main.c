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
    "Run 'flashgen <command> --help' for a command's options; --opt=value works as\n"
    "well as --opt value. plan, source, compile and bundle work without a GPU.\n"
    "Exit status: 0 done, 1 failed, 2 the command line is wrong.\n"
    "FLASHGEN_COMPILE_LOG=1 prints a line on stderr for each kernel compiled.\n"
    "Long work shows its progress on a terminal; FLASHGEN_PROGRESS=1 shows it\n"
    "anywhere, FLASHGEN_PROGRESS=0 nowhere.\n";

/* The library's log also carries its warnings (an unusable cache folder,
 * environment values it does not understand): those always show, once per
 * process however many contexts report them; compile lines only with
 * FLASHGEN_COMPILE_LOG=1 (user non-NULL). */
static void log_to_stderr(const char *line, void *user) {
    static char last_warning[4096];
    if (strncmp(line, "flashgen: warning: ", 19) == 0) {
        if (strcmp(line, last_warning) == 0) return;
        snprintf(last_warning, sizeof last_warning, "%s", line);
    } else if (user == NULL) {
        return;
    }
    cli_progress_hide(NULL);
    fprintf(stderr, "%s\n", line);
}

fg_status cli_context_create(fg_context **ctx, const char *target) {
    static int show_compiles = 1, warned;
    fg_status st = fg_context_create(ctx, target);
    const char *env = getenv("FLASHGEN_COMPILE_LOG");
    int compiles = env != NULL && strcmp(env, "1") == 0;
    if (env && env[0] && !compiles && strcmp(env, "0") != 0 && !warned++)
        fprintf(stderr, "flashgen: warning: FLASHGEN_COMPILE_LOG=%s is not understood (1 turns "
                        "the compile log on, 0 off): no log\n", env);
    if (st == FG_OK)
        fg_context_set_compile_log(*ctx, log_to_stderr, compiles ? &show_compiles : NULL);
    return st;
}

const char *cli_compile_time(const fg_kernel_info *info, char *buf, size_t len) {
    if (info->from_cache != 0)
        snprintf(buf, len, "cached");
    else
        snprintf(buf, len, "%.0fms", info->compile_ms);
    return buf;
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

static fg_context *open_context(const char *command, const char *target) {
    fg_context *ctx;
    if (cli_context_create(&ctx, target) == FG_OK) return ctx;
    char valid[128];
    if (target)
        cli_error("%s", fg_last_message());
    else
        cli_error("%s: without --target it works for this machine's GPU, and there is none "
                  "(%s); name a target with --target (%s) or use --all-targets",
                  command, fg_last_message(), cli_target_list(valid, sizeof valid));
    return NULL;
}

static void print_plan(const fg_context *ctx, const fg_plan_info *p, const char *compiled) {
    printf("target   %s\nkernel   %s\nplan     Br=%d Bc=%d warps=%d threads=%d stages=%d "
           "head dim padded %d, shared memory %d bytes\n%s\nwhy\n%s\n",
           fg_context_target(ctx), p->kernel_name, p->block_m, p->block_n, p->warps, p->threads,
           p->stages, p->head_dim_padded, p->smem_bytes, compiled, p->why);
}

/* The plan of the kernel that runs: fg_compile's, which includes a re-plan
 * after ptxas spills. Without NVRTC (and no bundle that has the kernel) the
 * derived plan, saying that compiling may change it. */
static int plan_one(fg_context *ctx, const cli_options *o, const char *where) {
    static const char *const from[] = {"by NVRTC now", "from the kernel cache", "from memory",
                                       "from a bundle"};
    fg_kernel_info info;
    char line[1024], err[512];
    if (fg_compile(ctx, &o->spec, o->pass, &info) == FG_OK) {
        snprintf(line, sizeof line, "compiled %d registers, %d bytes spilled (%s)%s", info.registers,
                 info.spill_bytes, from[info.from_cache],
                 info.spill_bytes ? ": no smaller tiling fits, so the spilling one is kept" : "");
        print_plan(ctx, &info.plan, line);
        return 0;
    }
    if (nvrtc_lib_load(err, sizeof err) == 0) {
        cli_spec_error(o, where, fg_context_message(ctx));
        return 1;
    }
    fg_plan_info plan;
    if (fg_plan(ctx, &o->spec, o->pass, &plan) != FG_OK) {
        cli_spec_error(o, where, fg_context_message(ctx));
        return 1;
    }
    snprintf(line, sizeof line,
             "note     the derived plan, not compiled (%s): if ptxas spills with it, compiling "
             "re-plans with smaller tiles",
             err);
    print_plan(ctx, &plan, line);
    return 0;
}

static int cmd_plan(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets), rc = 0;
    for (int i = 0; i < n; i++) {
        fg_context *ctx = open_context("plan", targets[i]);
        if (!ctx) return 1;
        if (i > 0) printf("\n");
        rc |= plan_one(ctx, o, targets[i] ? targets[i] : "this GPU");
        fg_context_destroy(ctx);
    }
    return rc;
}

/* One target's source after another, each under a comment naming it. */
static int cmd_source(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets), rc = 0;
    for (int i = 0; i < n; i++) {
        fg_context *ctx = open_context("source", targets[i]);
        if (!ctx) return 1;
        const char *src;
        if (fg_source(ctx, &o->spec, o->pass, &src) != FG_OK) {
            cli_spec_error(o, targets[i] ? targets[i] : "this GPU", fg_context_message(ctx));
            rc = 1;
        } else {
            if (n > 1) printf("%s// flashgen source: %s\n", i > 0 ? "\n" : "", fg_context_target(ctx));
            fputs(src, stdout);
        }
        fg_context_destroy(ctx);
    }
    return rc;
}

int cli_compile(const cli_options *o) {
    const char *targets[8];
    int n = target_list(o, targets), rc = 0, rows = 0;
    cli_progress progress; /* over several targets */
    cli_progress_start(&progress, "compile", n > 1 ? n : 0);
    for (int i = 0; i < n; i++) {
        cli_progress_step(&progress, i > 0, targets[i]);
        fg_context *ctx = open_context("compile", targets[i]);
        if (!ctx) return 1;
        fg_kernel_info info;
        int st = fg_compile(ctx, &o->spec, o->pass, &info);
        cli_progress_hide(&progress);
        if (st != FG_OK) {
            cli_spec_error(o, targets[i] ? targets[i] : "this GPU", fg_context_message(ctx));
            rc = 1;
        } else {
            static const char *const from[] = {"nvrtc", "disk cache", "memory", "bundle"};
            char took[32];
            if (rows++ == 0) /* the header over the first row: none over errors alone */
                printf("%-10s %-56s %5s %6s %6s %7s %9s  %s\n", "target", "kernel", "regs",
                       "spill", "stack", "smem", "compile", "from");
            printf("%-10s %-56s %5d %6d %6d %7d %9s  %s\n", targets[i] ? targets[i] : "live",
                   info.plan.kernel_name, info.registers, info.spill_bytes, info.stack_bytes,
                   info.plan.smem_bytes, cli_compile_time(&info, took, sizeof took),
                   from[info.from_cache]);
            fflush(stdout);
            if (info.spill_bytes) rc = 1;
        }
        fg_context_destroy(ctx);
    }
    cli_progress_end(&progress);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        cli_error("name a command\n\n%s", usage_text);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("flashgen %s\n", FLASHGEN_VERSION);
        return 0;
    }
    const char *command = argv[1];
    static const char *const commands[] = {"demo",  "plan",  "source", "compile", "check",
                                           "bench", "cache", "bundle", "tune"};
    int which = -1;
    for (int i = 0; i < 9; i++)
        if (strcmp(command, commands[i]) == 0) which = i;
    if (which < 0) {
        cli_error("unknown command '%s'\n\n%s", command, usage_text);
        return CLI_EXIT_USAGE;
    }
    /* cache has its own options (cli/cache.c), not the spec and problem ones */
    if (which == 6) return cli_cache(argc - 2, argv + 2);
    if (which == 7) return cli_bundle(argc - 2, argv + 2); /* cli/bundle.c, likewise */
    cli_options o;
    int r = cli_parse(argc - 2, argv + 2, command, &o);
    if (r != 0) return r > 0 ? 0 : CLI_EXIT_USAGE;
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
