/*
 * The E2M1 GEMM (NVFP4 and MXFP4: dot.c's quant_gemm_blocked on E2M1 codes) in AVX-512 F/BW/
 * VL/DQ: e2m1_gemm_avx512; compiled a second time with E2M1_VNNI defined and -mavx512vnni:
 * e2m1_gemm_avx512vnni, which sums the bytes with vpdpbusd instead of vpmaddubsw, vpaddw and
 * vpmaddwd. Both give dot.c's bits.
 *
 * Shape. The output columns in tiles of 16, a column a lane; K in chunks of 64 codes (4 NVFP4
 * blocks, 2 MXFP4 blocks). Per tile and chunk the 16 weight rows' codes become their k_w
 * (k = 2 x value, |k| <= 12, signed bytes) through vpshufb and are transposed 16 x 16 in
 * dwords, so that register i holds codes 4i .. 4i+3 of every column; a block's correction
 * -12 sum(k_w) per column comes from the same registers. Then for each row of activations
 * (up to PASS_ROWS rows a pass, each reusing the transposed chunk from registers) its 64
 * codes become k_a + 12 (unsigned bytes, 0 .. 24), and each dword of them, broadcast, is
 * multiplied with register i, 4 products summed per lane; a block's lanes start at the
 * correction, so they end at S = sum k_a k_w, the block's exact dot in units of 1/4 (at most
 * 32 x 144 in magnitude: no product, pair or sum overflows its int16 or int32 lane).
 *
 * Then dot.c's fp32 chain in the 16 lanes, the blocks in ascending order: acc = acc +
 * (S * (a_s / 4)) * w_s, which is acc + (d * a_s) * w_s: d = S / 4 exactly, a_s / 4 is exact
 * (an E4M3 value is at least 2^-9, an E8M0 one at least 2^-127: a power of two down to 2^-149
 * divides exactly), so S * (a_s / 4) and d * a_s are the same real number, rounded once. Last,
 * NVFP4's acc * (s2a * s2w). Past K the codes read as 0 (k = 0 on the weights' side, which
 * contributes nothing), masked loads reading nothing beyond.
 */
#include <immintrin.h>

#include "dot.h"
#include "e2m1_simd.h"

#if defined(E2M1_VNNI)
#define E2M1_GEMM e2m1_gemm_avx512vnni
#else
#define E2M1_GEMM e2m1_gemm_avx512
#endif

enum { TILE = 16, CHUNK = 64, PASS_ROWS = 32 };

/* E2M1_K_BIAS in each byte of 8 dwords: the bias the activations' bytes carry, whose
 * product with a block's k_w is the correction. */
static const int32_t biases[8] = {
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101};

/* The codes [0, len) of a row from p (len <= 64; 0 in the bytes past len, which are not
 * read). The one place codes are read: a packed layout changes this function alone. */
static inline __m512i load_codes(const uint8_t *p, size_t len) {
    if (len >= CHUNK) return _mm512_loadu_si512((const void *)p);
    return _mm512_maskz_loadu_epi8((__mmask64)((1ull << len) - 1), p);
}

/* Transposes 16 rows of 16 dwords: r[i] becomes dword i of every row, row l in lane l. */
static inline void transpose_16x16(__m512i r[TILE]) {
    __m512i t[TILE], u[TILE];
    for (int i = 0; i < TILE; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + p], 128-bit lane L: dword 4L + p of rows 4g .. 4g + 3 */
    for (int g = 0; g < 4; g++) {
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    /* then the 128-bit lanes transposed 4 x 4 across u[p], u[4 + p], u[8 + p], u[12 + p] */
    for (int p = 0; p < 4; p++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[p], u[4 + p], 0x44);
        const __m512i v1 = _mm512_shuffle_i32x4(u[p], u[4 + p], 0xee);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + p], u[12 + p], 0x44);
        const __m512i v3 = _mm512_shuffle_i32x4(u[8 + p], u[12 + p], 0xee);
        r[p] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + p] = _mm512_shuffle_i32x4(v0, v2, 0xdd);
        r[8 + p] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + p] = _mm512_shuffle_i32x4(v1, v3, 0xdd);
    }
}

/* Per lane, the sum over the dwords `first` .. first + n - 1 of `u` (unsigned bytes) times w
 * (signed bytes), 4 products a dword, added to `start`. */
static inline __m512i dot_dwords(__m512i start, const __m512i *w, const int32_t *u, int n) {
#if defined(E2M1_VNNI)
#pragma GCC unroll 8
    for (int q = 0; q < n; q++) start = _mm512_dpbusd_epi32(start, _mm512_set1_epi32(u[q]), w[q]);
    return start;
#else
    /* pairs of products in int16 (at most 2 x 24 x 12), n <= 8 of them summed (at most 4608) */
    __m512i pairs = _mm512_maddubs_epi16(_mm512_set1_epi32(u[0]), w[0]);
#pragma GCC unroll 8
    for (int q = 1; q < n; q++)
        pairs = _mm512_add_epi16(pairs, _mm512_maddubs_epi16(_mm512_set1_epi32(u[q]), w[q]));
    return _mm512_add_epi32(start, _mm512_madd_epi16(pairs, _mm512_set1_epi16(1)));
#endif
}

