/* What the AVX2 kernel files share (included only by files compiled with -mavx2 -mfma
 * -mf16c): masked loads and stores of partial blocks of 8 lanes, bf16 and fp16 widening and
 * rounding, the generic row access of the region kernels, the dot16 fold of two ymm and the
 * dot16 product that the fp32-weight GEMM takes for its last columns. */
#ifndef PARITY_KERNELS_AVX2_H
#define PARITY_KERNELS_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernel_common.h"
#include "kernels.h"
#include "kernels_x86.h"

/* ---- loads, stores, rounding ------------------------------------------------------------ */

/* Lanes 0..n-1 set (n <= 8). */
static inline __m256i lane_mask(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 load_f32_n(const float *p, size_t n) {
    return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lane_mask(n));
}

/* The same with lanes >= n set to -0: the first factor of a padded dot16 product, so that
 * the product is -0 (the second factor is padded with +0). */
static inline __m256 load_f32_n_neg0(const float *p, size_t n) {
    if (n == 8) return _mm256_loadu_ps(p);
    __m256i m = lane_mask(n);
    __m256 pad = _mm256_andnot_ps(_mm256_castsi256_ps(m), _mm256_set1_ps(-0.0f));
    return _mm256_or_ps(_mm256_maskload_ps(p, m), pad);
}

static inline void store_f32_n(float *p, size_t n, __m256 v) {
    if (n == 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, lane_mask(n), v);
}

static inline __m256 widen_bf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline __m256 load_bf16_n(const uint16_t *p, size_t n) {
    if (n == 8) return widen_bf16(_mm_loadu_si128((const __m128i *)p));
    uint16_t buf[8] = {0};
    memcpy(buf, p, n * sizeof *p);
    return widen_bf16(_mm_loadu_si128((const __m128i *)buf));
}

/* bf16_from_f32 on 8 lanes: (u + 0x7fff + ((u >> 16) & 1)) >> 16, NaN -> 0x7fc0; the
 * results sit in the low 16 bits of each dword. */
static inline __m256i bf16_bits(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}

/* round_bf16 on 8 lanes. */
static inline __m256 round_bf16_8(__m256 x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(x), 16));
}

/* The first n of 8 16-bit values at p. */
static inline void store_u16_n(uint16_t *p, size_t n, __m128i h) {
    if (n == 8) {
        _mm_storeu_si128((__m128i *)p, h);
    } else {
        uint16_t buf[8];
        _mm_storeu_si128((__m128i *)buf, h);
        memcpy(p, buf, n * sizeof *p);
    }
}

static inline void store_bf16_n(uint16_t *p, size_t n, __m256 x) {
    __m256i b = bf16_bits(x);
    /* The values fit in 16 bits, so the saturating pack is a plain narrowing. */
    store_u16_n(p, n, _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
}

/* fp32 -> fp16 on 8 lanes, as f16_from_f32: vcvtps2ph rounds to nearest even with
 * overflow to infinity and subnormals kept, as the specification does; only NaN differs
 * (vcvtps2ph keeps sign and payload bits), so NaN lanes become 0x7fc00000 first, whose
 * conversion is 0x7e00. */
static inline __m128i fp16_bits(__m256 x) {
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 canon = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
    return _mm256_cvtps_ph(_mm256_blendv_ps(x, canon, nan), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* round_fp16 on 8 lanes. */
static inline __m256 round_fp16_8(__m256 x) { return _mm256_cvtph_ps(fp16_bits(x)); }

static inline __m256 load_fp16_n(const uint16_t *p, size_t n) {
    if (n == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t buf[8] = {0};
    memcpy(buf, p, n * sizeof *p);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)buf));
}

static inline void store_fp16_n(uint16_t *p, size_t n, __m256 x) { store_u16_n(p, n, fp16_bits(x)); }

/* Generic row access for the region kernels, which exist on fp32 and on 16-bit buffers with
 * one body: `elt` (a constant after inlining: FMT_NONE for fp32, FMT_BF16, FMT_FP16) selects
 * the element type. A 16-bit store rounds to its format; an fp32 store stores. */
ALWAYS_INLINE __m256 ld(int elt, const void *p, size_t i, size_t n) {
    return elt == FMT_BF16   ? load_bf16_n((const uint16_t *)p + i, n)
           : elt == FMT_FP16 ? load_fp16_n((const uint16_t *)p + i, n)
                             : load_f32_n((const float *)p + i, n);
}

ALWAYS_INLINE void st(int elt, void *p, size_t i, size_t n, __m256 v) {
    if (elt == FMT_BF16)
        store_bf16_n((uint16_t *)p + i, n, v);
    else if (elt == FMT_FP16)
        store_fp16_n((uint16_t *)p + i, n, v);
    else
        store_f32_n((float *)p + i, n, v);
}

/* A rounding point: to the format the policy names there (kernel_common.h), or not at all. */
static inline __m256 round_if(int fmt, __m256 x) {
    return fmt == FMT_BF16 ? round_bf16_8(x) : fmt == FMT_FP16 ? round_fp16_8(x) : x;
}

/* ---- dot16 ------------------------------------------------------------------------------ */

/* The dot16 fold of lanes 0..7 (a0) and 8..15 (a1): l += l + 8, l + 4, l + 2, l + 1. */
static inline float fold16(__m256 a0, __m256 a1) {
    __m256 v = _mm256_add_ps(a0, a1);
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* Lanes of the block of 8 at i in a row of n (i < n): 8, or fewer at the end of the row.
 * In the last, partial block of 16, lanes 0..7 take lanes_at(n, i) elements and lanes
 * 8..15 the rest, if any. */
static inline size_t lanes_at(size_t n, size_t i) { return n - i < 8 ? n - i : 8; }

/* dot16 of a and b (kernels_avx2.c: the table's dot_f32). */
float dot_f32_avx2(const float *a, const float *b, size_t n);

/* The GEMM entries (gemm_avx2.c) over the table t. */
void gemm_avx2_set_entries(kernels *t);

#endif /* PARITY_KERNELS_AVX2_H */
