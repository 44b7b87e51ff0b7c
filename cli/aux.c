/* --aux NAME:TYPE:SIZES, the tensors the expressions read, and their
 * contents for the commands that run them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cli_aux_parse(const char *text, fg_spec *spec, fgh_shape *shape) {
    const char *usage = "--aux takes NAME:TYPE:SIZES, TYPE f32 or i32 and SIZES one to three "
                        "sizes joined by 'x' (bias:f32:16x8191)";
    static char names[FG_MAX_AUX][EXPR_AUX_NAME_MAX + 1]; /* the spec points at them */
    const char *c1 = strchr(text, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c1 || !c2) {
        cli_error("--aux %s: %s", text, usage);
        return -1;
    }
    if (spec->aux_count >= FG_MAX_AUX) {
        cli_error("--aux %s: at most %d tensors", text, FG_MAX_AUX);
        return -1;
    }
    size_t name_len = (size_t)(c1 - text);
    if (name_len == 0 || name_len > EXPR_AUX_NAME_MAX) {
        cli_error("--aux %s: a name of 1 to %d characters; %s", text, EXPR_AUX_NAME_MAX, usage);
        return -1;
    }
    fg_aux_type type;
    if (c2 - c1 == 4 && !strncmp(c1 + 1, "f32", 3)) type = FG_AUX_F32;
    else if (c2 - c1 == 4 && !strncmp(c1 + 1, "i32", 3)) type = FG_AUX_I32;
    else {
        cli_error("--aux %s: the type is f32 or i32; %s", text, usage);
        return -1;
    }
    const int t = spec->aux_count;
    int rank = 0;
    for (const char *s = c2 + 1;;) {
        char *end;
        errno = 0;
        long long n = *s >= '0' && *s <= '9' ? strtoll(s, &end, 10) : -1;
        if (n < 0 || errno || n > INT32_MAX || rank == 3 || (end == s) ||
            (*end != 'x' && *end != '\0')) {
            cli_error("--aux %s: sizes 0..2^31-1, one to three; %s", text, usage);
            return -1;
        }
        shape->aux_size[t][rank++] = n;
        if (*end == '\0') break;
        s = end + 1;
    }
    memcpy(names[t], text, name_len);
    names[t][name_len] = '\0';
    spec->aux[t] = (fg_aux_decl){names[t], type, rank};
    spec->aux_count++;
    return 0;
}

/* Float tensors uniform in [-1, 1); int tensors of one index ascending runs
 * (8 documents of equal length, as packed sequences), others in 0..7. */
void cli_aux_fill(fgh_rng *rng, fgh_problem *p) {
    for (int t = 0; t < p->spec.aux_count; t++) {
        size_t n = p->aux_elems[t];
        if (p->spec.aux[t].type == FG_AUX_F32) {
            float *x = p->host.aux[t];
            for (size_t i = 0; i < n; i++) x[i] = fgh_rng_uniform(rng);
        } else {
            int32_t *x = p->host.aux[t];
            for (size_t i = 0; i < n; i++)
                x[i] = p->spec.aux[t].rank == 1 ? (int32_t)(i * 8 / n)
                                                : (int32_t)(fgh_rng_next(rng) % 8);
        }
    }
}
