/* Tests of the reference itself: conversions, Philox and the dropout stream,
 * mask/sparsity visibility, the fp64 attention against hand computations and
 * a slow independent implementation, and the low-precision yardstick. */
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/ref_problems.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static float *rand_tensor(size_t n, int dtype) {
    float *x = malloc(n * sizeof *x);
    if (!x)
        return NULL;
    for (size_t t = 0; t < n; t++)
        x[t] = ref_round(rng_uniform(-1.0f, 1.0f), dtype);
    return x;
}

static float f_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of_f(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The logit of a visible pair from its scaled score, written out from the
 * definition: the cap, then ALiBi's bias at the pair's distance from the
 * diagonal. */
static double naive_logit(const ref_problem *p, int b, int h, int i, int j, double s) {
    if (p->softcap > 0)
        s = p->softcap * tanh(s / p->softcap);
    if (p->alibi_slopes) {
        size_t at = (size_t)(p->batch0 + b) * (size_t)p->alibi_stride_batch + (size_t)h;
        s -= (double)p->alibi_slopes[at] * fabs((double)i + (double)p->diag_offset - (double)j);
    }
    return s;
}

/* Slow, straightforward attention built only on ref_visible and
 * ref_dropout_keep: every (i, j) pair is asked, sums run in plain order; the
 * sink is one more term of the max and the sum. */
static void naive_attention(const ref_problem *p, const float *q, const float *k, const float *v,
                            double *o, double *lse) {
    int group = p->heads_q / p->heads_kv;
    uint32_t thr = ref_dropout_threshold(p->dropout_p);
    double dscale = ref_dropout_scale(thr);
    double *s = malloc(sizeof(double) * (size_t)(p->seqlen_k + 1));
    for (int b = 0; b < p->batch; b++)
        for (int h = 0; h < p->heads_q; h++)
            for (int i = 0; i < p->seqlen_q; i++) {
                size_t row = ((size_t)b * p->heads_q + h) * p->seqlen_q + i;
                const float *qi = q + row * p->head_dim;
                size_t kvbase = ((size_t)b * p->heads_kv + h / group) * p->seqlen_k;
                double m = p->sinks ? (double)p->sinks[h] : -INFINITY;
                int n = 0;
                for (int j = 0; j < p->seqlen_k; j++) {
                    if (!ref_visible(p, h, i, j))
                        continue;
                    const float *kj = k + (kvbase + j) * p->head_dim;
                    double dot = 0;
                    for (int d = 0; d < p->head_dim; d++)
                        dot += (double)qi[d] * kj[d];
                    s[j] = naive_logit(p, b, h, i, j, p->scale * dot);
                    m = fmax(m, s[j]);
                    n++;
                }
                double sum = p->sinks ? exp((double)p->sinks[h] - m) : 0;
                for (int j = 0; j < p->seqlen_k; j++)
                    if (ref_visible(p, h, i, j))
                        sum += exp(s[j] - m);
                double l = n || p->sinks ? m + log(sum) : -INFINITY;
                const int dv = dv_of(p); /* v's and o's rows */
                for (int d = 0; d < dv; d++) {
                    double acc = 0;
                    for (int j = 0; j < p->seqlen_k; j++) {
                        if (!ref_visible(p, h, i, j))
                            continue;
                        double pj = exp(s[j] - l);
                        if (thr)
                            pj *= ref_dropout_keep(p->seed, p->offset, p->batch0 + b, h, i, j, thr)
                                      ? dscale
                                      : 0.0;
                        acc += pj * v[(kvbase + j) * dv + d];
                    }
                    o[row * dv + d] = acc;
                }
                lse[row] = l;
            }
    free(s);
}

/* max |a - b| over n, treating equal infinities as 0 apart */
static double max_abs_diff(const double *a, const double *b, size_t n) {
    double m = 0;
    for (size_t t = 0; t < n; t++) {
        if (a[t] == b[t])
            continue;
        double d = fabs(a[t] - b[t]);
        if (isnan(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}

/* ---- fp16 / bf16 ---------------------------------------------------------------- */

static void test_half(void) {
    CHECK(ref_float_to_half(1.0f) == 0x3c00, "1.0 -> %04x", ref_float_to_half(1.0f));
    CHECK(ref_float_to_half(-2.0f) == 0xc000, "-2.0");
    CHECK(ref_float_to_half(-0.0f) == 0x8000, "-0.0");
    CHECK(ref_float_to_half(65504.0f) == 0x7bff, "max half");
    CHECK(ref_float_to_half(65519.0f) == 0x7bff, "just below the overflow midpoint");
    CHECK(ref_float_to_half(65520.0f) == 0x7c00, "overflow midpoint ties to inf (even)");
    CHECK(ref_float_to_half(1e9f) == 0x7c00, "overflow to inf");
    CHECK(ref_float_to_half(-1e9f) == 0xfc00, "overflow to -inf");
    CHECK(ref_float_to_half(INFINITY) == 0x7c00, "inf");
    CHECK(ref_float_to_half(-INFINITY) == 0xfc00, "-inf");
    uint16_t hn = ref_float_to_half(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "NaN -> %04x", hn);
    hn = ref_float_to_half(f_of_bits(0x7f800001u)); /* payload only in low bits */
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "low-payload NaN stays NaN: %04x", hn);

    /* ties in the normal range: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01 */
    CHECK(ref_float_to_half(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even (down)");
    CHECK(ref_float_to_half(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "tie to even (up)");
    CHECK(ref_float_to_half(1.0f + ldexpf(1, -11) + ldexpf(1, -20)) == 0x3c01, "above tie");
    CHECK(ref_float_to_half(1.0f + ldexpf(1, -11) - ldexpf(1, -20)) == 0x3c00, "below tie");
    CHECK(ref_float_to_half(2047.0f) == 0x67ff, "2047 exact");
    CHECK(ref_float_to_half(2049.0f) == 0x6800, "2049 ties to 2048");
    CHECK(ref_float_to_half(2051.0f) == 0x6802, "2051 ties to 2052");

    /* subnormals */
    CHECK(ref_float_to_half(ldexpf(1, -24)) == 0x0001, "smallest subnormal");
    CHECK(ref_float_to_half(ldexpf(1, -25)) == 0x0000, "half of it ties to 0");
    CHECK(ref_float_to_half(-ldexpf(1, -25)) == 0x8000, "negative tie to -0");
    CHECK(ref_float_to_half(ldexpf(1.0f + ldexpf(1, -20), -25)) == 0x0001, "above tie rounds up");
    CHECK(ref_float_to_half(3 * ldexpf(1, -25)) == 0x0002, "1.5 ulp ties to 2");
    CHECK(ref_float_to_half(5 * ldexpf(1, -25)) == 0x0002, "2.5 ulp ties to 2");
    CHECK(ref_float_to_half(ldexpf(1, -14)) == 0x0400, "smallest normal");
    CHECK(ref_float_to_half(ldexpf(1, -14) - ldexpf(1, -25)) == 0x0400,
          "largest subnormal + half ulp ties up into the normals");
    CHECK(ref_float_to_half(ldexpf(1, -30)) == 0x0000, "far below: zero");
    CHECK(ref_float_to_half(f_of_bits(1)) == 0x0000, "float subnormal: zero");
    CHECK(ref_half_to_float(0x0001) == ldexpf(1, -24), "decode smallest subnormal");
    CHECK(ref_half_to_float(0x03ff) == ldexpf(1023, -24), "decode largest subnormal");
    CHECK(ref_half_to_float(0x8000) == 0.0f && signbit(ref_half_to_float(0x8000)), "-0");
    CHECK(ref_half_to_float(0x7bff) == 65504.0f, "decode max");
    CHECK(isinf(ref_half_to_float(0xfc00)) && ref_half_to_float(0xfc00) < 0, "decode -inf");
    CHECK(isnan(ref_half_to_float(0x7e00)), "decode NaN");

    /* every pattern round-trips; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ref_half_to_float((uint16_t)h);
        uint16_t back = ref_float_to_half(f);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (is_nan ? !isnan(f) || !((back & 0x7c00) == 0x7c00 && (back & 0x3ff)) : back != h)
            bad++;
        /* the decoded value must equal mantissa * 2^exponent computed in double */
        if (!is_nan && (h & 0x7c00) != 0x7c00) {
            int e = (h >> 10) & 0x1f, mm = h & 0x3ff;
            double want = e ? ldexp(1024 + mm, e - 25) : ldexp(mm, -24);
            if (h & 0x8000)
                want = -want;
            if ((double)f != want)
                bad++;
        }
    }
    CHECK(bad == 0, "%d half patterns failed the round trip", bad);

    /* random floats in range go to a nearest neighbour, ties to even */
    bad = 0;
    for (int t = 0; t < 200000; t++) {
        float f = f_of_bits((uint32_t)(rng_next() & 0x7fffffffu));
        if (!(f < 65504.0f))
            continue;
        if (t & 1)
            f = ldexpf(f, -((int)(rng_next() % 40))); /* reach the subnormals */
        uint16_t r = ref_float_to_half(f);
        double e = fabs((double)f - ref_half_to_float(r));
        double up = r < 0x7bff ? fabs((double)f - ref_half_to_float((uint16_t)(r + 1))) : INFINITY;
        double dn = r > 0 ? fabs((double)f - ref_half_to_float((uint16_t)(r - 1))) : INFINITY;
        if (e > up || e > dn || ((e == up || e == dn) && (r & 1)))
            bad++;
    }
    CHECK(bad == 0, "%d random floats not rounded to nearest even half", bad);

    CHECK(ref_round(1.0f + ldexpf(1, -11) + ldexpf(1, -20), 0) == 1.0f + ldexpf(1, -10),
          "ref_round fp16");
    /* ref_round agrees with the encode/decode pair everywhere, edges included */
    bad = 0;
    for (int t = 0; t < 400000; t++) {
        uint32_t u = (uint32_t)rng_next();
        if (t & 1) /* float exponents around the half range: 2^-27 .. 2^23 */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + rng_next() % 51) << 23);
        float f = f_of_bits(u), r = ref_round(f, 0), w = ref_half_to_float(ref_float_to_half(f));
        if (bits_of_f(r) != bits_of_f(w) && !(isnan(r) && isnan(w)))
            bad++;
    }
    static const uint32_t edges[] = {0x38800000u, 0x387fffffu, 0x387ff000u, 0x477fefffu,
                                     0x477ff000u, 0x477fe000u, 0x477fffffu, 0x47800000u,
                                     0x33000000u, 0x33000001u};
    for (size_t t = 0; t < sizeof edges / sizeof edges[0]; t++)
        for (uint32_t sgn = 0; sgn < 2; sgn++) {
            float f = f_of_bits(edges[t] | sgn << 31);
            if (bits_of_f(ref_round(f, 0)) != bits_of_f(ref_half_to_float(ref_float_to_half(f))))
                bad++;
        }
    CHECK(bad == 0, "%d values where ref_round(fp16) differs from the round trip", bad);
    CHECK(ref_round(70000.0f, 0) == INFINITY, "ref_round fp16 overflow");
}

static void test_bf16(void) {
    CHECK(ref_float_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(ref_float_to_bf16(-0.0f) == 0x8000, "-0");
    CHECK(ref_float_to_bf16(1.0f + ldexpf(1, -8)) == 0x3f80, "tie to even (down)");
    CHECK(ref_float_to_bf16(1.0f + 3 * ldexpf(1, -8)) == 0x3f82, "tie to even (up)");
    CHECK(ref_float_to_bf16(1.0f + ldexpf(1, -8) + ldexpf(1, -20)) == 0x3f81, "above tie");
    CHECK(ref_float_to_bf16(f_of_bits(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
    CHECK(ref_float_to_bf16(f_of_bits(0x7f7f7fffu)) == 0x7f7f, "just below: max bf16");
    CHECK(ref_float_to_bf16(INFINITY) == 0x7f80 && ref_float_to_bf16(-INFINITY) == 0xff80, "inf");
    uint16_t bn = ref_float_to_bf16(f_of_bits(0x7f800001u));
    CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f), "low-payload NaN stays NaN: %04x", bn);
    bn = ref_float_to_bf16(f_of_bits(0xffffffffu));
    CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f), "all-ones NaN stays NaN: %04x", bn);
    CHECK(ref_float_to_bf16(f_of_bits(0x00008000u)) == 0x0000, "subnormal tie to even 0");
    CHECK(ref_float_to_bf16(f_of_bits(0x00018000u)) == 0x0002, "subnormal tie to even 2");
    CHECK(ref_float_to_bf16(f_of_bits(0x00008001u)) == 0x0001, "subnormal above tie");
    CHECK(ref_float_to_bf16(f_of_bits(0x007fffffu)) == 0x0080, "carry into the normals");
    CHECK(ref_bf16_to_float(0x4049) == 3.140625f, "decode");

    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = ref_bf16_to_float((uint16_t)b);
        int is_nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
        uint16_t back = ref_float_to_bf16(f);
        if (is_nan ? !isnan(f) || !isnan(ref_bf16_to_float(back)) : back != b)
            bad++;
    }
    CHECK(bad == 0, "%d bf16 patterns failed the round trip", bad);

    bad = 0;
    for (int t = 0; t < 200000; t++) {
        uint32_t u = (uint32_t)(rng_next() & 0x7fffffffu);
        if (u >= 0x7f7f8000u)
            continue; /* keep a finite upper neighbour */
        float f = f_of_bits(u);
        uint16_t r = ref_float_to_bf16(f);
        double e = fabs((double)f - ref_bf16_to_float(r));
        double up = fabs((double)f - ref_bf16_to_float((uint16_t)(r + 1)));
        double dn = r > 0 ? fabs((double)f - ref_bf16_to_float((uint16_t)(r - 1))) : INFINITY;
        if (e > up || e > dn || ((e == up || e == dn) && (r & 1)))
            bad++;
    }
    CHECK(bad == 0, "%d random floats not rounded to nearest even bf16", bad);
    CHECK(ref_round(1.0f + ldexpf(1, -8) + ldexpf(1, -20), 1) == 1.0f + ldexpf(1, -7),
          "ref_round bf16");
    CHECK(bits_of_f(ref_round(0.1f, 1)) == 0x3dcd0000u, "ref_round 0.1 bf16: %08x",
          bits_of_f(ref_round(0.1f, 1)));
}

/* ---- Philox and dropout ----------------------------------------------------------- */

static void test_philox_kat(void) {
    /* Random123 kat_vectors, philox4x32 with 10 rounds: counter, key, expected */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        ref_philox4x32_10(kat[t], kat[t] + 4, out);
        for (int w = 0; w < 4; w++)
            CHECK(out[w] == kat[t][6 + w], "kat %d word %d: %08x != %08x", t, w, out[w],
                  kat[t][6 + w]);
    }
}

static void test_dropout_params(void) {
    CHECK(ref_dropout_threshold(0.0) == 0, "p=0");
    CHECK(ref_dropout_threshold(-0.5) == 0, "p<0");
    CHECK(ref_dropout_threshold(NAN) == 0, "p NaN");
    CHECK(ref_dropout_threshold(1.0) == 256, "p=1");
    CHECK(ref_dropout_threshold(3.0) == 256, "p>1");
    CHECK(ref_dropout_threshold(0.5) == 128, "p=0.5");
    CHECK(ref_dropout_threshold(0.3) == 77, "p=0.3 -> %u", ref_dropout_threshold(0.3));
    CHECK(ref_dropout_threshold(0.999) == 256, "p just below 1 rounds to all-drop");
    CHECK(ref_dropout_threshold(0.001) == 0, "p below 1/512 rounds to none");
    CHECK(ref_dropout_scale(0) == 1.0, "scale at 0");
    CHECK(ref_dropout_scale(128) == 2.0, "scale at 1/2");
    CHECK(ref_dropout_scale(256) == 0.0, "scale when all drop");
    CHECK(fabs(ref_dropout_scale(77) - 256.0 / 179.0) < 1e-15, "scale at 0.3");
    for (int j = 0; j < 64; j++) {
        CHECK(ref_dropout_keep(1, 2, 0, 0, 3, j, 0) == 1, "threshold 0 keeps all");
        CHECK(ref_dropout_keep(1, 2, 0, 0, 3, j, 256) == 0, "threshold 256 drops all");
    }
}

/* The element -> Philox mapping, written from the tensor-core thread's point
 * of view: row i lies in 16-row tile i/16 as its row g = i%8 (upper half,
 * i%16 < 8) or g + 8 (lower half); column j lies in 32-column stretch j/32,
 * 8-column tile (j%32)/8. The thread owning rows g, g+8 and columns 2t, 2t+1
 * of each tile uses counter (stretch*4 + t, tile16*8 + g) and reads its
 * words in order: upper-half row then lower, tiles 0,1 then 2,3, each tile's
 * two columns as two bytes, least significant first. */
static int keep_by_layout(uint64_t seed, uint64_t offset, int b, int h, int64_t i, int64_t j,
                          uint32_t thr) {
    int64_t stretch = j >> 5, tile16 = i >> 4;
    int g = (int)(i & 7), lower = (int)((i >> 3) & 1);
    int tile = (int)((j & 31) >> 3), col = (int)(j & 7);
    uint32_t ctr[4] = {(uint32_t)(stretch * 4 + (col >> 1)), (uint32_t)(tile16 * 8 + g),
                       (uint32_t)b * 65536u + (uint32_t)h, (uint32_t)offset};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32)};
    uint32_t out[4];
    ref_philox4x32_10(ctr, key, out);
    uint32_t word = out[lower * 2 + tile / 2];
    uint32_t r = (word >> (8 * ((tile % 2) * 2 + (col & 1)))) & 0xff;
    return r >= thr;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void test_dropout_layout(void) {
    uint64_t seeds[3] = {0, 0x123456789abcdef0ull, 42};
    uint64_t offsets[3] = {0, 0xfedcba9876543210ull, 7};
    int bad = 0, n = 0;
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 3; b++)
            for (int h = 0; h < 5; h += 2)
                for (int64_t i = 0; i < 300; i += 37)
                    for (int64_t j = 0; j < 200; j++, n++)
                        if (ref_dropout_keep(seeds[s], offsets[s], b * 1000, h, i, j, 117) !=
                            keep_by_layout(seeds[s], offsets[s], b * 1000, h, i, j, 117))
                            bad++;
    CHECK(bad == 0, "%d of %d keep decisions differ from the layout", bad, n);

    /* rows 21 and 29 (one pair of a 16-row tile) across a 32-column stretch
     * use all 64 bytes of their 4 Philox calls, each once: recover every
     * element's 8-bit value from the keep decisions (keep iff value >=
     * threshold) and compare the two multisets */
    const uint64_t seed = 0xabcdef0123ull, offset = 0x300000077ull;
    uint32_t got[64], want[64];
    for (int e = 0; e < 64; e++) {
        uint32_t lo = 0, hi = 255; /* largest threshold that still keeps */
        while (lo < hi) {
            uint32_t mid = (lo + hi + 1) / 2;
            if (ref_dropout_keep(seed, offset, 1, 2, e < 32 ? 21 : 29, 32 + e % 32, mid))
                lo = mid;
            else
                hi = mid - 1;
        }
        got[e] = lo;
    }
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32)};
    for (uint32_t call = 0; call < 4; call++) {
        uint32_t ctr[4] = {4 + call, 8 + 5, (1u << 16) | 2u, (uint32_t)offset}, out[4];
        ref_philox4x32_10(ctr, key, out);
        for (int w = 0; w < 4; w++)
            for (int byte = 0; byte < 4; byte++)
                want[call * 16 + w * 4 + byte] = (out[w] >> (8 * byte)) & 0xff;
    }
    qsort(got, 64, sizeof got[0], cmp_u32);
    qsort(want, 64, sizeof want[0], cmp_u32);
    CHECK(memcmp(got, want, sizeof got) == 0, "stretch values are not the 4 calls' 64 bytes");
}

