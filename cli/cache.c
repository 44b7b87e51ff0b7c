/* flashgen cache list|stats|verify|clear: look after the kernel cache folder.
 * The work is in cache/manage.c; this parses options and prints tables. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "runtime/tools.h"

static const char *cache_help =
    "usage: flashgen cache <list|stats|verify|clear> [--arch T] [--dir D] [--remove]\n"
    "\n"
    "  list     every entry: target, key, size, last use, kernel; most recent first\n"
    "  stats    per target: disk-cache hits and misses, entries and size; the size cap\n"
    "  verify   read every entry in full (header, checksum, payload) and name the\n"
    "           damaged ones; exits 1 if there were any (--remove deletes them)\n"
    "  clear    remove the entries, statistics and temporary files; says how much\n"
    "\n"
    "options:\n"
    "  --arch T   only target T: 90 or sm_90, 90a or sm_90a (its own folder), one\n"
    "             the named targets' kernels are built for or one the cache holds;\n"
    "             default every target\n"
    "  --dir D    the cache folder, which must exist; default $FLASHGEN_CACHE_DIR\n"
    "             (which must exist too), else $XDG_CACHE_HOME/flashgen, else\n"
    "             ~/.cache/flashgen\n"
    "  --remove   verify: delete the damaged entries\n"
    "\n"
    "FLASHGEN_CACHE_MAX_SIZE caps the entries' total size (bytes, or with a K, M or G\n"
    "suffix; 0 for no cap; default 4G). After each save the least recently used\n"
    "entries go first; a disk hit counts as a use.\n";

static const char *human(uint64_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

static void when(int64_t sec, char *buf, size_t len) {
    time_t t = (time_t)sec;
    struct tm tm;
    if (localtime_r(&t, &tm) == NULL || strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, len, "%lld", (long long)sec);
}

static int cmd_list(const cache_store *s, const char *target) {
    cache_entry_info *e;
    size_t n;
    char msg[512], size[32], used[32];
    if (cache_list(s, target, CACHE_LIST_NAMES, &e, &n, msg, sizeof msg) != 0) {
        cli_error("cache list: %s", msg);
        return 1;
    }
    uint64_t total = 0;
    printf("%-7s %-16s %10s  %-19s  %s\n", "target", "key", "size", "last used", "kernel");
    for (size_t i = 0; i < n; i++) {
        when(e[i].used_sec, used, sizeof used);
        printf("%-7s %-16.16s %10s  %-19s  %s\n", e[i].target, e[i].key,
               human(e[i].bytes, size, sizeof size), used,
               e[i].kernel_name[0] ? e[i].kernel_name : "(unreadable)");
        total += e[i].bytes;
    }
    printf("%zu entr%s, %s in %s\n", n, n == 1 ? "y" : "ies", human(total, size, sizeof size),
           s->root);
    free(e);
    return 0;
}

static void print_stats_row(const char *name, const cache_target_stats *r) {
    char size[32], rate[16] = "-";
    uint64_t lookups = r->hits + r->misses;
    if (lookups > 0) snprintf(rate, sizeof rate, "%.1f%%", 100.0 * (double)r->hits / (double)lookups);
    printf("%-7s %8llu %11s %10llu %10llu %9s\n", name, (unsigned long long)r->entries,
           human(r->bytes, size, sizeof size), (unsigned long long)r->hits,
           (unsigned long long)r->misses, rate);
}

static int cmd_stats(const cache_store *s, const char *target) {
    cache_target_stats *rows;
    size_t n;
    char msg[512], cap[32];
    if (cache_stats(s, target, &rows, &n, msg, sizeof msg) != 0) {
        cli_error("cache stats: %s", msg);
        return 1;
    }
    printf("cache %s, cap %s\n", s->root,
           s->max_bytes ? human(s->max_bytes, cap, sizeof cap) : "none");
    printf("%-7s %8s %11s %10s %10s %9s\n", "target", "entries", "size", "hits", "misses",
           "hit rate");
    cache_target_stats total;
    memset(&total, 0, sizeof total);
    for (size_t i = 0; i < n; i++) {
        print_stats_row(rows[i].target, &rows[i]);
        total.entries += rows[i].entries;
        total.bytes += rows[i].bytes;
        total.hits += rows[i].hits;
        total.misses += rows[i].misses;
    }
    if (n != 1) print_stats_row("total", &total);
    free(rows);
    return 0;
}

static void print_damaged(const cache_entry_info *e, const char *why, int removed, void *user) {
    const cache_store *s = user;
    printf("damaged  %s/%s/%s.fgc: %s%s\n", s->root, e->target, e->key, why,
           removed ? " (removed)" : "");
}

static int cmd_verify(const cache_store *s, const char *target, int remove) {
    cache_verify_result r;
    char msg[512], size[32];
    if (cache_verify(s, target, remove, print_damaged, (void *)s, &r, msg, sizeof msg) != 0) {
        cli_error("cache verify: %s", msg);
        return 1;
    }
    printf("checked %llu entr%s: %llu damaged", (unsigned long long)r.checked,
           r.checked == 1 ? "y" : "ies", (unsigned long long)r.damaged);
    if (remove) printf(", %llu removed (%s)", (unsigned long long)r.removed.files,
                       human(r.removed.bytes, size, sizeof size));
    printf("\n");
    if (r.damaged > 0 && !remove) printf("run 'flashgen cache verify --remove' to delete them\n");
    return r.damaged > 0 ? 1 : 0;
}

static int cmd_clear(const cache_store *s, const char *target) {
    cache_removal r;
    char msg[512], size[32], where[1100];
    int rc = cache_clear(s, target, &r, msg, sizeof msg);
    if (target[0])
        snprintf(where, sizeof where, "%s/%s", s->root, target);
    else
        snprintf(where, sizeof where, "%s", s->root);
    printf("removed %llu file%s, %s, from %s\n", (unsigned long long)r.files,
           r.files == 1 ? "" : "s", human(r.bytes, size, sizeof size), where);
    if (rc != 0) {
        cli_error("cache clear: %s", msg);
        return 1;
    }
    return 0;
}

/* --arch's target: one the named targets' kernels are built for, or one the
 * cache holds (a GPU of another arch compiles for its own). 0, or -1 after
 * a message that lists them. */
