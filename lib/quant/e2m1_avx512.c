/*
 * The E2M1 formats' AVX-512 variants (e2m1_lanes.h over 16 fp32 lanes): e2m1_gemm_avx512,
 * nvfp4_quantize_rows_avx512 and mxfp4_quantize_rows_avx512 under -mavx512f -mavx512bw
 * -mavx512vl -mavx512dq; compiled a second time with E2M1_VNNI defined and -mavx512vnni for
 * e2m1_gemm_avx512vnni alone, whose block dots are vpdpbusd where the first sums the bytes by
 * vpmaddubsw, vpaddw and vpmaddwd. A chunk of a weight row is 64 codes (4 NVFP4 blocks, 2
 * MXFP4 ones), 32 bytes of a row held two codes a byte, loaded under a byte mask at the row's
 * end, transposed packed and then widened to one a byte; a row's last block of values is loaded
 * and its codes stored under masks.
 */
#include <immintrin.h>

#include "e2m1_simd.h"

#if defined(E2M1_VNNI)
#define EV_NAME(f) f##_avx512vnni
#define E2M1_GEMM_ONLY
#else
#define EV_NAME(f) f##_avx512
#endif
/* the next tile (16 rows) goes to L2: the faster on Zen 4 */
#define EV_PREFETCH _MM_HINT_T1
#define EV_LANES 16
typedef __m512 ev;
typedef __m512i ei;

/* The codes [0, len) of an activation row from p, one a byte (len <= 64; 0 in the bytes past
 * len, which are not read). */
static inline ei ei_codes(const uint8_t *p, size_t len) {
    if (len >= 64) return _mm512_loadu_si512((const void *)p);
    return _mm512_maskz_loadu_epi8((__mmask64)((1ull << len) - 1), p);
}

#define ei_table(...) _mm512_broadcast_i32x4(_mm_setr_epi8(__VA_ARGS__))
#define ei_store(p, v) _mm512_storeu_si512((void *)(p), v)
#define ei_shuffle_bytes _mm512_shuffle_epi8
#define ei_set1 _mm512_set1_epi32
#define ei_add _mm512_add_epi32
#define ei_sub _mm512_sub_epi32
#define ei_or _mm512_or_si512
#define ei_and _mm512_and_si512
#define ei_srli _mm512_srli_epi32
#define ei_slli _mm512_slli_epi32
#define ei_of_dwords(d)                                                                          \
    _mm512_setr_epi32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],        \
                     d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15])
#define ev_set1 _mm512_set1_ps
#define ev_zero _mm512_setzero_ps
#define ev_add _mm512_add_ps
#define ev_mul _mm512_mul_ps
#define ev_fma _mm512_fmadd_ps
#define ev_div _mm512_div_ps
#define ev_min _mm512_min_ps
#define ev_max _mm512_max_ps
#define ev_abs _mm512_abs_ps
#define ev_from_int _mm512_cvtepi32_ps
#define ev_bits _mm512_castps_si512
#define ev_from_bits _mm512_castsi512_ps
#define ev_reduce_max _mm512_reduce_max_ps
#define ei_count_if(code, a, c, pred)                                                             \
    _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, c, pred), code, _mm512_set1_epi32(1))

/* The lanes under a count n (all of them from 16). */
static inline __mmask16 lanes_of(size_t n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}
static inline void ev_store(float *p, ev v, size_t n) { _mm512_mask_storeu_ps(p, lanes_of(n), v); }
static inline ev ev_load(const float *p, size_t n) { return _mm512_maskz_loadu_ps(lanes_of(n), p); }
#if !defined(E2M1_GEMM_ONLY)
static inline void e2m1_store(uint8_t *p, ei code, size_t n) {
    _mm_mask_storeu_epi8(p, lanes_of(n), _mm512_cvtepi32_epi8(code));
}
#endif

/* Transposes 16 rows of 16 16-bit units (r[c] unit p, p < 8 in the low 128-bit lane) into
 * r[p] unit c: four rounds of unpacks within 128-bit lanes (16, 32, 64 bits), then the lanes
 * crossed; with rows 8..15 zero, the same rounds give rows 0..7 transposed in the low halves. */
static inline void e2m1_transpose16x16_epi16(__m256i r[16]) {
    __m256i a[16], b[16], c[16];
    /* a[2i + h]: unit j of lane L is the column pair (2i, 2i + 1) at p = 8L + 4h + j */
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm256_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm256_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    /* b[4q + 2h + g]: 64-bit unit j of lane L is the column quad q at p = 8L + 4h + 2g + j */
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            b[4 * q + 2 * h] = _mm256_unpacklo_epi32(a[4 * q + h], a[4 * q + 2 + h]);
            b[4 * q + 2 * h + 1] = _mm256_unpackhi_epi32(a[4 * q + h], a[4 * q + 2 + h]);
        }
    /* c[8o + t]: lane L is the column octet o at p = 8L + t (t = 4h + 2g + the unpack half) */
    for (int o = 0; o < 2; o++)
        for (int hg = 0; hg < 4; hg++) {
            c[8 * o + 2 * hg] = _mm256_unpacklo_epi64(b[8 * o + hg], b[8 * o + 4 + hg]);
            c[8 * o + 2 * hg + 1] = _mm256_unpackhi_epi64(b[8 * o + hg], b[8 * o + 4 + hg]);
        }
    for (int t = 0; t < 8; t++) {
        r[t] = _mm256_permute2x128_si256(c[t], c[8 + t], 0x20);
        r[8 + t] = _mm256_permute2x128_si256(c[t], c[8 + t], 0x31);
    }
}

