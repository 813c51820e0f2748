/*
 * The element codecs below bf16, each written once and inline: the OCP 8-bit floats E4M3 (the
 * "FN" variant: no infinities, one NaN pattern per sign, max 448) and E5M2 (IEEE-like: max
 * 57344, infinities, NaN), the 4-bit E2M1 (max 6, no NaN, no infinity) and the scale byte E8M0
 * (a power of two 2^(byte - 127)). Every conversion from fp32 rounds on the integer bits of the
 * input (or compares against exact midpoints), so it needs no floating-point environment and
 * gives the same codes on every CPU path; test_formats checks each against a value-based
 * formula on all 2^32 inputs.
 *
 * Overflow of the 8-bit floats: "saturating" conversions clamp to the largest finite value, as
 * every production quantizer does before its cast; the non-saturating forms are c10's older
 * casts (formats.c says which inputs become NaN or infinity). NaN keeps its sign: E4M3 0x7f,
 * E5M2 0x7f (| 0x80 when negative), as c10 writes them.
 */
#ifndef PARITY_QUANT_CODECS_H
#define PARITY_QUANT_CODECS_H

#include <math.h>
#include <stdint.h>

#include "base/floats.h"

/* ---- the 8-bit floats ------------------------------------------------------------------------ */

/* A small binary float: `mbits` fraction bits, exponent bias `bias`, largest finite code
 * `max_code` (sign excluded), the code overflow reaches when not saturating, the NaN code
 * written; `ieee` says whether the top exponent holds infinities and NaNs (E5M2) or only
 * the top code is NaN (E4M3). */
typedef struct minifloat {
    uint32_t mbits, bias, max_code, overflow_code, nan_code;
    int ieee;
} minifloat;

static const minifloat MINIFLOAT_E4M3 = {3, 7, 0x7e, 0x7f, 0x7f, 0};
static const minifloat MINIFLOAT_E5M2 = {2, 15, 0x7b, 0x7c, 0x7f, 1};

/* x in the format f, rounded to nearest even; `saturate`: overflow clamps to the largest
 * finite code (infinities too), else it goes to f's overflow code. */
static inline uint8_t minifloat_from_f32(const minifloat *f, float x, int saturate) {
    const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return sign | (uint8_t)f->nan_code;
    const uint32_t drop = 23 - f->mbits;           /* fp32 fraction bits that go */
    const uint32_t min_normal = (127 - f->bias + 1) << 23;
    uint32_t code;
    if (a >= min_normal) {
        if (a >= 0x7f800000u) {
            code = 0xffu; /* infinity: past every finite code */
        } else {
            /* RNE at bit `drop`, then rebias the exponent; a carry out of the fraction is
             * the next binade, as it should be */
            const uint32_t r = a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u);
            code = (r >> drop) - ((127 - f->bias) << f->mbits);
        }
        if (code > f->max_code) return sign | (uint8_t)(saturate ? f->max_code : f->overflow_code);
        return sign | (uint8_t)code;
    }
    /* below the smallest normal: n = RNE(|x| / q), q = 2^(1 - bias - mbits) the subnormal
     * quantum; |x| = m 2^(e - 150), so n = RNE(m 2^(e - 150 + bias - 1 + mbits)) */
    const uint32_t e = a >> 23;
    if (e == 0) return sign; /* an fp32 subnormal is far below half the quantum */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 150 - (f->bias - 1 + f->mbits) - e;
    if (shift > 24) return sign; /* |x| < q / 2: zero */
    uint32_t n = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (n & 1u))) n++;
    return sign | (uint8_t)n; /* n = 2^mbits is the smallest normal's code */
}

/* The value of a code of f, exact; a NaN code gives a quiet NaN of its sign. */
static inline float minifloat_to_f32(const minifloat *f, uint8_t c) {
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24, mag = c & 0x7fu;
    const uint32_t mask = (1u << f->mbits) - 1u;
    const uint32_t e = mag >> f->mbits, frac = mag & mask;
    if (!f->ieee && mag == 0x7fu) return f32_from_bits(sign | 0x7fc00000u);
    if (f->ieee && e == (0x7fu >> f->mbits))
        return f32_from_bits(sign | (frac ? 0x7fc00000u : 0x7f800000u));
    if (e == 0) {
        /* frac * 2^(1 - bias - mbits): exact in fp32 (a small integer times a power of 2) */
        const float q = f32_from_bits((127u + 1u - f->bias - f->mbits) << 23);
        const float v = (float)frac * q;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((e + 127u - f->bias) << 23) | (frac << (23 - f->mbits)));
}

