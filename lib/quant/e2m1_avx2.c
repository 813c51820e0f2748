/*
 * The E2M1 formats' AVX2 variants (e2m1_lanes.h over 8 fp32 lanes): e2m1_gemm_avx2,
 * nvfp4_quantize_rows_avx2 and mxfp4_quantize_rows_avx2, under -mavx2 -mfma -mf16c. A chunk of
 * a weight row is 32 codes (2 NVFP4 blocks, 1 MXFP4 block); block dots by vpmaddubsw, vpaddw
 * and vpmaddwd. At a row's end codes and values are read from a copy padded with 0, and codes
 * and outputs are written through one: nothing past a row is read or written. A chunk's weight
 * codes are 16 bytes of a row held two codes a byte, widened to one a byte.
 */
#include <immintrin.h>
#include <string.h>

#include "e2m1_simd.h"

#define EV_NAME(f) f##_avx2
/* the next tile (8 rows) fits L1: the faster on Zen 4 */
#define EV_PREFETCH _MM_HINT_T0
#define EV_LANES 8
typedef __m256 ev;
typedef __m256i ei;

/* The codes [0, len) of an activation row from p, one a byte (len <= 32; 0 in the bytes past
 * len, which are not read). */
static inline ei ei_codes(const uint8_t *p, size_t len) {
    if (len >= 32) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    uint8_t tail[32] = {0};
    memcpy(tail, p, len);
    return _mm256_loadu_si256((const __m256i *)(const void *)tail);
}

/* The codes [0, len) of a weight row held two a byte from p (len <= 32: (len + 1) / 2 bytes
 * read), one a byte in their order, 0 past len: each byte widened to a word, then its high
 * nibble shifted into the word's high byte, code 2i into byte 2i and 2i + 1 into byte 2i + 1. */
static inline ei ei_weight_codes(const uint8_t *p, size_t len) {
    __m128i bytes;
    if (len >= 32) {
        bytes = _mm_loadu_si128((const __m128i *)(const void *)p);
    } else {
        uint8_t tail[16] = {0};
        memcpy(tail, p, (len + 1) / 2);
        if (len % 2) tail[len / 2] &= 0xfu;
        bytes = _mm_loadu_si128((const __m128i *)(const void *)tail);
    }
    const __m256i words = _mm256_cvtepu8_epi16(bytes);
    return _mm256_and_si256(_mm256_or_si256(words, _mm256_slli_epi16(words, 4)),
                            _mm256_set1_epi16(0x0f0f));
}

#define ei_table(...) _mm256_setr_epi8(__VA_ARGS__, __VA_ARGS__)
#define ei_store(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), v)
#define ei_shuffle_bytes _mm256_shuffle_epi8
#define ei_set1 _mm256_set1_epi32
#define ei_add _mm256_add_epi32
#define ei_sub _mm256_sub_epi32
#define ei_or _mm256_or_si256
#define ei_and _mm256_and_si256
#define ei_srli _mm256_srli_epi32
#define ei_slli _mm256_slli_epi32
#define ei_of_dwords(d) _mm256_setr_epi32(d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7])
#define ev_set1 _mm256_set1_ps
#define ev_zero _mm256_setzero_ps
#define ev_add _mm256_add_ps
#define ev_mul _mm256_mul_ps
#define ev_fma _mm256_fmadd_ps
#define ev_div _mm256_div_ps
#define ev_min _mm256_min_ps
#define ev_max _mm256_max_ps
#define ev_from_int _mm256_cvtepi32_ps
#define ev_bits _mm256_castps_si256
#define ev_from_bits _mm256_castsi256_ps
/* the compare is -1 in the lanes where it holds */
#define ei_count_if(code, a, c, pred)                                                             \
    _mm256_sub_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(a, c, pred)))

static inline ev ev_abs(ev v) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

/* The max of the 8 lanes (none of them NaN). */
static inline float ev_reduce_max(ev m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

static inline ev ev_load(const float *p, size_t n) {
    if (n >= 8) return _mm256_loadu_ps(p);
    float tail[8] = {0};
    memcpy(tail, p, n * sizeof(float));
    return _mm256_loadu_ps(tail);
}

static inline void ev_store(float *p, ev v, size_t n) {
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
        return;
    }
    float tail[8];
    _mm256_storeu_ps(tail, v);
    memcpy(p, tail, n * sizeof(float));
}

/* The low bytes of the 8 lanes' codes (each 0 .. 15), n of them. */
static inline void e2m1_store(uint8_t *p, ei code, size_t n) {
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code),
                                           _mm256_extracti128_si256(code, 1));
    const __m128i bytes = _mm_packus_epi16(words, words);
    if (n >= 8) {
        _mm_storel_epi64((__m128i *)(void *)p, bytes);
        return;
    }
    uint8_t tail[16];
    _mm_storeu_si128((__m128i *)(void *)tail, bytes);
    memcpy(p, tail, n);
}

/* Transposes 8 rows of 8 dwords: r[i] becomes dword i of every row, row l in lane l. */
static inline void ei_transpose(ei r[8]) {
    ei t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + p], 128-bit lane L: dword 4L + p of rows 4g .. 4g + 3 */
    for (int g = 0; g < 2; g++) {
        u[4 * g] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int p = 0; p < 4; p++) {
        r[p] = _mm256_permute2x128_si256(u[p], u[4 + p], 0x20);
        r[4 + p] = _mm256_permute2x128_si256(u[p], u[4 + p], 0x31);
    }
}

/* The chunk of 8 weight rows from byte byte0 of each, a row a lane: each row's codes widened,
 * then transposed in dwords. */
static inline void ei_weight_chunk(ei w[8], const uint8_t *const rows[8], size_t byte0,
                                   size_t len) {
    for (int l = 0; l < 8; l++) w[l] = ei_weight_codes(rows[l] + byte0, len);
    ei_transpose(w);
}

/* Per lane, start + the sum over n dwords of u[q] (unsigned bytes, broadcast) times w[q]
 * (signed bytes), 4 products a dword: pairs in int16 (at most 2 x 24 x 12), n <= 8 of them
 * summed (at most 4608), then int32. */
static inline ei ei_dot(ei start, const ei *w, const int32_t *u, int n) {
    ei pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(u[0]), w[0]);
#pragma GCC unroll 8
    for (int q = 1; q < n; q++)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(_mm256_set1_epi32(u[q]), w[q]));
    return _mm256_add_epi32(start, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

#include "e2m1_lanes.h"
