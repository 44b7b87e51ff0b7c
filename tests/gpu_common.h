/* What the GPU tests (gpu_forward, gpu_backward) share: the CUDA driver and
 * the device, a seeded random stream, fp16/bf16 storage, device tensors
 * wrapped in poisoned lead and guard zones, and the random inputs of a case.
 *
 * Failures found here are counted in the calling test's own check.h
 * counters: its main calls gpu_checks_attach(&check_passed_count,
 * &check_failed_count) before anything else. */
#ifndef FG_TESTS_GPU_COMMON_H
#define FG_TESTS_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "runtime/cuda_libs.h"

enum { ORDER_BSHD = 0, ORDER_BHSD = 1 };
/* Poisoned elements before and after each device tensor (64 keeps the data
 * 16-byte aligned). */
enum { LEAD = 64, GUARD = 512 };
#define POISON16 0xFFFFu
#define POISON32 0xFFFFFFFFu

struct gpu_case; /* gpu_cases.h */

/* ---- checks ------------------------------------------------------------------ */

void gpu_checks_attach(int *passed, int *failed);
void gpu_check_pass(void);
void gpu_check_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* CHECK of check.h for the shared files: the same output, the test's counters. */
#define GPU_CHECK(cond, ...)                                                    \
    do {                                                                        \
        if (cond) gpu_check_pass();                                             \
        else gpu_check_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);            \
    } while (0)

/* ---- small utilities ---------------------------------------------------------- */

void rng_seed(uint64_t seed);
uint64_t rng_next(void); /* splitmix64 */
double rng_unit(void);   /* (0, 1] */
float rng_normal(void);  /* Box-Muller */
double now_s(void);

uint16_t to_storage(float x, fg_dtype dt);
float from_storage(uint16_t x, fg_dtype dt);

/* `usage: prog [--quick] [name-filter]`; 0 (usage printed) on a bad option. */
int gpu_parse_args(int argc, char **argv, int *quick, const char **filter);

/* ---- the device ------------------------------------------------------------------ */

extern const cuda_driver *gpu_cu;

/* CHECKs a driver result; 1 when it succeeded. */
int cu_ok(CUresult r, const char *what);

/* Loads the driver and makes the device's primary context (which the library
 * retains too) current, so that the test allocates in the same one. */
int open_device(CUdevice *dev, CUcontext *cuctx);

/* The start every GPU test shares: a flashgen context on the live GPU (with
 * no GPU the test exits as skipped, code 77) and the device opened for the
 * test's own allocations. NULL after a recorded failure. */
fg_context *gpu_test_open(CUdevice *dev, CUcontext *cuctx);
void gpu_test_close(fg_context *ctx, CUdevice dev, CUcontext cuctx);

/* ---- device tensors -------------------------------------------------------------- */

/* A tensor as the kernel sees it plus its allocation: LEAD poisoned elements,
 * the strided extent, GUARD poisoned elements. host mirrors the allocation. */
struct dev_tensor {
    fg_tensor t;
    int batch, seq, heads, dim;
    CUdeviceptr base;
    size_t elems;   /* allocated elements, lead and guard included */
    uint16_t *host;
};

/* Strides of a (B,S,H,D) or (B,H,S,D) tensor with `pad` extra elements after
 * each row (0: dense). data is NULL. */
fg_tensor make_strides(int order, int pad, int seq, int heads, int dim);
size_t tensor_index(const struct dev_tensor *x, int b, int s, int h, int d);

/* Allocates the tensor on the device and fills the host mirror with poison. */
int dev_tensor_alloc(struct dev_tensor *x, int order, int pad, int batch, int seq, int heads,
                     int dim);
void dev_tensor_free(struct dev_tensor *x);
/* Fills the whole device allocation (lead, gaps and guard included) with poison. */
int dev_tensor_poison(struct dev_tensor *x, const char *what);
/* Scatters a (B,H,S,D) contiguous float array into the tensor and uploads it;
 * gaps, lead and guard stay NaN so that reading them would show. */
int dev_tensor_upload(struct dev_tensor *x, const float *src, fg_dtype dt);
/* Downloads the tensor, gathers it into (B,H,S,D) doubles and checks that
 * every element is finite and every other element of the allocation still
 * holds the poison. Leaves the host mirror all poison. */
int dev_tensor_take(struct dev_tensor *x, double *dst, fg_dtype dt, const char *name);
/* Copies the whole device allocation into the host mirror, as it is. */
int dev_tensor_pull(struct dev_tensor *x, const char *what);
/* CHECKs that the device allocation still equals the host mirror bit for bit
 * (an input, or an output pulled before, that nothing may write). */
int dev_tensor_unchanged(const struct dev_tensor *x, const char *name);

/* ---- inputs ---------------------------------------------------------------------- */

struct inputs {
    float *q, *k, *v;             /* (B,H,S,D) contiguous, rounded to the dtype */
    float *d_o;                   /* like q; only after inputs_add_d_o */
    size_t nq, nk;
};

void random_fill(float *x, size_t n, fg_dtype dt);
/* q, k, v of a case: random normal, or the dropout probe pattern (c->probe). */
int inputs_make(const struct gpu_case *c, struct inputs *in);
/* A random normal dO, rounded to the dtype. */
int inputs_add_d_o(const struct gpu_case *c, struct inputs *in);
void inputs_free(struct inputs *in);

/* ---- tuning ------------------------------------------------------------------------ */

/* Tune a pass of the named case (gpu_cases) on the live GPU and check the
 * report and the kept choice; prints a line. Returns the case's index when
 * tuned (the caller then runs the case again, now with the tuned plan), else
 * -1. */
int gpu_tune_case(fg_context *ctx, const char *name, fg_pass pass);

#endif
