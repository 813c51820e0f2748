/*
 * The quantized GEMM's column kernels, the GEMM entries of the format rows (rules.h): the
 * columns [n0, n1) of y = x W^T from the codes and scales of the activations and the weight.
 */
#ifndef PARITY_QUANT_DOT_H
#define PARITY_QUANT_DOT_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* One quantized GEMM: M rows of activations against the weight's N rows, K long. */
typedef struct quant_gemm_job {
    size_t M, K, nblocks, bc; /* nblocks blocks of bc along K (0 and 0 without blocks) */
    const quant_rule *rule;
    const uint8_t *xq;        /* [M][K] activation codes */
    const float *xs;          /* [M][nblocks] activation block scales */
    const float *xt;          /* [M] activation row scales (NVFP4 s2, ternary s_x) */
    const uint8_t *wq;        /* [N][w_row_bytes] weight codes as held (code_layout.h) */
    size_t w_row_bytes;       /* quant_weight_row_bytes(format, K) */
    union {                   /* the weight's block scales as held (quant_weight.h), */
        const float *ws;      /* w_grid_cols per row of the grid: fp32 values (scale_bytes 4), */
        const uint8_t *ws_codes; /* or the format's scale bytes (scale_bytes 1: E2M1) */
    };
    size_t w_grid_cols;
    float w_tensor_scale;     /* NVFP4's s2, ternary's s_w */
    float *y;
    size_t ldy;
} quant_gemm_job;

/* The block-scaled formats (E4M3 and E2M1 codes): per K block, the exact dot of the codes'
 * values rounded once to fp32, times the activation's and the weight's block scales, summed
 * in order in fp32; times both tensor scales where the format has them. */
void quant_gemm_blocked(const quant_gemm_job *job, size_t n0, size_t n1);
/* Ternary: the integer dot of int8 and ternary codes, divided by s_w s_x (in bf16 steps where
 * the rule computes in bf16). */
void quant_gemm_ternary(const quant_gemm_job *job, size_t n0, size_t n1);

#endif /* PARITY_QUANT_DOT_H */
