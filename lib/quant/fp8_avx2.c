/*
 * The FP8 (E4M3) formats' AVX2 kernels (fp8-block and MXFP8): the activation quantizer of
 * every rule (fp8.c's fp8_quantize_activations) and the blocked GEMM (dot.c's
 * quant_gemm_blocked on E4M3 codes), bit for bit; compiled with -mavx2 -mfma -mf16c.
 *
 * The arithmetic is fp8_simd.h's: per block, the three exact int32 dots of the codes' digits
 * (vpmaddwd + vpaddd), S = LL + 2^7 (P - LL - HH) + 2^14 HH exact in double, d = RN_fp32(S *
 * 2^-18); then acc = acc + (d * a_s) * w_s over the blocks in order, in fp32. The shape is
 * fp8_avx512.c's on 8 int32 lanes: output columns in tiles of 8 (one lane each), each tile's
 * weight block read once, 32 codes of each column at a time, their dwords transposed 8 x 8 (a
 * vector a quad of K of every column, its even and odd bytes two pairs of K) and decoded 32 codes
 * at once in bytes (vpshufb tables, vpsignb, then vpmaddubsw of the power and s of each word's
 * even or odd byte) into a tile of digit vectors in L1; the activations decoded once (fp8_simd.h;
 * their pairs in the tile's order); 4 rows at a time against the tile with broadcast activation
 * pairs (12 accumulators); a one-row decode step takes each decoded pair straight into its dots. A
 * NaN code (0x7f, 0xff) in a weight column's block or an activation row's block makes that d NaN,
 * as in dot.c. The ISA-free drivers (the tile loop, the fold into the fp32 chain, the entries) are
 * fp8_driver.h's.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"

#include "codecs.h"
#include "dot.h"
#include "fp8_simd.h"

/* The rows a GEMM step takes at once (3 accumulators each). */
#define STEP_ROWS 4
/* The columns of a tile: one int32 lane each. */
#define TILE 8
/* The pairs of K of a block of n codes: pack_tile's two a quad of codes. */
#define FP8_PAIRS(n) (2 * (((n) + 3) / 4))

/* ---- decoding E4M3 codes into digits ------------------------------------------------------ */

/* The three digit vectors of 16 codes (fp8_simd.h): lo, hi and v = lo + hi. */
typedef struct digits16 {
    __m256i lo, hi, v;
} digits16;

/* The first 16 words of a fp8_simd.h table (the positive sign) as bytes, in both lanes. */
static inline __m256i byte_table(const int16_t *words) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)words);
    const __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(words + 8));
    return _mm256_broadcastsi128_si256(_mm_packus_epi16(lo, hi));
}

/* Decodes 16 codes, zero-extended to words: the exponent field indexes the byte tables
 * (vpshufb, the high byte's index 0x80 giving 0), the power multiplies s, the code's sign
 * (moved to the word's sign bit) negates it, and the code's bit 6 says the kind. */
static inline digits16 decode16(__m256i x, __m256i implicit_table, __m256i power_table) {
    const __m256i e = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 3),
                                                       _mm256_set1_epi16(0x0f)),
                                      _mm256_set1_epi16((short)0x8000));
    const __m256i s = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi16(7)),
                                      _mm256_shuffle_epi8(implicit_table, e));
    const __m256i v = _mm256_sign_epi16(
        _mm256_mullo_epi16(s, _mm256_shuffle_epi8(power_table, e)), _mm256_slli_epi16(x, 8));
    const __m256i bit6 = _mm256_set1_epi16(0x40);
    const __m256i big = _mm256_cmpeq_epi16(_mm256_and_si256(x, bit6), bit6);
    digits16 d = {_mm256_andnot_si256(big, v), _mm256_and_si256(big, v), v};
    return d;
}

/* Whether n codes at p hold an E4M3 NaN (0x7f or 0xff). */
static inline int has_nan(const uint8_t *p, size_t n) {
    const __m256i low7 = _mm256_set1_epi8(0x7f);
    __m256i any = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
        any = _mm256_or_si256(any, _mm256_cmpeq_epi8(_mm256_and_si256(c, low7), low7));
    }
    int nan = !_mm256_testz_si256(any, any);
    for (; i < n; i++) nan |= (p[i] & 0x7f) == 0x7f;
    return nan;
}

