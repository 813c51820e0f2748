/*
 * The NVFP4 and MXFP4 activation quantizers in AVX2: nvfp4_quantize_rows_avx2 and
 * mxfp4_quantize_rows_avx2, bitwise nvfp4.c's and mxfp4.c's quantize_activations, as
 * e2m1_quant_avx512.c computes them, on 8 lanes: two ymm an NVFP4 block, four an MXFP4 one.
 * A row's last block goes through a copy padded with +0 (which no amax sees), and only its
 * codes are written back. amax: vmaxps with the running max second (a NaN lane passed over, as
 * fmaxf); the scale and the step: the scalar code every path shares (nvfp4.h, mxfp4.h); the
 * step in lanes: vdivps, vmulps, the clamp fminf(fmaxf(q, -6), 6) as vmaxps(q, -6) then
 * vminps, and E2M1 as the count of the midpoints |q| is above (or at, for the odd ones and
 * under round-away), ordered compares (false for NaN), the sign from bit 31.
 */
#include <immintrin.h>
#include <string.h>

#include "mxfp4.h"
#include "nvfp4.h"

/* A block of up to 32 values in lanes: `vectors` ymm, from a padded copy past the row. */
typedef struct lanes {
    __m256 v[4];
} lanes;

/* The n values of a block from p into `vectors` ymm (n <= 8 * vectors; +0 past n). */
static inline lanes load_block(const float *p, size_t n, int vectors) {
    lanes b;
    if (n >= (size_t)vectors * 8) {
        for (int i = 0; i < vectors; i++) b.v[i] = _mm256_loadu_ps(p + 8 * i);
        return b;
    }
    float tail[32] = {0};
    memcpy(tail, p, n * sizeof(float));
    for (int i = 0; i < vectors; i++) b.v[i] = _mm256_loadu_ps(tail + 8 * i);
    return b;
}

/* max |x| of the block's lanes (NaN lanes passed over), reduced to one value. */
static inline float block_amax(const lanes *b, int vectors) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < vectors; i++) m = _mm256_max_ps(_mm256_and_ps(b->v[i], abs_mask), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* e2m1_from_f32 of 8 lanes, as 8 bytes in the low half. */
static inline __m128i e2m1_codes(__m256 q, int away) {
    const __m256 a = _mm256_and_ps(q, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    __m256i code = _mm256_setzero_si256();
    /* the midpoints of E2M1_MAGNITUDE's neighbours; at the odd ones' a tie goes up */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; i++) {
        const __m256 up = away || (i & 1) ? _mm256_cmp_ps(a, _mm256_set1_ps(mid[i]), _CMP_GE_OQ)
                                          : _mm256_cmp_ps(a, _mm256_set1_ps(mid[i]), _CMP_GT_OQ);
        code = _mm256_sub_epi32(code, _mm256_castps_si256(up)); /* up is -1 where true */
    }
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(q), 28),
                                          _mm256_set1_epi32(8));
    code = _mm256_or_si256(code, sign);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code),
                                           _mm256_extracti128_si256(code, 1));
    return _mm_packus_epi16(words, words);
}

/* Stores the codes of a block's `vectors` ymm, n of them (n <= 8 * vectors). */
static inline void store_codes(uint8_t *p, const __m128i *c, size_t n, int vectors) {
    if (n >= (size_t)vectors * 8) {
        for (int i = 0; i < vectors; i++) _mm_storel_epi64((__m128i *)(void *)(p + 8 * i), c[i]);
        return;
    }
    uint8_t tail[32];
    for (int i = 0; i < vectors; i++) _mm_storel_epi64((__m128i *)(void *)(tail + 8 * i), c[i]);
    memcpy(p, tail, n);
}

/* The codes of 8 values under an NVFP4 step. */
static inline __m128i nvfp4_codes(const nvfp4_step *step, __m256 x) {
    const __m256 f = _mm256_set1_ps(step->factor);
    switch (step->codes) {
    case NVFP4_CODES_DIVIDE:
        return e2m1_codes(_mm256_div_ps(x, f), 0);
    case NVFP4_CODES_MULTIPLY:
        return e2m1_codes(_mm256_mul_ps(x, f), 0);
    case NVFP4_CODES_DIVIDE_CLAMPED:
        return e2m1_codes(_mm256_min_ps(_mm256_max_ps(_mm256_div_ps(x, f), _mm256_set1_ps(-6.0f)),
                                        _mm256_set1_ps(6.0f)),
                          0);
    }
    return _mm_setzero_si128();
}

void nvfp4_quantize_rows_avx2(const quant_rule *r, size_t rows, size_t cols, const float *x,
                              size_t x_stride, uint8_t *codes, size_t codes_stride,
                              float *block_scales, float *row_scales) {
    const size_t grid = (cols + 15) / 16;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        float row_amax = 0.0f;
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const lanes b = load_block(xr + c0, cols - c0, 2);
            const float amax = block_amax(&b, 2);
            row_amax = amax > row_amax ? amax : row_amax;
        }
        const nvfp4_tensor t = nvfp4_tensor_of(r->id, row_amax);
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t n = cols - c0;
            const lanes b = load_block(xr + c0, n, 2);
            const nvfp4_step step = nvfp4_block_step(r->id, &t, block_amax(&b, 2));
            const __m128i c[2] = {nvfp4_codes(&step, b.v[0]), nvfp4_codes(&step, b.v[1])};
            store_codes(cr + c0, c, n, 2);
            block_scales[row * grid + c0 / 16] = e4m3_to_f32(step.sf);
        }
        row_scales[row] = t.s2;
    }
}

void mxfp4_quantize_rows_avx2(const quant_rule *r, size_t rows, size_t cols, const float *x,
                              size_t x_stride, uint8_t *codes, size_t codes_stride, float *scales,
                              float *row_scales) {
    (void)row_scales;
    const size_t grid = (cols + 31) / 32;
    const int away = r->id == PARITY_QUANT_MXFP4_MICROXCALING;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t n = cols - c0;
            const lanes b = load_block(xr + c0, n, 4);
            const uint8_t e = mxfp4_scale_byte(r->id, block_amax(&b, 4));
            const __m256 mult = _mm256_set1_ps(e8m0_reciprocal(e));
            scales[row * grid + c0 / 32] = e8m0_to_f32(e);
            __m128i c[4];
            for (int i = 0; i < 4; i++) c[i] = e2m1_codes(_mm256_mul_ps(b.v[i], mult), away);
            store_codes(cr + c0, c, n, 4);
        }
    }
}
