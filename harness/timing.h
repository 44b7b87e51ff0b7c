/* Timing flashgen calls with device events, and the host clock. */
#ifndef FG_HARNESS_TIMING_H
#define FG_HARNESS_TIMING_H

#include "flashgen.h"
#include "harness/device.h"

/* Milliseconds per call of call(user), which queues work on the default
 * stream and returns 1 (0: it failed): device events around `repeats` calls,
 * median of 5 samples, after a first call and half a second of calls (the
 * clock the GPU holds under load). Negative when the first call fails. */
double fgh_time_calls(const fgh_device *d, int (*call)(void *user), void *user, int repeats);

/* The same of flashgen calls; negative when the warm-up call fails (the
 * context has the message). The forward takes a fresh dropout offset for
 * each call. */
double fgh_time_forward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                        fg_forward_args *a, int repeats);
double fgh_time_backward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                         fg_backward_args *b, int repeats);

/* Seconds of a monotonic host clock. */
double fgh_now_s(void);

#endif
