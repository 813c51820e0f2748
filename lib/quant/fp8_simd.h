/*
 * What the FP8 (E4M3) SIMD kernels of every ISA share (fp8_avx2.c, fp8_avx512.c; included only
 * by files compiled with AVX2 or wider): the digit decoding's tables, the decoded activations'
 * layout (fp8_rows, on the GEMM's stack) and a block's scale step.
 *
 * The digits: an E4M3 code's value is k * 2^-9 with k = s * 2^sh, s = m (exponent field e = 0)
 * or 8 + m (e >= 1, sh = e - 1). Where e < 8, k itself (|k| <= 15 * 2^6 = 960) is the code's
 * low digit and its high digit is 0; where e >= 8, k / 2^7 (<= 15 * 2^7 = 1920, exact: sh >= 7)
 * is the high digit and the low one is 0. So k_a k_w = LL + 2^7 (LH + HL) + 2^14 HH, and over a
 * block of at most 128 terms each of LL, HH and P = sum (lo_a + hi_a)(lo_w + hi_w) is below
 * 128 * 1920^2 < 2^29 in magnitude: exact in int32 (vpmaddwd pairs, vpdpwssd), as is the cross
 * term P - LL - HH = sum (LH + HL). The block's S = LL + 2^7 cross + 2^14 HH is an integer below
 * 2^43, which double holds exactly at every step of that sum.
 */
#ifndef PARITY_QUANT_FP8_SIMD_H
#define PARITY_QUANT_FP8_SIMD_H

#include <immintrin.h>
#include <stdint.h>

#include "codecs.h"
#include "dot.h"
#include "fp8.h"

/* By a code's bits 3..7 (its exponent field e and sign): 8 where e >= 1 (the implicit bit of
 * s), and the signed power of two that multiplies s into the code's digit (2^(e-1) for e in
 * 1..7, 2^(e-8) for e >= 8, 1 for e = 0; negated for the sign). */
static const int16_t fp8_implicit_bit[32] = {0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8,
                                             0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
static const int16_t fp8_signed_power[32] = {
    1,  1,  2,  4,  8,  16,  32,  64,  1,  2,  4,  8,  16,  32,  64,  128,
    -1, -1, -2, -4, -8, -16, -32, -64, -1, -2, -4, -8, -16, -32, -64, -128};

/* The pairs of K of a block at most (blocks of 128 or 32 codes). */
#define FP8_BLOCK_PAIRS 64
/* The rows of activations decoded at once: each weight tile is decoded once per chunk. */
#define FP8_CHUNK_ROWS 64
/* The dwords of decoded activations the GEMM holds (on its stack, 48 KB): a chunk of 64 rows
 * one K block at a time, fewer rows more blocks at a time (a decode step's row: K up to 8192
 * at once, so that its weight rows are read in one stream). */
#define FP8_ROWS_DWORDS (FP8_CHUNK_ROWS * FP8_BLOCK_PAIRS * 3)

/* A run of K blocks [kb0, kb0 + blocks) of a chunk of activation rows, decoded: the digits in
 * groups of `group` rows (the rows a GEMM step takes, or fewer when the chunk has fewer), per
 * group and pair of K three runs of `group` dwords (lo, hi, v; each dword a pair of K as two
 * int16 digits, zero past a block's end; a block's pairs FP8_BLOCK_PAIRS apart), so that a step
 * finds every row's broadcast dword at a fixed offset from one pointer; and the NaN flag of
 * each row's block ([row][block]). */
typedef struct fp8_rows {
    int32_t digits[FP8_ROWS_DWORDS];
    uint8_t nan[FP8_CHUNK_ROWS];
    size_t group, pairs, kb0, blocks; /* pairs: a row's pairs (blocks x FP8_BLOCK_PAIRS) */
} fp8_rows;

/* Sets b up for `rows` rows (at most FP8_CHUNK_ROWS) and steps of step_rows rows, from K block
 * kb0 with as many of the job's nblocks blocks as fit. */
static inline void fp8_rows_begin(fp8_rows *b, size_t rows, size_t step_rows, size_t kb0,
                                  size_t nblocks) {
    b->group = rows < step_rows ? rows : step_rows;
    const size_t held = (rows + b->group - 1) / b->group * b->group;
    size_t blocks = FP8_ROWS_DWORDS / (held * 3 * FP8_BLOCK_PAIRS);
    if (blocks > FP8_CHUNK_ROWS / held) blocks = FP8_CHUNK_ROWS / held; /* the NaN flags */
    b->blocks = blocks < nblocks - kb0 ? blocks : nblocks - kb0;
    b->kb0 = kb0;
    b->pairs = b->blocks * FP8_BLOCK_PAIRS;
}

/* The digits of pair p of the chunk's row r (lo; hi and v are group and 2 group dwords on). */
static inline int32_t *fp8_row_pair(fp8_rows *b, size_t r, size_t p) {
    const size_t g = b->group;
    return b->digits + (r / g) * (b->pairs * 3 * g) + p * 3 * g + r % g;
}

/* Stores the digit pairs [p0, p0 + n) of the chunk's row r (lo, hi, v: n dwords each). */
static inline void fp8_store_pairs(fp8_rows *b, size_t r, size_t p0, const int32_t *lo,
                                   const int32_t *hi, const int32_t *v, size_t n) {
    const size_t g = b->group;
    int32_t *a = fp8_row_pair(b, r, p0);
    for (size_t i = 0; i < n; i++, a += 3 * g) {
        a[0] = lo[i];
        a[g] = hi[i];
        a[2 * g] = v[i];
    }
}

/* The element step's parameters of rule r for a block of largest magnitude amax, and in
 * *stored the block's scale as the portable quantizer stores it (MX: the E8M0 power of two). */
static inline fp8_block_scale fp8_rule_scale(const quant_rule *r, float amax, float *stored) {
    if (r->format->block_scale == QUANT_SCALE_E8M0) {
        const uint8_t biased = fp8_mx_scale_of(r->id, amax);
        *stored = e8m0_to_f32(biased);
        const fp8_block_scale b = {*stored, fp8_mx_mult_of(r->id, biased), 0};
        return b;
    }
    const fp8_block_scale b = fp8_block_scale_of(r->id, amax);
    *stored = b.stored;
    return b;
}

/* fp8_row_avx512.c (AVX-512 with VBMI): the columns [n0, n1) of a job of one activation row
 * whose K it takes (returns 1), bit for bit quant_gemm_blocked; returns 0, computing nothing,
 * for any other job. */
int fp8_row_gemm_avx512vbmi(const quant_gemm_job *j, size_t n0, size_t n1);

#endif /* PARITY_QUANT_FP8_SIMD_H */
