/*
 * What the ternary format's SIMD files share (ternary_avx2.c, ternary_avx512.c; included only
 * by files compiled with AVX2 or more): the loop of the GEMM's column kernel around an ISA's
 * register tiles and the per-row values its tiles read; the activation quantizer's loop over
 * rows around an ISA's row functions.
 *
 * The loop: activation rows in blocks whose codes stay in L2 (TERNARY_BLOCK_BYTES); per block,
 * each row's sum of codes and its divisor (s_w s_x, rounded to bf16 under hf-bitlinear); then
 * the columns in groups of one vector's lanes (16 on AVX-512, 8 on AVX2), each group's weight
 * rows (their codes held four a byte, quant_weight.h: a group of 64 in 16 bytes, each field
 * w + 1) streamed once per tile of rows against 4, 2 or 1 activation rows: a tile of R rows x
 * lanes / R columns ends in one vector of outputs, lane i C + j the output of row i, column j.
 * A tile's integer sums are exact in int32 (TERNARY_MAX_K below says why), so the
 * order of their terms is free; the last steps are the portable kernel's fp32 (or bf16)
 * operations, lane for lane.
 */
#ifndef PARITY_QUANT_TERNARY_SIMD_H
#define PARITY_QUANT_TERNARY_SIMD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dot.h"

#include "base/floats.h"
#include "kernels/kernels_x86.h"

/* The tiles add (w + 1) x over K (w + 1 in {0, 1, 2}, |x| <= 128), at most 2 * 128 * K in
 * magnitude, and subtract the row's sum of x: exact in int32 while K <= 2^22. Longer rows go
 * to the portable kernel, which sums in int64. */
#define TERNARY_MAX_K ((size_t)1 << 22)
/* At most this many activation rows per block, and about this many bytes of their codes. */
#define TERNARY_BLOCK_ROWS 256
#define TERNARY_BLOCK_BYTES ((size_t)256 * 1024)

/* The activation rows [m0, m0 + rows) of a block and what a tile's last steps read per row:
 * the sum of its codes and its divisor. A tile reads one vector's lanes from row m on, so the
 * arrays run 16 entries past the block (zeros). */
typedef struct ternary_block {
    size_t m0, rows;
    int bf16_steps;
    int32_t sum_x[TERNARY_BLOCK_ROWS + 16];
    float divisor[TERNARY_BLOCK_ROWS + 16];
} ternary_block;

/* An ISA's sum of the K codes of one activation row. */
typedef int32_t ternary_sum_fn(const uint8_t *x, size_t K);
/* An ISA's tile: the block's rows m .. m + rows - 1 (rows 4, 2 or 1) against the weight rows
 * n .. n + cols - 1 (cols at most lanes / rows), stored into the job's y. */
typedef void ternary_tile_fn(const quant_gemm_job *j, const ternary_block *b, size_t m,
                             size_t rows, size_t n, size_t cols);

/* A tile's code rows: the activation rows m .. m + R - 1 of block b into x, the held weight rows
 * n .. n + C - 1 into w, those past `cols` the first one again (read, not stored). Returns how
 * far ahead of its weight reads the tile asks for lines: the first row tile of a block reads
 * the weight rows from memory, so it asks for those of the column group after next (R C rows
 * a group); the others read them from cache (0: the line being read). */
ALWAYS_INLINE size_t ternary_tile_rows(const int R, const int C, const quant_gemm_job *j,
                                       const ternary_block *b, size_t m, size_t n, size_t cols,
                                       const uint8_t **x, const uint8_t **w) {
    for (int r = 0; r < R; r++) x[r] = j->xq + (b->m0 + m + (size_t)r) * j->K;
    for (int c = 0; c < C; c++)
        w[c] = j->wq + (n + ((size_t)c < cols ? (size_t)c : 0)) * j->w_row_bytes;
    return m == 0 ? 2 * (size_t)(R * C) * j->w_row_bytes : 0;
}

/* The GEMM's columns [n0, n1) through an ISA's tiles of 4, 2 and 1 rows (`lanes` outputs
 * each). */