static void test_dropout_rate(void) {
    uint32_t thr = ref_dropout_threshold(0.3);
    long dropped = 0, n = 256 * 256;
    for (int i = 0; i < 256; i++)
        for (int j = 0; j < 256; j++)
            dropped += !ref_dropout_keep(1234, 5678, 1, 3, i, j, thr);
    double q = thr / 256.0, rate = (double)dropped / n;
    double sigma = sqrt(q * (1 - q) / n);
    CHECK(fabs(rate - q) < 4 * sigma, "drop rate %.5f, expected %.5f +- %.5f", rate, q, 4 * sigma);

    /* and each of the 16 bytes of a call, separately, is near the rate too */
    for (int lane = 0; lane < 16; lane++) {
        long d = 0, m = 0;
        for (int i = 0; i < 256; i++)
            for (int j = 0; j < 256; j++)
                if (((i / 8) % 2) * 8 + ((j / 8) % 4) * 2 + j % 2 == lane) {
                    d += !ref_dropout_keep(99, 0, 0, 0, i, j, thr);
                    m++;
                }
        double r = (double)d / m, sg = sqrt(q * (1 - q) / m);
        CHECK(fabs(r - q) < 5 * sg, "lane %d drop rate %.4f", lane, r);
    }
}

static double grid_diff(uint64_t s1, uint64_t o1, int b1, int h1, uint64_t s2, uint64_t o2, int b2,
                        int h2) {
    uint32_t thr = ref_dropout_threshold(0.3);
    int diff = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++)
            diff += ref_dropout_keep(s1, o1, b1, h1, i, j, thr) !=
                    ref_dropout_keep(s2, o2, b2, h2, i, j, thr);
    return diff / 4096.0;
}