/* The chunk of 16 weight rows from byte byte0 of each (32 bytes, 64 codes; (len + 1) / 2 bytes
 * where len < 64, the codes past len 0), a row a lane. The packed rows are transposed in words
 * (4 codes; e2m1_transpose16x16_epi16 above), so that r[q] holds word q of rows
 * 0 .. 15; each r[q] is then widened, its bytes to words and each high nibble shifted into its
 * word's high byte: dword l of w[q] is codes 4q .. 4q+3 of row l in their order. */
static inline void ei_weight_chunk(ei w[16], const uint8_t *const rows[16], size_t byte0,
                                   size_t len) {
    __m256i r[16];
    if (len >= 64) {
        for (int l = 0; l < 16; l++)
            r[l] = _mm256_loadu_si256((const __m256i *)(const void *)(rows[l] + byte0));
    } else {
        /* the row's last (len + 1) / 2 bytes, an odd row's last high nibble cleared */
        const size_t bytes = (len + 1) / 2;
        uint8_t keep[32] = {0};
        for (size_t i = 0; i < bytes; i++) keep[i] = i == len / 2 ? 0x0f : 0xff;
        const __m256i keep_v = _mm256_loadu_si256((const __m256i *)(const void *)keep);
        for (int l = 0; l < 16; l++)
            r[l] = _mm256_and_si256(
                _mm256_maskz_loadu_epi8((__mmask32)((1ull << bytes) - 1), rows[l] + byte0),
                keep_v);
    }
    e2m1_transpose16x16_epi16(r);
    for (int q = 0; q < 16; q++) {
        const __m512i words = _mm512_cvtepu8_epi16(r[q]);
        w[q] = _mm512_and_si512(_mm512_or_si512(words, _mm512_slli_epi16(words, 4)),
                                _mm512_set1_epi16(0x0f0f));
    }
}

/* Per lane, start + the sum over n dwords of u[q] (unsigned bytes, broadcast) times w[q]
 * (signed bytes), 4 products a dword. */
static inline ei ei_dot(ei start, const ei *w, const int32_t *u, int n) {
#if defined(E2M1_VNNI)
#pragma GCC unroll 8
    for (int q = 0; q < n; q++) start = _mm512_dpbusd_epi32(start, _mm512_set1_epi32(u[q]), w[q]);
    return start;
#else
    /* pairs of products in int16 (at most 2 x 24 x 12), n <= 8 of them summed (at most 4608) */
    ei pairs = _mm512_maddubs_epi16(_mm512_set1_epi32(u[0]), w[0]);
#pragma GCC unroll 8
    for (int q = 1; q < n; q++)
        pairs = _mm512_add_epi16(pairs, _mm512_maddubs_epi16(_mm512_set1_epi32(u[q]), w[q]));
    return _mm512_add_epi32(start, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}

/* A chunk's 4 E4M3 block scales of 16 rows (lane l of v: row l's bytes, block b in byte b) as
 * fp32, all four at once through fp16: the bytes widened to words (row-major, 4l + b), each
 * made the fp16 of the same value times 2^-8 (the sign to bit 15, exponent and mantissa to bits
 * 7 .. 13: E4M3's bias 7 is fp16's 15 less 8, a subnormal m 2^-9 is the fp16 subnormal m
 * 2^-17), the NaN codes fp16's quiet NaN of their sign; the words regrouped by block
 * (vpermt2w), widened exactly (vcvtph2ps) and times 2^8: bit for bit e4m3_to_f32, and for the
 * NaN codes its sign | 0x7fc00000. */
static inline void ev_e4m3_chunk(ev out[4], __m512i v) {
    /* the words of blocks (0, 1) and (2, 3), row r of block b at 16 b + r: row r < 8 is word
     * 4r + b of the low half, row r >= 8 word 4(r - 8) + b of the high one (index 32 + that) */
    static const uint16_t by_block[2][32] = {
        {0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60,
         1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61},
        {2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62,
         3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47, 51, 55, 59, 63}};
    __m512i half[2] = {_mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)),
                       _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1))};
    for (int h = 0; h < 2; h++) {
        const __m512i magnitude = _mm512_and_si512(half[h], _mm512_set1_epi16(0x7f));
        const __m512i sign =
            _mm512_slli_epi16(_mm512_and_si512(half[h], _mm512_set1_epi16(0x80)), 8);
        const __mmask32 nan = _mm512_cmpeq_epi16_mask(magnitude, _mm512_set1_epi16(0x7f));
        half[h] = _mm512_mask_mov_epi16(_mm512_or_si512(_mm512_slli_epi16(magnitude, 7), sign), nan,
                                        _mm512_or_si512(sign, _mm512_set1_epi16(0x7e00)));
    }
    for (int p = 0; p < 2; p++) {
        const __m512i words = _mm512_permutex2var_epi16(
            half[0], _mm512_loadu_si512((const void *)by_block[p]), half[1]);
        out[2 * p] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(words)),
                                   _mm512_set1_ps(0x1p8f));
        out[2 * p + 1] = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(words, 1)),
                                       _mm512_set1_ps(0x1p8f));
    }
}
#define EV_E4M3_CHUNK ev_e4m3_chunk

#include "e2m1_lanes.h"
