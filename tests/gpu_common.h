/* What the GPU tests (gpu_forward, gpu_backward, gpu_varlen, gpu_decode) share on top of the
 * harness (harness/: the device, poisoned tensors, problems, the reference
 * comparisons): their check counters, the test's start on the device,
 * checked downloads, and tuning a case.
 *
 * Failures found here are counted in the calling test's own check.h
 * counters: its main calls gpu_checks_attach(&check_passed_count,
 * &check_failed_count) before anything else. */
#ifndef FG_TESTS_GPU_COMMON_H
#define FG_TESTS_GPU_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "harness/buffer.h"
#include "harness/device.h"
#include "harness/tensor.h"

/* Poisoned elements before and after each device tensor and lse (64 keeps
 * the data 16-byte aligned). */
enum { LEAD = 64, GUARD = 512 };

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

/* `usage: prog [--quick] [--shard I/N] [name-filter]`; 0 (usage printed) on a bad option.
 * --shard I/N runs the cases whose index is I modulo N, so N processes share a suite. */
int gpu_parse_args(int argc, char **argv, int *quick, const char **filter);

/* Whether case i belongs to this process's shard (every case without --shard). */
int gpu_in_shard(int i);

/* ---- the device ------------------------------------------------------------------ */

/* The device the test allocates on: the primary context the library uses. */
extern fgh_device gpu_dev;

/* CHECKs the result of a harness call: 1 when it succeeded, else a failure
 * naming `what` with the harness's message. */
int gpu_ok(int ok, const char *what);

/* The start every GPU test shares: a flashgen context on the live GPU (with
 * no GPU the test exits as skipped, code 77) and gpu_dev opened for the
 * test's own allocations. NULL after a recorded failure. */
fg_context *gpu_test_open(void);
void gpu_test_close(fg_context *ctx);

/* A suite of named cases (gpu_varlen, gpu_decode): each case i that the
 * arguments select (--quick: those quick(i) marks; a filter: those whose
 * name holds it) is run(ctx, i); then, unless --quick or a filter leaves it
 * out, the checks named `last` (under compute-sanitizer, which --quick
 * serves, they would report the driver's refusals). */
typedef struct gpu_suite {
    int count;
    const char *(*name)(int i);
    int (*quick)(int i);
    void (*run)(fg_context *ctx, int i);
    const char *last_name;
    void (*last)(fg_context *ctx);
} gpu_suite;
/* Parses the arguments, opens the device, runs the suite, prints its time
 * and closes; 0 on a bad option (usage printed), else 1: the caller returns
 * check_summary. */
int gpu_run_suite(int argc, char **argv, const gpu_suite *s);

/* A context whose calls read their arrays back (FLASHGEN_DEBUG=1); NULL
 * after a recorded failure. */
fg_context *gpu_debug_context(void);
/* CHECKs that fg_forward of (spec, a) is refused as an invalid argument
 * with a message naming `arg`; `what` names the change. */
void gpu_expect_refused(fg_context *ctx, const fg_spec *spec, fg_forward_args a, const char *what,
                        const char *arg);

/* ---- device memory ------------------------------------------------------------- */

/* Takes an output (fgh_tensor_take) and CHECKs that every element is finite
 * and that nothing around it lost the poison. */
int gpu_take(fgh_tensor *x, double *dst, fg_dtype dt, const char *name);
/* CHECKs that the device buffer still equals its mirror bit for bit (an
 * input, or an output pulled before, that nothing may write). */
int gpu_unchanged(const fgh_buffer *b, const char *name);

/* ---- tuning ------------------------------------------------------------------------ */

/* Tune a pass of the named case (gpu_cases) on the live GPU and check the
 * report and the kept choice; prints a line. Returns the case's index when
 * tuned (the caller then runs the case again, now with the tuned plan), else
 * -1. */
int gpu_tune_case(fg_context *ctx, const char *name, fg_pass pass);

#endif