static void test_dropout_changes(void) {
    /* independent streams differ on 2*0.3*0.7 = 0.42 of the elements */
    const uint64_t S = 0x0123456789abcdefull, O = 0x0000000500000010ull;
    struct {
        const char *what;
        double f;
    } cases[] = {
        {"seed low", grid_diff(S, O, 2, 3, S + 1, O, 2, 3)},
        {"seed high", grid_diff(S, O, 2, 3, S + (1ull << 32), O, 2, 3)},
        {"offset low", grid_diff(S, O, 2, 3, S, O + 1, 2, 3)},
        {"offset high", grid_diff(S, O, 2, 3, S, O + (1ull << 32), 2, 3)},
        {"batch", grid_diff(S, O, 2, 3, S, O, 3, 3)},
        {"head", grid_diff(S, O, 2, 3, S, O, 2, 4)},
        {"batch/head swapped", grid_diff(S, O, 2, 3, S, O, 3, 2)},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        CHECK(cases[c].f > 0.35 && cases[c].f < 0.49, "%s: %.3f of decisions differ", cases[c].what,
              cases[c].f);
    CHECK(grid_diff(S, O, 2, 3, S, O, 2, 3) == 0.0, "same arguments, same grid");

    /* rows and column stretches do not repeat each other */
    uint32_t thr = ref_dropout_threshold(0.5);
    int same_row = 0, same_stretch = 0;
    for (int j = 0; j < 256; j++) {
        same_row +=
            ref_dropout_keep(S, O, 0, 0, 10, j, thr) == ref_dropout_keep(S, O, 0, 0, 11, j, thr);
        same_stretch += ref_dropout_keep(S, O, 0, 0, 10, j, thr) ==
                        ref_dropout_keep(S, O, 0, 0, 10, j + 32, thr);
    }
    CHECK(same_row > 90 && same_row < 166, "rows 10 and 11 agree on %d of 256", same_row);
    CHECK(same_stretch > 90 && same_stretch < 166, "stretches agree on %d of 256", same_stretch);
}

static void test_dropout_pure(void) {
    uint32_t thr = ref_dropout_threshold(0.4);
    int first[64], bad = 0;
    for (int j = 0; j < 64; j++)
        first[j] = ref_dropout_keep(77, 88, 1, 2, 5, j, thr);
    /* other calls in between must not disturb anything */
    for (int j = 0; j < 1000; j++)
        (void)ref_dropout_keep((uint64_t)j, 3, 0, 0, j, j, thr);
    for (int j = 63; j >= 0; j--)
        bad += first[j] != ref_dropout_keep(77, 88, 1, 2, 5, j, thr);
    CHECK(bad == 0, "%d decisions changed between calls", bad);
    /* and a higher threshold only ever drops more */
    int mono = 1;
    for (int j = 0; j < 256; j++)
        if (!ref_dropout_keep(5, 6, 0, 1, 2, j, 80) && ref_dropout_keep(5, 6, 0, 1, 2, j, 160))
            mono = 0;
    CHECK(mono, "a kept element at threshold 160 was dropped at 80");
}

/* ---- visibility ------------------------------------------------------------------------ */

static void check_table(const ref_problem *p, const char *const *rows, const char *what) {
    int bad = 0;
    for (int i = 0; i < p->seqlen_q; i++)
        for (int j = 0; j < p->seqlen_k; j++)
            if (ref_visible(p, 0, i, j) != (rows[i][j] == '1'))
                bad++;
    CHECK(bad == 0, "%s: %d cells differ", what, bad);
}

static void test_causal_alignment(void) {
    ref_problem p = base_problem(1, 1, 1, 3, 5, 4);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 5 - 3; /* bottom-right */
    const char *br35[] = {"11100", "11110", "11111"};
    check_table(&p, br35, "3x5 bottom-right");
    p.diag_offset = 0; /* top-left */
    const char *tl35[] = {"10000", "11000", "11100"};
    check_table(&p, tl35, "3x5 top-left");

    p = base_problem(1, 1, 1, 5, 3, 4);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 3 - 5;
    const char *br53[] = {"000", "000", "100", "110", "111"};
    check_table(&p, br53, "5x3 bottom-right");
    p.diag_offset = 0;
    const char *tl53[] = {"100", "110", "111", "111", "111"};
    check_table(&p, tl53, "5x3 top-left");

    /* causal is exactly window(left = -1, right = 0), for any offset */
    int bad = 0;
    for (int64_t off = -4; off <= 4; off++) {
        ref_problem c = base_problem(1, 1, 1, 7, 9, 4), w = c;
        c.mask = REF_MASK_CAUSAL;
        w.mask = REF_MASK_WINDOW;
        c.diag_offset = w.diag_offset = off;
        w.window_left = -1;
        w.window_right = 0;
        for (int i = 0; i < 7; i++)
            for (int j = 0; j < 9; j++)
                bad += ref_visible(&c, 0, i, j) != ref_visible(&w, 0, i, j);
    }
    CHECK(bad == 0, "causal and window(-1,0) differ in %d cells", bad);
}

static int count_visible(const ref_problem *p, int h) {
    int n = 0;
    for (int i = 0; i < p->seqlen_q; i++)
        for (int j = 0; j < p->seqlen_k; j++)
            n += ref_visible(p, h, i, j);
    return n;
}

static void test_window(void) {
    ref_problem p = base_problem(1, 1, 1, 10, 10, 4);
    p.mask = REF_MASK_WINDOW;
    p.window_left = 2;
    p.window_right = 1;
    /* rows see [i-2, i+1] clipped: 2 + 3 + 7*4 + 3 */
    CHECK(count_visible(&p, 0) == 36, "window(2,1): %d", count_visible(&p, 0));
    p.window_left = 0;
    p.window_right = 0;
    CHECK(count_visible(&p, 0) == 10, "window(0,0) is the diagonal");
    p.window_left = -1;
    p.window_right = -1;
    CHECK(count_visible(&p, 0) == 100, "unbounded window sees all");
    p.window_left = 3;
    p.window_right = -1;
    /* j >= i-3: row i sees 10 - max(0, i-3) */
    CHECK(count_visible(&p, 0) == 100 - (1 + 2 + 3 + 4 + 5 + 6), "left only: %d",
          count_visible(&p, 0));
    /* bottom-right shift on 4x10: diag at j = i + 6, window (1, 1) */
    p = base_problem(1, 1, 1, 4, 10, 4);
    p.mask = REF_MASK_WINDOW;
    p.diag_offset = 6;
    p.window_left = 1;
    p.window_right = 1;
    const char *t[] = {"0000011100", "0000001110", "0000000111", "0000000011"};
    check_table(&p, t, "4x10 window(1,1) bottom-right");
}

static int popcount64(uint64_t x) {
    int c = 0;
    for (; x; x >>= 1)
        c += (int)(x & 1);
    return c;
}

static void test_butterfly(void) {
    ref_problem p = base_problem(1, 1, 1, 64, 64, 4);
    p.sparsity = REF_SPARSE_BUTTERFLY;
    p.block_q = 8;
    p.block_k = 4;
    for (int f = 0; f <= 4; f++) {
        p.butterfly_factors = f;
        int bad = 0;
        for (int i = 0; i < 64; i++)
            for (int j = 0; j < 64; j++) {
                uint64_t x = (uint64_t)(i / 8) ^ (uint64_t)(j / 4);
                /* same block, or blocks that differ in exactly one of the low f bits */
                int want = x == 0 || (popcount64(x) == 1 && x < (1ull << f));
                bad += ref_visible(&p, 0, i, j) != want;
            }
        CHECK(bad == 0, "butterfly factors=%d: %d cells differ", f, bad);
    }
    /* 8x16 blocks of 1, factors 2: block row 0 sees blocks 0, 1, 2 */
    p = base_problem(1, 1, 1, 8, 16, 4);
    p.sparsity = REF_SPARSE_BUTTERFLY;
    p.block_q = p.block_k = 1;
    p.butterfly_factors = 2;
    CHECK(ref_visible(&p, 0, 0, 0) && ref_visible(&p, 0, 0, 1) && ref_visible(&p, 0, 0, 2) &&
              !ref_visible(&p, 0, 0, 3) && !ref_visible(&p, 0, 0, 4),
          "row 0 butterfly");
    CHECK(ref_visible(&p, 0, 5, 4) && ref_visible(&p, 0, 5, 7) && !ref_visible(&p, 0, 5, 1) &&
              !ref_visible(&p, 0, 5, 6),
          "row 5 butterfly");
    /* combined with causal: AND */
    p.mask = REF_MASK_CAUSAL;
    CHECK(!ref_visible(&p, 0, 5, 7) && ref_visible(&p, 0, 5, 4), "butterfly AND causal");
}

/* ---- attention --------------------------------------------------------------------------- */

static void test_single_key(void) {
    /* window (0,0): each query sees only its own key, so o = v_i and
     * lse = scale * q_i . k_i */
    ref_problem p = base_problem(2, 2, 2, 6, 6, 8);
    p.mask = REF_MASK_WINDOW;
    p.window_left = p.window_right = 0;
    float *q = rand_tensor(q_elems(&p), 2), *k = rand_tensor(kv_elems(&p), 2),
          *v = rand_tensor(kv_elems(&p), 2);
    double o[2 * 2 * 6 * 8], lse[2 * 2 * 6];
    CHECK(ref_attention_fp64(&p, q, k, v, o, lse) == 0, "fp64 failed");
    double err = 0, lerr = 0;
    for (size_t r = 0; r < 2 * 2 * 6; r++) {
        double dot = 0;
        for (int d = 0; d < 8; d++) {
            err = fmax(err, fabs(o[r * 8 + d] - v[r * 8 + d]));
            dot += (double)q[r * 8 + d] * k[r * 8 + d];
        }
        lerr = fmax(lerr, fabs(lse[r] - p.scale * dot));
    }
    CHECK(err < 1e-15, "o != v for a single key: %g", err);
    CHECK(lerr < 1e-14, "lse != score for a single key: %g", lerr);
    free(q);
    free(k);
    free(v);
}

static void test_equal_scores(void) {
    ref_problem p = base_problem(1, 1, 1, 3, 7, 5);
    float q[3 * 5] = {0}, *k = rand_tensor(kv_elems(&p), 2), *v = rand_tensor(kv_elems(&p), 2);
    double o[3 * 5], lse[3];
    CHECK(ref_attention_fp64(&p, q, k, v, o, lse) == 0, "fp64 failed");
    for (int d = 0; d < 5; d++) {
        double mean = 0;
        for (int j = 0; j < 7; j++)
            mean += v[j * 5 + d];
        mean /= 7;
        for (int i = 0; i < 3; i++)
            CHECK(fabs(o[i * 5 + d] - mean) < 1e-15, "row %d dim %d: %g != mean %g", i, d,
                  o[i * 5 + d], mean);
    }
    for (int i = 0; i < 3; i++)
        CHECK(fabs(lse[i] - log(7.0)) < 1e-15, "lse %g", lse[i]);
    free(k);
    free(v);
}

static void test_hand_lse(void) {
    /* q = [1, 2], keys [1, 0], [0, 1], [1, 1], scale 0.5: scores 0.5, 1, 1.5 */
    ref_problem p = base_problem(1, 1, 1, 1, 3, 2);
    p.scale = 0.5;
    float q[2] = {1, 2}, k[6] = {1, 0, 0, 1, 1, 1}, v[6] = {1, 10, 2, 20, 4, 40};
    double o[2], lse[1];
    CHECK(ref_attention_fp64(&p, q, k, v, o, lse) == 0, "fp64 failed");
    double e0 = exp(0.5), e1 = exp(1.0), e2 = exp(1.5), z = e0 + e1 + e2;
    CHECK(fabs(lse[0] - log(z)) < 1e-15, "lse %.17g vs %.17g", lse[0], log(z));
    CHECK(fabs(o[0] - (e0 * 1 + e1 * 2 + e2 * 4) / z) < 1e-14, "o0 %g", o[0]);
    CHECK(fabs(o[1] - (e0 * 10 + e1 * 20 + e2 * 40) / z) < 1e-13, "o1 %g", o[1]);
    /* large scores must not overflow: shift every score by +1000 */
    p.scale = 1000.0;
    float q2[2] = {1, 0}, k2[6] = {1, 0, 1, 0, 1, 0};
    CHECK(ref_attention_fp64(&p, q2, k2, v, o, lse) == 0, "fp64 failed");
    CHECK(fabs(lse[0] - (1000.0 + log(3.0))) < 1e-12, "large lse %.17g", lse[0]);
    CHECK(fabs(o[0] - 7.0 / 3) < 1e-14, "large-score mean %g", o[0]);
    /* NULL outputs are allowed */
    CHECK(ref_attention_fp64(&p, q2, k2, v, NULL, lse) == 0, "o NULL");
    CHECK(ref_attention_fp64(&p, q2, k2, v, o, NULL) == 0, "lse NULL");
}

static void test_masked_rows(void) {
    ref_problem p = base_problem(1, 2, 1, 5, 3, 4);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 3 - 5; /* rows 0 and 1 see nothing */
    float *q = rand_tensor(q_elems(&p), 2), *k = rand_tensor(kv_elems(&p), 2),
          *v = rand_tensor(kv_elems(&p), 2);
    double o[2 * 5 * 4], lse[2 * 5];
    float ol[2 * 5 * 4];
    for (int t = 0; t < 40; t++)
        o[t] = ol[t] = 12345;
    CHECK(ref_attention_fp64(&p, q, k, v, o, lse) == 0, "fp64 failed");
    CHECK(ref_attention_lowp(&p, 0, q, k, v, ol) == 0, "lowp failed");
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 5; i++) {
            size_t r = (size_t)h * 5 + i;
            int empty = i < 2, zeros = 1, lzeros = 1;
            for (int d = 0; d < 4; d++) {
                zeros &= o[r * 4 + d] == 0.0;
                lzeros &= ol[r * 4 + d] == 0.0f;
            }
            if (empty) {
                CHECK(zeros && lzeros, "row %d not zero", i);
                CHECK(isinf(lse[r]) && lse[r] < 0, "row %d lse %g", i, lse[r]);
            } else {
                CHECK(!zeros && !lzeros, "row %d zero", i);
                CHECK(isfinite(lse[r]), "row %d lse %g", i, lse[r]);
            }
        }
    /* row 2 sees key 0 only */
    CHECK(fabs(o[2 * 4] - v[0]) < 1e-15 && fabs(o[2 * 4 + 3] - v[3]) < 1e-15, "row 2 = v0");
    free(q);
    free(k);
    free(v);
}

