/* Timing: see timing.h. */
#include "harness/timing.h"

#include <time.h>

#define SAMPLES 5

/* One launch sequence on the default stream; args is the call's own. */
typedef fg_status (*timed_call)(fg_context *ctx, const fg_spec *spec, void *args);

static double time_calls(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                         timed_call call, void *args, int repeats) {
    const cuda_driver *cu = d->cu;
    CUevent e0, e1;
    if (call(ctx, spec, args) != FG_OK) return -1;
    cu->cuEventCreate(&e0, 0), cu->cuEventCreate(&e1, 0);
    double samples[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
        cu->cuEventRecord(e0, NULL);
        for (int i = 0; i < repeats; i++) call(ctx, spec, args);
        cu->cuEventRecord(e1, NULL);
        cu->cuEventSynchronize(e1);
        float ms;
        cu->cuEventElapsedTime(&ms, e0, e1);
        samples[s] = ms / repeats;
    }
    cu->cuEventDestroy(e0), cu->cuEventDestroy(e1);
    for (int i = 0; i < SAMPLES; i++)
        for (int j = i + 1; j < SAMPLES; j++)
            if (samples[j] < samples[i]) {
                double t = samples[i];
                samples[i] = samples[j], samples[j] = t;
            }
    return samples[SAMPLES / 2];
}

static fg_status forward_call(fg_context *ctx, const fg_spec *spec, void *args) {
    fg_forward_args *a = args;
    a->offset += 1;
    return fg_forward(ctx, spec, a);
}

static fg_status backward_call(fg_context *ctx, const fg_spec *spec, void *args) {
    return fg_backward(ctx, spec, args);
}

double fgh_time_forward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                        fg_forward_args *a, int repeats) {
    return time_calls(d, ctx, spec, forward_call, a, repeats);
}

double fgh_time_backward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                         fg_backward_args *b, int repeats) {
    return time_calls(d, ctx, spec, backward_call, b, repeats);
}

double fgh_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
