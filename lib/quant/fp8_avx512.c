/*
 * The FP8 (E4M3) formats' AVX-512 kernels (fp8-block and MXFP8): the activation quantizer of
 * every rule (fp8.c's fp8_quantize_activations) and the blocked GEMM (dot.c's
 * quant_gemm_blocked on E4M3 codes), bit for bit. Compiled twice: with AVX-512 F/BW/VL/DQ
 * (the _avx512 entries, vpmaddwd + vpaddd) and with VNNI too (-DFP8_VNNI, the _avx512vnni
 * entries, vpdpwssd); the products and sums are the same integers either way.
 *
 * The GEMM's arithmetic (fp8_simd.h): each code's k (value k * 2^-9) as one nonzero int16
 * digit, low (k) or high (k / 2^7), so that a block's dot is three exact int32 dots (LL, HH
 * and the dot P of the digits regardless of kind), S = LL + 2^7 (P - LL - HH) + 2^14 HH, an
 * integer below 2^43, exact in double; d = RN_fp32(S * 2^-18), as the specification's exact
 * double sum rounded once. Then acc = acc + (d * a_s) * w_s over the blocks in order, in fp32.
 *
 * The kernel's shape: output columns in tiles of 16, one int32 lane per column. Per tile and K
 * block the weight codes are read once (16 column rows of the [N][K] codes), transposed to
 * pairs of K (two codes of one column a dword) and decoded to the three digit planes of the
 * tile (int16 pairs, 12 KB for a block of 128, L1); the activations were decoded once (digit
 * pairs as dwords, in groups of 8 rows, chunks of 64 rows on the stack: fp8_simd.h). Then 8
 * rows at a time take, per pair of K, the three weight vectors against three broadcast
 * activation dwords: 24 accumulators, no horizontal sum; each block's d is computed for 16
 * columns at once. A one-row decode step takes each decoded pair straight into its dots
 * instead. A NaN code (0x7f, 0xff) in a weight column's block or an activation row's block
 * makes that d NaN, as in dot.c. Each weight byte is read once per chunk of 64 rows; prefill
 * reuses the decoded tile from L1 for every row of the chunk. The ISA-free drivers (the loops,
 * the fold into the fp32 chain, the entries) are fp8_driver.h's.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"

#include "codecs.h"
#include "dot.h"
#include "fp8_simd.h"

#ifdef FP8_VNNI
#define FP8_ENTRY(name) name##_avx512vnni
/* acc + the dword dot products of the int16 pairs of the dword at a, broadcast, and of w (no
 * overflow: fp8_simd.h). vpdpwssd with the broadcast as its memory operand, written out: GCC's
 * intrinsic copies the accumulators between registers at every step. */
static inline __m512i dot_pairs(__m512i acc, const int32_t *a, __m512i w) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*a));
    return acc;
}
#else
#define FP8_ENTRY(name) name##_avx512
static inline __m512i dot_pairs(__m512i acc, const int32_t *a, __m512i w) {
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_set1_epi32(*a), w));
}
#endif

/* The rows a GEMM step takes at once (3 accumulators each, and 3 weight vectors: 27 zmm). */
#define STEP_ROWS 8
/* The columns of a tile: one int32 lane each. */
#define TILE 16

/* ---- decoding E4M3 codes into digits ------------------------------------------------------ */

/* The three digit vectors of 32 codes: lo (k where the exponent field is below 8, else 0), hi
 * (k / 2^7 where it is 8 or above, else 0) and v = lo + hi. */
typedef struct digits32 {
    __m512i lo, hi, v;
} digits32;

/* Decodes 32 codes, zero-extended to words: k = s * 2^sh with s = m or 8 + m (the implicit
 * bit of a normal exponent), and the signed power of two by (sign, exponent) from a word
 * table (vpermw on the code's bits 3..7); the exponent's top bit (code bit 6) says the kind. */
