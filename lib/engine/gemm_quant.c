/*
 * The quantized GEMMs (parity.h, PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY). The fp8 ones
 * (PARITY_GEMM_FP8_BLOCK and PARITY_GEMM_MXFP8): weights quantized once
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
 *
 * The 4-bit ones: an E2M1 value is k * 2^-1 with |k| <= 12, so a product is a multiple of 2^-2
 * below 36 and a block of 16 or 32 sums exactly (the same double sums, any order). NVFP4:
 * acc = acc + (d * sfa) * sfw, exact per term (d has at most 12 significant bits, each E4M3
 * scale 4), y = RN(acc * RN(s2a * s2w)). MXFP4: as MXFP8. Ternary: the integer dot of the
 * int8 and ternary codes, exact in int64; y = RN(D / RN(s_w * s_x)), or its bf16 steps under
 * "hf-bitlinear". Activations are never NaN here: the forward refuses NaN weights at load,
 * and an activation NaN quantizes as its rule computes it (E2M1 saturates, int8 clamps).
 */
#include <math.h>

#include "gemm_quant.h"
#include "base/internal.h"
#include "model/model.h"

/* k of every E4M3 code (value = k * 2^-9) and of every E2M1 code (value = k * 2^-1), as a
 * double; NaN for the E4M3 NaN codes. */
static double e4m3_k[256], e2m1_k[16];
static pthread_once_t k_once = PTHREAD_ONCE_INIT;

static void fill_k(void) {
    for (int c = 0; c < 256; c++) {
        const int mag = c & 0x7f, e = mag >> 3, f = mag & 7;
        double k = mag == 0x7f ? NAN : e == 0 ? f : (double)((8 + f) << (e - 1));
        e4m3_k[c] = c & 0x80 ? -k : k;
    }
    static const double mag[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    for (int c = 0; c < 16; c++) e2m1_k[c] = c & 8 ? -mag[c & 7] : mag[c & 7];
}

static int is_fp8_rule(int quantizer) { return quantizer <= PARITY_FP8Q_MX_RCEIL; }

/* The scale grid of a quantizer for a rows x cols weight. */
static uint64_t grid_of(int quantizer, uint64_t rows, uint64_t cols) {
    const uint64_t bc = quant_block_cols(quantizer);
    if (!bc) return 1;
    if (quantizer <= PARITY_FP8Q_TE_POW2) return ((rows + 127) / 128) * ((cols + bc - 1) / bc);
    return rows * ((cols + bc - 1) / bc);
}

quant_weight *quant_weight_alloc(parity_model *m, const weight *w, int quantizer) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    quant_weight *q = model_own(m, px_calloc(1, sizeof *q, "quantized weight"));
    if (!q) return NULL;
    q->codes = model_own(m, px_huge_alloc(n, "quantized weight codes"));
    q->scales = q->codes ? model_own(m, px_huge_alloc(grid_of(quantizer, w->rows, w->cols) *
                                                          sizeof(float), "quantized weight scales"))
                         : NULL;
    return q->scales ? q : NULL;
}

size_t quant_scratch_floats(const weight *w, int quantizer) {
    if (w->master) return 0;
    return is_fp8_rule(quantizer) ? 128 * (size_t)w->cols : (size_t)w->rows * w->cols;
}

void quant_weight_quantize(const weight *w, int quantizer, quant_weight *q, float *scratch) {
    const size_t rows = w->rows, cols = w->cols;
    if (!is_fp8_rule(quantizer)) {
        /* the per-tensor rules read the whole tensor: the master, or the bf16 values widened */
        const float *src = w->master;
        if (!src) {
            for (size_t i = 0; i < rows * cols; i++) scratch[i] = bf16_to_f32(w->bf16[i]);
            src = scratch;
        }
        quant4_weight(quantizer, rows, cols, src, cols, q->codes, cols, q->scales, &q->tensor_scale);
        return;
    }
    q->tensor_scale = 0.0f;
    if (w->master) {
        fp8_quantize_rows(quantizer, rows, cols, w->master, cols, 128, q->codes, cols, q->scales);
        return;
    }
    /* bf16 values, widened (exactly) 128 rows at a time: one block row */
    const size_t bc = quant_block_cols(quantizer);
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

typedef struct quant_job {
    size_t M, K, nblocks, bc;
    int quantizer, format;
    const uint8_t *xq;      /* [M][K] activation codes */
    const float *xs;        /* [M][nblocks] activation block scales */
    const float *xt;        /* [M] activation row scales (NVFP4 s2, ternary s_x) */
    const quant_weight *w;
    size_t w_grid_cols;     /* weight scales per row of the scale grid */
    float *y;
    size_t ldy;
} quant_job;

/* The exact block dot of two code runs with the value table k (E4M3 or E2M1), as a double. */
static double block_dot(const double *k, const uint8_t *xr, const uint8_t *wr, size_t k0, size_t k1) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = k0;
    for (; i + 4 <= k1; i += 4) {
        s0 += k[xr[i]] * k[wr[i]];
        s1 += k[xr[i + 1]] * k[wr[i + 1]];
        s2 += k[xr[i + 2]] * k[wr[i + 2]];
        s3 += k[xr[i + 3]] * k[wr[i + 3]];
    }
    for (; i < k1; i++) s0 += k[xr[i]] * k[wr[i]];
    return (s0 + s1) + (s2 + s3);
}

