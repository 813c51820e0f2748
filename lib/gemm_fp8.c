/*
 * The fp8 GEMMs (parity.h, PARITY_GEMM_FP8_BLOCK and PARITY_GEMM_MXFP8): weights quantized once
 * per quantizer, activations quantized per token at each GEMM input with the same rule, and
 *   y[m][n] = sum over K blocks kb, ascending, in fp32: acc = acc + (d * a_s) * w_s
 * with d the block's dot product of the codes' values computed exactly and rounded once to
 * fp32. An E4M3 value is k * 2^-9 with k an integer, |k| <= 448 * 512 < 2^18, so a product of
 * two is an integer multiple of 2^-18 below 2^36 of them and a block sum (at most 128 terms)
 * an integer below 2^43: the sums of the integers k_a k_w are exact in double in any order, and
 * d = RN_fp32(sum * 2^-18). So the order of a block's terms is free; the order of the blocks
 * and of the scale products is the one above. This is one C implementation that every CPU
 * path runs (the codes and scales are integers and powers of two, not SIMD-specific values).
 * A NaN activation (whose code is 0x7f) makes the block's d NaN.
 */
#include <math.h>

#include "forward.h"
#include "internal.h"
#include "model.h"

/* k of every E4M3 code (value = k * 2^-9), as a double; NaN for the NaN codes. */
static double e4m3_k[256];
static pthread_once_t e4m3_k_once = PTHREAD_ONCE_INIT;

static void fill_e4m3_k(void) {
    for (int c = 0; c < 256; c++) {
        const int mag = c & 0x7f, e = mag >> 3, f = mag & 7;
        double k = mag == 0x7f ? NAN : e == 0 ? f : (double)((8 + f) << (e - 1));
        e4m3_k[c] = c & 0x80 ? -k : k;
    }
}

static size_t block_cols_of(int quantizer) { return quantizer >= PARITY_FP8Q_MX_OCP ? 32 : 128; }

fp8_weight *fp8_weight_alloc(parity_model *m, const weight *w, int quantizer) {
    const size_t bc = block_cols_of(quantizer);
    const uint64_t n = (uint64_t)w->rows * w->cols;
    const uint64_t grid = quantizer >= PARITY_FP8Q_MX_OCP
                              ? (uint64_t)w->rows * ((w->cols + bc - 1) / bc)
                              : (uint64_t)((w->rows + 127) / 128) * ((w->cols + bc - 1) / bc);
    fp8_weight *q = model_own(m, px_calloc(1, sizeof *q, "fp8 weight"));
    if (!q) return NULL;
    q->codes = model_own(m, px_weight_alloc(n, "fp8 weight codes"));
    q->scales = q->codes ? model_own(m, px_weight_alloc(grid * sizeof(float), "fp8 weight scales"))
                         : NULL;
    return q->scales ? q : NULL;
}

void fp8_weight_quantize(const weight *w, int quantizer, fp8_weight *q, float *scratch) {
    const size_t rows = w->rows, cols = w->cols;
    if (w->master) {
        fp8_quantize_rows(quantizer, rows, cols, w->master, cols, 128, q->codes, cols, q->scales);
        return;
    }
    /* bf16 values, widened (exactly) 128 rows at a time: one block row */
    const size_t bc = block_cols_of(quantizer);
    const size_t grid_cols = (cols + bc - 1) / bc;
    const int mx = quantizer >= PARITY_FP8Q_MX_OCP;
    for (size_t r0 = 0; r0 < rows; r0 += 128) {
        const size_t n = rows - r0 < 128 ? rows - r0 : 128;
        for (size_t i = 0; i < n * cols; i++) scratch[i] = bf16_to_f32(w->bf16[r0 * cols + i]);
        fp8_quantize_rows(quantizer, n, cols, scratch, cols, 128, q->codes + r0 * cols, cols,
                          q->scales + (mx ? r0 : r0 / 128) * grid_cols);
    }
}

/* ---- the GEMM ------------------------------------------------------------------------------ */

typedef struct fp8_job {
    size_t M, K, nblocks, bc;
    const uint8_t *xq;      /* [M][K] activation codes */
    const float *xs;        /* [M][nblocks] activation scales */
    const fp8_weight *w;
    size_t w_grid_cols;     /* weight scales per row of the scale grid */
    int mx;
    float *y;
    size_t ldy;
} fp8_job;

static void fp8_columns(void *p, size_t n0, size_t n1, unsigned worker) {
    (void)worker;
    const fp8_job *j = p;
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *wr = j->w->codes + n * j->K;
        const float *ws = j->w->scales + (j->mx ? n : n / 128) * j->w_grid_cols;
        for (size_t m = 0; m < j->M; m++) {
            const uint8_t *xr = j->xq + m * j->K;
            const float *xs = j->xs + m * j->nblocks;
            float acc = 0.0f;
            for (size_t kb = 0; kb < j->nblocks; kb++) {
                const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
                /* exact: integers below 2^43 (the file's comment), so any order */
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                size_t k = k0;
                for (; k + 4 <= k1; k += 4) {
                    s0 += e4m3_k[xr[k]] * e4m3_k[wr[k]];
                    s1 += e4m3_k[xr[k + 1]] * e4m3_k[wr[k + 1]];
                    s2 += e4m3_k[xr[k + 2]] * e4m3_k[wr[k + 2]];
                    s3 += e4m3_k[xr[k + 3]] * e4m3_k[wr[k + 3]];
                }
                for (; k < k1; k++) s0 += e4m3_k[xr[k]] * e4m3_k[wr[k]];
                const float d = (float)(((s0 + s1) + (s2 + s3)) * 0x1p-18);
                acc = acc + (d * xs[kb]) * ws[kb];
            }
            j->y[m * j->ldy + n] = acc;
        }
    }
}

void linear_fp8(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, const weight *w,
                const fp8_weight *wq, const float *bias, float *y, size_t ldy) {
    pthread_once(&e4m3_k_once, fill_e4m3_k);
    const int q = ctx->pol.quantizer, mx = ctx->pol.gemm == PARITY_GEMM_MXFP8;
    const size_t K = w->cols, N = w->rows, bc = block_cols_of(q);
    const size_t nblocks = (K + bc - 1) / bc;
    /* the activations' codes and scales in the GEMM scratch (room for M x K floats) */
    uint8_t *xq = (uint8_t *)ctx->s->gemm.xpack;
    float *xs = (float *)(void *)(xq + (M * K + 63) / 64 * 64);
    fp8_quantize_rows(q, M, K, x, ldx, 1, xq, K, xs);
    fp8_job j = {M, K, nblocks, bc, xq, xs, wq, nblocks, mx, y, ldy};
    pool_run(ctx->pool, fp8_columns, &j, N);
    if (bias)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) y[m * ldy + n] += bias[n];
}
