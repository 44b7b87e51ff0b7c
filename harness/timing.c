/* Timing: see timing.h. */
#include "harness/timing.h"

#include <time.h>

#define SAMPLES 5

/* Seconds of calls before the samples. From idle a GPU boosts its clock,
 * then its power limit brings it down (an H100: 1980 MHz falling to
 * 1450-1750 within a fraction of a second under attention kernels), so a
 * timing that starts cool reads up to 10% faster than one under load. Every
 * timing starts under load, as training runs and as bench/sdpa.py times the
 * peers. */
#define WARM_S 0.5

double fgh_time_calls(const fgh_device *d, int (*call)(void *user), void *user, int repeats) {
    const cuda_driver *cu = d->cu;
    CUevent e0, e1;
    if (!call(user)) return -1;
    cu->cuEventCreate(&e0, 0), cu->cuEventCreate(&e1, 0);
    const double warm_from = fgh_now_s();
    do {  // in batches, each waited for, so no queue runs on past the warm-up
        for (int i = 0; i < repeats; i++) call(user);
        cu->cuEventRecord(e1, NULL);
        cu->cuEventSynchronize(e1);
    } while (fgh_now_s() - warm_from < WARM_S);
    double samples[SAMPLES];
    for (int s = 0; s < SAMPLES; s++) {
        cu->cuEventRecord(e0, NULL);
        for (int i = 0; i < repeats; i++) call(user);
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

/* A flashgen call of the timed kind. */
typedef struct timed_call {
    fg_context *ctx;
    const fg_spec *spec;
    void *args;
} timed_call;

static int forward_call(void *user) {
    timed_call *c = user;
    fg_forward_args *a = c->args;
    a->offset += 1;
    return fg_forward(c->ctx, c->spec, a) == FG_OK;
}

static int backward_call(void *user) {
    timed_call *c = user;
    return fg_backward(c->ctx, c->spec, c->args) == FG_OK;
}

double fgh_time_forward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                        fg_forward_args *a, int repeats) {
    timed_call c = {ctx, spec, a};
    return fgh_time_calls(d, forward_call, &c, repeats);
}

double fgh_time_backward(const fgh_device *d, fg_context *ctx, const fg_spec *spec,
                         fg_backward_args *b, int repeats) {
    timed_call c = {ctx, spec, b};
    return fgh_time_calls(d, backward_call, &c, repeats);
}

double fgh_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
