/*
 * The quantized GEMM's column kernels (dot.h), which engine/gemm_quant.c runs over the thread
 * pool. The arithmetic: an E4M3 value is k * 2^-9 with k an integer, |k| <= 448 * 512 < 2^18,
 * so a product of two is an integer multiple of 2^-18 below 2^36 of them and a block sum (at
 * most 128 terms) an integer below 2^43: the sums of the integers k_a k_w are exact in double
 * in any order, and d = RN_fp32(sum * 2^-18). An E2M1 value is k * 2^-1 with |k| <= 12, so a
 * product is a multiple of 2^-2 below 36 and a block of 16 or 32 sums exactly the same way.
 * So the order of a block's terms is free; the order of the blocks and of the scale products
 * is fixed: acc = acc + (d * a_s) * w_s over the blocks, ascending, in fp32 (exact per term
 * for NVFP4: d has at most 12 significant bits, each E4M3 scale 4), then NVFP4's
 * y = RN(acc * RN(s2a * s2w)). Ternary: the integer dot of the int8 and ternary codes, exact in
 * int64 (its weight codes held four a byte, code_layout.h, unpacked a block at a time);
 * y = RN(D / RN(s_w * s_x)), or its bf16 steps under "hf-bitlinear". This is one C
 * implementation that every CPU path runs (the codes and scales are integers and powers of
 * two, not SIMD-specific values). A NaN activation (whose E4M3 code is 0x7f) makes the block's
 * d NaN.
 */
#include <pthread.h>

#include "dot.h"

#include "base/floats.h"
#include "code_layout.h"
#include "codecs.h"

/* k of every E4M3 code (value = k * 2^-9) and of every E2M1 code (value = k * 2^-1), as a
 * double (exact); NaN for the E4M3 NaN codes. */
static double e4m3_k[256], e2m1_k[16];
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

static void fill_k(void) {
    for (int c = 0; c < 256; c++) e4m3_k[c] = (double)e4m3_to_f32((uint8_t)c) * 0x1p9;
    for (int c = 0; c < 16; c++) e2m1_k[c] = (double)e2m1_to_f32((uint8_t)c) * 2.0;
}

/* The exact dot of n codes of x and of w with the value table k (E4M3 or E2M1), as a double. */
static double block_dot(const double *k, const uint8_t *x, const uint8_t *w, size_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += k[x[i]] * k[w[i]];
        s1 += k[x[i + 1]] * k[w[i + 1]];
        s2 += k[x[i + 2]] * k[w[i + 2]];
        s3 += k[x[i + 3]] * k[w[i + 3]];
    }
    for (; i < n; i++) s0 += k[x[i]] * k[w[i]];
    return (s0 + s1) + (s2 + s3);
}

/* The codes a packed weight row is unpacked by at once (a whole number of every format's
 * blocks: 16, 32 and 128 divide it). */
enum { UNPACKED_CODES = 1024 };

void quant_gemm_blocked(const quant_gemm_job *j, size_t n0, size_t n1) {
    pthread_once(&k_once, fill_k);
    const quant_format *f = j->rule->format;
    const int fp4 = f->element == QUANT_ELEMENT_E2M1;
    const double *k = fp4 ? e2m1_k : e4m3_k;
    const double unit = fp4 ? 0x1p-2 : 0x1p-18;
    /* codes held one a byte (E4M3) are read in place, a whole row at once; packed ones (E2M1,
     * two a byte) are unpacked UNPACKED_CODES at a time, each output's fp32 chain kept in y
     * between the spans */
    const int packed = f->code_bits == 4;
    const size_t span = packed ? UNPACKED_CODES : j->K;
    uint8_t unpacked[UNPACKED_CODES];
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *held = j->wq + n * j->w_row_bytes;
        const size_t ws0 = (n / f->block_rows) * j->w_grid_cols;
        size_t c0 = 0;
        do {
            const size_t c1 = j->K - c0 < span ? j->K : c0 + span;
            const uint8_t *wr = held + c0;
            if (packed) {
                quant_nibbles_unpack(held, c0, c1, unpacked);
                wr = unpacked;
            }
            for (size_t m = 0; m < j->M; m++) {
                const uint8_t *xr = j->xq + m * j->K;
                const float *xs = j->xs + m * j->nblocks;
                float *y = &j->y[m * j->ldy + n];
                float acc = c0 == 0 ? 0.0f : *y;
                for (size_t kb = c0 / j->bc; kb < j->nblocks && kb * j->bc < c1; kb++) {
                    const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
                    const float d = (float)(block_dot(k, xr + k0, wr + (k0 - c0), k1 - k0) * unit);
                    const float w_s = f->scale_bytes == 1
                                          ? quant_scale_value(f, j->ws_codes[ws0 + kb])
                                          : j->ws[ws0 + kb];
                    acc = acc + (d * xs[kb]) * w_s;
                }
                if (c1 == j->K && f->has_tensor_scale) acc = acc * (j->xt[m] * j->w_tensor_scale);
                *y = acc;
            }
            c0 = c1;
        } while (c0 < j->K);
    }
}

/* The portable ternary kernel unpacks a weight row's held codes this many at a time (whole
 * groups of 64) into int8 on its stack, and runs them against this many activation rows at
 * once, each row's integer sum kept in int64. */
#define TERNARY_UNPACK_CODES 2048
#define TERNARY_UNPACK_ROWS 64

void quant_gemm_ternary(const quant_gemm_job *j, size_t n0, size_t n1) {
    const int bf16_steps = j->rule->tensor_scale == QUANT_SCALE_BF16;
    int8_t w[TERNARY_UNPACK_CODES];
    int64_t d[TERNARY_UNPACK_ROWS];
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *held = j->wq + n * j->w_row_bytes;
        for (size_t m0 = 0; m0 < j->M; m0 += TERNARY_UNPACK_ROWS) {
            const size_t rows = j->M - m0 < TERNARY_UNPACK_ROWS ? j->M - m0 : TERNARY_UNPACK_ROWS;
            for (size_t r = 0; r < rows; r++) d[r] = 0;
            for (size_t k0 = 0; k0 < j->K; k0 += TERNARY_UNPACK_CODES) {
                const size_t len =
                    j->K - k0 < TERNARY_UNPACK_CODES ? j->K - k0 : TERNARY_UNPACK_CODES;
                quant_ternary_groups_unpack(held + k0 / 4, (len + 63) / 64, w);
                for (size_t r = 0; r < rows; r++) {
                    const int8_t *xr =
                        (const int8_t *)(const void *)(j->xq + (m0 + r) * j->K + k0);
                    /* at most 2048 products of magnitude at most 128: exact in int32 */
                    int32_t s = 0;
                    for (size_t i = 0; i < len; i++) s += (int32_t)xr[i] * w[i];
                    d[r] += s;
                }
            }
            for (size_t r = 0; r < rows; r++) {
                const size_t m = m0 + r;
                float y;
                if (bf16_steps)
                    y = round_bf16(round_bf16((float)d[r]) /
                                   round_bf16(j->w_tensor_scale * j->xt[m]));
                else
                    y = (float)d[r] / (j->w_tensor_scale * j->xt[m]);
                j->y[m * j->ldy + n] = y;
            }
        }
    }
}
