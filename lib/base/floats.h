/* fp32, bf16 and fp16 as bits: the conversions and the rounding points every layer uses
 * (round_bf16, round_fp16). Integer arithmetic only, so MXCSR plays no part. */
#ifndef PARITY_BASE_FLOATS_H
#define PARITY_BASE_FLOATS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* fp32 -> bf16 bits: round to nearest even; every NaN -> 0x7fc0 (PyTorch's c10::BFloat16). */
static inline uint16_t bf16_from_f32(float x) {
    const uint32_t u = f32_bits(x), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    /* no branch: a loop of these vectorizes (kv_store) */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}
static inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }
/* The rounding point: an fp32 value rounded to the nearest bf16, held in fp32. */
static inline float round_bf16(float x) { return bf16_to_f32(bf16_from_f32(x)); }

/* f16 (IEEE binary16) bits -> fp32, exact (subnormals, infinities and NaN payloads kept;
 * floats.c). */
float f16_to_f32(uint16_t h);
/* fp32 -> f16 bits: round to nearest even, overflow to infinity (|x| >= 65520), subnormals
 * kept (quantum 2^-24), every NaN -> 0x7e00 (as bf16's one NaN 0x7fc0: which sign a NaN
 * result has follows the operand order a compiler chose, so it is not the same in every
 * kernel table; PyTorch's c10::Half keeps it). Integer arithmetic only, so MXCSR plays no
 * part. */
static inline uint16_t f16_from_f32(float x) {
    const uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u;             /* >= 65520 (and inf): inf */
    if (a >= 0x38800000u) {                                  /* >= 2^-14: normal */
        const uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);   /* RNE at bit 13 */
        return sign | (uint16_t)((r >> 13) - ((127u - 15u) << 10));
    }
    if (a <= 0x33000000u) return sign;                       /* <= 2^-25 (a tie at 2^-25): 0 */
    /* subnormal: n = RNE(|x| / 2^-24) with |x| = m 2^(e - 150); n = 1024 is the smallest
     * normal, whose encoding is n itself */
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t n = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (n & 1u))) n++;
    return sign | (uint16_t)n;
}
/* The fp16 rounding point: an fp32 value rounded to the nearest fp16, held in fp32. */
static inline float round_fp16(float x) { return f16_to_f32(f16_from_f32(x)); }

#endif /* PARITY_BASE_FLOATS_H */
