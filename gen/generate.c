#include "gen/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/expr_emit.h"
#include "gen/spec.h"

/* Params every kernel template gets besides its plan: the target, the spec
 * and the launch-argument struct. */
#define FIXED_PARAMS 28
#define MAX_FIGURES 32

static const char *sparsity_name(fg_sparsity s) {
    return s == FG_SPARSE_LAYOUT ? "layout" : s == FG_SPARSE_BUTTERFLY ? "butterfly" : "none";
}

static lua_host_param int_param(const char *key, long long v) {
    lua_host_param p = {key, LUA_PARAM_INT, v, NULL};
    return p;
}

static lua_host_param string_param(const char *key, const char *v) {
    lua_host_param p = {key, LUA_PARAM_STRING, 0, v};
    return p;
}

static lua_host_param bool_param(const char *key, int v) {
    lua_host_param p = {key, LUA_PARAM_BOOL, v != 0, NULL};
    return p;
}

/* Every grid field must be an int of the launch arguments: the runtime
 * multiplies them as they are filled in, read at the offsets set here. */
static int check_launches(generated *g, const params_layout *params, const char *entry,
                          char *err, size_t err_len) {
    if (g->launch_count < 1) {
        snprintf(err, err_len, "%s: the template returned no launches", entry);
        return -1;
    }
    for (int i = 0; i < g->launch_count; i++)
        for (int f = 0; f < g->launch[i].factor_count; f++)
            for (int k = 0; k < g->launch[i].factor[f].field_count; k++) {
                const char *name = g->launch[i].factor[f].field[k];
                const param_field *field = params_field(params, name);
                if (!field || field->count != 1 || strcmp(field->type, "int") != 0) {
                    snprintf(err, err_len, "%s: launch %s: grid field '%s' is not an int of %s",
                             entry, g->launch[i].entry, name, params->name);
                    return -1;
                }
                g->launch[i].factor[f].offset[k] = (int)field->offset;
            }
    return 0;
}

/* The device functions of the spec's expressions (none without). */
static int spec_expressions(const fg_spec *spec, expr_source *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (!spec_has_expr(spec->score_mod) && !spec_has_expr(spec->mask_mod)) return 0;
    expr_tree *trees = malloc(2 * sizeof *trees);
    expr_aux aux[EXPR_MAX_AUX];
    int rc = -1;
    if (!trees)
        snprintf(err, err_len, "expressions: out of memory");
    else if (spec_expr_trees(spec, &trees[0], &trees[1], err, err_len) == 0 &&
             spec_expr_aux(spec, aux, err, err_len) == 0)
        rc = expr_emit(spec_has_expr(spec->score_mod) ? &trees[0] : NULL,
                       spec_has_expr(spec->mask_mod) ? &trees[1] : NULL, aux,
                       out, err, err_len);
    free(trees);
    return rc;
}

int generate_kernel(const char *entry, const fg_spec *spec, const kernel_target *target,
                    const plan_figure *figures, int figure_count, const params_layout *params,
                    generated *out, char *err, size_t err_len) {
    memset(out, 0, sizeof *out);
    if (figure_count < 0 || figure_count > MAX_FIGURES) {
        snprintf(err, err_len, "%s: %d plan figures (at most %d)", entry, figure_count, MAX_FIGURES);
        return -1;
    }
    char spec_text[128], tag[16], name[16];
    spec_name(spec, spec_text, sizeof spec_text);
    target_tag(target, tag, sizeof tag);
    target_name(target, name, sizeof name);
    expr_source exprs;
    if (spec_expressions(spec, &exprs, err, err_len) != 0) return -1;
    char *params_source = kernel_params_source(params);
    if (!params_source) {
        expr_source_free(&exprs);
        snprintf(err, err_len, "%s: out of memory", entry);
        return -1;
    }
    lua_host_param p[FIXED_PARAMS + MAX_FIGURES];
    int n = 0;
    p[n++] = int_param("arch", target->cc);
    p[n++] = string_param("target", name);
    p[n++] = string_param("target_tag", tag);
    p[n++] = string_param("generator_version", FG_GENERATOR_VERSION);
    p[n++] = string_param("spec_name", spec_text);
    p[n++] = string_param("dtype", spec_dtype_name(spec->dtype));
    p[n++] = int_param("head_dim", spec->head_dim);
    p[n++] = int_param("head_dim_v", spec_head_dim_v(spec)); /* the head dim where equal */
    p[n++] = string_param("mask", spec_mask_name(spec->mask));
    p[n++] = bool_param("dropout", spec->dropout);
    p[n++] = bool_param("varlen", spec->varlen);
    p[n++] = bool_param("kv_cache", spec->kv_cache);
    p[n++] = bool_param("latent", spec->kv_cache == FG_KV_LATENT);
    p[n++] = bool_param("softcap", spec->softcap);
    p[n++] = bool_param("alibi", spec->alibi);
    p[n++] = bool_param("sinks", spec->sinks);
    p[n++] = string_param("sparsity", sparsity_name(spec->sparsity));
    p[n++] = int_param("sparse_block_q", spec->sparse_block_q);
    p[n++] = int_param("sparse_block_k", spec->sparse_block_k);
    p[n++] = int_param("butterfly_factors", spec->butterfly_factors);
    p[n++] = string_param("params_struct", params_source);
    p[n++] = bool_param("score_mod", exprs.score_mod);
    p[n++] = bool_param("mask_mod", exprs.mask_mod);
    p[n++] = bool_param("aux_grad", exprs.aux_grad);
    p[n++] = string_param("expressions", exprs.text ? exprs.text : "");
    for (int i = 0; i < figure_count; i++) p[n++] = int_param(figures[i].name, figures[i].value);
    int rc = lua_host_run(entry, p, n, LUA_HOST_DEFAULT_BUDGET, out, err, err_len);
    free(params_source);
    expr_source_free(&exprs);
    if (rc == 0 && check_launches(out, params, entry, err, err_len) != 0) {
        generated_free(out);
        rc = -1;
    }
    return rc;
}

void generated_free(generated *g) {
    free(g->source);
    g->source = NULL;
}

/* The sm_90a probe's template, for sm_90 and one dtype. */
int generate_probe_sm90a(const char *dtype, generated *out, char *err, size_t err_len) {
    const lua_host_param p[] = {
        int_param("arch", 90),
        string_param("generator_version", FG_GENERATOR_VERSION),
        string_param("dtype", dtype),
    };
    return lua_host_run("kernel_probe_sm90a.lua", p, (int)(sizeof p / sizeof p[0]),
                        LUA_HOST_DEFAULT_BUDGET, out, err, err_len);
}

int generate_philox_bench(const kernel_target *target, int head_dim, generated *out, char *err,
                          size_t err_len) {
    const lua_host_param p[] = {
        int_param("arch", target->cc),
        string_param("generator_version", FG_GENERATOR_VERSION),
        int_param("head_dim", head_dim),
    };
    return lua_host_run("kernel_bench_philox.lua", p, (int)(sizeof p / sizeof p[0]),
                        LUA_HOST_DEFAULT_BUDGET, out, err, err_len);
}