static void test_layout(void) {
    /* 10 x 9, blocks 4 x 4 -> layout 3 x 3. Head 0: block row 1 all zero and
     * only block (0,0), (2,1), (2,2) set; head 1: everything set. */
    ref_problem p = base_problem(1, 2, 2, 10, 9, 6);
    p.sparsity = REF_SPARSE_LAYOUT;
    p.block_q = p.block_k = 4;
    const uint8_t layout[2 * 9] = {1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    p.layout = layout;
    p.layout_heads = 2;
    CHECK(count_visible(&p, 0) == 4 * 4 + 2 * 5, "head 0 visible %d", count_visible(&p, 0));
    CHECK(count_visible(&p, 1) == 90, "head 1 visible %d", count_visible(&p, 1));
    float *q = rand_tensor(q_elems(&p), 2), *k = rand_tensor(kv_elems(&p), 2),
          *v = rand_tensor(kv_elems(&p), 2);
    double o[2 * 10 * 6], lse[2 * 10], on[2 * 10 * 6], lsen[2 * 10];
    CHECK(ref_attention_fp64(&p, q, k, v, o, lse) == 0, "fp64 failed");
    naive_attention(&p, q, k, v, on, lsen);
    for (int i = 4; i < 8; i++) {
        int zeros = 1;
        for (int d = 0; d < 6; d++)
            zeros &= o[i * 6 + d] == 0.0;
        CHECK(zeros && isinf(lse[i]) && lse[i] < 0, "empty block row %d", i);
    }
    CHECK(max_abs_diff(o, on, 120) < 1e-14, "layout o vs naive");
    CHECK(max_abs_diff(lse, lsen, 20) < 1e-14, "layout lse vs naive");

    /* rows 0..3 of head 0 are plain attention over keys 0..3 */
    ref_problem p4 = base_problem(1, 1, 1, 4, 4, 6);
    float k4[4 * 6], v4[4 * 6];
    memcpy(k4, k, sizeof k4);
    memcpy(v4, v, sizeof v4);
    double o4[4 * 6], l4[4];
    CHECK(ref_attention_fp64(&p4, q, k4, v4, o4, l4) == 0, "fp64 failed");
    CHECK(max_abs_diff(o, o4, 24) < 1e-15 && max_abs_diff(lse, l4, 4) < 1e-15,
          "block (0,0) alone differs from plain attention on 4 keys");

    /* a shared layout (layout_heads 1) applies the first head's to both */
    p.layout_heads = 1;
    CHECK(count_visible(&p, 1) == count_visible(&p, 0), "shared layout");
    free(q);
    free(k);
    free(v);
}

static void test_gqa(void) {
    /* 6 query heads over 2 kv heads equals 6 heads with K/V copied per group */
    ref_problem g = base_problem(2, 6, 2, 9, 11, 8);
    g.mask = REF_MASK_CAUSAL;
    g.diag_offset = 2;
    ref_problem f = g;
    f.heads_kv = 6;
    float *q = rand_tensor(q_elems(&g), 2), *k = rand_tensor(kv_elems(&g), 2),
          *v = rand_tensor(kv_elems(&g), 2);
    float *kf = malloc(kv_elems(&f) * sizeof(float)), *vf = malloc(kv_elems(&f) * sizeof(float));
    size_t head = (size_t)11 * 8;
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 6; h++) {
            memcpy(kf + ((size_t)b * 6 + h) * head, k + ((size_t)b * 2 + h / 3) * head,
                   head * sizeof(float));
            memcpy(vf + ((size_t)b * 6 + h) * head, v + ((size_t)b * 2 + h / 3) * head,
                   head * sizeof(float));
        }
    size_t no = q_elems(&g), nl = (size_t)2 * 6 * 9;
    double *og = malloc(no * sizeof(double)), *of = malloc(no * sizeof(double));
    double *lg = malloc(nl * sizeof(double)), *lf = malloc(nl * sizeof(double));
    CHECK(ref_attention_fp64(&g, q, k, v, og, lg) == 0, "gqa failed");
    CHECK(ref_attention_fp64(&f, q, kf, vf, of, lf) == 0, "mha failed");
    CHECK(max_abs_diff(og, of, no) == 0 && max_abs_diff(lg, lf, nl) == 0, "GQA != replicated MHA");
    ref_problem bad = g;
    bad.heads_kv = 4;
    CHECK(ref_attention_fp64(&bad, q, k, v, og, lg) == -1, "heads_q %% heads_kv != 0 accepted");
    float *ol = malloc(no * sizeof(float));
    CHECK(ref_attention_lowp(&bad, 0, q, k, v, ol) == -1, "lowp accepted it too");
    CHECK(ref_attention_lowp(&g, 7, q, k, v, ol) == -1, "bad dtype accepted");
    bad = g;
    bad.sparsity = REF_SPARSE_LAYOUT;
    bad.block_q = bad.block_k = 4;
    CHECK(ref_attention_fp64(&bad, q, k, v, og, lg) == -1, "layout sparsity without a layout");
    uint8_t ones[6 * 3 * 3];
    memset(ones, 1, sizeof ones);
    bad.layout = ones;
    bad.layout_heads = 3; /* neither 1 nor heads_q */
    CHECK(ref_attention_fp64(&bad, q, k, v, og, lg) == -1, "layout_heads 3 of 6 accepted");
    bad.layout_heads = 6;
    CHECK(ref_attention_fp64(&bad, q, k, v, og, lg) == 0, "full layout refused");
    CHECK(max_abs_diff(og, of, no) == 0, "an all-ones layout changes the result");
    bad.mask = 9;
    CHECK(ref_attention_fp64(&bad, q, k, v, og, lg) == -1, "unknown mask accepted");
    free(ol);
    free(q);
    free(k);
    free(v);
    free(kf);
    free(vf);
    free(og);
    free(of);
    free(lg);
    free(lf);
}

