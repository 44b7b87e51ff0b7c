/* flashgen bundle: build (bundle_build.c) or verify a bundle of precompiled
 * kernels. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "runtime/tools.h"

static const char *verify_help =
    "usage: flashgen bundle verify DIR [--target NAME] [--verbose]\n"
    "\n"
    "Checks every manifest entry: the file is there, its sha256 matches, the store's\n"
    "header and checksum hold, and it holds the kernel the manifest names, built for\n"
    "its folder's target. Entries for another format or generator version (or another\n"
    "target than --target) are skipped with a note; damaged or misplaced ones are\n"
    "rejected. Files the manifest does not list are checked and reported too. A\n"
    "manifest made by an older flashgen is refused: rebuild the bundle.\n"
    "Exit status 0 when nothing is rejected.\n"
    "\n"
    "  --target NAME   check only this target's entries: a named target (h100) or\n"
    "                  a target as NVRTC names it (sm_90, sm_90a)\n"
    "  --verbose       also list the entries that are fine\n";

static const char *bundle_usage =
    "usage: flashgen bundle build --out DIR [options]   compile a bundle (see --help)\n"
    "       flashgen bundle verify DIR [options]        check a bundle's integrity\n";

/* ---- verify ---- */

typedef struct verify_print {
    int verbose;
} verify_print;

static void print_check(const bundle_entry *e, int line, bundle_verdict verdict, const char *note,
                        void *user) {
    const verify_print *p = user;
    static const char *const words[] = {"ok", "skipped", "REJECTED"};
    if (verdict == BUNDLE_ENTRY_OK && !p->verbose) return;
    char where[32];
    if (line > 0)
        snprintf(where, sizeof where, "line %d", line);
    else
        snprintf(where, sizeof where, "unlisted");
    const char *what = e->kernel[0] ? e->kernel : e->key[0] ? e->key : "?";
    printf("%-8s %-9s %s %s%s%s\n", words[verdict], where, e->target[0] ? e->target : "-", what,
           note[0] ? ": " : "", note);
}

static int cmd_verify(int argc, char **argv) {
    const char *dir = NULL;
    char target[CACHE_TARGET_SIZE] = ""; /* "": every target */
    verify_print p = {0};
    cli_args s = {argc, argv, 0};
    cli_arg a;
    cli_seen seen = {0};
    while (cli_args_next(&s, &a)) {
        if (strcmp(a.name, "--help") == 0 || strcmp(a.name, "-h") == 0) {
            fputs(verify_help, stdout);
            return 0;
        } else if (strcmp(a.name, "--verbose") == 0) {
            if (cli_arg_flag(&a) != 0 || cli_once(&seen, a.name, &a) != 0) return CLI_EXIT_USAGE;
            p.verbose = 1;
        } else if (strcmp(a.name, "--target") == 0) {
            const char *name = cli_args_value(&s, &a);
            if (!name || cli_once(&seen, a.name, &a) != 0 || cli_arg_unspaced(&a) != 0)
                return CLI_EXIT_USAGE;
            if (tools_target_cc(name)) {
                snprintf(target, sizeof target, "sm_%d", tools_target_cc(name));
            } else if (cache_target_parse(name, target) != 0) {
                char valid[128];
                cli_error("bundle verify: %s: unknown target; valid: %s, or a target as NVRTC "
                          "names it (sm_90, sm_90a)",
                          a.typed, cli_target_list(valid, sizeof valid));
                return CLI_EXIT_USAGE;
            }
        } else if (a.name[0] != '-' && !dir) {
            dir = a.text;
        } else {
            cli_error("bundle verify: unexpected %s (see 'flashgen bundle verify --help')", a.typed);
            return CLI_EXIT_USAGE;
        }
    }
    if (!dir) {
        cli_error("bundle verify: name the bundle folder (see 'flashgen bundle verify --help')");
        return CLI_EXIT_USAGE;
    }
    bundle_verify_result r;
    char err[1200];
    /* FLASHGEN_VERSION is the library's FG_GENERATOR_VERSION (CMakeLists.txt
     * checks that they agree). */
    if (bundle_verify(dir, FLASHGEN_VERSION, target, print_check, &p, &r, err, sizeof err) != 0) {
        cli_error("bundle verify: %s", err);
        return CLI_EXIT_FAILED;
    }
    printf("%s: %zu ok, %zu skipped, %zu rejected (%zu file%s not in the manifest)\n", dir, r.ok,
           r.skipped, r.rejected, r.unlisted, r.unlisted == 1 ? "" : "s");
    return r.rejected ? 1 : 0;
}

int cli_bundle(int argc, char **argv) {
    if (argc < 1) {
        cli_error("bundle: name a subcommand\n\n%s", bundle_usage);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        fputs(bundle_usage, stdout);
        return 0;
    }
    if (strcmp(argv[0], "build") == 0) return cli_bundle_build(argc - 1, argv + 1);
    if (strcmp(argv[0], "verify") == 0) return cmd_verify(argc - 1, argv + 1);
    cli_error("bundle: unknown subcommand '%s'\n%s", argv[0], bundle_usage);
    return CLI_EXIT_USAGE;
}
