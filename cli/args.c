/* The command line's conventions, shared by every command: one message
 * prefix, options as `--opt value` or `--opt=value`, enumerations that
 * list their valid values when given another, and progress on stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

void cli_error(const char *fmt, ...) {
    va_list ap;
    cli_progress_hide(NULL);
    va_start(ap, fmt);
    fputs("flashgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_args_next(cli_args *s, cli_arg *a) {
    memset(a, 0, sizeof *a);
    if (s->next >= s->argc) return 0;
    const char *text = s->argv[s->next++];
    a->text = text;
    const char *eq = strncmp(text, "--", 2) == 0 ? strchr(text, '=') : NULL;
    if (eq) {
        snprintf(a->name, sizeof a->name, "%.*s", (int)(eq - text), text);
        a->value = eq + 1;
        a->inline_value = 1;
    } else {
        snprintf(a->name, sizeof a->name, "%s", text);
    }
    snprintf(a->typed, sizeof a->typed, "%s", text);
    return 1;
}

const char *cli_args_value(cli_args *s, cli_arg *a) {
    if (!a->inline_value) {
        if (s->next >= s->argc) {
            cli_error("%s needs a value", a->name);
            return NULL;
        }
        a->value = s->argv[s->next++];
        snprintf(a->typed, sizeof a->typed, "%s %s", a->name, a->value);
    }
    return a->value;
}

int cli_arg_flag(const cli_arg *a) {
    if (!a->inline_value) return 0;
    cli_error("%s takes no value (given '%s')", a->name, a->typed);
    return -1;
}

int cli_arg_unspaced(const cli_arg *a) {
    if (!a->value || !a->value[strcspn(a->value, " \t\n\v\f\r")]) return 0;
    cli_error("%s: '%s' has white space in it", a->typed, a->value);
    return -1;
}

int cli_once(cli_seen *seen, const char *name, const cli_arg *a) {
    for (int i = 0; i < seen->count; i++)
        if (strcmp(seen->name[i], name) == 0) {
            cli_error("%s and %s: the same option twice; give it once", seen->typed[i], a->typed);
            return -1;
        }
    if (seen->count < 32) {
        snprintf(seen->name[seen->count], sizeof seen->name[0], "%s", name);
        snprintf(seen->typed[seen->count++], sizeof seen->typed[0], "%s", a->typed);
    }
    return 0;
}

const char *cli_list(const char *const *names, int count, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

int cli_enum(const cli_arg *a, const char *const *names, int count) {
    for (int i = 0; i < count; i++)
        if (strcmp(a->value, names[i]) == 0) return i;
    char valid[256];
    cli_error("%s: unknown value '%s'; valid: %s", a->typed, a->value,
              cli_list(names, count, valid, sizeof valid));
    return -1;
}

const char *cli_target_list(char *buf, size_t len) {
    const char *names[16];
    int n = 0;
    for (; n < tools_target_count() && n < 16; n++) names[n] = tools_target_name(n);
    return cli_list(names, n, buf, len);
}

/* ---- progress ---- */

static cli_progress *shown_progress; /* the one whose line is on the terminal */

static double progress_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_progress_mode(void) {
    static int warned;
    const char *env = getenv("FLASHGEN_PROGRESS");
    if (env && strcmp(env, "0") == 0) return 0;
    int terminal = isatty(STDERR_FILENO);
    if (env && strcmp(env, "1") == 0) return terminal ? 1 : 2;
    if (env && env[0] && !warned++)
        fprintf(stderr, "flashgen: warning: FLASHGEN_PROGRESS=%s is not understood (1 shows "
                        "progress, 0 hides it): progress on a terminal only\n", env);
    if (!terminal) return 0;
    /* output piped: its lines would reach the terminal at other moments than
       the progress line, and break it */
    struct stat st;
    if (fstat(STDOUT_FILENO, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return 0;
    return 1;
}

void cli_progress_duration(double s, char *buf, size_t len) {
    if (s < 0) s = 0;
    if (s < 9.95) snprintf(buf, len, "%.1fs", s);
    else if (s < 59.5) snprintf(buf, len, "%.0fs", s);
    else if (s < 3599.5) snprintf(buf, len, "%dm%02ds", (int)(s + 0.5) / 60, (int)(s + 0.5) % 60);
    else snprintf(buf, len, "%dh%02dm", (int)(s / 60 + 0.5) / 60, (int)(s / 60 + 0.5) % 60);
}

void cli_progress_line(const char *what, int done, int total, double elapsed, const char *label,
                       char *buf, size_t len) {
    char took[16], left[16];
    cli_progress_duration(elapsed, took, sizeof took);
    int n = snprintf(buf, len, "flashgen: %s %d/%d", what, done, total);
    if (total > 0 && n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " (%d%%)", (int)(100.0 * done / total));
    if (n >= 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ", %s elapsed", took);
    if (done > 0 && done < total && n >= 0 && (size_t)n < len) {
        cli_progress_duration(elapsed / done * (total - done), left, sizeof left);
        n += snprintf(buf + n, len - (size_t)n, ", about %s left", left);
    }
    if (label && label[0] && n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, ": %s", label);
}

void cli_progress_start(cli_progress *p, const char *what, int total) {
    memset(p, 0, sizeof *p);
    p->mode = total > 0 ? cli_progress_mode() : 0;
    p->total = total;
    p->start = progress_now_s();
    snprintf(p->what, sizeof p->what, "%s", what);
}

void cli_progress_hide(cli_progress *p) {
    if (!p) p = shown_progress;
    if (!p || p != shown_progress) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    shown_progress = NULL;
}

void cli_progress_step(cli_progress *p, int more, const char *label) {
    if (!p->mode) return;
    p->done += more;
    char line[512];
    cli_progress_line(p->what, p->done, p->total, progress_now_s() - p->start, label, line,
                      sizeof line);
    if (p->mode == 2) { /* forced off a terminal: a line per update */
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
        return;
    }
    /* in place, cut to the terminal's width so that it never wraps */
    struct winsize ws;
    size_t cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col : 80;
    if (strlen(line) > cols - 1) line[cols - 1] = '\0';
    if (shown_progress && shown_progress != p) cli_progress_hide(NULL);
    fprintf(stderr, "\r%s\033[K", line);
    fflush(stderr);
    shown_progress = p;
}

void cli_progress_end(cli_progress *p) {
    cli_progress_hide(p);
    if (p->mode == 2) { /* the lines end with the time it all took */
        char took[16];
        cli_progress_duration(progress_now_s() - p->start, took, sizeof took);
        fprintf(stderr, "flashgen: %s finished in %s\n", p->what, took);
        fflush(stderr);
    }
    p->mode = 0;
}