/* The `bytes` bytes at p (at most 32), zero past them. */
static inline __m256i load_partial(const uint8_t *p, size_t bytes) {
    if (bytes >= 32) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    uint8_t buffer[32] = {0};
    memcpy(buffer, p, bytes);
    return _mm256_loadu_si256((const __m256i *)(const void *)buffer);
}

/* ---- the GEMM ------------------------------------------------------------------------------ */

#define FP8_ENTRY(name) name##_avx2

/* The vector types and operations of fp8_driver.h. */
typedef __m256i vint;
typedef __m256 vfloat;
typedef __m256i vlanes; /* all-ones dword lanes */

static inline vint v_add(vint a, vint b) { return _mm256_add_epi32(a, b); }
static inline vint v_zero(void) { return _mm256_setzero_si256(); }
static inline vfloat vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vfloat vf_mul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
static inline vfloat vf_add(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }

static inline vfloat nan_lanes(vfloat d, vlanes nan, int all) {
    const __m256i lanes = all ? _mm256_set1_epi32(-1) : nan;
    return _mm256_blendv_ps(d, _mm256_set1_ps(NAN), _mm256_castsi256_ps(lanes));
}

/* The lanes [0, n) of 8, as a maskload mask. */
static inline __m256i first_lanes(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The first cols (<= 8) floats at y, zero in the other lanes; stores v's first cols lanes. */
static inline vfloat load_columns(const float *y, size_t cols) {
    return _mm256_maskload_ps(y, first_lanes(cols));
}

static inline void store_columns(float *y, vfloat v, size_t cols) {
    _mm256_maskstore_ps(y, first_lanes(cols), v);
}

/* acc + the dword dot products of the int16 pairs of the dword at a, broadcast, and of w. */
static inline __m256i dot_pairs(__m256i acc, const int32_t *a, __m256i w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_set1_epi32(*a), w));
}

/* TILE int32s from p; the floats at base + offsets, a lane each. */
static inline vint load_ints(const int32_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}
static inline vfloat gather_columns(const float *base, vint offsets) {
    return _mm256_i32gather_ps(base, offsets, 4);
}

#include "fp8_driver.h"

/* decode_rows (fp8_driver.h): the pairs in pack_tile's order, (4q, 4q + 2) then
 * (4q + 1, 4q + 3) for each 4 codes from the block's start. */
static void decode_rows(const quant_gemm_job *j, size_t m0, size_t rows, size_t kb, size_t k0,
                        size_t k1, fp8_rows *b) {
    const size_t pair0 = (kb - b->kb0) * FP8_BLOCK_PAIRS;
    const __m256i implicit_table = byte_table(fp8_implicit_bit);
    const __m256i power_table = byte_table(fp8_signed_power);
    /* codes 4q, 4q + 2, 4q + 1, 4q + 3 */
    const __m128i quad_order = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *xr = j->xq + (m0 + r) * j->K;
        for (size_t k = k0; k < k1; k += 16) {
            __m128i codes;
            if (k + 16 <= k1) {
                codes = _mm_loadu_si128((const __m128i *)(const void *)(xr + k));
            } else {
                uint8_t buffer[16] = {0};
                memcpy(buffer, xr + k, k1 - k);
                codes = _mm_loadu_si128((const __m128i *)(const void *)buffer);
            }
            const digits16 d = decode16(_mm256_cvtepu8_epi16(_mm_shuffle_epi8(codes, quad_order)),
                                        implicit_table, power_table);
            int32_t lo[8], hi[8], v[8];
            _mm256_storeu_si256((__m256i *)(void *)lo, d.lo);
            _mm256_storeu_si256((__m256i *)(void *)hi, d.hi);
            _mm256_storeu_si256((__m256i *)(void *)v, d.v);
            fp8_store_pairs(b, r, pair0 + (k - k0) / 2, lo, hi, v, 8);
        }
        b->nan[r * b->blocks + kb - b->kb0] = (uint8_t)has_nan(xr + k0, k1 - k0);
    }
}

/* The weight row's codes [k, min(k + 32, k1)), zero past k1: the one place the GEMM reads
 * weight codes (a packed layout of the codes changes this function alone). */
static inline __m256i weight_codes32(const uint8_t *row, size_t k, size_t k1) {
    return load_partial(row + k, k1 - k);
}

