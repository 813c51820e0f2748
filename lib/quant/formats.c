/*
 * Element formats below bf16: IEEE binary16 (fp16) and the two OCP 8-bit floats, E4M3 (the
 * "FN" variant: no infinities, one NaN pattern per sign, max 448) and E5M2 (IEEE-like: max
 * 57344, infinities, NaN). Every conversion from fp32 rounds to nearest even on the integer
 * bits of the input, so it needs no floating-point environment and gives the same codes on
 * every CPU path; test_formats checks each on all 2^32 inputs against a value-based formula.
 *
 * Overflow. "Saturating" conversions clamp to the largest finite value first, as every
 * production quantizer does before its cast (and as PyTorch's float8 casts do since 2026,
 * pytorch #177870/#178817); infinities then become that value too. The non-saturating forms
 * are what c10's fp8e4m3fn_from_fp32_value / fp8e5m2_from_fp32_value computed before that:
 * E4M3 rounds onto a grid whose pattern above 448 is NaN, so (464, inf] becomes NaN (464 is a
 * tie and goes to the even 448); E5M2 rounds [61440, inf] to infinity. NaN keeps its sign:
 * E4M3 0x7f, E5M2 0x7f (| 0x80 when negative), as c10 writes them.
 */
#include <math.h>

#include "base/internal.h"

uint16_t parity_fp16_from_f32(float x) { return f16_from_f32(x); }

float parity_fp16_to_f32(uint16_t x) { return f16_to_f32(x); }

/* A small binary float: `mbits` fraction bits, exponent bias `bias`, largest finite code
 * `max_code` (sign excluded), the code overflow reaches when not saturating, the NaN code
 * written; `ieee` says whether the top exponent holds infinities and NaNs (E5M2) or only
 * the top code is NaN (E4M3). */
typedef struct minifloat {
    uint32_t mbits, bias, max_code, overflow_code, nan_code;
    int ieee;
} minifloat;

static const minifloat E4M3 = {3, 7, 0x7e, 0x7f, 0x7f, 0};
static const minifloat E5M2 = {2, 15, 0x7b, 0x7c, 0x7f, 1};

static uint8_t minifloat_from_f32(const minifloat *f, float x, int saturate) {
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

static float minifloat_to_f32(const minifloat *f, uint8_t c) {
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

static const minifloat *fp8_format(int format) {
    return format == PARITY_FP8_E4M3 ? &E4M3 : format == PARITY_FP8_E5M2 ? &E5M2 : NULL;
}

int parity_fp8_from_f32(int format, int saturate, size_t n, const float *x, uint8_t *out) {
    clear_error();
    const minifloat *f = fp8_format(format);
    if (!f) return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp8_from_f32: format %d is "
                             "neither PARITY_FP8_E4M3 nor PARITY_FP8_E5M2", format);
    if (n && (!x || !out))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp8_from_f32: %s is NULL",
                         x ? "out" : "x");
    for (size_t i = 0; i < n; i++) out[i] = minifloat_from_f32(f, x[i], saturate);
    return PARITY_OK;
}

int parity_fp8_to_f32(int format, size_t n, const uint8_t *codes, float *out) {
    clear_error();
    const minifloat *f = fp8_format(format);
    if (!f) return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp8_to_f32: format %d is "
                             "neither PARITY_FP8_E4M3 nor PARITY_FP8_E5M2", format);
    if (n && (!codes || !out))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp8_to_f32: %s is NULL",
                         codes ? "out" : "codes");
    for (size_t i = 0; i < n; i++) out[i] = minifloat_to_f32(f, codes[i]);
    return PARITY_OK;
}

uint8_t e4m3_from_f32_saturating(float x) { return minifloat_from_f32(&E4M3, x, 1); }

/* ---- E2M1 ---------------------------------------------------------------------------------- */

/* The midpoints between consecutive E2M1 magnitudes (exact in fp32): |x| past midpoint i rounds
 * to code i + 1 or above; at the midpoint itself RNE takes the even code (i + 1 when i is odd),
 * half-away the larger one. */
static const float e2m1_mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
static const float e2m1_value[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

static uint8_t e2m1_from_f32(float x, int away) {
    const uint8_t sign = (uint8_t)((f32_bits(x) >> 28) & 0x8u);
    const float a = fabsf(x); /* an infinity passes every midpoint: saturates at 6 */
    uint8_t code = 0;
    for (int i = 0; i < 7; i++)
        if (a > e2m1_mid[i] || (a == e2m1_mid[i] && (away || (i & 1)))) code = (uint8_t)(i + 1);
    return sign | code;
}

int parity_fp4_from_f32(int rounding, size_t n, const float *x, uint8_t *codes) {
    clear_error();
    if (rounding != PARITY_FP4_RNE && rounding != PARITY_FP4_HALF_AWAY)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_from_f32: rounding %d is neither "
                         "PARITY_FP4_RNE nor PARITY_FP4_HALF_AWAY", rounding);
    if (n && (!x || !codes))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_from_f32: %s is NULL",
                         x ? "codes" : "x");
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return set_error(PARITY_ERR_TENSOR_NONFINITE, "parity_fp4_from_f32: x[%zu] is NaN, "
                             "which E2M1 cannot hold", i);
    for (size_t i = 0; i < n; i++) codes[i] = e2m1_from_f32(x[i], rounding == PARITY_FP4_HALF_AWAY);
    return PARITY_OK;
}

/* The checks of a call reading n codes into `out`: both buffers there, every code 4 bits. */
static int fp4_check_codes(const char *fn, size_t n, const uint8_t *codes, const void *out,
                           const char *out_name) {
    if (n && (!codes || !out))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, codes ? out_name : "codes");
    for (size_t i = 0; i < n; i++)
        if (codes[i] > 0xf)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: codes[%zu] is 0x%02x, not a 4-bit "
                             "code", fn, i, codes[i]);
    return PARITY_OK;
}

int parity_fp4_to_f32(size_t n, const uint8_t *codes, float *out) {
    clear_error();
    const int rc = fp4_check_codes("parity_fp4_to_f32", n, codes, out, "out");
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        const float v = e2m1_value[codes[i] & 7];
        out[i] = codes[i] & 8 ? -v : v;
    }
    return PARITY_OK;
}

int parity_fp4_pack(size_t n, const uint8_t *codes, uint8_t *packed) {
    clear_error();
    const int rc = fp4_check_codes("parity_fp4_pack", n, codes, packed, "packed");
    if (rc) return rc;
    for (size_t j = 0; j < n / 2; j++) packed[j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
    if (n & 1) packed[n / 2] = codes[n - 1];
    return PARITY_OK;
}

int parity_fp4_unpack(size_t n, const uint8_t *packed, uint8_t *codes) {
    clear_error();
    if (n && (!codes || !packed))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_fp4_unpack: %s is NULL",
                         packed ? "codes" : "packed");
    for (size_t i = 0; i < n; i++) codes[i] = (uint8_t)(packed[i / 2] >> (4 * (i & 1)) & 0xfu);
    return PARITY_OK;
}
