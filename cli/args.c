/* The command line's conventions, shared by every command: one message
 * prefix, options as `--opt value` or `--opt=value`, and enumerations that
 * list their valid values when given another. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

void cli_error(const char *fmt, ...) {
    va_list ap;
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