static void blocked_columns(const quant_job *j, size_t n0, size_t n1) {
    const int fp4 = j->format == PARITY_GEMM_NVFP4 || j->format == PARITY_GEMM_MXFP4;
    const double *k = fp4 ? e2m1_k : e4m3_k;
    const double unit = fp4 ? 0x1p-2 : 0x1p-18;
    const int per_row = j->format != PARITY_GEMM_FP8_BLOCK;
    for (size_t n = n0; n < n1; n++) {
        const uint8_t *wr = j->w->codes + n * j->K;
        const float *ws = j->w->scales + (per_row ? n : n / 128) * j->w_grid_cols;
        for (size_t m = 0; m < j->M; m++) {
            const uint8_t *xr = j->xq + m * j->K;
            const float *xs = j->xs + m * j->nblocks;
            float acc = 0.0f;
            for (size_t kb = 0; kb < j->nblocks; kb++) {
                const size_t k0 = kb * j->bc, k1 = k0 + j->bc < j->K ? k0 + j->bc : j->K;
                const float d = (float)(block_dot(k, xr, wr, k0, k1) * unit);
                acc = acc + (d * xs[kb]) * ws[kb];
            }
            if (j->format == PARITY_GEMM_NVFP4) acc = acc * (j->xt[m] * j->w->tensor_scale);
            j->y[m * j->ldy + n] = acc;
        }
    }
}

static void ternary_columns(const quant_job *j, size_t n0, size_t n1) {
    const int bf16_steps = j->quantizer == PARITY_QUANT_TERNARY_HF_BITLINEAR;
    for (size_t n = n0; n < n1; n++) {
        const int8_t *wr = (const int8_t *)(const void *)(j->w->codes + n * j->K);
        for (size_t m = 0; m < j->M; m++) {
            const int8_t *xr = (const int8_t *)(const void *)(j->xq + m * j->K);
            int64_t d = 0;
            for (size_t i = 0; i < j->K; i++) d += (int32_t)xr[i] * wr[i];
            float y;
            if (bf16_steps)
                y = round_bf16(round_bf16((float)d) / round_bf16(j->w->tensor_scale * j->xt[m]));
            else
                y = (float)d / (j->w->tensor_scale * j->xt[m]);
            j->y[m * j->ldy + n] = y;
        }
    }
}

static void quant_columns(void *p, size_t n0, size_t n1, unsigned worker) {
    (void)worker;
    const quant_job *j = p;
    if (j->format == PARITY_GEMM_TERNARY) ternary_columns(j, n0, n1);
    else blocked_columns(j, n0, n1);
}

void linear_quantized(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx, const weight *w,
                      const quant_weight *wq, const float *bias, float *y, size_t ldy) {
    pthread_once(&k_once, fill_k);
    const int q = ctx->pol.quantizer, format = ctx->pol.gemm;
    const size_t K = w->cols, N = w->rows, bc = quant_block_cols(q);
    const size_t nblocks = bc ? (K + bc - 1) / bc : 0;
    /* the activations' codes and scales in the GEMM scratch (linear_quantized_scratch bytes) */
    uint8_t *xq = (uint8_t *)ctx->s->gemm.xpack;
    float *xs = (float *)(void *)(xq + (M * K + 63) / 64 * 64);
    float *xt = xs + M * nblocks;
    if (is_fp8_rule(q))
        fp8_quantize_rows(q, M, K, x, ldx, 1, xq, K, xs);
    else
        quant4_activations(q, M, K, x, ldx, xq, K, xs, xt);
    quant_job j = {M, K, nblocks, bc, q, format, xq, xs, xt, wq, nblocks, y, ldy};
    pool_run(ctx->pool, quant_columns, &j, N);
    if (!is_fp8_rule(q))
        /* E2M1 and int8 have no NaN: a row holding a NaN or an infinity yields NaN, as an
         * E4M3 NaN code does in the fp8 GEMMs, rather than the codes its saturation gives */
        for (size_t m = 0; m < M; m++)
            for (size_t i = 0; i < K; i++)
                if (!isfinite(x[m * ldx + i])) {
                    for (size_t c = 0; c < N; c++) y[m * ldy + c] = NAN;
                    break;
                }
    if (bias)
        for (size_t m = 0; m < M; m++)
            for (size_t n = 0; n < N; n++) y[m * ldy + n] += bias[n];
}

size_t linear_quantized_scratch(int quantizer, size_t M, size_t K) {
    const size_t bc = quant_block_cols(quantizer), nblocks = bc ? (K + bc - 1) / bc : 0;
    return (M * K + 63) / 64 * 64 + (M * nblocks + M) * sizeof(float);
}
