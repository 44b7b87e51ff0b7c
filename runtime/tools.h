/* What flashgen's own tools (the command line, the GPU harness, the tests)
 * need beyond flashgen.h, in one place: the named targets, spec names,
 * bundle builds and the Philox benchmark's module from the library, with
 * the cache layer's management calls and bundle format (cache/cache.h,
 * cache/bundle.h) and the CUDA driver and NVRTC tables (runtime/cuda_libs.h). */
#ifndef FG_TOOLS_H
#define FG_TOOLS_H

#include <stddef.h>

#include "cache/bundle.h"
#include "cache/cache.h"
#include "flashgen.h"
#include "runtime/cuda_libs.h"

/* The named targets ("t4", "a100", "rtx3090", "l4", "h100"), in order. */
int tools_target_count(void);
const char *tools_target_name(int index); /* NULL past the end */
/* A named target's compute capability (75, 80, ...), or 0 if unknown. */
int tools_target_cc(const char *name);
/* The targets as NVRTC names them ("sm_75", ..., "sm_90", "sm_90a") that
 * the named targets' kernels are built for, each once, in cache_target_cmp's
 * order (the kernel cache's folders); returns the count (at most max). */
int tools_target_folders(char (*out)[CACHE_TARGET_SIZE], int max);

/* The short name of a spec's canonical form ("bf16_d128_causal_drop").
 * Returns 0, or -1 with err when the spec is invalid. */
int tools_spec_name(const fg_spec *spec, char *buf, size_t len, char *err, size_t err_len);

/* FG_OK when ctx's target runs this pass of spec; FG_ERR_UNSUPPORTED (or
 * FG_ERR_INVALID_ARGUMENT) with the reason in the context's message when
 * not. Nothing is planned or compiled. */
fg_status tools_check_spec(fg_context *ctx, const fg_spec *spec, fg_pass pass);

/* Called for each kernel a bundle build saves (sha256 and versions filled
 * in, step left empty for the caller, which knows which step was kept). */
typedef void (*bundle_saved_fn)(const bundle_entry *entry, void *user);

/* Bundle builds: from now on every step ctx compiles or reads from the
 * user's cache is also saved in dir under its portable key and reported to
 * saved; bundles are then not searched, so each entry's NVRTC version is
 * known. */
fg_status tools_bundle_build_into(fg_context *ctx, const char *dir, bundle_saved_fn saved,
                                  void *user);

/* The Philox/tensor-core overlap benchmark's module for compute capability
 * cc (fg_philox_mma, fg_philox_rng, fg_philox_both; head_dim sets the
 * forward's work per key tile), compiled: *cubin malloc'ed. Returns 0, or -1
 * with err. */
int tools_philox_bench_cubin(int cc, int head_dim, void **cubin, size_t *cubin_len, char *err,
                             size_t err_len);

#endif
