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
 * block the weight codes are read once (16 column rows of the [N][K] codes, 32 codes of each
 * at a time, columns c and c + 8 in one vector), their dwords transposed (8 x 8 in each
 * 256-bit half: 24 shuffles for 512 codes), so that a vector holds a quad of K of every column;
 * its even bytes and its odd ones, as words, are two pairs of K of the tile (codes 4q, 4q + 2
 * and 4q + 1, 4q + 3; the activations' pairs are decoded in that order). A pair's digits come
 * from two 64-entry word tables by the code's low 6 bits (vpermt2w, zeroing the lanes of the
 * other kind), negated by the code's sign: seven operations for 32 codes. The three digit
 * planes of the tile (12 KB for a block of 128) stay in L1; the activations were decoded once
 * (digit pairs as dwords, in groups of 8 rows, chunks of 64 rows on the stack: fp8_simd.h).
 * Then 8 rows at a time take, per pair of K, the three weight vectors against three broadcast
 * activation dwords: 24 accumulators, no horizontal sum; each block's d is computed for 16
 * columns at once. A one-row decode step takes each decoded pair straight into its dots
 * instead (two chains of three, by the pair's parity), and the next tile's rows are prefetched
 * into L2. A NaN code (0x7f, 0xff) in a weight column's block or an activation row's block
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
#include "kernels/kernels.h"

#if defined(PARITY_HAVE_AVX512VBMI)
/* A job of one activation row goes to the one-row kernel (fp8_row_avx512.c) where the CPU has
 * VBMI and the kernel takes it (fp8_driver.h). */
#define FP8_ONE_ROW(j, n0, n1) (cpu_has_avx512_vbmi() && fp8_row_gemm_avx512vbmi(j, n0, n1))
#endif

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
/* The pairs of K of a block of n codes: pack_tile's two a quad of codes. */
#define FP8_PAIRS(n) (2 * (((n) + 3) / 4))

/* ---- decoding E4M3 codes into digits ------------------------------------------------------ */

/* The three digit vectors of 32 codes: lo (k where the exponent field is below 8, else 0), hi
 * (k / 2^7 where it is 8 or above, else 0) and v = lo + hi. */
typedef struct digits32 {
    __m512i lo, hi, v;
} digits32;

/* The magnitudes of the digits by a code's low 6 bits (mantissa m, the exponent field's low 3
 * bits e'): of the codes whose exponent field is e' (lo: m for e' = 0, (8 + m) << (e' - 1)
 * above) and of those whose field is 8 + e' (hi: (8 + m) << e'; 1920 for the NaN code 0x7f,
 * whose block's d is NaN whatever its digit). */
static const int16_t fp8_lo_digit[64] = {
    0,   1,   2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,  14,  15,
    16,  18,  20,  22,  24,  26,  28,  30,  32,  36,  40,  44,  48,  52,  56,  60,
    64,  72,  80,  88,  96,  104, 112, 120, 128, 144, 160, 176, 192, 208, 224, 240,
    256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 832, 896, 960};
static const int16_t fp8_hi_digit[64] = {
    8,   9,   10,  11,  12,  13,  14,  15,  16,   18,   20,   22,   24,   26,   28,   30,
    32,  36,  40,  44,  48,  52,  56,  60,  64,   72,   80,   88,   96,   104,  112,  120,
    128, 144, 160, 176, 192, 208, 224, 240, 256,  288,  320,  352,  384,  416,  448,  480,
    512, 576, 640, 704, 768, 832, 896, 960, 1024, 1152, 1280, 1408, 1536, 1664, 1792, 1920};

/* The two tables in vectors of 32 words (vpermt2w takes an index's low 6 bits). */
typedef struct digit_tables {
    __m512i lo0, lo1, hi0, hi1;
} digit_tables;

static inline digit_tables load_digit_tables(void) {
    const digit_tables t = {
        _mm512_loadu_si512(fp8_lo_digit), _mm512_loadu_si512(fp8_lo_digit + 32),
        _mm512_loadu_si512(fp8_hi_digit), _mm512_loadu_si512(fp8_hi_digit + 32)};
    return t;
}

/* The digits of the 32 codes in the low bytes of idx's words (the high bytes ignored), whose
 * kind (code bit 6: the exponent field's top bit) and sign (bit 7) are big and neg: each
 * table's magnitude in the lanes of its kind (zero in the others), negated where neg; then
 * v = lo | hi (one of them zero). */
static inline digits32 decode_words(__m512i idx, __mmask32 big, __mmask32 neg,
                                    const digit_tables *t) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i lo = _mm512_maskz_permutex2var_epi16((__mmask32)~big, t->lo0, idx, t->lo1);
    __m512i hi = _mm512_maskz_permutex2var_epi16(big, t->hi0, idx, t->hi1);
    lo = _mm512_mask_sub_epi16(lo, neg, zero, lo);
    hi = _mm512_mask_sub_epi16(hi, neg, zero, hi);
    const digits32 d = {lo, hi, _mm512_or_si512(lo, hi)};
    return d;
}

/* The digits of 32 codes zero-extended to words. */
static inline digits32 decode32(__m512i x, const digit_tables *t) {
    return decode_words(x, _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x40)),
                        _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x80)), t);
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

static inline vint v_add(vint a, vint b) { return _mm512_add_epi32(a, b); }
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

/* TILE int32s from p; the floats at base + offsets, a lane each. */
static inline vint load_ints(const int32_t *p) { return _mm512_loadu_si512(p); }
static inline vfloat gather_columns(const float *base, vint offsets) {
    return _mm512_i32gather_ps(offsets, base, 4);
}

