#include "gen/generate.h"

#include <stdio.h>
#include <string.h>

#include "gen/lua_host.h"
#include "gen/spec.h"

static const char *sparsity_name(fg_sparsity s) {
    return s == FG_SPARSE_LAYOUT ? "layout" : s == FG_SPARSE_BUTTERFLY ? "butterfly" : "none";
}

#define INT_PARAM(k, v) {k, LUA_PARAM_INT, (v), 0}
#define STR_PARAM(k, v) {k, LUA_PARAM_STRING, 0, (v)}
#define BOOL_PARAM(k, v) {k, LUA_PARAM_BOOL, (v) != 0, 0}

/* Params every kernel template gets: the target and the spec. */
#define SPEC_PARAMS(arch, spec, spec_text)                                   \
    INT_PARAM("arch", arch), STR_PARAM("generator_version", FG_GENERATOR_VERSION), \
        STR_PARAM("spec_name", spec_text), STR_PARAM("dtype", spec_dtype_name((spec)->dtype)), \
        INT_PARAM("head_dim", (spec)->head_dim), STR_PARAM("mask", spec_mask_name((spec)->mask)), \
        BOOL_PARAM("dropout", (spec)->dropout), \
        STR_PARAM("sparsity", sparsity_name((spec)->sparsity)), \
        INT_PARAM("sparse_block_q", (spec)->sparse_block_q), \
        INT_PARAM("sparse_block_k", (spec)->sparse_block_k), \
        INT_PARAM("butterfly_factors", (spec)->butterfly_factors)

static int run_template(const char *entry, const lua_host_param *params, int count, char **source,
                        char *name, size_t name_len, char *err, size_t err_len) {
    lua_host_result result;
    memset(&result, 0, sizeof result);
    if (lua_host_run(entry, params, count, LUA_HOST_DEFAULT_BUDGET, &result, err, err_len) != 0)
        return -1;
    *source = result.source;
    snprintf(name, name_len, "%s", result.kernel_name);
    return 0;
}

int generate_forward(const fg_spec *spec, const fg_fwd_plan *plan, int arch, char **source,
                     char *name, size_t name_len, char *err, size_t err_len) {
    char spec_text[128];
    spec_name(spec, spec_text, sizeof spec_text);
    const lua_host_param params[] = {
        SPEC_PARAMS(arch, spec, spec_text),
        INT_PARAM("block_m", plan->block_m),
        INT_PARAM("block_n", plan->block_n),
        INT_PARAM("warps", plan->warps),
        INT_PARAM("m_tiles", plan->m_tiles),
        INT_PARAM("stages", plan->stages),
        INT_PARAM("head_dim_padded", plan->head_dim_padded),
        INT_PARAM("smem_row", plan->smem_row),
        INT_PARAM("smem_bytes", plan->smem_bytes),
        INT_PARAM("threads", plan->threads),
    };
    return run_template("kernel_fwd_sm80.lua", params, (int)(sizeof params / sizeof params[0]), source,
                        name, name_len, err, err_len);
}

int generate_backward(const fg_spec *spec, const fg_bwd_plan *plan, int arch, char **source,
                      char *name, size_t name_len, char *err, size_t err_len) {
    char spec_text[128];
    spec_name(spec, spec_text, sizeof spec_text);
    const lua_host_param params[] = {
        SPEC_PARAMS(arch, spec, spec_text),
        INT_PARAM("block_m", plan->block_m),
        INT_PARAM("block_n", plan->block_n),
        INT_PARAM("warps", plan->warps),
        INT_PARAM("threads", plan->threads),
        INT_PARAM("stages", plan->stages),
        INT_PARAM("head_dim_padded", plan->head_dim_padded),
        INT_PARAM("smem_row", plan->smem_row),
        INT_PARAM("ds_row", plan->ds_row),
        INT_PARAM("smem_bytes", plan->smem_bytes),
        INT_PARAM("s_warps_m", plan->s_warps_m),
        INT_PARAM("s_warps_n", plan->s_warps_n),
        INT_PARAM("kv_warps_n", plan->kv_warps_n),
        INT_PARAM("kv_warps_d", plan->kv_warps_d),
        INT_PARAM("q_warps_m", plan->q_warps_m),
        INT_PARAM("q_warps_d", plan->q_warps_d),
        INT_PARAM("col_splits", plan->col_splits),
        INT_PARAM("dq_chunk", PLAN_DQ_CHUNK),
    };
    return run_template("kernel_bwd_sm80.lua", params, (int)(sizeof params / sizeof params[0]), source,
                        name, name_len, err, err_len);
}

int generate_philox_bench(int arch, int head_dim, char **source, char *name, size_t name_len,
                          char *err, size_t err_len) {
    const lua_host_param params[] = {
        INT_PARAM("arch", arch),
        STR_PARAM("generator_version", FG_GENERATOR_VERSION),
        INT_PARAM("head_dim", head_dim),
    };
    return run_template("kernel_bench_philox.lua", params, (int)(sizeof params / sizeof params[0]), source,
                        name, name_len, err, err_len);
}
