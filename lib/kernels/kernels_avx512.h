/* What the AVX-512 kernel files share (included only by files compiled with AVX-512 F, BW,
 * VL and DQ): masks for row tails, the bf16 widening load and the dot16 fold of one zmm. */
#ifndef PARITY_KERNELS_AVX512_H
#define PARITY_KERNELS_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Lanes 0..n-1 (n <= 16). */
static inline __mmask16 z_mask(size_t n) { return (__mmask16)((1u << n) - 1); }

/* The mask of the block of 16 at i in a row of n (i < n): all 16 lanes, or fewer at the end. */
static inline __mmask16 z_mask_at(size_t n, size_t i) { return z_mask(n - i < 16 ? n - i : 16); }

/* bf16 lanes (masked: +0 past the mask) widened to fp32. */
static inline __m512 z_load_bf16(const uint16_t *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The dot16 fold of the 16 lanes of one zmm: l += l + 8, then l + 4, l + 2, l + 1. */
static inline float z_fold16(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#endif
