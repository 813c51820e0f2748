/*
 * The types of the training GEMM (train_gemm.h has its entries, train_gemm_kernel.h its column
 * loop): an operand as the caller gives it, its decoded form, a job, a column kernel.
 */
#ifndef PARITY_QUANT_TRAIN_GEMM_TYPES_H
#define PARITY_QUANT_TRAIN_GEMM_TYPES_H

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

/* A column kernel: the columns [n0, n1) of the job (train_gemm.h, train_gemm_columns). The
 * AVX-512 one (train_gemm_avx512.c: this loop compiled with AVX-512 F/BW/VL/DQ, the int64 block
 * sums vectorized with vpmullq) has the portable one's bits (every block sum an exact integer). */
typedef void train_columns_fn(const train_gemm_job *job, size_t n0, size_t n1);
train_columns_fn train_gemm_columns_avx512;

#endif /* PARITY_QUANT_TRAIN_GEMM_TYPES_H */