/* Rows [i0, i0 + n) of head tensor t (B, H, S, D) for every (b, h), as a
 * tensor (B, H, n, D). */
static float *rows_of(const float *t, int bh, int s, int d, int i0, int n) {
    float *out = malloc((size_t)bh * n * d * sizeof *out);
    for (int x = 0; x < bh; x++)
        memcpy(out + (size_t)x * n * d, t + ((size_t)x * s + i0) * d, (size_t)n * d * sizeof *out);
    return out;
}

/* A call split into blocks of queries and keys, each at its positions (the
 * diagonal shifted by position_q - position_k, dropout drawn there), merged
 * through the blocks' log-sum-exps, is the whole call: the arithmetic of
 * context-parallel attention. */
static void test_blocks(void) {
    enum { B = 2, HQ = 2, HKV = 1, S = 150, D = 8, NB = 2 };
    const int q_cut[NB + 1] = {0, 64, S}, k_cut[NB + 1] = {0, 96, S};
    ref_problem whole = base_problem(B, HQ, HKV, S, S, D);
    whole.mask = REF_MASK_WINDOW; /* top-left: diag_offset 0 */
    whole.window_left = 40, whole.window_right = 10;
    whole.dropout_p = 0.2, whole.seed = 77, whole.offset = 3;
    float *q = rand_tensor(q_elems(&whole), 1), *k = rand_tensor(kv_elems(&whole), 1),
          *v = rand_tensor(kv_elems(&whole), 1);
    size_t rows = (size_t)B * HQ * S;
    double *o = malloc(rows * D * sizeof *o), *lse = malloc(rows * sizeof *lse);
    double *acc = calloc(rows * D, sizeof *acc), *acc_lse = malloc(rows * sizeof *acc_lse);
    CHECK(ref_attention_fp64(&whole, q, k, v, o, lse) == 0, "whole call failed");
    for (size_t r = 0; r < rows; r++) acc_lse[r] = -INFINITY;
    for (int qb = 0; qb < NB; qb++)
        for (int kb = 0; kb < NB; kb++) {
            const int i0 = q_cut[qb], n = q_cut[qb + 1] - i0, j0 = k_cut[kb], m = k_cut[kb + 1] - j0;
            ref_problem blk = whole;
            blk.seqlen_q = n, blk.seqlen_k = m;
            blk.position_q = i0, blk.position_k = j0;
            blk.diag_offset = i0 - j0;
            float *bq = rows_of(q, B * HQ, S, D, i0, n), *bk = rows_of(k, B * HKV, S, D, j0, m),
                  *bv = rows_of(v, B * HKV, S, D, j0, m);
            double *bo = malloc((size_t)B * HQ * n * D * sizeof *bo);
            double *bl = malloc((size_t)B * HQ * n * sizeof *bl);
            CHECK(ref_attention_fp64(&blk, bq, bk, bv, bo, bl) == 0, "block %d,%d failed", qb, kb);
            for (int x = 0; x < B * HQ; x++)
                for (int i = 0; i < n; i++) {
                    const size_t r = (size_t)x * S + i0 + i, br = (size_t)x * n + i;
                    if (bl[br] == -INFINITY) continue;
                    const double l = acc_lse[r] == -INFINITY
                                         ? bl[br]
                                         : fmax(acc_lse[r], bl[br]) +
                                               log1p(exp(-fabs(acc_lse[r] - bl[br])));
                    const double keep = acc_lse[r] == -INFINITY ? 0.0 : exp(acc_lse[r] - l);
                    for (int e = 0; e < D; e++)
                        acc[r * D + e] = keep * acc[r * D + e] + exp(bl[br] - l) * bo[br * D + e];
                    acc_lse[r] = l;
                }
            free(bq);
            free(bk);
            free(bv);
            free(bo);
            free(bl);
        }
    double lse_err = 0;
    for (size_t r = 0; r < rows; r++) lse_err = fmax(lse_err, fabs(acc_lse[r] - lse[r]));
    CHECK(max_abs_diff(acc, o, rows * D) < 1e-12 && lse_err < 1e-12,
          "blocks merged differ from the whole call: O by %g, lse by %g",
          max_abs_diff(acc, o, rows * D), lse_err);
    /* without the positions the blocks' dropout differs */
    ref_problem blk = whole;
    blk.seqlen_q = blk.seqlen_k = S - 64, blk.position_q = 64, blk.position_k = 64;
    float *bq = rows_of(q, B * HQ, S, D, 64, S - 64), *bk = rows_of(k, B * HKV, S, D, 64, S - 64),
          *bv = rows_of(v, B * HKV, S, D, 64, S - 64);
    double *b1 = malloc(q_elems(&blk) * sizeof *b1), *b2 = malloc(q_elems(&blk) * sizeof *b2);
    CHECK(ref_attention_fp64(&blk, bq, bk, bv, b1, NULL) == 0, "block failed");
    blk.position_q = blk.position_k = 0;
    CHECK(ref_attention_fp64(&blk, bq, bk, bv, b2, NULL) == 0, "block failed");
    CHECK(max_abs_diff(b1, b2, q_elems(&blk)) > 1e-3, "dropout ignores the positions");
    free(bq);
    free(bk);
    free(bv);
    free(b1);
    free(b2);
    free(q);
    free(k);
    free(v);
    free(o);
    free(lse);
    free(acc);
    free(acc_lse);
}

static void test_against_naive(void) {
    static uint8_t layout[3 * 4 * 3];
    for (size_t t = 0; t < sizeof layout; t++)
        layout[t] = (uint8_t)(rng_next() % 3 != 0);
    for (int c = 0; c < 10; c++) {
        ref_problem p = base_problem(2, 3, c % 2 ? 1 : 3, 13 + c, 21 - c, 7 + 3 * (c % 3));
        if (c >= 8) { /* rows that span several 32-column dropout stretches */
            p.seqlen_q = 20;
            p.seqlen_k = 150;
        }
        p.scale = 0.3 + 0.1 * c;
        switch (c) {
        case 1:
            p.mask = REF_MASK_CAUSAL;
            p.diag_offset = p.seqlen_k - p.seqlen_q;
            break;
        case 2:
            p.mask = REF_MASK_CAUSAL;
            p.diag_offset = -3;
            break;
        case 3:
            p.mask = REF_MASK_WINDOW;
            p.window_left = 3;
            p.window_right = 2;
            p.diag_offset = 1;
            break;
        case 4:
            p.mask = REF_MASK_WINDOW;
            p.window_left = -1;
            p.window_right = 4;
            break;
        case 5:
            p.sparsity = REF_SPARSE_LAYOUT;
            p.block_q = 5;
            p.block_k = 8; /* 18 x 16 -> 4 x 2 */
            p.layout = layout;
            p.layout_heads = 3;
            p.mask = REF_MASK_WINDOW;
            p.window_left = 6;
            break;
        case 6:
            p.sparsity = REF_SPARSE_BUTTERFLY;
            p.block_q = 2;
            p.block_k = 3;
            p.butterfly_factors = 2;
            break;
        case 8:
            p.mask = REF_MASK_WINDOW;
            p.window_left = 41;
            p.window_right = 7;
            p.diag_offset = 60;
            break;
        case 9:
            p.sparsity = REF_SPARSE_BUTTERFLY;
            p.block_q = 4;
            p.block_k = 16;
            p.butterfly_factors = 3;
            break;
        default:
            break;
        }
        if (c >= 4) {
            p.dropout_p = 0.25;
            p.seed = 1000 + (uint64_t)c;
            p.offset = (uint64_t)c << 33;
        }
        size_t nq = q_elems(&p), nk = kv_elems(&p), nl = nq / p.head_dim;
        float *q = rand_tensor(nq, 2), *k = rand_tensor(nk, 2), *v = rand_tensor(nk, 2);
        double *o = malloc(nq * sizeof(double)), *on = malloc(nq * sizeof(double));
        double *l = malloc(nl * sizeof(double)), *ln = malloc(nl * sizeof(double));
        CHECK(ref_attention_fp64(&p, q, k, v, o, l) == 0, "case %d failed", c);
        naive_attention(&p, q, k, v, on, ln);
        CHECK(max_abs_diff(o, on, nq) < 1e-13, "case %d: o differs by %g", c,
              max_abs_diff(o, on, nq));
        CHECK(max_abs_diff(l, ln, nl) < 1e-13, "case %d: lse differs by %g", c,
              max_abs_diff(l, ln, nl));
        free(q);
        free(k);
        free(v);
        free(o);
        free(on);
        free(l);
        free(ln);
    }
}

