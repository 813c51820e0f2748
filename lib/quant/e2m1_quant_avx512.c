/*
 * The NVFP4 and MXFP4 activation quantizers in AVX-512 F/BW/VL/DQ: nvfp4_quantize_rows_avx512
 * and mxfp4_quantize_rows_avx512, bitwise nvfp4.c's and mxfp4.c's quantize_activations. A zmm
 * holds an NVFP4 block (16 values), two an MXFP4 block (32); a row's last block is loaded and
 * stored under a mask (nothing past the row read or written; the lanes past it read +0, which
 * no amax sees). Per block, amax is the lanes' max of |x| (NaN passed over, as fmaxf: vmaxps
 * returns its second operand, the running max, when the first is NaN; a max is exact in any
 * order), the scale and the step come from the scalar code every path shares (nvfp4.h,
 * mxfp4.h), and the step runs in lanes: vdivps and vmulps are the scalar IEEE operations, the
 * clamp is fminf(fmaxf(q, -6), 6) (vmaxps gives -6 for a NaN q, as fmaxf does), and E2M1 is
 * codecs.h's e2m1_from_f32: the count of the midpoints |q| is above (or at, for the odd ones
 * and under round-away), ordered compares (false for NaN), the sign from bit 31.
 */
#include <immintrin.h>

#include "mxfp4.h"
#include "nvfp4.h"

/* The values [0, n) of a block from p (n <= 16; +0 in the lanes past n, not read). */
static inline __m512 load_values(const float *p, size_t n) {
    if (n >= 16) return _mm512_loadu_ps(p);
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}

/* Stores the 16 bytes c, up to n of them. */
static inline void store_codes(uint8_t *p, __m128i c, size_t n) {
    if (n >= 16)
        _mm_storeu_si128((__m128i *)(void *)p, c);
    else
        _mm_mask_storeu_epi8(p, (__mmask16)((1u << n) - 1), c);
}

/* max |x| over the lanes with the running max `m` (NaN lanes passed over). */
static inline __m512 max_abs(__m512 x, __m512 m) { return _mm512_max_ps(_mm512_abs_ps(x), m); }

/* e2m1_from_f32 of 16 lanes, as 16 bytes. */
static inline __m128i e2m1_codes(__m512 q, int away) {
    const __m512 a = _mm512_abs_ps(q);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i code = _mm512_setzero_si512();
    /* the midpoints of E2M1_MAGNITUDE's neighbours; at the odd ones' a tie goes up */
    static const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    for (int i = 0; i < 7; i++) {
        const __mmask16 up = away || (i & 1)
                                 ? _mm512_cmp_ps_mask(a, _mm512_set1_ps(mid[i]), _CMP_GE_OQ)
                                 : _mm512_cmp_ps_mask(a, _mm512_set1_ps(mid[i]), _CMP_GT_OQ);
        code = _mm512_mask_add_epi32(code, up, code, one);
    }
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(q), 28),
                                          _mm512_set1_epi32(8));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

/* The codes of a block's values under an NVFP4 step. */
static inline __m128i nvfp4_codes(const nvfp4_step *step, __m512 x) {
    const __m512 f = _mm512_set1_ps(step->factor);
    switch (step->codes) {
    case NVFP4_CODES_DIVIDE:
        return e2m1_codes(_mm512_div_ps(x, f), 0);
    case NVFP4_CODES_MULTIPLY:
        return e2m1_codes(_mm512_mul_ps(x, f), 0);
    case NVFP4_CODES_DIVIDE_CLAMPED:
        return e2m1_codes(_mm512_min_ps(_mm512_max_ps(_mm512_div_ps(x, f), _mm512_set1_ps(-6.0f)),
                                        _mm512_set1_ps(6.0f)),
                          0);
    }
    return _mm_setzero_si128();
}

void nvfp4_quantize_rows_avx512(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                size_t x_stride, uint8_t *codes, size_t codes_stride,
                                float *block_scales, float *row_scales) {
    const size_t grid = (cols + 15) / 16;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        __m512 m = _mm512_setzero_ps();
        for (size_t c0 = 0; c0 < cols; c0 += 16) m = max_abs(load_values(xr + c0, cols - c0), m);
        const nvfp4_tensor t = nvfp4_tensor_of(r->id, _mm512_reduce_max_ps(m));
        for (size_t c0 = 0; c0 < cols; c0 += 16) {
            const size_t n = cols - c0;
            const __m512 v = load_values(xr + c0, n);
            const float amax = _mm512_reduce_max_ps(max_abs(v, _mm512_setzero_ps()));
            const nvfp4_step step = nvfp4_block_step(r->id, &t, amax);
            store_codes(cr + c0, nvfp4_codes(&step, v), n);
            block_scales[row * grid + c0 / 16] = e4m3_to_f32(step.sf);
        }
        row_scales[row] = t.s2;
    }
}

void mxfp4_quantize_rows_avx512(const quant_rule *r, size_t rows, size_t cols, const float *x,
                                size_t x_stride, uint8_t *codes, size_t codes_stride,
                                float *scales, float *row_scales) {
    (void)row_scales;
    const size_t grid = (cols + 31) / 32;
    const int away = r->id == PARITY_QUANT_MXFP4_MICROXCALING;
    for (size_t row = 0; row < rows; row++) {
        const float *xr = x + row * x_stride;
        uint8_t *cr = codes + row * codes_stride;
        for (size_t c0 = 0; c0 < cols; c0 += 32) {
            const size_t n = cols - c0, n1 = n > 16 ? n - 16 : 0;
            const __m512 v0 = load_values(xr + c0, n);
            const __m512 v1 = n1 ? load_values(xr + c0 + 16, n1) : _mm512_setzero_ps();
            const float amax = _mm512_reduce_max_ps(max_abs(v1, max_abs(v0, _mm512_setzero_ps())));
            const uint8_t b = mxfp4_scale_byte(r->id, amax);
            const __m512 mult = _mm512_set1_ps(e8m0_reciprocal(b));
            scales[row * grid + c0 / 32] = e8m0_to_f32(b);
            store_codes(cr + c0, e2m1_codes(_mm512_mul_ps(v0, mult), away), n);
            if (n1) store_codes(cr + c0 + 16, e2m1_codes(_mm512_mul_ps(v1, mult), away), n1);
        }
    }
}
