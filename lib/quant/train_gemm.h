/*
 * The training GEMM's column kernel (train_gemm.c): y = a b^T on two pre-quantized operands,
 * each quantized along the reduction dimension k (MXFP8 codes E4M3 or E5M2 with E8M0 block
 * scales in 1 x 32 blocks; NVFP4 codes E2M1 with E4M3 block scales in 1 x 16 blocks and fp32
 * globals), the arithmetic of the forward's quantized GEMM (dot.h) with every element pair.
 */
#ifndef PARITY_QUANT_TRAIN_GEMM_H
#define PARITY_QUANT_TRAIN_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "train_gemm_types.h"

/* The bytes of one operand's decoded form, rows x K with `block`-long blocks; and the decoding
 * of operand o's rows into d, whose k, scale and bad point into `bytes` of that size. */
size_t train_decoded_bytes(size_t rows, size_t K, size_t block);
void train_gemm_decode(const train_operand *o, size_t rows, size_t K, size_t block, void *bytes,
                       train_decoded *d);

/* The columns [n0, n1) (a and b decoded): per K block kb, ascending, d = the exact dot of the
 * codes' values rounded once to fp32; acc = acc + (d * sa) * sb in fp32; then, with globals,
 * y = RN(acc * RN(ga * gb)). A block holding a non-finite code (E4M3 NaN, E5M2 infinity or
 * NaN) in either operand gives d = NaN. */
train_columns_fn train_gemm_columns;
/* The entry the current CPU path runs: train_gemm_columns_avx512 (train_gemm_types.h) on the
 * avx512 and avx512bf16 paths, train_gemm_columns on the others. */
train_columns_fn *train_gemm_columns_entry(void);

#endif /* PARITY_QUANT_TRAIN_GEMM_H */