/* The columns [n0, n1) of the job under blocks of `dwords` dwords (4: NVFP4's 16 codes, 8:
 * MXFP4's 32), the tile's 16 columns a lane each. */
static inline __attribute__((always_inline)) void columns(const quant_gemm_job *j, size_t n0,
                                                          size_t n1, const int dwords) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols;
    const int blocks_per_chunk = CHUNK / 4 / dwords;
    const __m512i signed_k = _mm512_broadcast_i32x4(_mm_setr_epi8(E2M1_K_SIGNED));
    const __m512i unsigned_k = _mm512_broadcast_i32x4(_mm_setr_epi8(E2M1_K_UNSIGNED));
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t nt = n0; nt < n1; nt += TILE) {
        const size_t cols = n1 - nt < TILE ? n1 - nt : TILE;
        const __mmask16 store = (__mmask16)((1u << cols) - 1);
        /* lanes past the tile's columns repeat its last column (read, never stored) */
        const __m512i col = _mm512_min_epi32(lane, _mm512_set1_epi32((int)cols - 1));
        const __m512i ws_index = _mm512_mullo_epi32(col, _mm512_set1_epi32((int)grid));
        const float *ws = j->ws + nt * grid;
        const uint8_t *wrow[TILE];
        for (size_t l = 0; l < TILE; l++) wrow[l] = j->wq + (nt + (l < cols ? l : cols - 1)) * K;
        for (size_t m0 = 0; m0 < j->M; m0 += PASS_ROWS) {
            const size_t m1 = j->M - m0 < PASS_ROWS ? j->M : m0 + PASS_ROWS;
            __m512 acc[PASS_ROWS];
            for (size_t m = m0; m < m1; m++) acc[m - m0] = _mm512_setzero_ps();
            for (size_t k0 = 0, kb0 = 0; k0 < K; k0 += CHUNK, kb0 += (size_t)blocks_per_chunk) {
                const size_t len = K - k0 < CHUNK ? K - k0 : CHUNK;
                const int nbc = (int)(nb - kb0 < (size_t)blocks_per_chunk ? nb - kb0
                                                                          : (size_t)blocks_per_chunk);
                __m512i w[TILE];
                for (int l = 0; l < TILE; l++)
                    w[l] = _mm512_shuffle_epi8(signed_k, load_codes(wrow[l] + k0, len));
                transpose_16x16(w);
                /* per block: -12 sum(k_w) in each lane, and w_s */
                __m512i correction[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(),
                                         _mm512_setzero_si512(), _mm512_setzero_si512()};
                __m512 w_scale[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                                     _mm512_setzero_ps(), _mm512_setzero_ps()};
                for (int b = 0; b < blocks_per_chunk; b++) {
                    if (b >= nbc) break;
                    correction[b] = _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        dot_dwords(_mm512_setzero_si512(), w + b * dwords, biases, dwords));
                    w_scale[b] = _mm512_i32gather_ps(ws_index, ws + kb0 + (size_t)b, 4);
                }
                for (size_t m = m0; m < m1; m++) {
                    /* the row's codes as k_a + 12, then read back a dword at a time */
                    int32_t u[CHUNK / 4];
                    const uint8_t *xr = j->xq + m * K + k0;
                    _mm512_storeu_si512((void *)u,
                                        _mm512_shuffle_epi8(unsigned_k, load_codes(xr, len)));
                    const float *xs = j->xs + m * nb + kb0;
                    __m512 a = acc[m - m0];
#pragma GCC unroll 4
                    for (int b = 0; b < blocks_per_chunk; b++) {
                        if (b >= nbc) break;
                        const __m512i s = dot_dwords(correction[b], w + b * dwords,
                                                     u + b * dwords, dwords);
                        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s),
                                                       _mm512_set1_ps(xs[b] * 0.25f));
                        a = _mm512_add_ps(a, _mm512_mul_ps(t, w_scale[b]));
                    }
                    acc[m - m0] = a;
                }
            }
            for (size_t m = m0; m < m1; m++) {
                __m512 a = acc[m - m0];
                if (j->rule->format->has_tensor_scale)
                    a = _mm512_mul_ps(a, _mm512_set1_ps(j->xt[m] * j->w_tensor_scale));
                _mm512_mask_storeu_ps(j->y + m * j->ldy + nt, store, a);
            }
        }
    }
}

void E2M1_GEMM(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->bc == 16)
        columns(j, n0, n1, 4);
    else
        columns(j, n0, n1, 8);
}