static inline digits32 decode32(__m512i x) {
    const __m512i idx = _mm512_srli_epi16(x, 3);
    const __m512i implicit = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(fp8_implicit_bit));
    const __m512i s = _mm512_ternarylogic_epi32(x, _mm512_set1_epi16(7), implicit, 0xea);
    const __m512i v = _mm512_mullo_epi16(s, _mm512_permutexvar_epi16(
                                                idx, _mm512_loadu_si512(fp8_signed_power)));
    const __mmask32 big = _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40));
    digits32 d = {_mm512_maskz_mov_epi16((__mmask32)~big, v), _mm512_maskz_mov_epi16(big, v), v};
    return d;
}

/* Whether n codes at p hold an E4M3 NaN (0x7f or 0xff). */
static inline int has_nan(const uint8_t *p, size_t n) {
    const __m512i low7 = _mm512_set1_epi8(0x7f);
    __mmask64 any = 0;
    for (size_t i = 0; i < n; i += 64) {
        const __mmask64 in = n - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (n - i)) - 1;
        const __m512i c = _mm512_maskz_loadu_epi8(in, p + i);
        any |= _mm512_mask_cmpeq_epi8_mask(in, _mm512_and_si512(c, low7), low7);
    }
    return any != 0;
}

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* The vector types and operations of fp8_driver.h. */
typedef __m512i vint;
typedef __m512 vfloat;
typedef __mmask16 vlanes;

static inline vint v_zero(void) { return _mm512_setzero_si512(); }
static inline vfloat vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vfloat vf_mul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
static inline vfloat vf_add(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }

static inline vfloat nan_lanes(vfloat d, vlanes nan, int all) {
    return _mm512_mask_mov_ps(d, all ? (__mmask16)0xffff : nan, _mm512_set1_ps(NAN));
}

/* The first cols (<= 16) floats at y, zero in the other lanes; stores v's first cols lanes. */
static inline vfloat load_columns(const float *y, size_t cols) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << cols) - 1), y);
}

static inline void store_columns(float *y, vfloat v, size_t cols) {
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << cols) - 1), v);
}

#include "fp8_driver.h"

/* decode_rows (fp8_driver.h). */
static void decode_rows(const quant_gemm_job *j, size_t m0, size_t rows, size_t kb, size_t k0,
                        size_t k1, fp8_rows *b) {
    const size_t pair0 = (kb - b->kb0) * FP8_BLOCK_PAIRS;
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *xr = j->xq + (m0 + r) * j->K;
        for (size_t k = k0; k < k1; k += 32) {
            const __mmask32 in = k + 32 <= k1 ? ~(__mmask32)0 : ((__mmask32)1 << (k1 - k)) - 1;
            const digits32 d = decode32(_mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(in, xr + k)));
            int32_t lo[16], hi[16], v[16];
            _mm512_storeu_si512(lo, d.lo);
            _mm512_storeu_si512(hi, d.hi);
            _mm512_storeu_si512(v, d.v);
            fp8_store_pairs(b, r, pair0 + (k - k0) / 2, lo, hi, v, 16);
        }
        b->nan[r * b->blocks + kb - b->kb0] = (uint8_t)has_nan(xr + k0, k1 - k0);
    }
}

/* The weight row's codes [k, min(k + 32, k1)), zero past k1: the one place the GEMM reads
 * weight codes (a packed layout of the codes changes this function alone). */
static inline __m256i weight_codes32(const uint8_t *row, size_t k, size_t k1) {
    const __mmask32 in = k + 32 <= k1 ? ~(__mmask32)0 : ((__mmask32)1 << (k1 - k)) - 1;
    return _mm256_maskz_loadu_epi8(in, row + k);
}

