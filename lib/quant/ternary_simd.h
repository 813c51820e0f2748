/*
 * What the ternary format's SIMD files share (ternary_avx2.c, ternary_avx512.c; included only
 * by files compiled with AVX2 or more): the loop of the GEMM's column kernel around an ISA's
 * register tiles and the per-row values its tiles read; the activation quantizer's loop over
 * rows around an ISA's row functions.
 *
 * The loop: activation rows in blocks whose codes stay in L2 (TERNARY_BLOCK_BYTES); per block,
 * each row's sum of codes and its divisor (s_w s_x, rounded to bf16 under hf-bitlinear); then
 * the columns in groups of one vector's lanes (16 on AVX-512, 8 on AVX2), each group's weight
 * rows (their codes held four a byte, code_layout.h: a group of 64 in 16 bytes, each field
 * w + 1) streamed once per tile of rows against 4, 2 or 1 activation rows: a tile of R rows x
 * lanes / R columns ends in one vector of outputs, lane i C + j the output of row i, column j.
 * Where a block has two row tiles of 4 or more (prefill), the weight rows of its tiles of 4
 * are unpacked once, one code a byte, into a buffer on the stack that those tiles read, rather
 * than each unpacking them again (TERNARY_UNPACKED_BYTES): a column group's rows at once
 * where they fit, else a tile's columns at a time, with every row tile of 4 of the block run
 * on them before the next columns.
 * At M = 1 each ISA file has a kernel of its own (gemm_row: the weight rows streamed in
 * address order against the activation row), which finishes 16 or 8 columns at a time through
 * its tiles' last steps on ternary_row_block's block.
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
/* The bytes on the stack for the unpacked weight rows of the row tiles of 4. */
#define TERNARY_UNPACKED_BYTES ((size_t)32 * 1024)
/* At most this many activation rows per block, and about this many bytes of their codes. */
#define TERNARY_BLOCK_ROWS 256
#define TERNARY_BLOCK_BYTES ((size_t)256 * 1024)

/* The activation rows [m0, m0 + rows) of a block and what a tile's last steps read per row:
 * the sum of its codes and its divisor. A tile reads one vector's lanes from row m on, so the
 * arrays run 16 entries past the block (zeros). */
typedef struct ternary_block {
    size_t m0, rows;
    int bf16_steps;
    /* NULL, or the weight rows from column unpacked_n on for the tiles of 4 rows, unpacked one
     * code a byte as w + 1, unpacked_stride bytes apart (K rounded up to 64) */
    const uint8_t *unpacked;
    size_t unpacked_n, unpacked_stride;
    int32_t sum_x[TERNARY_BLOCK_ROWS + 16];
    float divisor[TERNARY_BLOCK_ROWS + 16];
} ternary_block;

/* An ISA's sum of the K codes of one activation row. */
typedef int32_t ternary_sum_fn(const uint8_t *x, size_t K);
/* An ISA's tile: the block's rows m .. m + rows - 1 (rows 4, 2 or 1) against the weight rows
 * n .. n + cols - 1 (cols at most lanes / rows; from b->unpacked where it is set), stored into
 * the job's y. */
typedef void ternary_tile_fn(const quant_gemm_job *j, const ternary_block *b, size_t m,
                             size_t rows, size_t n, size_t cols);
/* An ISA's unpacking of a held weight row's codes (quant_weight.h), whole groups of 64, into
 * bytes w + 1 (K rounded up to 64 of them). */
typedef void ternary_unpack_fn(const uint8_t *held, size_t K, uint8_t *bytes);

/* A tile's code rows: the activation rows m .. m + R - 1 of block b into x, the weight rows
 * n .. n + C - 1 into w (held, or where U the block's unpacked ones), those past `cols` the
 * first one again (read, not stored). Returns how far ahead of its weight reads the tile asks
 * for lines: the first row tile of a block reads the held weight rows from memory, so it asks
 * for those of the column group after next (R C rows a group); the others read them from
 * cache (0: none asked for). */
