/* Generation: a canonical spec and a family's plan -> CUDA source, through
 * the sandboxed templates. */
#ifndef FG_GENERATE_H
#define FG_GENERATE_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/kernel_params.h"
#include "gen/lua_host.h"
#include "gen/target.h"

#ifndef FG_GENERATOR_VERSION
#define FG_GENERATOR_VERSION "0.0.0"
#endif

/* What a family's planner hands its template: the plan's figures by name. */
typedef struct plan_figure {
    const char *name;
    int value;
} plan_figure;

/* Generate a family's kernel: runs template `entry` (a kernel_*.lua file)
 * with the target, the spec, the plan's figures and the launch-argument
 * struct. Every launch the template returns must name an entry point and
 * grid fields of `params`. On success out->source is malloc'ed (free it with
 * generated_free). Returns 0, or -1 with err holding the template's
 * "file.lua:LINE: message". */
int generate_kernel(const char *entry, const fg_spec *spec, const kernel_target *target,
                    const plan_figure *figures, int figure_count, const params_layout *params,
                    generated *out, char *err, size_t err_len);

void generated_free(generated *g);

/* The Philox/tensor-core overlap benchmark (kernel_bench_philox): one module
 * with fg_philox_mma, fg_philox_rng and fg_philox_both, modelling the
 * forward's work per key tile at head dim head_dim. */
int generate_philox_bench(const kernel_target *target, int head_dim, generated *out, char *err,
                          size_t err_len);

/* The sm_90a probe (kernel_probe_sm90a): TMA loads, an mbarrier and wgmma on
 * one 64 x 64 x 64 tile, fg_probe_b_kmajor and fg_probe_b_mnmajor, for dtype
 * "fp16" or "bf16". Compiles for sm_90a only. */
int generate_probe_sm90a(const char *dtype, generated *out, char *err, size_t err_len);

#endif