static int known_target(const cache_store *s, const char *typed, const char *target) {
    char valid[32][CACHE_TARGET_SIZE];
    int n = tools_target_folders(valid, 32);
    cache_target_stats *rows = NULL;
    size_t count = 0;
    char msg[512];
    if (cache_stats(s, NULL, &rows, &count, msg, sizeof msg) == 0)
        for (size_t i = 0; i < count && n < 32; i++) {
            int seen = 0;
            for (int j = 0; j < n && !seen; j++) seen = strcmp(valid[j], rows[i].target) == 0;
            if (!seen) snprintf(valid[n++], CACHE_TARGET_SIZE, "%s", rows[i].target);
        }
    free(rows);
    const char *names[32];
    for (int i = 0; i < n; i++) {
        if (strcmp(valid[i], target) == 0) return 0;
        names[i] = valid[i];
    }
    char list[512];
    cli_error("cache: %s: %s is no target of flashgen's or of this cache; valid: %s", typed, target,
              cli_list(names, n, list, sizeof list));
    return -1;
}

int cli_cache(int argc, char **argv) {
    static const char *const subs[] = {"list", "stats", "verify", "clear"};
    const char *dir = NULL;
    char target[CACHE_TARGET_SIZE] = ""; /* "": every target */
    char arch_typed[128] = "";
    int remove = 0, which = -1;
    cli_args s = {argc, argv, 0};
    cli_arg a;
    cli_seen seen = {0};
    while (cli_args_next(&s, &a)) {
        if (strcmp(a.name, "--help") == 0 || strcmp(a.name, "-h") == 0) {
            fputs(cache_help, stdout);
            return 0;
        } else if (strcmp(a.name, "--remove") == 0) {
            if (cli_arg_flag(&a) != 0 || cli_once(&seen, a.name, &a) != 0) return CLI_EXIT_USAGE;
            remove = 1;
        } else if (strcmp(a.name, "--arch") == 0 || strcmp(a.name, "--dir") == 0) {
            const char *v = cli_args_value(&s, &a);
            if (!v || cli_once(&seen, a.name, &a) != 0) return CLI_EXIT_USAGE;
            if (a.name[2] == 'd') {
                dir = v;
            } else if (cli_arg_unspaced(&a) != 0) {
                return CLI_EXIT_USAGE;
            } else if (cache_target_parse(v, target) != 0) {
                cli_error("cache: %s: not a target (e.g. 80, sm_80, 90a or sm_90a)", a.typed);
                return CLI_EXIT_USAGE;
            } else {
                snprintf(arch_typed, sizeof arch_typed, "%s", a.typed);
            }
        } else if (which < 0 && a.name[0] != '-') {
            for (int k = 0; k < 4; k++)
                if (strcmp(a.name, subs[k]) == 0) which = k;
            if (which < 0) {
                char valid[64];
                cli_error("cache: unknown subcommand '%s'; valid: %s", a.name,
                          cli_list(subs, 4, valid, sizeof valid));
                return CLI_EXIT_USAGE;
            }
        } else {
            cli_error("cache: unexpected %s (see 'flashgen cache --help')", a.typed);
            return CLI_EXIT_USAGE;
        }
    }
    if (which < 0) {
        cli_error("cache: name a subcommand\n\n%s", cache_help);
        return CLI_EXIT_USAGE;
    }
    if (remove && which != 2) {
        cli_error("cache: --remove goes with verify");
        return CLI_EXIT_USAGE;
    }
    /* Opening a store makes its folder; a folder named by --dir or
     * FLASHGEN_CACHE_DIR that is not there is more likely a typo than a wish
     * for a new cache. */
    const char *named = dir, *how = "--dir ";
    if (!named && getenv("FLASHGEN_CACHE_DIR") && getenv("FLASHGEN_CACHE_DIR")[0])
        named = getenv("FLASHGEN_CACHE_DIR"), how = "FLASHGEN_CACHE_DIR=";
    struct stat st;
    if (named && stat(named, &st) != 0) {
        cli_error("cache: %s%s: %s", how, named, errno == ENOENT ? "no such folder" : strerror(errno));
        return CLI_EXIT_FAILED;
    }
    if (named && !S_ISDIR(st.st_mode)) {
        cli_error("cache: %s%s: not a folder", how, named);
        return CLI_EXIT_FAILED;
    }
    cache_store store;
    char warn[1024];
    if (cache_store_open(&store, dir, warn, sizeof warn) != 0) {
        cli_error("cache: %s", warn);
        return CLI_EXIT_FAILED;
    }
    /* An unwritable folder can still be listed and checked; say why clear
     * or --remove may fail. */
    if (warn[0] != '\0') cli_error("warning: %s", warn);
    if (target[0] && known_target(&store, arch_typed, target) != 0) return CLI_EXIT_USAGE;
    switch (which) {
    case 0: return cmd_list(&store, target);
    case 1: return cmd_stats(&store, target);
    case 2: return cmd_verify(&store, target, remove);
    default: return cmd_clear(&store, target);
    }
}
