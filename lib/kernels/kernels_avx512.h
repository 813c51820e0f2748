/* What the AVX-512 kernel files share (included only by files compiled with AVX-512 F, BW,
 * VL and DQ): masks for row tails, the bf16 widening load, the dot16 fold of one zmm, the
 * 16 folds of 16 zmm at once, the store of a block of outputs through them, the decode loop
 * of one x row over a table's pair32 chunks, and the entry point of the GEMM file. */
#ifndef PARITY_KERNELS_AVX512_H
#define PARITY_KERNELS_AVX512_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* Lanes 0..n-1 (n <= 16). */
static inline __mmask16 z_mask(size_t n) { return (__mmask16)((1u << n) - 1); }

/* The mask of the block of 16 at i in a row of n (i < n): all 16 lanes, or fewer at the end. */
static inline __mmask16 z_mask_at(size_t n, size_t i) { return z_mask(n - i < 16 ? n - i : 16); }

/* bf16 lanes (masked: +0 past the mask) widened to fp32. */
static inline __m512 z_load_bf16(const uint16_t *p, __mmask16 m) {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* bf16_from_f32 on 16 lanes: (u + 0x7fff + ((u >> 16) & 1)) >> 16, NaN -> 0x7fc0, in the
 * low 16 bits of each dword. */
static inline __m512i z_bf16_bits(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_set1_epi32(0x7fc0));
}

/* round_bf16 on 16 lanes. */
static inline __m512 z_round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(z_bf16_bits(x), 16));
}

/* The dot16 fold of the 16 lanes of one zmm: l += l + 8, then l + 4, l + 2, l + 1. */
static inline float z_fold16(__m512 v) {
    const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    const __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* The dot16 folds of 16 accumulators at once: out lane a is the fold of acc[a]. Each
 * step is the fold's, lane l += lane l + h for h = 8, 4, 2, 1; a step adds two registers'
 * halves at a time, so 16 folds take 15 adds and 30 shuffles instead of 16 * 4 adds and
 * 16 * 4 extracts. */
static inline __m512 z_fold16x16(const __m512 acc[16]) {
    /* h = 8: v[p] holds acc[2p]'s lanes 0..7 + 8..15 in its low half, acc[2p + 1]'s high */
    __m512 v[8], u[4], t[2];
    for (int p = 0; p < 8; p++)
        v[p] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * p], acc[2 * p + 1], 0xee));
    /* h = 4: 128-bit lane q of u[p] holds lanes 0..3 + 4..7 of acc[4p + q] */
    for (int p = 0; p < 4; p++)
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xdd));
    /* h = 2: within each 128-bit lane q of t[p]: [acc(a) 0+2, 1+3, acc(b) 0+2, 1+3] with
     * a = 8p + q (from u[2p]) and b = 8p + 4 + q (from u[2p + 1]) */
    for (int p = 0; p < 2; p++)
        t[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xee));
    /* h = 1: 128-bit lane q: [acc(q), acc(4 + q), acc(8 + q), acc(12 + q)] */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88),
                                   _mm512_shuffle_ps(t[0], t[1], 0xdd));
    /* lane 4q + s holds acc[q + 4s]: transpose the 4 x 4 of 128-bit lanes and dwords, so
     * that lane a holds acc[a] */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, r);
}

/* The outputs of an R x C block (R * C <= 16, constants after inlining) from their
 * accumulators acc[C * i + j] into y[i][j] (row stride ldy): a full block folds as one tree,
 * its lane C * i + j being y[i][j], and stores a row with one masked store; a smaller one
 * folds each output alone. With round_bf16, the outputs are rounded to bf16 before the store
 * (z_round_bf16: round_bf16's bits, on integers, whatever MXCSR says). */
static inline __attribute__((always_inline)) void z_store_block_as(const int R, const int C,
                                                                   const __m512 *acc, float *y,
                                                                   size_t ldy, int round_bf16) {
    if (R * C == 16) {
        __m512 f = z_fold16x16(acc);
        if (round_bf16) f = z_round_bf16(f);
        for (int i = 0; i < R; i++)
            _mm512_mask_storeu_ps(y + i * ldy - C * i, (__mmask16)(((1u << C) - 1) << (C * i)), f);
    } else if (round_bf16) {
        /* the folds side by side (lane C i + j, the rest +0), rounded as one vector */
        float f[16] = {0};
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) f[C * i + j] = z_fold16(acc[C * i + j]);
        const __m512 r = z_round_bf16(_mm512_loadu_ps(f));
        for (int i = 0; i < R; i++)
            _mm512_mask_storeu_ps(y + i * ldy - C * i, (__mmask16)(((1u << C) - 1) << (C * i)), r);
    } else {
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) y[i * ldy + j] = z_fold16(acc[C * i + j]);
    }
}

static inline __attribute__((always_inline)) void z_store_block(const int R, const int C,
                                                                const __m512 *acc, float *y,
                                                                size_t ldy) {
    z_store_block_as(R, C, acc, y, ldy, 0);
}

/* One chunk of a table's pair32 (kernels.h), at element k of a row of K, on accumulator a: x is
 * the packed x row, w the weight row; an always-inline function, so that no call is left in the
 * loop of z_rowwise. */
typedef __m512 (*z_pair32_chunk)(__m512 a, const void *x, const uint16_t *w, size_t k, size_t K);

/* One x row against C weight rows (a decode step; C <= 16, a constant after inlining), row
 * after row: each weight row's chunks in order on one accumulator, so that the weights are
 * read as one linear stream, which the hardware prefetchers follow better than C streams of K
 * elements each, the line `ahead` elements on asked into L1 across rows; the out-of-order core
 * overlaps the rows' chains. The outputs are stored by z_store_block_as (rounded to bf16 where
 * round_bf16). */
static inline __attribute__((always_inline)) void z_rowwise(const int C, z_pair32_chunk chunk,
                                                            size_t ahead, size_t K, const void *x,
                                                            const uint16_t *w, size_t ldw,
                                                            float *y, int round_bf16) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < C; j++) {
        const uint16_t *wj = w + j * ldw;
        __m512 a = _mm512_setzero_ps();
        for (size_t k = 0; k < K; k += 32) {
            _mm_prefetch((const char *)(wj + k + ahead), _MM_HINT_T0);
            a = chunk(a, x, wj, k, K);
        }
        acc[j] = a;
    }
    z_store_block_as(1, C, acc, y, 0, round_bf16);
}

/* The GEMM entries (gemm_avx512.c) over the table t. */
void gemm_avx512_set_entries(kernels *t);

#endif /* PARITY_KERNELS_AVX512_H */