/* ---- value head dims -------------------------------------------------------------- */

/* Columns [c0, c0 + w) of the (rows, width) array x, as (rows, w). */
static float *columns_of(const float *x, size_t rows, int width, int c0, int w) {
    float *out = malloc(rows * (size_t)w * sizeof *out + 1);
    for (size_t r = 0; out && r < rows; r++)
        memcpy(out + r * w, x + r * width + c0, (size_t)w * sizeof *out);
    return out;
}

/* V (and O) of a width of their own: against the naive attention, and
 * column by column against problems of V's columns in slices as wide as
 * the head dim (the single-width path) and the rest: each output column
 * depends on its V column alone, so the slices' outputs are the wide
 * one's bit for bit, in fp64 and in the input precision alike. Odd sizes,
 * Dv below and above D, masks, dropout, GQA, sinks. */
static void test_value_head_dim(void) {
    static const float sinks[4] = {0.5f, 1.5f, -0.5f, 2.0f};
    static const int dims[][2] = {{5, 12}, {12, 5}, {3, 1}, {1, 7}, {16, 8}, {7, 16}, {24, 9}};
    const int ncases = (int)(sizeof dims / sizeof dims[0]);
    for (int c = 0; c < ncases; c++) {
        const int d = dims[c][0], dv = dims[c][1];
        ref_problem p = base_problem(2, 4, c % 2 ? 2 : 4, 11 + c, 17 - c, d);
        p.head_dim_v = dv;
        p.scale = 0.4 + 0.05 * c;
        if (c % 3 == 1) {
            p.mask = REF_MASK_CAUSAL;
            p.diag_offset = p.seqlen_k - p.seqlen_q;
        }
        if (c % 3 == 2) {
            p.mask = REF_MASK_WINDOW;
            p.window_left = 4, p.window_right = 1, p.diag_offset = 2;
            p.dropout_p = 0.2, p.seed = 77 + (uint64_t)c, p.offset = 5;
        }
        if (c == 4) p.sinks = sinks;
        const size_t nq = q_elems(&p), nk = kv_elems(&p), no = o_elems(&p), nv = v_elems(&p);
        const size_t nl = nq / (size_t)d, kv_rows = nv / (size_t)dv;
        float *q = rand_tensor(nq, 1), *k = rand_tensor(nk, 1), *v = rand_tensor(nv, 1);
        double *o = malloc(no * sizeof *o), *on = malloc(no * sizeof *on);
        double *l = malloc(nl * sizeof *l), *ln = malloc(nl * sizeof *ln);
        float *lo = malloc(no * sizeof *lo);
        CHECK(ref_attention_fp64(&p, q, k, v, o, l) == 0 &&
                  ref_attention_lowp(&p, 1, q, k, v, lo) == 0,
              "d %d dv %d: refused", d, dv);
        naive_attention(&p, q, k, v, on, ln);
        CHECK(max_abs_diff(o, on, no) < 1e-13 && max_abs_diff(l, ln, nl) < 1e-13,
              "d %d dv %d: o differs from the naive attention by %g, lse by %g", d, dv,
              max_abs_diff(o, on, no), max_abs_diff(l, ln, nl));
        double biggest = 0;
        for (size_t t = 0; t < no; t++) biggest = fmax(biggest, fabs(o[t]));
        CHECK(biggest > 0.05, "d %d dv %d: o vanishes (%g)", d, dv, biggest);
        int differ = 0, differ_lowp = 0;
        for (int c0 = 0; c0 < dv; c0 += d) {
            const int w = dv - c0 < d ? dv - c0 : d;
            ref_problem ps = p;
            ps.head_dim_v = w == d ? 0 : w; /* a slice as wide as D: one width */
            float *vs = columns_of(v, kv_rows, dv, c0, w);
            double *os = malloc(nl * (size_t)w * sizeof *os), *ls = malloc(nl * sizeof *ls);
            float *los = malloc(nl * (size_t)w * sizeof *los);
            CHECK(vs && os && ls && los && ref_attention_fp64(&ps, q, k, vs, os, ls) == 0 &&
                      ref_attention_lowp(&ps, 1, q, k, vs, los) == 0,
                  "d %d dv %d: the slice at %d refused", d, dv, c0);
            for (size_t r = 0; r < nl; r++) {
                for (int t = 0; t < w; t++) {
                    differ += memcmp(&os[r * w + t], &o[r * dv + c0 + t], sizeof *os) != 0;
                    differ_lowp += los[r * w + t] != lo[r * dv + c0 + t];
                }
                differ += memcmp(&ls[r], &l[r], sizeof *ls) != 0;
            }
            free(vs), free(os), free(ls), free(los);
        }
        CHECK(differ == 0 && differ_lowp == 0,
              "d %d dv %d: %d fp64 and %d low-precision values differ from V's slices'", d, dv,
              differ, differ_lowp);
        free(q), free(k), free(v), free(o), free(on), free(l), free(ln), free(lo);
    }
    /* a value head dim the reference cannot take */
    ref_problem bad = base_problem(1, 1, 1, 2, 2, 4);
    bad.head_dim_v = -3;
    float x[64] = {0};
    double y[64];
    CHECK(ref_attention_fp64(&bad, x, x, x, y, y) == -1, "head_dim_v -3 accepted");
}

/* ---- the scores' variants ----------------------------------------------------------- */

enum { V_CAP = 1, V_ALIBI = 2, V_SINKS = 4 };

/* The problem without the variants in `drop`. */
static ref_problem without(const ref_problem *p, int drop) {
    ref_problem r = *p;
    if (drop & V_CAP)
        r.softcap = 0;
    if (drop & V_ALIBI)
        r.alibi_slopes = NULL, r.alibi_stride_batch = 0;
    if (drop & V_SINKS)
        r.sinks = NULL;
    return r;
}

/* The largest |scale·q·k| over the visible pairs. */
static double max_scaled_score(const ref_problem *p, const float *q, const float *k) {
    int group = p->heads_q / p->heads_kv;
    double most = 0;
    for (int b = 0; b < p->batch; b++)
        for (int h = 0; h < p->heads_q; h++)
            for (int i = 0; i < p->seqlen_q; i++)
                for (int j = 0; j < p->seqlen_k; j++) {
                    if (!ref_visible(p, h, i, j))
                        continue;
                    const size_t qrow = ((size_t)b * p->heads_q + h) * p->seqlen_q + i;
                    const size_t krow = ((size_t)b * p->heads_kv + h / group) * p->seqlen_k + j;
                    const float *qi = q + qrow * p->head_dim, *kj = k + krow * p->head_dim;
                    double dot = 0;
                    for (int d = 0; d < p->head_dim; d++)
                        dot += (double)qi[d] * kj[d];
                    most = fmax(most, fabs(p->scale * dot));
                }
    return most;
}

/* Each variant made to bind (caps of 0.5..2 on scores that reach past
 * twice the cap, sinks beside the row maxima, slopes of 1/4..1 over tens of
 * keys), at odd sizes, with masks (rows that see no key among them), GQA,
 * dropout, sparsity, ALiBi slopes per (batch, head) with batch0 != 0 and a
 * stride that is not heads_q: the fp64 reference against the naive one
 * written from the definition, each variant changing O by more than 2%,
 * rows that see no key O = 0 with lse -inf, or the sink exactly, and no
 * NaN; and the low-precision path within its usual error of fp64. */
