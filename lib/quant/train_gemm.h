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

/* An operand's element codes (one a byte). */
enum { TRAIN_E4M3, TRAIN_E5M2, TRAIN_E2M1 };

/* One operand: rows of k codes quantized along k, rows `codes_stride` apart. */
typedef struct train_operand {
    int element;              /* TRAIN_E4M3, TRAIN_E5M2, TRAIN_E2M1 */
    const uint8_t *codes;
    size_t codes_stride;
    const uint8_t *scales;    /* E8M0 bytes (E4M3 and E5M2 codes) or E4M3 codes (E2M1) */
    size_t scales_stride;     /* bytes between two rows of the scale grid */
    size_t scale_rows;        /* rows that share a row of the grid: 1, or 16 (16 x 16 blocks) */
    const float *globals;     /* E2M1: the fp32 global scale(s); NULL for the others */
    int per_row_globals;      /* 1: globals[row], 0: globals[0] */
} train_operand;

/* An operand decoded for the kernel (train_gemm_decode): each code's integer k (value = k *
 * 2^unit_exp), each block's scale value, and whether the block holds a non-finite code. */
typedef struct train_decoded {
    int64_t *k;               /* [rows][K] */
    float *scale;             /* [rows][nblocks] */
    uint8_t *bad;             /* [rows][nblocks] */
    int unit_exp;
} train_decoded;

/* y[m][n] for m < M and the columns n of [n0, n1) of the job. */
typedef struct train_gemm_job {
    size_t M, N, K;
    size_t block;             /* 32 (MX) or 16 (NVFP4) */
    train_operand a, b;       /* a: M rows, b: N rows, both K long */
    train_decoded da, db;     /* their decoded forms (train_gemm_decode) */
    float *y;
    size_t ldy;
} train_gemm_job;

/* The bytes of one operand's decoded form, rows x K with `block`-long blocks; and the decoding
 * of operand o's rows into d, whose k, scale and bad point into `bytes` of that size. */
size_t train_decoded_bytes(size_t rows, size_t K, size_t block);
void train_gemm_decode(const train_operand *o, size_t rows, size_t K, size_t block, void *bytes,
                       train_decoded *d);

/* The columns [n0, n1) (a and b decoded): per K block kb, ascending, d = the exact dot of the
 * codes' values rounded once to fp32; acc = acc + (d * sa) * sb in fp32; then, with globals,
 * y = RN(acc * RN(ga * gb)). A block holding a non-finite code (E4M3 NaN, E5M2 infinity or
 * NaN) in either operand gives d = NaN. */
typedef void train_columns_fn(const train_gemm_job *job, size_t n0, size_t n1);
train_columns_fn train_gemm_columns;
/* The same columns compiled for AVX-512 (F, DQ: the int64 block sums vectorized), the same
 * bits (exact integer sums); and the entry the current CPU path runs: that variant on the
 * avx512 and avx512bf16 paths, train_gemm_columns on the others. */
train_columns_fn train_gemm_columns_avx512;
train_columns_fn *train_gemm_columns_entry(void);

#endif /* PARITY_QUANT_TRAIN_GEMM_H */
