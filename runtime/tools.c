/* The library's side of runtime/tools.h. */
#include "runtime/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/generate.h"
#include "gen/profile.h"
#include "gen/spec.h"
#include "runtime/runtime.h"

int tools_target_count(void) { return profile_named_count(); }

const char *tools_target_name(int index) {
    const fg_profile *p = profile_named_at(index);
    return p ? p->name : NULL;
}

int tools_target_cc(const char *name) {
    const fg_profile *p = profile_named(name);
    return p ? p->arch : 0;
}

static int target_cmp(const void *a, const void *b) { return cache_target_cmp(a, b); }

int tools_target_folders(char (*out)[CACHE_TARGET_SIZE], int max) {
    int n = 0;
    for (int i = 0; i < profile_named_count(); i++) {
        const fg_profile *p = profile_named_at(i);
        for (int pass = FG_PASS_FORWARD; pass <= FG_PASS_BACKWARD; pass++) {
            const kernel_family *families[16];
            int count = families_for((fg_pass)pass, p, families, 16);
            for (int f = 0; f < count; f++) {
                kernel_target t = family_target(families[f], p);
                char name[16];
                target_name(&t, name, sizeof name);
                int seen = 0;
                for (int j = 0; j < n && !seen; j++) seen = strcmp(out[j], name) == 0;
                if (!seen && n < max) snprintf(out[n++], CACHE_TARGET_SIZE, "%s", name);
            }
        }
    }
    qsort(out, (size_t)n, CACHE_TARGET_SIZE, target_cmp);
    return n;
}

int tools_spec_name(const fg_spec *spec, char *buf, size_t len, char *err, size_t err_len) {
    fg_spec canonical;
    if (spec_canonicalize(spec, &canonical, err, err_len) != 0) return -1;
    spec_name(&canonical, buf, len);
    return 0;
}

fg_status tools_check_spec(fg_context *ctx, const fg_spec *spec, fg_pass pass) {
    fg_spec canonical;
    const kernel_family *family;
    fg_status st = canonical_spec(ctx, spec, &canonical);
    return st ? st : family_of(ctx, &canonical, pass, &family);
}

int tools_philox_bench_cubin(int cc, int head_dim, void **cubin, size_t *cubin_len, char *err,
                             size_t err_len) {
    kernel_target target = {cc, 0};
    char name[16];
    target_name(&target, name, sizeof name);
    generated g;
    if (generate_philox_bench(&target, head_dim, &g, err, err_len) != 0) return -1;
    char *log = NULL;
    nvrtc_resources res;
    int rc = nvrtc_compile_cubin(g.source, g.kernel_name, name, NULL, 0, cubin, cubin_len, &log,
                                 &res, err, err_len);
    free(log);
    generated_free(&g);
    return rc;
}