#include "fp8_driver.h"

/* decode_rows (fp8_driver.h): the pairs in pack_tile's order, (4q, 4q + 2) then
 * (4q + 1, 4q + 3) for each 4 codes from the block's start. */
static void decode_rows(const quant_gemm_job *j, size_t m0, size_t rows, size_t kb, size_t k0,
                        size_t k1, fp8_rows *b) {
    const size_t pair0 = (kb - b->kb0) * FP8_BLOCK_PAIRS;
    const digit_tables t = load_digit_tables();
    /* codes 4q, 4q + 2, 4q + 1, 4q + 3 */
    const __m256i quad_order =
        _mm256_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15, 0, 2, 1, 3, 4, 6, 5,
                         7, 8, 10, 9, 11, 12, 14, 13, 15);
    for (size_t r = 0; r < rows; r++) {
        const uint8_t *xr = j->xq + (m0 + r) * j->K;
        for (size_t k = k0; k < k1; k += 32) {
            const __mmask32 in = k + 32 <= k1 ? ~(__mmask32)0 : ((__mmask32)1 << (k1 - k)) - 1;
            const __m256i codes =
                _mm256_shuffle_epi8(_mm256_maskz_loadu_epi8(in, xr + k), quad_order);
            const digits32 d = decode32(_mm512_cvtepu8_epi16(codes), &t);
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
    if (k + 32 <= k1) return _mm256_loadu_si256((const __m256i *)(const void *)(row + k));
    return _mm256_maskz_loadu_epi8(((__mmask32)1 << (k1 - k)) - 1, row + k);
}

/* Transposes the dwords of two 8 x 8 matrices, one in each 256-bit half of r[0..7] (r[c]
 * dword q of the half into r[q] dword c): unpacks of 32 and 64 bits within 128-bit lanes, then
 * the lanes crossed within each half by masked lane shuffles. */
static inline void transpose8x8_halves_epi32(__m512i r[8]) {
    __m512i a[8], b[8];
    /* a[2i + h]: lane L is rows 2i, 2i + 1 at dwords 4L' + 2h, 4L' + 2h + 1 (L' = L % 2) */
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* b[4g + t]: lane L is rows 4g .. 4g + 3 at dword 4L' + t */
    for (int g = 0; g < 2; g++)
        for (int h = 0; h < 2; h++) {
            b[4 * g + 2 * h] = _mm512_unpacklo_epi64(a[4 * g + h], a[4 * g + 2 + h]);
            b[4 * g + 2 * h + 1] = _mm512_unpackhi_epi64(a[4 * g + h], a[4 * g + 2 + h]);
        }
    /* r[t]: lanes 0 and 2 of b[t], 0 and 2 of b[4 + t] interleaved; r[4 + t]: lanes 1 and 3 */
    for (int t = 0; t < 4; t++) {
        r[t] = _mm512_mask_shuffle_i32x4(b[t], 0xf0f0, b[4 + t], b[4 + t], 0xa0);
        r[4 + t] = _mm512_mask_shuffle_i32x4(b[4 + t], 0x0f0f, b[t], b[t], 0xf5);
    }
}

/* pack_tile (fp8_driver.h). Per 32 codes of K, the 16 columns' rows in 8 vectors (columns c and
 * c + 8 in the halves), their dwords transposed: vector q holds codes 4q .. 4q + 3 of every
 * column, a column a dword. Its even bytes (codes 4q, 4q + 2) and odd ones (4q + 1, 4q + 3),
 * each as words, are the pairs 2q and 2q + 1 of the tile (the activations' pairs are ordered
 * so: decode_rows). */
static inline __attribute__((always_inline)) __mmask16 pack_tile(
    const uint8_t *const *w, size_t cols, size_t k0, size_t k1, __m512i *tile,
    const int32_t *row, __m512i *dots) {
    const digit_tables t = load_digit_tables();
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    __m512i nan_max = _mm512_setzero_si512(); /* per byte the max of code | 0x80: 0xff: NaN */
    for (size_t k = k0; k < k1; k += 32) {
        __m512i r[8];
        for (size_t c = 0; c < 8; c++) {
            const __m256i low = c < cols ? weight_codes32(w[c], k, k1) : _mm256_setzero_si256();
            const __m256i high =
                c + 8 < cols ? weight_codes32(w[c + 8], k, k1) : _mm256_setzero_si256();
            r[c] = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
        }
        transpose8x8_halves_epi32(r);
        const size_t quads = (k1 - k + 3) / 4 < 8 ? (k1 - k + 3) / 4 : 8;
        for (size_t q = 0; q < quads; q++) {
            const __m512i x = r[q];
            nan_max = _mm512_max_epu8(nan_max, _mm512_or_si512(x, sign));
            const digits32 even = decode32(x, &t);
            const digits32 odd = decode_words(
                _mm512_srli_epi16(x, 8), _mm512_test_epi16_mask(x, _mm512_set1_epi16(0x4000)),
                _mm512_movepi16_mask(x), &t);
            const size_t pair = (k - k0) / 2 + 2 * q;
            take_pair(row, dots, tile, pair, even.lo, even.hi, even.v);
            take_pair(row, row ? dots + 3 : NULL, tile, pair + 1, odd.lo, odd.hi, odd.v);
        }
    }
    /* bytes 4c .. 4c + 3: column c */
    const __m512i nan_bytes =
        _mm512_movm_epi8(_mm512_cmpeq_epi8_mask(nan_max, _mm512_set1_epi8(-1)));
    return _mm512_test_epi32_mask(nan_bytes, nan_bytes);
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