static void test_variants(void) {
    static const char *const names[] = {
        "softcap 0.5",          "softcap 1 causal br, empty rows", "softcap 2 causal tl",
        "sinks window, empty rows", "alibi per head causal tl",  "alibi (B,H) batch0 2 stride 4",
        "all, dropout gqa layout",  "softcap sinks butterfly window"};
    static uint8_t layout[3 * 8 * 8];
    for (size_t t = 0; t < sizeof layout; t++)
        layout[t] = (uint8_t)(rng_next() % 4 != 0);
    const float sinks[3] = {1.5f, 3.0f, -0.5f};
    const float head_slopes[3] = {0.5f, 0.25f, 1.0f};
    float batch_slopes[4 * 4]; /* (batch0 + B) rows of stride 4 > Hq */
    for (int r = 0; r < 4; r++)
        for (int h = 0; h < 4; h++)
            batch_slopes[r * 4 + h] = 0.25f + 0.125f * (float)r + 0.0625f * (float)h;
    int empty_seen[2] = {0, 0}; /* rows that see no key, without and with a sink */
    for (int c = 0; c < 8; c++) {
        ref_problem p = base_problem(2, 3, c == 6 ? 1 : 3, 13 + c, 21 - c, 7 + 2 * (c % 3));
        int on = 0;
        p.scale = 1.0; /* scores of a few units */
        switch (c) {
        case 0:
            p.softcap = 0.5, on = V_CAP;
            break;
        case 1:
            p.seqlen_q = 19, p.seqlen_k = 11;
            p.mask = REF_MASK_CAUSAL, p.diag_offset = 11 - 19; /* rows 0..7 see nothing */
            p.softcap = 1.0, on = V_CAP;
            break;
        case 2:
            p.mask = REF_MASK_CAUSAL;
            p.softcap = 2.0, on = V_CAP;
            break;
        case 3:
            p.mask = REF_MASK_WINDOW, p.window_left = 2, p.window_right = 1;
            p.diag_offset = -5; /* rows 0..3 see nothing */
            p.sinks = sinks, on = V_SINKS;
            break;
        case 4:
            p.mask = REF_MASK_CAUSAL;
            p.alibi_slopes = head_slopes, on = V_ALIBI;
            break;
        case 5:
            p.diag_offset = 3;
            p.batch0 = 2;
            p.alibi_slopes = batch_slopes, p.alibi_stride_batch = 4, on = V_ALIBI;
            break;
        case 6:
            p.sparsity = REF_SPARSE_LAYOUT, p.block_q = 4, p.block_k = 3;
            p.layout = layout, p.layout_heads = 3;
            p.dropout_p = 0.25, p.seed = 77, p.offset = 5;
            p.softcap = 1.5, p.alibi_slopes = batch_slopes, p.alibi_stride_batch = 4;
            p.sinks = sinks, on = V_CAP | V_ALIBI | V_SINKS;
            break;
        default:
            p.sparsity = REF_SPARSE_BUTTERFLY, p.block_q = 4, p.block_k = 4;
            p.butterfly_factors = 1;
            p.mask = REF_MASK_WINDOW, p.window_left = 6, p.window_right = 3;
            p.softcap = 1.0, p.sinks = sinks, on = V_CAP | V_SINKS;
            break;
        }
        const size_t nq = q_elems(&p), nk = kv_elems(&p), nl = nq / p.head_dim;
        float *q = rand_tensor(nq, 1), *k = rand_tensor(nk, 1), *v = rand_tensor(nk, 1);
        for (size_t t = 0; t < nq; t++)
            q[t] *= 2; /* exact: the scores reach a few units */
        double *o = malloc(nq * sizeof(double)), *on_ = malloc(nq * sizeof(double));
        double *x = malloc(nq * sizeof(double)), *l = malloc(nl * sizeof(double)),
               *ln = malloc(nl * sizeof(double));
        float *ol = malloc(nq * sizeof(float));
        CHECK(ref_attention_fp64(&p, q, k, v, o, l) == 0, "%s: failed", names[c]);
        naive_attention(&p, q, k, v, on_, ln);
        CHECK(max_abs_diff(o, on_, nq) < 1e-13, "%s: o differs from the naive by %g", names[c],
              max_abs_diff(o, on_, nq));
        CHECK(max_abs_diff(l, ln, nl) < 1e-13, "%s: lse differs from the naive by %g", names[c],
              max_abs_diff(l, ln, nl));
        if (p.softcap > 0)
            CHECK(max_scaled_score(&p, q, k) > 2 * p.softcap, "%s: scores of at most %g: the cap "
                  "%g does not saturate", names[c], max_scaled_score(&p, q, k), p.softcap);
        for (int bit = 1; bit <= V_SINKS; bit <<= 1) {
            if (!(on & bit))
                continue;
            ref_problem w = without(&p, bit);
            CHECK(ref_attention_fp64(&w, q, k, v, x, NULL) == 0, "%s: failed", names[c]);
            double e = ref_rel_error(x, o, nq);
            CHECK(e > 0.02, "%s: variant %d changes O by %g only", names[c], bit, e);
        }
        /* rows that see no key, and no NaN anywhere */
        int bad = 0, nan = 0;
        for (size_t r = 0; r < nl; r++) {
            const int h = (int)(r / (size_t)p.seqlen_q % (size_t)p.heads_q);
            const int i = (int)(r % (size_t)p.seqlen_q);
            int visible = 0;
            for (int j = 0; j < p.seqlen_k; j++)
                visible += ref_visible(&p, h, i, j);
            for (int d = 0; d < p.head_dim; d++)
                nan += !isfinite(o[r * p.head_dim + d]);
            nan += isnan(l[r]) || l[r] == INFINITY;
            if (visible)
                continue;
            empty_seen[p.sinks != NULL]++;
            for (int d = 0; d < p.head_dim; d++)
                bad += o[r * p.head_dim + d] != 0.0;
            bad += p.sinks ? l[r] != (double)p.sinks[h] : !(isinf(l[r]) && l[r] < 0);
        }
        CHECK(nan == 0, "%s: %d values not finite", names[c], nan);
        CHECK(bad == 0, "%s: %d values wrong in rows that see no key", names[c], bad);
        for (int dtype = 0; dtype < 2; dtype++) {
            CHECK(ref_attention_lowp(&p, dtype, q, k, v, ol) == 0, "%s: lowp failed", names[c]);
            double e = ref_rel_error_f(ol, o, nq), lim = dtype == 0 ? 1e-2 : 5e-2;
            CHECK(e > 0 && e < lim, "%s: dtype %d lowp error %g", names[c], dtype, e);
        }
        free(q);
        free(k);
        free(v);
        free(o);
        free(on_);
        free(x);
        free(l);
        free(ln);
        free(ol);
    }
    CHECK(empty_seen[0] > 0 && empty_seen[1] > 0, "rows that see no key: %d without sinks, %d with",
          empty_seen[0], empty_seen[1]);
}

/* Sinks in the limits: a sink far below every logit changes nothing, one
 * far above takes all the mass (O and the lse's excess over the sink go to
 * 0); an ALiBi slope of 0 is no bias; a cap far above the scores is none. */
static void test_variant_limits(void) {
    ref_problem p = base_problem(2, 2, 1, 9, 14, 5);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 5;
    const size_t nq = q_elems(&p), nl = nq / p.head_dim;
    float *q = rand_tensor(nq, 1), *k = rand_tensor(kv_elems(&p), 1),
          *v = rand_tensor(kv_elems(&p), 1);
    double *o0 = malloc(nq * sizeof(double)), *o = malloc(nq * sizeof(double));
    double *l0 = malloc(nl * sizeof(double)), *l = malloc(nl * sizeof(double));
    CHECK(ref_attention_fp64(&p, q, k, v, o0, l0) == 0, "plain failed");
    const float low[2] = {-800.0f, -900.0f}, high[2] = {60.0f, 70.0f}, zero[2] = {0.0f, 0.0f};
    ref_problem w = p;
    w.sinks = low;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == 0 && max_abs_diff(o, o0, nq) == 0 &&
              max_abs_diff(l, l0, nl) == 0,
          "a sink of -800 changes the output");
    w.sinks = high;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == 0, "high sink failed");
    double most = 0, excess = 0;
    for (size_t t = 0; t < nq; t++)
        most = fmax(most, fabs(o[t]));
    for (size_t r = 0; r < nl; r++)
        excess = fmax(excess, l[r] - high[r / (size_t)p.seqlen_q % 2]);
    CHECK(most < 1e-20 && excess >= 0 && excess < 1e-20, "a sink of 60: |O| %g, lse - sink %g",
          most, excess);
    w = p;
    w.alibi_slopes = zero;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == 0 && max_abs_diff(o, o0, nq) == 0 &&
              max_abs_diff(l, l0, nl) == 0,
          "slopes of 0 change the output");
    w = p;
    w.softcap = 1e9;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == 0 && max_abs_diff(o, o0, nq) < 1e-14 &&
              max_abs_diff(l, l0, nl) < 1e-14,
          "a cap of 1e9 changes the output by %g", max_abs_diff(o, o0, nq));
    /* invalid values */
    w = p;
    w.softcap = -1;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == -1, "a negative cap accepted");
    w.softcap = NAN;
    float *ol = malloc(nq * sizeof(float));
    CHECK(ref_attention_lowp(&w, 0, q, k, v, ol) == -1, "a NaN cap accepted");
    free(ol);
    w = p;
    w.alibi_slopes = zero, w.alibi_stride_batch = -2;
    CHECK(ref_attention_fp64(&w, q, k, v, o, l) == -1, "a negative slope stride accepted");
    free(q);
    free(k);
    free(v);
    free(o0);
    free(o);
    free(l0);
    free(l);
}

static void test_dropout_expectation(void) {
    ref_problem p = base_problem(1, 1, 1, 4, 8, 4);
    float *q = rand_tensor(16, 2), *k = rand_tensor(32, 2), *v = rand_tensor(32, 2);
    for (int t = 0; t < 16; t++)
        q[t] *= 3; /* make the softmax uneven */
    for (int t = 0; t < 32; t++)
        v[t] += 1; /* keep o away from zero */
    double o0[16], l0[4], o[16], l[4], mean[16] = {0};
    CHECK(ref_attention_fp64(&p, q, k, v, o0, l0) == 0, "no-dropout failed");
    p.dropout_p = 0.3;
    const int n = 4000;
    double single = 0;
    for (int s = 0; s < n; s++) {
        p.seed = 0x5eed0000ull + (uint64_t)s;
        CHECK(ref_attention_fp64(&p, q, k, v, o, l) == 0, "dropout failed");
        double e = ref_rel_error(o, o0, 16);
        single += e * e / n;
        for (int t = 0; t < 16; t++)
            mean[t] += o[t] / n;
        if (s == 0)
            CHECK(max_abs_diff(l, l0, 4) == 0, "lse must not depend on dropout");
    }
    single = sqrt(single); /* rms error of one sample */
    double e = ref_rel_error(mean, o0, 16);
    /* unbiased: the mean's error shrinks like 1/sqrt(n) */
    CHECK(single > 0.05, "dropout barely changes the output (%g)", single);
    CHECK(e < 3 * single / sqrt((double)n),
          "mean over %d seeds is %g away from no-dropout "
          "(one sample: %g)",
          n, e, single);
    free(q);
    free(k);
    free(v);
}

