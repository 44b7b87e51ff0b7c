/* Generation: a canonical spec and its plan -> CUDA source, through the
 * sandboxed templates. */
#ifndef FG_GENERATE_H
#define FG_GENERATE_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/plan.h"

#ifndef FG_GENERATOR_VERSION
#define FG_GENERATOR_VERSION "0.0.0"
#endif

/* On success *source is malloc'ed and name holds the kernel's name. Returns
 * 0, or -1 with err holding the template's "file.lua:LINE: message". */
int generate_forward(const fg_spec *spec, const fg_fwd_plan *plan, int arch, char **source,
                     char *name, size_t name_len, char *err, size_t err_len);

/* The same for the backward: one module with NAME_pre, NAME and NAME_post;
 * name holds NAME. */
int generate_backward(const fg_spec *spec, const fg_bwd_plan *plan, int arch, char **source,
                      char *name, size_t name_len, char *err, size_t err_len);

/* The Philox/tensor-core overlap benchmark (templates/kernel_bench_philox.lua): one
 * module with fg_philox_mma, fg_philox_rng and fg_philox_both, modelling the
 * forward's work per key tile at head dim head_dim. */
int generate_philox_bench(int arch, int head_dim, char **source, char *name, size_t name_len,
                          char *err, size_t err_len);

#endif
