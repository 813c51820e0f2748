/*
 * The FP8 formats' quantization (fp8.c): fp8-block and MXFP8, E4M3 codes; the entries of their
 * format rows (format.h) and the forms the public calls write.
 */
#ifndef PARITY_QUANT_FP8_H
#define PARITY_QUANT_FP8_H

#include "format.h"

/* The entries (quant_fn): a weight in the format's blocks (128 x 128 or 1 x 32), activations
 * in 1 x 128 or 1 x 32 blocks; scales as fp32 values (MX: the powers of two); no tensor
 * scale (a weight's is written 0). */
quant_fn fp8_quantize_weight, fp8_quantize_activations;
/* A block rule in blocks of block_rows x block_cols: scales [ceil(rows / block_rows)]
 * [ceil(cols / block_cols)], the stored fp32 multipliers. */
void fp8_quantize_blocks(const quant_rule *r, size_t rows, size_t cols, const float *x,
                         size_t x_stride, size_t block_rows, size_t block_cols, uint8_t *codes,
                         size_t codes_stride, float *scales);
/* An MX rule: scales [rows][ceil(cols / 32)] as E8M0 bytes. */
void mxfp8_quantize_bytes(const quant_rule *r, size_t rows, size_t cols, const float *x,
                          size_t x_stride, uint8_t *codes, size_t codes_stride, uint8_t *scales);

#endif /* PARITY_QUANT_FP8_H */