static void test_lowp(void) {
    for (int dtype = 0; dtype < 2; dtype++)
        for (int c = 0; c < 2; c++) {
            ref_problem p = base_problem(1, 2, 2, 100, 130, 64);
            if (c) {
                p.mask = REF_MASK_CAUSAL;
                p.diag_offset = 30;
                p.dropout_p = 0.2;
                p.seed = 99;
                p.offset = 12;
            }
            size_t nq = q_elems(&p), nk = kv_elems(&p);
            float *q = rand_tensor(nq, dtype), *k = rand_tensor(nk, dtype),
                  *v = rand_tensor(nk, dtype), *ol = malloc(nq * sizeof(float));
            double *o = malloc(nq * sizeof(double));
            CHECK(ref_attention_fp64(&p, q, k, v, o, NULL) == 0, "fp64 failed");
            CHECK(ref_attention_lowp(&p, dtype, q, k, v, ol) == 0, "lowp failed");
            double e = ref_rel_error_f(ol, o, nq);
            double lim = dtype == 0 ? 1e-2 : 5e-2;
            CHECK(e > 0 && e < lim, "dtype %d case %d: lowp error %g", dtype, c, e);
            int rep = 1;
            for (size_t t = 0; t < nq; t++)
                rep &= ref_round(ol[t], dtype) == ol[t];
            CHECK(rep, "lowp output not representable in dtype %d", dtype);
            if (c) { /* another seed: the error jumps, so the decisions matched */
                p.seed = 100;
                CHECK(ref_attention_lowp(&p, dtype, q, k, v, ol) == 0, "lowp failed");
                double e2 = ref_rel_error_f(ol, o, nq);
                CHECK(e2 > 0.2 && e2 > 50 * e, "other seed error only %g", e2);
            }
            free(q);
            free(k);
            free(v);
            free(ol);
            free(o);
        }
}

/* The logit of the low-precision path from the dtype scaled score x, in
 * fp32: cap·tanhf(x/cap), then minus slope·distance; *dt (if given) gets
 * 1 − tanh² in fp32. */
static float lowp_logit(const ref_problem *p, int b, int h, int i, int j, float x, float *dt) {
    if (p->softcap > 0) {
        const float cap = (float)p->softcap, th = tanhf(x / cap);
        x = cap * th;
        if (dt)
            *dt = 1.0f - th * th;
    }
    if (p->alibi_slopes) {
        int64_t dist = (int64_t)i + p->diag_offset - j;
        x -= p->alibi_slopes[(size_t)(p->batch0 + b) * (size_t)p->alibi_stride_batch + (size_t)h] *
             (float)(dist < 0 ? -dist : dist);
    }
    return x;
}

/* The naive path written out step by step, with every sum in key / head-dim
 * order. Fed with inputs whose dot products are exact in fp32, it must agree
 * bit for bit with ref_attention_lowp: this pins which tensors get rounded. */
static void naive_lowp(const ref_problem *p, int dtype, const float *q, const float *k,
                       const float *v, float *o) {
    int group = p->heads_q / p->heads_kv, D = p->head_dim;
    uint32_t thr = ref_dropout_threshold(p->dropout_p);
    float dscale = (float)ref_dropout_scale(thr);
    float *s = malloc(sizeof(float) * (size_t)p->seqlen_k);
    for (int b = 0; b < p->batch; b++)
        for (int h = 0; h < p->heads_q; h++)
            for (int i = 0; i < p->seqlen_q; i++) {
                size_t row = ((size_t)b * p->heads_q + h) * p->seqlen_q + i;
                size_t kvbase = ((size_t)b * p->heads_kv + h / group) * p->seqlen_k;
                float m = -INFINITY, sum = 0;
                for (int j = 0; j < p->seqlen_k; j++) {
                    if (!ref_visible(p, h, i, j))
                        continue;
                    float dot = 0;
                    for (int d = 0; d < D; d++)
                        dot += q[row * D + d] * k[(kvbase + j) * D + d];
                    s[j] = lowp_logit(p, b, h, i, j,
                                      ref_round(ref_round(dot, dtype) * (float)p->scale, dtype),
                                      NULL);
                    m = fmaxf(m, s[j]);
                }
                if (p->sinks)
                    m = fmaxf(m, p->sinks[h]);
                for (int j = 0; j < p->seqlen_k; j++)
                    if (ref_visible(p, h, i, j))
                        sum += expf(s[j] - m);
                if (p->sinks)
                    sum += expf(p->sinks[h] - m);
                for (int d = 0; d < D; d++) {
                    float acc = 0;
                    for (int j = 0; j < p->seqlen_k; j++) {
                        if (!ref_visible(p, h, i, j))
                            continue;
                        float pj = ref_round(expf(s[j] - m) / sum, dtype);
                        if (thr)
                            pj = ref_dropout_keep(p->seed, p->offset, b, h, i, j, thr)
                                     ? ref_round(pj * dscale, dtype)
                                     : 0.0f;
                        acc += pj * v[(kvbase + j) * D + d];
                    }
                    o[row * D + d] = ref_round(acc, dtype);
                }
            }
    free(s);
}

static void test_lowp_steps(void) {
    const float sinks[4] = {0.5f, 2.0f, -1.0f, 1.25f};
    float slopes[3 * 4]; /* (batch0 + B, Hq) */
    for (int t = 0; t < 12; t++)
        slopes[t] = 0.1f + 0.05f * (float)t;
    for (int dtype = 0; dtype < 2; dtype++)
        for (int c = 0; c < 4; c++) {
            ref_problem p = base_problem(2, 4, c % 2 ? 2 : 4, 19, 23, c % 2 ? 15 : 16);
            p.scale = 0.3; /* not a power of two: the scaled scores round again */
            if (c % 2) {
                p.mask = REF_MASK_CAUSAL;
                p.diag_offset = 4;
                p.dropout_p = 0.15;
                p.seed = 5;
                p.offset = 3;
            }
            if (c == 2) { /* every variant; slopes per (batch, head) from batch 1 */
                p.softcap = 1.0;
                p.alibi_slopes = slopes, p.alibi_stride_batch = 4, p.batch0 = 1;
                p.sinks = sinks;
            } else if (c == 3) {
                p.softcap = 0.75, p.alibi_slopes = slopes, p.sinks = sinks;
            }
            size_t nq = q_elems(&p), nk = kv_elems(&p);
            float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)),
                  *v = malloc(nk * sizeof(float)), *o = malloc(nq * sizeof(float)),
                  *on = malloc(nq * sizeof(float));
            /* multiples of 1/64 up to 2: products and their sums are exact in fp32 */
            for (size_t t = 0; t < nq; t++)
                q[t] = (float)((int)(rng_next() % 257) - 128) / 64;
            for (size_t t = 0; t < nk; t++)
                k[t] = (float)((int)(rng_next() % 257) - 128) / 64;
            for (size_t t = 0; t < nk; t++)
                v[t] = (float)((int)(rng_next() % 257) - 128) / 64;
            CHECK(ref_attention_lowp(&p, dtype, q, k, v, o) == 0, "lowp failed");
            naive_lowp(&p, dtype, q, k, v, on);
            int diff = 0;
            for (size_t t = 0; t < nq; t++)
                diff += bits_of_f(o[t]) != bits_of_f(on[t]);
            CHECK(diff == 0, "dtype %d case %d: %d of %zu outputs differ from the naive steps",
                  dtype, c, diff, nq);
            free(q);
            free(k);
            free(v);
            free(o);
            free(on);
        }
}

static void test_rel_error(void) {
    double a[2] = {3, 4}, b[2] = {3, 0}, z[2] = {0, 0};
    CHECK(fabs(ref_rel_error(a, b, 2) - 4.0 / 3) < 1e-15, "rel error %g", ref_rel_error(a, b, 2));
    CHECK(ref_rel_error(b, b, 2) == 0, "identical");
    CHECK(ref_rel_error(z, z, 2) == 0, "both zero");
    CHECK(isinf(ref_rel_error(a, z, 2)), "reference zero");
    double nan_a[2] = {NAN, 0};
    CHECK(isnan(ref_rel_error(nan_a, b, 2)), "NaN in a");
    CHECK(isnan(ref_rel_error(nan_a, z, 2)), "NaN in a, zero b");
    float af[2] = {3, 4}, nf[2] = {0, NAN};
    CHECK(fabs(ref_rel_error_f(af, b, 2) - 4.0 / 3) < 1e-15, "float rel error");
    CHECK(isnan(ref_rel_error_f(nf, b, 2)), "float NaN");
    CHECK(ref_rel_error_f(af, b, 0) == 0, "n = 0");
}

int main(void) {
    test_half();
    test_bf16();
    test_philox_kat();
    test_dropout_params();
    test_dropout_layout();
    test_dropout_rate();
    test_dropout_changes();
    test_dropout_pure();
    test_causal_alignment();
    test_window();
    test_butterfly();
    test_single_key();
    test_equal_scores();
    test_hand_lse();
    test_masked_rows();
    test_layout();
    test_gqa();
    test_blocks();
    test_against_naive();
    test_value_head_dim();
    test_variants();
    test_variant_limits();
    test_dropout_expectation();
    test_lowp();
    test_lowp_steps();
    test_rel_error();
    return check_summary("test_reference");
}