/* fp32 -> E4M3, round to nearest even, saturating at +-448, NaN -> sign | 0x7f: the cast every
 * quantizer rule applies after its clamp. */
static inline uint8_t e4m3_from_f32_saturating(float x) {
    return minifloat_from_f32(&MINIFLOAT_E4M3, x, 1);
}

/* The value of an E4M3 code: k * 2^-9 with k an integer, |k| <= 448 * 512; NaN for 0x7f, 0xff. */
static inline float e4m3_to_f32(uint8_t c) { return minifloat_to_f32(&MINIFLOAT_E4M3, c); }

/* ---- E2M1 ------------------------------------------------------------------------------------ */

/* The eight magnitudes of E2M1 (code & 7; the sign is bit 3), each k * 2^-1 with k <= 12. */
static const float E2M1_MAGNITUDE[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

/* x in E2M1, saturating at +-6 (an infinity too; NaN is the caller's to refuse): |x| past the
 * midpoint of magnitudes i and i + 1 (exact in fp32) rounds to code i + 1 or above; at the
 * midpoint itself the even code (i + 1 when i is odd), or with `away` the larger one. */
static inline uint8_t e2m1_from_f32(float x, int away) {
    const uint8_t sign = (uint8_t)((f32_bits(x) >> 28) & 0x8u);
    const float a = fabsf(x);
    uint8_t code = 0;
    for (int i = 0; i < 7; i++) {
        const float mid = 0.5f * (E2M1_MAGNITUDE[i] + E2M1_MAGNITUDE[i + 1]);
        if (a > mid || (a == mid && (away || (i & 1)))) code = (uint8_t)(i + 1);
    }
    return sign | code;
}

/* The value of a 4-bit code (bits above the low four ignored); code 0x8 is -0. */
static inline float e2m1_to_f32(uint8_t code) {
    const float v = E2M1_MAGNITUDE[code & 7];
    return code & 8 ? -v : v;
}

/* ---- E8M0 ------------------------------------------------------------------------------------ */

/* The power of two 2^(byte - 127) an E8M0 scale byte means (0x00 the subnormal 2^-127). 0xff,
 * E8M0's NaN, which no quantizer writes for finite inputs, gives 2^128 = +inf. */
static inline float e8m0_to_f32(uint8_t byte) { return ldexpf(1.0f, (int)byte - 127); }

/* The reciprocal 2^(127 - byte) of a scale byte, from its exponent (torchao's; 2^-128 and
 * below are subnormal): what an element step multiplies by. */
static inline float e8m0_reciprocal(uint8_t byte) { return ldexpf(1.0f, 127 - (int)byte); }

/* The byte of a power of two s in [2^-127, 2^127]. */
static inline uint8_t e8m0_from_pow2(float s) { return (uint8_t)(ilogbf(s) + 127); }

/* The byte of floor(log2 amax) - emax, clamped to [-127, 128] (OCP's shared exponent, from the
 * exponent bits of amax; emax the element format's largest exponent: 8 for E4M3, 2 for E2M1). */
static inline uint8_t e8m0_floor_scale(float amax, int emax) {
    int e = (int)((f32_bits(amax) >> 23) & 0xffu) - 127 - emax;
    if (e < -127) e = -127;
    if (e > 128) e = 128;
    return (uint8_t)(e + 127);
}

/* The byte of v rounded up to a power of two (TE's float_to_e8m0): the exponent of v, one more
 * when v has fraction bits, except at the top finite exponent and for subnormals at or below
 * 2^-127; an infinite v gives 0xfe, a NaN 0xff. */
static inline uint8_t e8m0_ceil_scale(float v) {
    const uint32_t u = f32_bits(v);
    const uint32_t exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
    if (exp == 0xffu) return mant ? 0xff : 0xfe;
    const int up = mant > 0 && exp != 0xfeu && !(exp == 0 && mant <= 0x400000u);
    return (uint8_t)(exp + (uint32_t)up);
}

#endif /* PARITY_QUANT_CODECS_H */
