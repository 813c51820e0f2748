/*
 * The E2M1 GEMM (NVFP4 and MXFP4: dot.c's quant_gemm_blocked on E2M1 codes) in AVX2:
 * e2m1_gemm_avx2, dot.c's bits. The shape and the arithmetic are e2m1_gemm_avx512.c's on
 * 8 lanes: the output columns in tiles of 8, a column a lane; K in chunks of 32 codes (2
 * NVFP4 blocks, 1 MXFP4 block), the 8 weight rows' codes mapped to k_w by vpshufb and
 * transposed 8 x 8 in dwords; each activation row's codes as k_a + 12, a dword broadcast
 * against each transposed register, products summed by vpmaddubsw (pairs, at most 2 x 24 x 12
 * in int16), vpaddw (a block's dwords: at most 4608) and vpmaddwd (int32) onto the block's
 * correction -12 sum(k_w): the exact block dot S in units of 1/4 per lane; then
 * acc = acc + (S * (a_s / 4)) * w_s in fp32, ascending over the blocks, and NVFP4's
 * acc * (s2a * s2w). Past K the codes read as 0, from a copy: nothing beyond K is read.
 */
#include <immintrin.h>
#include <string.h>

#include "dot.h"
#include "e2m1_simd.h"

enum { TILE = 8, CHUNK = 32, PASS_ROWS = 32 };

/* E2M1_K_BIAS in each byte of 8 dwords: the bias the activations' bytes carry, whose
 * product with a block's k_w is the correction. */
static const int32_t biases[8] = {
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101,
    E2M1_K_BIAS * 0x01010101, E2M1_K_BIAS * 0x01010101};

/* The codes [0, len) of a row from p (len <= 32; 0 in the bytes past len, which are not
 * read). The one place codes are read: a packed layout changes this function alone. */
static inline __m256i load_codes(const uint8_t *p, size_t len) {
    if (len >= CHUNK) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    uint8_t tail[CHUNK] = {0};
    memcpy(tail, p, len);
    return _mm256_loadu_si256((const __m256i *)(const void *)tail);
}

/* Transposes 8 rows of 8 dwords: r[i] becomes dword i of every row, row l in lane l. */
static inline void transpose_8x8(__m256i r[TILE]) {
    __m256i t[TILE], u[TILE];
    for (int i = 0; i < TILE; i += 2) {
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

/* Per lane, the sum over n dwords of `u` (unsigned bytes, broadcast) times w (signed bytes), 4
 * products a dword, added to `start`. */
static inline __m256i dot_dwords(__m256i start, const __m256i *w, const int32_t *u, int n) {
    __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi32(u[0]), w[0]);
#pragma GCC unroll 8
    for (int q = 1; q < n; q++)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(_mm256_set1_epi32(u[q]), w[q]));
    return _mm256_add_epi32(start, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

/* The columns [n0, n1) of the job under blocks of `dwords` dwords (4: NVFP4's 16 codes, 8:
 * MXFP4's 32), the tile's 8 columns a lane each. */
static inline __attribute__((always_inline)) void columns(const quant_gemm_job *j, size_t n0,
                                                          size_t n1, const int dwords) {
    const size_t K = j->K, nb = j->nblocks, grid = j->w_grid_cols;
    const int blocks_per_chunk = CHUNK / 4 / dwords;
    const __m256i signed_k = _mm256_setr_epi8(E2M1_K_SIGNED, E2M1_K_SIGNED);
    const __m256i unsigned_k = _mm256_setr_epi8(E2M1_K_UNSIGNED, E2M1_K_UNSIGNED);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t nt = n0; nt < n1; nt += TILE) {
        const size_t cols = n1 - nt < TILE ? n1 - nt : TILE;
        /* lanes past the tile's columns repeat its last column (read, never stored) */
        const __m256i col = _mm256_min_epi32(lane, _mm256_set1_epi32((int)cols - 1));
        const __m256i ws_index = _mm256_mullo_epi32(col, _mm256_set1_epi32((int)grid));
        const float *ws = j->ws + nt * grid;
        const uint8_t *wrow[TILE];
        for (size_t l = 0; l < TILE; l++) wrow[l] = j->wq + (nt + (l < cols ? l : cols - 1)) * K;
        for (size_t m0 = 0; m0 < j->M; m0 += PASS_ROWS) {
            const size_t m1 = j->M - m0 < PASS_ROWS ? j->M : m0 + PASS_ROWS;
            __m256 acc[PASS_ROWS];
            for (size_t m = m0; m < m1; m++) acc[m - m0] = _mm256_setzero_ps();
            for (size_t k0 = 0, kb0 = 0; k0 < K; k0 += CHUNK, kb0 += (size_t)blocks_per_chunk) {
                const size_t len = K - k0 < CHUNK ? K - k0 : CHUNK;
                const int nbc = (int)(nb - kb0 < (size_t)blocks_per_chunk ? nb - kb0
                                                                          : (size_t)blocks_per_chunk);
                __m256i w[TILE];
                for (int l = 0; l < TILE; l++)
                    w[l] = _mm256_shuffle_epi8(signed_k, load_codes(wrow[l] + k0, len));
                transpose_8x8(w);
                /* per block: -12 sum(k_w) in each lane, and w_s */
                __m256i correction[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                __m256 w_scale[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
                for (int b = 0; b < blocks_per_chunk; b++) {
                    if (b >= nbc) break;
                    correction[b] = _mm256_sub_epi32(
                        _mm256_setzero_si256(),
                        dot_dwords(_mm256_setzero_si256(), w + b * dwords, biases, dwords));
                    w_scale[b] = _mm256_i32gather_ps(ws + kb0 + (size_t)b, ws_index, 4);
                }
                for (size_t m = m0; m < m1; m++) {
                    /* the row's codes as k_a + 12, then read back a dword at a time */
                    int32_t u[CHUNK / 4];
                    _mm256_storeu_si256((__m256i *)(void *)u,
                                        _mm256_shuffle_epi8(unsigned_k,
                                                            load_codes(j->xq + m * K + k0, len)));
                    const float *xs = j->xs + m * nb + kb0;
                    __m256 a = acc[m - m0];
#pragma GCC unroll 2
                    for (int b = 0; b < blocks_per_chunk; b++) {
                        if (b >= nbc) break;
                        const __m256i s = dot_dwords(correction[b], w + b * dwords,
                                                     u + b * dwords, dwords);
                        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(s),
                                                       _mm256_set1_ps(xs[b] * 0.25f));
                        a = _mm256_add_ps(a, _mm256_mul_ps(t, w_scale[b]));
                    }
                    acc[m - m0] = a;
                }
            }
            for (size_t m = m0; m < m1; m++) {
                __m256 a = acc[m - m0];
                if (j->rule->format->has_tensor_scale)
                    a = _mm256_mul_ps(a, _mm256_set1_ps(j->xt[m] * j->w_tensor_scale));
                float *yr = j->y + m * j->ldy + nt;
                if (cols == TILE) {
                    _mm256_storeu_ps(yr, a);
                } else {
                    float out[TILE];
                    _mm256_storeu_ps(out, a);
                    memcpy(yr, out, cols * sizeof(float));
                }
            }
        }
    }
}

void e2m1_gemm_avx2(const quant_gemm_job *j, size_t n0, size_t n1) {
    if (j->bc == 16)
        columns(j, n0, n1, 4);
    else
        columns(j, n0, n1, 8);
}