/* Transposes the dwords of the 8 x 8 matrix r[0..7] (r[c] dword q into r[q] dword c): unpacks
 * of 32 and 64 bits within 128-bit lanes, then the lanes crossed. */
static inline void transpose8x8_epi32(__m256i r[8]) {
    __m256i a[8], b[8];
    /* a[2i + h]: lane L is rows 2i, 2i + 1 at dwords 4L + 2h, 4L + 2h + 1 */
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* b[4g + t]: lane L is rows 4g .. 4g + 3 at dword 4L + t */
    for (int g = 0; g < 2; g++)
        for (int h = 0; h < 2; h++) {
            b[4 * g + 2 * h] = _mm256_unpacklo_epi64(a[4 * g + h], a[4 * g + 2 + h]);
            b[4 * g + 2 * h + 1] = _mm256_unpackhi_epi64(a[4 * g + h], a[4 * g + 2 + h]);
        }
    for (int t = 0; t < 4; t++) {
        r[t] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x20);
        r[4 + t] = _mm256_permute2x128_si256(b[t], b[4 + t], 0x31);
    }
}

/* The digits of the 32 codes of x as two sets of 16 words: of its even bytes and of its odd
 * ones. Per byte: the exponent field indexes the byte tables (vpshufb), s = m | the implicit
 * bit, signed by the code's sign (vpsignb), split by kind (code bit 6); then each word's
 * digit is power * s of its even (or odd) byte alone (vpmaddubsw with the other byte's power
 * zeroed: |power * s| <= 1920, no saturation). */
static inline void decode_bytes(__m256i x, __m256i implicit_table, __m256i power_table,
                                digits16 *even, digits16 *odd) {
    const __m256i e = _mm256_and_si256(_mm256_srli_epi16(x, 3), _mm256_set1_epi8(0x0f));
    const __m256i s = _mm256_sign_epi8(
        _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi8(7)),
                        _mm256_shuffle_epi8(implicit_table, e)),
        x);
    const __m256i bit6 = _mm256_set1_epi8(0x40);
    const __m256i big = _mm256_cmpeq_epi8(_mm256_and_si256(x, bit6), bit6);
    const __m256i s_lo = _mm256_andnot_si256(big, s), s_hi = _mm256_and_si256(big, s);
    const __m256i power = _mm256_shuffle_epi8(power_table, e), low = _mm256_set1_epi16(0xff);
    const __m256i power_even = _mm256_and_si256(power, low);
    const __m256i power_odd = _mm256_andnot_si256(low, power);
    even->lo = _mm256_maddubs_epi16(power_even, s_lo);
    even->hi = _mm256_maddubs_epi16(power_even, s_hi);
    even->v = _mm256_maddubs_epi16(power_even, s);
    odd->lo = _mm256_maddubs_epi16(power_odd, s_lo);
    odd->hi = _mm256_maddubs_epi16(power_odd, s_hi);
    odd->v = _mm256_maddubs_epi16(power_odd, s);
}

/* pack_tile (fp8_driver.h). Per 32 codes of K, the 8 columns' rows with their dwords
 * transposed: vector q holds codes 4q .. 4q + 3 of every column, a column a dword; its even
 * bytes (codes 4q, 4q + 2) and odd ones (4q + 1, 4q + 3) are the pairs 2q and 2q + 1 of the
 * tile (the activations' pairs are ordered so: decode_rows). */
