/* The tuner's measuring loop and selection rule, apart from any GPU so a
 * test can drive them with a scripted timer.
 *
 * Candidates are timed in rounds, each round running every candidate once in
 * a fixed order, so slow drifts (clocks, temperature) touch all of them
 * alike. Candidate 0 is the derived plan. The spread is the largest relative
 * 10-90% range of any candidate's samples: a difference smaller than that is
 * noise. A candidate is kept only if its median beats the derived
 * plan's by more than the spread; among those kept, the earliest (in the
 * fixed order) whose median is within the spread of the fastest is chosen,
 * so that two runs measuring the same GPU pick the same plan. */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantile q of sorted values, interpolated. */
static double quantile(const double *sorted, int n, double q) {
    double pos = q * (n - 1);
    int i = (int)pos;
    if (i >= n - 1) return sorted[n - 1];
    return sorted[i] + (pos - i) * (sorted[i + 1] - sorted[i]);
}

int tune_select(int n, const double *median, const int *failed, double spread) {
    if (n < 1 || failed[0]) return 0;
    int best = -1;
    for (int i = 1; i < n; i++)
        if (!failed[i] && median[i] < median[0] * (1.0 - spread) &&
            (best < 0 || median[i] < median[best]))
            best = i;
    if (best < 0) return 0;
    for (int i = 1; i < best; i++)
        if (!failed[i] && median[i] < median[0] * (1.0 - spread) &&
            median[i] <= median[best] * (1.0 + spread))
            return i;
    return best;
}

int tune_measure(int n, tune_time_fn time, void *user, int warmup, int rounds,
                 tune_outcome *out) {
    memset(out, 0, sizeof *out);
    if (n < 1 || n > TUNE_MAX_CANDIDATES || rounds < 1 || rounds > TUNE_MAX_ROUNDS) return -1;
    out->n = n;
    for (int w = 0; w < warmup; w++)
        for (int i = 0; i < n; i++)
            if (!out->failed[i] && time(user, i) < 0) out->failed[i] = 1;
    static _Thread_local double samples[TUNE_MAX_CANDIDATES][TUNE_MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            if (out->failed[i]) continue;
            double ms = time(user, i);
            if (ms < 0) out->failed[i] = 1;
            samples[i][r] = ms;
        }
    if (out->failed[0]) return -1; /* the derived plan must run */
    for (int i = 0; i < n; i++) {
        if (out->failed[i]) continue;
        qsort(samples[i], (size_t)rounds, sizeof samples[i][0], cmp_double);
        double med = quantile(samples[i], rounds, 0.5);
        double range = quantile(samples[i], rounds, 0.9) - quantile(samples[i], rounds, 0.1);
        out->median[i] = med;
        if (med > 0 && range / med > out->spread) out->spread = range / med;
    }
    out->chosen = tune_select(n, out->median, out->failed, out->spread);
    return 0;
}