/* pack_tile (fp8_driver.h). */
static inline __attribute__((always_inline)) __mmask16 pack_tile(
    const uint8_t *const *w, size_t cols, size_t k0, size_t k1, __m512i *tile,
    const int32_t *row, __m512i *dots) {
    const __m256i sign = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(-1);
    __mmask32 nan_bytes = 0; /* bytes 2c, 2c + 1: column c (a code | 0x80 is 0xff: NaN) */
    for (size_t k = k0; k < k1; k += 32) {
        __m256i r[TILE];
        for (size_t c = 0; c < TILE; c++)
            r[c] = c < cols ? weight_codes32(w[c], k, k1) : _mm256_setzero_si256();
        fp8_transpose16x16_epi16(r);
        const size_t pairs = (k1 - k + 1) / 2 < 16 ? (k1 - k + 1) / 2 : 16;
        for (size_t p = 0; p < pairs; p++) {
            nan_bytes |= _mm256_cmpeq_epi8_mask(_mm256_or_si256(r[p], sign), ones);
            const digits32 d = decode32(_mm512_cvtepu8_epi16(r[p]));
            take_pair(row, dots, tile, (k - k0) / 2 + p, d.lo, d.hi, d.v);
        }
    }
    const __m512i nan_words = _mm512_movm_epi16(nan_bytes);
    return _mm512_test_epi32_mask(nan_words, nan_words);
}

/* S * 2^-18 of 8 columns from the halves of the three dots, in double: LL 2^-18 + cross
 * 2^-11 + HH 2^-4, each step exact (fp8_simd.h); then rounded once to fp32. */
static inline __m256 half_d(__m256i ll, __m256i cross, __m256i hh) {
    __m512d s = _mm512_mul_pd(_mm512_cvtepi32_pd(ll), _mm512_set1_pd(0x1p-18));
    s = _mm512_fmadd_pd(_mm512_cvtepi32_pd(cross), _mm512_set1_pd(0x1p-11), s);
    s = _mm512_fmadd_pd(_mm512_cvtepi32_pd(hh), _mm512_set1_pd(0x1p-4), s);
    return _mm512_cvtpd_ps(s);
}

/* d of 16 columns from the three dots, cross = P - LL - HH exact in int32. */
static inline __m512 block_d(__m512i ll, __m512i hh, __m512i pp) {
    const __m512i cross = _mm512_sub_epi32(_mm512_sub_epi32(pp, ll), hh);
    const __m256 low = half_d(_mm512_castsi512_si256(ll), _mm512_castsi512_si256(cross),
                              _mm512_castsi512_si256(hh));
    const __m256 high = half_d(_mm512_extracti64x4_epi64(ll, 1),
                               _mm512_extracti64x4_epi64(cross, 1),
                               _mm512_extracti64x4_epi64(hh, 1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(low), high, 1);
}

/* ---- the activation quantizer -------------------------------------------------------------- */

/* e4m3_from_f32_saturating of 16 values, as dwords: a normal result rounds on the fp32 bits
 * (RNE at bit 20, rebias, clamp to 0x7e, which infinities reach too), a subnormal one is
 * RNE(|x| * 2^9) (exact scaling, the conversion's round to nearest even), NaN is 0x7f; then
 * the sign. */
static inline __m512i e4m3_encode16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512i rounded = _mm512_add_epi32(
        _mm512_add_epi32(a, _mm512_set1_epi32(0x7ffff)),
        _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1)));
    const __m512i normal = _mm512_min_epi32(
        _mm512_sub_epi32(_mm512_srli_epi32(rounded, 20), _mm512_set1_epi32(960)),
        _mm512_set1_epi32(0x7e));
    const __m512i subnormal = _mm512_cvtps_epi32(
        _mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)));
    __m512i code = _mm512_mask_blend_epi32(
        _mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(121 << 23)), subnormal, normal);
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000)),
                                 _mm512_set1_epi32(0x7f));
    return _mm512_or_si512(code, sign);
}

/* quantize_block (fp8_driver.h). */
static float quantize_block(const quant_rule *r, const float *x, size_t n, uint8_t *codes) {
    __m512 amax = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        /* max(|x|, amax): a NaN |x| yields amax (the second operand) */
        amax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(in, x + i)), amax);
    }
    float stored;
    const fp8_block_scale b = fp8_rule_scale(r, _mm512_reduce_max_ps(amax), &stored);
    const __m512 by = _mm512_set1_ps(b.divide ? b.stored : b.mult);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 in = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(in, x + i);
        const __m512 scaled = b.divide ? _mm512_div_ps(v, by) : _mm512_mul_ps(v, by);
        _mm512_mask_cvtepi32_storeu_epi8(codes + i, in, e4m3_encode16(scaled));
    }
    return stored;
}