ALWAYS_INLINE size_t ternary_tile_rows(const int R, const int C, const int U,
                                       const quant_gemm_job *j, const ternary_block *b, size_t m,
                                       size_t n, size_t cols, const uint8_t **x,
                                       const uint8_t **w) {
    for (int r = 0; r < R; r++) x[r] = j->xq + (b->m0 + m + (size_t)r) * j->K;
    for (int c = 0; c < C; c++) {
        const size_t at = n + ((size_t)c < cols ? (size_t)c : 0);
        w[c] = U ? b->unpacked + (at - b->unpacked_n) * b->unpacked_stride
                 : j->wq + at * j->w_row_bytes;
    }
    return m == 0 && !U ? 2 * (size_t)(R * C) * j->w_row_bytes : 0;
}

/* The block of a job of one activation row (M = 1) as the ISAs' one-row kernels give it to
 * their tiles' last steps: row 0's sum of codes and divisor (as ternary_gemm_loop computes
 * them), zeros past it; no unpacked rows. */
ALWAYS_INLINE void ternary_row_block(const quant_gemm_job *j, ternary_sum_fn *sum_codes,
                                     ternary_block *b) {
    b->m0 = 0;
    b->rows = 1;
    b->bf16_steps = j->rule->tensor_scale == QUANT_SCALE_BF16;
    b->unpacked = NULL;
    memset(b->sum_x, 0, 17 * sizeof b->sum_x[0]);
    memset(b->divisor, 0, 17 * sizeof b->divisor[0]);
    b->sum_x[0] = sum_codes(j->xq, j->K);
    const float divisor = j->w_tensor_scale * j->xt[0];
    b->divisor[0] = b->bf16_steps ? round_bf16(divisor) : divisor;
}

/* The GEMM's columns [n0, n1) through an ISA's tiles of 4, 2 and 1 rows (`lanes` outputs
 * each), the weight rows of the tiles of 4 unpacked first where two tiles or more share
 * them. */
ALWAYS_INLINE void ternary_gemm_loop(const quant_gemm_job *j, size_t n0, size_t n1,
                                     const size_t lanes, ternary_sum_fn *sum_codes,
                                     ternary_tile_fn *tile, ternary_unpack_fn *unpack) {
    if (j->K > TERNARY_MAX_K) {
        quant_gemm_ternary(j, n0, n1);
        return;
    }
    size_t block_rows = TERNARY_BLOCK_BYTES / j->K / 4 * 4;
    if (block_rows < 4) block_rows = 4;
    if (block_rows > TERNARY_BLOCK_ROWS) block_rows = TERNARY_BLOCK_ROWS;
    _Alignas(64) uint8_t unpacked[TERNARY_UNPACKED_BYTES];
    ternary_block b;
    b.bf16_steps = j->rule->tensor_scale == QUANT_SCALE_BF16;
    b.unpacked_stride = (j->K + 63) / 64 * 64;
    const size_t tile_cols4 = lanes / 4; /* a tile of 4 rows' columns */
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
        const size_t rows4 = b.rows / 4 * 4; /* the rows in tiles of 4 */
        for (size_t n = n0; n < n1; n += lanes) {
            const size_t cols = n1 - n < lanes ? n1 - n : lanes;
            /* the columns unpacked at once: the group's, a tile's, or none (0) */
            const size_t fit = rows4 < 8 ? 0
                               : cols * b.unpacked_stride <= sizeof unpacked       ? cols
                               : tile_cols4 * b.unpacked_stride <= sizeof unpacked ? tile_cols4
                                                                                   : 0;
            for (size_t c0 = 0; c0 < cols; c0 += fit ? fit : cols) {
                const size_t c1 = fit && c0 + fit < cols ? c0 + fit : cols;
                b.unpacked = NULL;
                if (fit) {
                    for (size_t c = c0; c < c1; c++)
                        unpack(j->wq + (n + c) * j->w_row_bytes, j->K,
                               unpacked + (c - c0) * b.unpacked_stride);
                    b.unpacked = unpacked;
                    b.unpacked_n = n + c0;
                }
                for (size_t m = 0; m < rows4; m += 4)
                    for (size_t c = c0; c < c1; c += tile_cols4)
                        tile(j, &b, m, 4, n + c, c1 - c < tile_cols4 ? c1 - c : tile_cols4);
            }
            b.unpacked = NULL;
            for (size_t m = rows4; m < b.rows;) {
                const size_t rows = b.rows - m >= 2 ? 2 : 1, tile_cols = lanes / rows;
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