ALWAYS_INLINE void ternary_gemm_loop(const quant_gemm_job *j, size_t n0, size_t n1,
                                     const size_t lanes, ternary_sum_fn *sum_codes,
                                     ternary_tile_fn *tile) {
    if (j->K > TERNARY_MAX_K) {
        quant_gemm_ternary(j, n0, n1);
        return;
    }
    size_t block_rows = TERNARY_BLOCK_BYTES / j->K / 4 * 4;
    if (block_rows < 4) block_rows = 4;
    if (block_rows > TERNARY_BLOCK_ROWS) block_rows = TERNARY_BLOCK_ROWS;
    ternary_block b;
    b.bf16_steps = j->rule->tensor_scale == QUANT_SCALE_BF16;
    for (b.m0 = 0; b.m0 < j->M; b.m0 += block_rows) {
        b.rows = j->M - b.m0 < block_rows ? j->M - b.m0 : block_rows;
        memset(b.sum_x + b.rows, 0, 16 * sizeof b.sum_x[0]);
        memset(b.divisor + b.rows, 0, 16 * sizeof b.divisor[0]);
        for (size_t i = 0; i < b.rows; i++) {
            const size_t m = b.m0 + i;
            b.sum_x[i] = sum_codes(j->xq + m * j->K, j->K);
            /* the divisor of quant_gemm_ternary, as it computes it */
            const float divisor = j->w_tensor_scale * j->xt[m];
            b.divisor[i] = b.bf16_steps ? round_bf16(divisor) : divisor;
        }
        for (size_t n = n0; n < n1; n += lanes) {
            const size_t cols = n1 - n < lanes ? n1 - n : lanes;
            for (size_t m = 0; m < b.rows;) {
                const size_t left = b.rows - m, rows = left >= 4 ? 4 : left >= 2 ? 2 : 1;
                const size_t tile_cols = lanes / rows;
                for (size_t c = 0; c < cols; c += tile_cols)
                    tile(j, &b, m, rows, n + c, cols - c < tile_cols ? cols - c : tile_cols);
                m += rows;
            }
        }
    }
}

/* An ISA's max |x| over a row (|round_bf16(x)| where `bf16`), a NaN passed over as fmaxf
 * does. */
typedef float ternary_amax_fn(const float *x, size_t n, int bf16);
/* An ISA's codes of a row of n values under the scale s (ternary.c's steps: the product,
 * rounded to bf16 where `bf16`; rounded to an integer, to even or, where `half_up`, as
 * floor(v + 0.5); clamped to [-128, 127]; as two's complement int8). */
typedef void ternary_codes_fn(int half_up, int bf16, const float *x, size_t n, float s,
                              uint8_t *codes);

/* The activation quantizer (quant_fn) through an ISA's row functions: per row, max |x|, then
 * the scale as ternary.c computes it (in scalar fp32, bf16 steps under hf-bitlinear), then the
 * codes. */
ALWAYS_INLINE void ternary_rows_loop(const quant_rule *r, size_t rows, size_t cols,
                                     const float *x, size_t x_stride, uint8_t *codes,
                                     size_t codes_stride, float *row_scales,
                                     ternary_amax_fn *row_amax, ternary_codes_fn *row_codes) {
    const int bf16 = r->tensor_scale == QUANT_SCALE_BF16;
    const int half_up = r->id == PARITY_QUANT_TERNARY_ONEBITLLMS;
    for (size_t i = 0; i < rows; i++) {
        const float *xi = x + i * x_stride;
        const float amax = row_amax(xi, cols, bf16);
        const float s = bf16 ? round_bf16(127.0f / fmaxf(amax, round_bf16(1e-5f)))
                             : 127.0f / fmaxf(amax, 1e-5f);
        row_codes(half_up, bf16, xi, cols, s, codes + i * codes_stride);
        row_scales[i] = s;
    }
}

#endif /* PARITY_QUANT_TERNARY_SIMD_H */
