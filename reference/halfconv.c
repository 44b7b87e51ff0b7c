/* fp16 and bf16 conversions on the host, round to nearest even, done on the
 * bit patterns so the result does not depend on the host's FPU modes. */
#include "reference/halfconv.h"

#include <string.h>

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t ref_float_to_half(float f) {
    uint32_t u = float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t exp = (u >> 23) & 0xffu;
    uint32_t mant = u & 0x7fffffu;

    if (exp == 0xffu) {
        if (mant == 0)
            return (uint16_t)(sign | 0x7c00u);
        /* keep the top payload bits and force a quiet NaN so that a payload
         * living only in the low bits cannot turn into infinity */
        return (uint16_t)(sign | 0x7e00u | (mant >> 13));
    }

    int e = (int)exp - 127 + 15; /* biased half exponent */
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);

    if (e <= 0) {
        /* half subnormal (or zero): value = m * 2^-24 */
        if (exp == 0)
            return sign; /* float subnormals are far below 2^-25 */
        uint32_t m = mant | 0x800000u;
        int shift = 14 - e;
        if (shift > 24)
            return sign; /* below half of the smallest subnormal */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1u)))
            r++;
        /* r == 0x400 is exactly the smallest normal's encoding */
        return (uint16_t)(sign | r);
    }

    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    /* a carry out of the mantissa bumps the exponent, up to infinity */
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float ref_half_to_float(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;

    if (exp == 0x1fu)
        return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp != 0)
        return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0)
        return bits_float(sign);
    /* subnormal: normalize so the leading one becomes the implicit bit */
    int e = 113; /* float biased exponent of 2^-14 */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return bits_float(sign | ((uint32_t)e << 23) | ((mant & 0x3ffu) << 13));
}

uint16_t ref_float_to_bf16(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu))
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN stays NaN */
    /* adding 0x7fff plus the lowest kept bit rounds to nearest even; the
     * carry propagates into the exponent and overflows to infinity */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ref_bf16_to_float(uint16_t b) {
    return bits_float((uint32_t)b << 16);
}

float ref_round(float f, int dtype) {
    if (dtype == 0) {
        /* fast path for results in the normal half range: round the float's
         * mantissa to 10 bits in place; the rest goes through the encoding */
        uint32_t u = float_bits(f), a = u & 0x7fffffffu;
        if (a >= 0x38800000u && a < 0x477ff000u) {
            u += 0xfffu + ((u >> 13) & 1u);
            return bits_float(u & ~0x1fffu);
        }
        return ref_half_to_float(ref_float_to_half(f));
    }
    if (dtype == 1)
        return ref_bf16_to_float(ref_float_to_bf16(f));
    return f;
}