static inline __attribute__((always_inline)) vlanes pack_tile(
    const uint8_t *const *w, size_t cols, size_t k0, size_t k1, __m256i *tile,
    const int32_t *row, __m256i *dots) {
    const __m256i implicit_table = byte_table(fp8_implicit_bit);
    const __m256i power_table = byte_table(fp8_signed_power);
    const __m256i sign = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi8(-1);
    __m256i nan_bytes = _mm256_setzero_si256(); /* bytes 4c .. 4c + 3: column c */
    for (size_t k = k0; k < k1; k += 32) {
        __m256i r[8];
        for (size_t c = 0; c < 8; c++)
            r[c] = c < cols ? weight_codes32(w[c], k, k1) : _mm256_setzero_si256();
        transpose8x8_epi32(r);
        const size_t quads = (k1 - k + 3) / 4 < 8 ? (k1 - k + 3) / 4 : 8;
        for (size_t q = 0; q < quads; q++) {
            const __m256i x = r[q];
            /* a code | 0x80 is 0xff: NaN */
            nan_bytes =
                _mm256_or_si256(nan_bytes, _mm256_cmpeq_epi8(_mm256_or_si256(x, sign), ones));
            digits16 even, odd;
            decode_bytes(x, implicit_table, power_table, &even, &odd);
            const size_t pair = (k - k0) / 2 + 2 * q;
            take_pair(row, dots, tile, pair, even.lo, even.hi, even.v);
            take_pair(row, row ? dots + 3 : NULL, tile, pair + 1, odd.lo, odd.hi, odd.v);
        }
    }
    return _mm256_xor_si256(_mm256_cmpeq_epi32(nan_bytes, _mm256_setzero_si256()), ones);
}

/* d of 8 columns from the three dots (fp8_simd.h), each step exact in double, then rounded
 * once to fp32. */
static inline __m256 block_d(__m256i ll, __m256i hh, __m256i pp) {
    const __m256i cross = _mm256_sub_epi32(_mm256_sub_epi32(pp, ll), hh);
    __m128 half[2];
    for (int h = 0; h < 2; h++) {
        const __m256d l = _mm256_cvtepi32_pd(h ? _mm256_extracti128_si256(ll, 1)
                                               : _mm256_castsi256_si128(ll));
        const __m256d c = _mm256_cvtepi32_pd(h ? _mm256_extracti128_si256(cross, 1)
                                               : _mm256_castsi256_si128(cross));
        const __m256d g = _mm256_cvtepi32_pd(h ? _mm256_extracti128_si256(hh, 1)
                                               : _mm256_castsi256_si128(hh));
        __m256d s = _mm256_mul_pd(l, _mm256_set1_pd(0x1p-18));
        s = _mm256_fmadd_pd(c, _mm256_set1_pd(0x1p-11), s);
        s = _mm256_fmadd_pd(g, _mm256_set1_pd(0x1p-4), s);
        half[h] = _mm256_cvtpd_ps(s);
    }
    return _mm256_set_m128(half[1], half[0]);
}

/* ---- the activation quantizer -------------------------------------------------------------- */

/* e4m3_from_f32_saturating of 8 values, as dwords (fp8_avx512.c's e4m3_encode16 on 8 lanes). */
static inline __m256i e4m3_encode8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i rounded = _mm256_add_epi32(
        _mm256_add_epi32(a, _mm256_set1_epi32(0x7ffff)),
        _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1)));
    const __m256i normal = _mm256_min_epi32(
        _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(960)),
        _mm256_set1_epi32(0x7e));
    const __m256i subnormal = _mm256_cvtps_epi32(
        _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)));
    __m256i code = _mm256_blendv_epi8(
        subnormal, normal, _mm256_cmpgt_epi32(a, _mm256_set1_epi32((121 << 23) - 1)));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f),
                              _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
    return _mm256_or_si256(code, sign);
}


/* quantize_block (fp8_driver.h). */
static float quantize_block(const quant_rule *r, const float *x, size_t n, uint8_t *codes) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 amax = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_maskload_ps(x + i, first_lanes(n - i));
        /* max(|x|, amax): a NaN |x| yields amax (the second operand) */
        amax = _mm256_max_ps(_mm256_and_ps(v, magnitude), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float stored;
    const fp8_block_scale b = fp8_rule_scale(r, _mm_cvtss_f32(m4), &stored);
    const __m256 by = _mm256_set1_ps(b.divide ? b.stored : b.mult);
    /* the low byte of each dword, lanes 0..3 then 4..7, into the low 8 bytes */
    const __m256i low_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    for (size_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_maskload_ps(x + i, first_lanes(n - i));
        const __m256 scaled = b.divide ? _mm256_div_ps(v, by) : _mm256_mul_ps(v, by);
        const __m256i bytes =
            _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(e4m3_encode8(scaled), low_bytes),
                                        _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        uint8_t out[8];
        _mm_storel_epi64((__m128i *)(void *)out, _mm256_castsi256_si128(bytes));
        memcpy(codes + i, out, n - i < 8 ? n - i : 8);
    }
    return stored;
}
