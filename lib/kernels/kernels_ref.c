/*
 * The portable kernels: the specification of every kernel table (see kernels.h).
 *
 * Written to be read, not to be fast: plain loops that follow the summation orders
 * literally (16 lane accumulators, element i in lane i % 16, then the fold), one IEEE
 * operation per step in the order written. Every other table must reproduce these bits;
 * when in doubt about what a SIMD kernel has to compute, this file is the answer.
 *
 * The file must be compiled with -ffp-contract=off (the project sets it): a compiler that
 * fused a*b+c into an fma here would change the specification.
 */
#include <math.h>

#include "base/floats.h"
#include "kernel_common.h"
#include "kernels.h"

/* ---- exp -------------------------------------------------------------------------------- */

/* The constants are in kernel_common.h, shared with every table. */

/*
 * x = n ln2 + r, |r| <= ln2 / 2 (a little more when x * log2e rounds across a half):
 * n = rint(x * log2e), r = x - n * ln2 in two fmaf steps (Cody-Waite with an fp32 hi/lo
 * split of ln2); exp(x) = p(r) * 2^n. The scale is applied in two steps, 2^n1 then 2^n2
 * with n1 = floor(n / 2) and n2 = n - n1, both within [-75, 64]: 2^n1 and 2^n2 are normal
 * fp32 values, p * 2^n1 is exact, and the second product rounds once. That gives the right
 * overflow at the top (n = 128) and gradual subnormals at the bottom (n = -150) without a
 * branch on n, which is what lets a SIMD table run the same operations on every lane.
 *
 * Measured against (float)exp((double)x) over every fp32 in [-104, 89] (test_kernels):
 * max error 1 ulp, 99.55% correctly rounded.
 */
float parity_expf(float x) {
    if (isnan(x)) return x + x;  /* quiet NaN, payload kept: what vaddps does */
    if (x > EXP_HI) return INFINITY;
    if (x < EXP_LO) return 0.0f;

    float t = x * LOG2E;
    float n = (t + ROUND_MAGIC) - ROUND_MAGIC;
    float r = fmaf(-n, LN2_HI, x);
    r = fmaf(-n, LN2_LO, r);

    float p = EXP_C7;
    p = fmaf(p, r, EXP_C6);
    p = fmaf(p, r, EXP_C5);
    p = fmaf(p, r, EXP_C4);
    p = fmaf(p, r, EXP_C3);
    p = fmaf(p, r, EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);

    /* n is in [-150, 128]; floor(n / 2) on the biased, non-negative n (kernel_common.h) */
    int32_t ni = (int32_t)n;
    int32_t n1 = (int32_t)((uint32_t)(ni + EXP_SCALE_BIAS) >> 1) - EXP_SCALE_BIAS / 2;
    int32_t n2 = ni - n1;
    float s1 = f32_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = f32_from_bits((uint32_t)(n2 + 127) << 23);
    return (p * s1) * s2;
}

/* silu(g) = g / (1 + exp(-g)), the division last: the form every table computes. */
static float silu(float g) { return g / (1.0f + parity_expf(-g)); }

/* ---- dot16 ------------------------------------------------------------------------------ */

/* The dot16 fold: lane l += lane l + 8 (l < 8), then l + 4, l + 2, l + 1; lane 0 is the
 * result. A SIMD table holds lanes 0..7 and 8..15 in two registers, so the first step is
 * one vector add. */
static float fold16(float acc[16]) {
    for (int l = 0; l < 8; l++) acc[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) acc[l] = acc[l] + acc[l + 4];
    for (int l = 0; l < 2; l++) acc[l] = acc[l] + acc[l + 2];
    acc[0] = acc[0] + acc[1];
    return acc[0];
}

static float dot_f32_ref(const float *a, const float *b, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i++) acc[i % 16] = fmaf(a[i], b[i], acc[i % 16]);
    return fold16(acc);
}

static float dot_f32_bf16_ref(const float *a, const uint16_t *b, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i++) acc[i % 16] = fmaf(a[i], bf16_to_f32(b[i]), acc[i % 16]);
    return fold16(acc);
}

static void dots_f32_bf16_ref(const float *a, size_t lda, size_t queries, const uint16_t *b,
                              size_t ldb, size_t count, size_t n, float *out, size_t ldo) {
    for (size_t q = 0; q < queries; q++)
        for (size_t j = 0; j < count; j++) out[q * ldo + j] = dot_f32_bf16_ref(a + q * lda, b + j * ldb, n);
}

static void dots_f32_ref(const float *a, size_t lda, size_t queries, const float *b, size_t ldb,
                         size_t count, size_t n, float *out, size_t ldo) {
    for (size_t q = 0; q < queries; q++)
        for (size_t j = 0; j < count; j++) out[q * ldo + j] = dot_f32_ref(a + q * lda, b + j * ldb, n);
}

static float sum_squares_ref(const float *x, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i++) acc[i % 16] = fmaf(x[i], x[i], acc[i % 16]);
    return fold16(acc);
}

static float sum_exp_ref(const float *x, size_t n, float m, float *out) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i++) {
        float e = parity_expf(x[i] - m);
        if (out) out[i] = e;
        acc[i % 16] = acc[i % 16] + e;
    }
    return fold16(acc);
}

/* max in dot16 order with the step m = (x > m) ? x : m (what vmaxps(x, m) computes), every
 * lane starting at x[0]. Hence a NaN is the result only if x[0] is NaN (comparisons with
 * NaN are false), and which zero wins among +0 and -0 depends on the lanes: both are fixed
 * by this definition, not by the order of a scan. */
static float max_f32_ref(const float *x, size_t n) {
    float acc[16];
    for (int l = 0; l < 16; l++) acc[l] = x[0];
    for (size_t i = 0; i < n; i++) acc[i % 16] = x[i] > acc[i % 16] ? x[i] : acc[i % 16];
    for (int step = 8; step >= 1; step /= 2)
        for (int l = 0; l < step; l++) acc[l] = acc[l + step] > acc[l] ? acc[l + step] : acc[l];
    return acc[0];
}

/* ---- elementwise ------------------------------------------------------------------------ */

static void round_bf16_ref(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = round_bf16(x[i]);
}

static void round_fp16_ref(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = round_fp16(x[i]);
}

static void exp_f32_ref(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = parity_expf(x[i]);
}

static void axpy_f32_ref(float *o, float p, const float *v, size_t n) {
    for (size_t i = 0; i < n; i++) o[i] = fmaf(p, v[i], o[i]);
}

static void axpy_bf16_ref(float *o, float p, const uint16_t *v, size_t n) {
    for (size_t i = 0; i < n; i++) o[i] = fmaf(p, bf16_to_f32(v[i]), o[i]);
}

static void pv_bf16_ref(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                        const uint16_t *v, size_t ldv, size_t count, size_t n) {
    for (size_t q = 0; q < queries; q++)
        for (size_t j = 0; j < count; j++) axpy_bf16_ref(o + q * ldo, p[q * ldp + j], v + j * ldv, n);
}

static void pv_f32_ref(float *o, size_t ldo, const float *p, size_t ldp, size_t queries,
                       const float *v, size_t ldv, size_t count, size_t n) {
    for (size_t q = 0; q < queries; q++)
        for (size_t j = 0; j < count; j++) axpy_f32_ref(o + q * ldo, p[q * ldp + j], v + j * ldv, n);
}

static void widen_bf16_ref(const uint16_t *src, size_t n, float *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

/* ---- GEMM ------------------------------------------------------------------------------- */

void gemm_pack_x(size_t M, size_t K, const float *x, size_t ldx, float *xp) {
    size_t row = gemm_packed_row(K);
    for (size_t m = 0; m < M; m++) {
        const float *xm = x + m * ldx;
        float *pm = xp + m * row;
        for (size_t c = 0; c < row / 32; c++) {
            for (size_t l = 0; l < 16; l++) {
                size_t k0 = 32 * c + 2 * l, k1 = k0 + 1;
                pm[32 * c + l] = k0 < K ? xm[k0] : 0.0f;
                pm[32 * c + 16 + l] = k1 < K ? xm[k1] : 0.0f;
            }
        }
    }
}

/* ---- pair32 ------------------------------------------------------------------------------ */

/* A denormal operand read as a zero of its sign (DAZ). */
static float daz(float v) { return fabsf(v) < 0x1p-126f ? copysignf(0.0f, v) : v; }

/* fmaf(a, b, c) as pair32 computes it (kernels.h): operands through daz, and a result that
 * is tiny after rounding flushed to a zero of its sign (FTZ). |r| < 2^-126 is tiny in any
 * case. |r| = 2^-126 may be the gradual-underflow rounding of an exact value whose rounding
 * to 24 bits (exponent unbounded) lies below 2^-126: the same fma scaled by 2^24 (exact,
 * and far from the denormals) rounds as the unbounded exponent would and tells. The scale
 * goes on the operand that cannot overflow: an r this small with |a| >= 2^100 means
 * |b| < 2^28 (|c| >= 2^100 cannot give it: a*b would have to cancel c to below 2^-125). */
static float fma_flushed(float a, float b, float c) {
    a = daz(a), b = daz(b), c = daz(c);
    const float r = fmaf(a, b, c);
    if (fabsf(r) < 0x1p-126f) return copysignf(0.0f, r);
    if (fabsf(r) == 0x1p-126f) {
        const float s = fabsf(a) < 0x1p100f ? fmaf(a * 0x1p24f, b, c * 0x1p24f)
                                            : fmaf(a, b * 0x1p24f, c * 0x1p24f);
        if (fabsf(s) < 0x1p-102f) return copysignf(0.0f, r);
    }
    return r;
}

/* The dot16 fold with every add as pair32's: a + b = fma_flushed(a, 1, b). */
static float fold16_flushed(float acc[16]) {
    for (int step = 8; step >= 1; step /= 2)
        for (int l = 0; l < step; l++) acc[l] = fma_flushed(acc[l], 1.0f, acc[l + step]);
    return acc[0];
}

/* pair32: lane l of chunk c takes (k0 = 32c + 2l, k1 = k0 + 1), odd element first. */
static void gemm_bf16w_ref(size_t M, size_t K, const float *xp, const uint16_t *w, size_t ldw,
                           float *y, size_t ldy, size_t n0, size_t n1) {
    size_t row = gemm_packed_row(K);
    for (size_t m = 0; m < M; m++) {
        const float *xm = xp + m * row;
        for (size_t n = n0; n < n1; n++) {
            const uint16_t *wn = w + n * ldw;
            float acc[16] = {0};
            for (size_t c = 0; c < row / 32; c++) {
                for (size_t l = 0; l < 16; l++) {
                    size_t k0 = 32 * c + 2 * l, k1 = k0 + 1;
                    const float *xc = xm + 32 * c;
                    if (k1 < K) acc[l] = fma_flushed(xc[16 + l], bf16_to_f32(wn[k1]), acc[l]);
                    if (k0 < K) acc[l] = fma_flushed(xc[l], bf16_to_f32(wn[k0]), acc[l]);
                }
            }
            y[m * ldy + n] = fold16_flushed(acc);
        }
    }
}

void gemm_pack_xt_row(size_t M, size_t K, const float *x, size_t ldx, float *tile, size_t t,
                      size_t c, size_t r) {
    const size_t nc = gemm_packed_row(K) / 32, m = t * GEMM_XT_ROWS + r;
    const float *xc = x + m * ldx + 32 * c;
    const size_t n = m < M ? (K - 32 * c < 32 ? K - 32 * c : 32) : 0;
    for (size_t l = 0; l < 16; l++) {
        float *at = tile + (l * nc + c) * 2 * GEMM_XT_ROWS + r;
        at[0] = 2 * l + 1 < n ? xc[2 * l + 1] : 0.0f;
        at[GEMM_XT_ROWS] = 2 * l < n ? xc[2 * l] : 0.0f;
    }
}

void gemm_pack_xt_tiles(size_t M, size_t K, const float *x, size_t ldx, float *xt, size_t t0,
                        size_t t1) {
    const size_t row = gemm_packed_row(K), nc = row / 32;
    /* chunk by chunk: the 16 rows' 32 elements of chunk c fill 16 blocks of 32 floats (one per
     * lane), all within 2 KB */
    for (size_t t = t0; t < t1; t++)
        for (size_t c = 0; c < nc; c++)
            for (size_t r = 0; r < GEMM_XT_ROWS; r++)
                gemm_pack_xt_row(M, K, x, ldx, xt + t * GEMM_XT_ROWS * row, t, c, r);
}

/* The specification read from the lane-major layout (the panel is not needed here). */
static void gemm_bf16w_tiles_ref(size_t M, size_t K, const float *xt, const uint16_t *w,
                                 size_t ldw, float *y, size_t ldy, size_t n0, size_t n1,
                                 float *panel) {
    (void)panel;
    const size_t row = gemm_packed_row(K), nc = row / 32;
    for (size_t m = 0; m < M; m++) {
        const float *tile = xt + m / GEMM_XT_ROWS * GEMM_XT_ROWS * row + m % GEMM_XT_ROWS;
        for (size_t n = n0; n < n1; n++) {
            const uint16_t *wn = w + n * ldw;
            float acc[16] = {0};
            for (size_t c = 0; c < nc; c++)
                for (size_t l = 0; l < 16; l++) {
                    const size_t k0 = 32 * c + 2 * l, k1 = k0 + 1;
                    const float *at = tile + (l * nc + c) * 2 * GEMM_XT_ROWS;
                    if (k1 < K) acc[l] = fma_flushed(at[0], bf16_to_f32(wn[k1]), acc[l]);
                    if (k0 < K) acc[l] = fma_flushed(at[GEMM_XT_ROWS], bf16_to_f32(wn[k0]), acc[l]);
                }
            y[m * ldy + n] = fold16_flushed(acc);
        }
    }
}

static void gemm_f32w_ref(size_t M, size_t K, const float *x, size_t ldx, const float *w,
                          size_t ldw, float *y, size_t ldy, size_t n0, size_t n1) {
    for (size_t m = 0; m < M; m++)
        for (size_t n = n0; n < n1; n++) y[m * ldy + n] = dot_f32_ref(x + m * ldx, w + n * ldw, K);
}

/* ---- regions ---------------------------------------------------------------------------- */

/* A rounding point: to the format the policy names there (kernel_common.h), or not at all. */
static float round_if(int fmt, float x) {
    return fmt == FMT_BF16 ? round_bf16(x) : fmt == FMT_FP16 ? round_fp16(x) : x;
}

static void scale_round_ref(float *x, size_t n, float scale, int before, int after, float *max) {
    for (size_t i = 0; i < n; i++) x[i] = round_if(after, round_if(before, x[i]) * scale);
    if (max) *max = max_f32_ref(x, n);
}

/* The policy decoded into rounding points (norm_points_of, swiglu_points_of,
 * rope_points_of) and inv_rms: kernel_common.h, shared with every table. */

/* One normalised output, rounded per the policy. */
static float norm_value(norm_points p, float w, float v, float r) {
    return round_if(p.out, w * round_if(p.twice, v * r));
}

static float swiglu_value(op_points p, float g, float u) {
    return round_if(p.out, round_if(p.per_op, silu(g)) * u);
}

/* The rotate-half pair (a, b) = (x[i], x[i + hd/2]) becomes (a c - b s, b c + a s). */
static void rope_pair(op_points p, float c, float s, float *a, float *b) {
    float x0 = *a, x1 = *b;
    *a = round_if(p.out, round_if(p.per_op, x0 * c) - round_if(p.per_op, x1 * s));
    *b = round_if(p.out, round_if(p.per_op, x1 * c) + round_if(p.per_op, x0 * s));
}

/* Two passes over the row: the sum of squares, then the outputs. The second pass recomputes
 * s = residual + delta, so that neither the in-place residual nor an `out` aliasing `delta`
 * is overwritten before it is read, and no scratch buffer is needed. */
static void rmsnorm_residual_ref(const parity_policy *pol, size_t dim, const float *delta,
                                 float *residual, const float *w, float eps, float *out) {
    norm_points p = norm_points_of(pol, 1, 0);
    float acc[16] = {0};
    for (size_t i = 0; i < dim; i++) {
        float v = round_if(p.rounded_in, residual[i] + delta[i]);
        acc[i % 16] = fmaf(v, v, acc[i % 16]);
    }
    float r = inv_rms(fold16(acc), dim, eps);
    for (size_t i = 0; i < dim; i++) {
        float s = residual[i] + delta[i];
        residual[i] = round_if(p.out, s);
        out[i] = norm_value(p, w[i], round_if(p.rounded_in, s), r);
    }
}

static void rmsnorm_ref(const parity_policy *pol, int qk, size_t dim, const float *x,
                        const float *w, float eps, float *out) {
    norm_points p = norm_points_of(pol, 0, qk);
    float r = inv_rms(sum_squares_ref(x, dim), dim, eps);
    for (size_t i = 0; i < dim; i++) out[i] = norm_value(p, w[i], x[i], r);
}

static void swiglu_ref(const parity_policy *pol, size_t n, const float *g, const float *u,
                       float *out) {
    op_points p = swiglu_points_of(pol);
    for (size_t i = 0; i < n; i++) out[i] = swiglu_value(p, g[i], u[i]);
}

static void rope_ref(const parity_policy *pol, size_t n_heads, size_t hd, float *x,
                     const float *cos, const float *sin) {
    op_points p = rope_points_of(pol);
    size_t half = hd / 2;
    for (size_t h = 0; h < n_heads; h++) {
        float *xh = x + h * hd;
        for (size_t i = 0; i < half; i++)
            rope_pair(p, cos[i], sin[i], xh + i, xh + i + half);
    }
}

/* The 16-bit-buffer forms: bf16 patterns, or fp16 ones under PARITY_COMPUTE_FP16
 * (buffer_format_of). The same arithmetic; loads widen exactly, stores round to the buffer's
 * format (which only matters under PARITY_COMPUTE_FP32, where it is the one rounding of the
 * region: elsewhere the value stored is already one of that format). */

static float load16(int fmt, uint16_t h) { return fmt == FMT_FP16 ? f16_to_f32(h) : bf16_to_f32(h); }

static uint16_t store16(int fmt, float x) {
    return fmt == FMT_FP16 ? f16_from_f32(x) : bf16_from_f32(x);
}

static void rmsnorm_residual_16_ref(const parity_policy *pol, size_t dim, const uint16_t *delta,
                                    const uint16_t *residual, const uint16_t *w, float eps,
                                    uint16_t *residual_out, uint16_t *out) {
    const int b = buffer_format_of(pol);
    norm_points p = norm_points_of(pol, 1, 0);
    float acc[16] = {0};
    for (size_t i = 0; i < dim; i++) {
        float v = round_if(p.rounded_in, load16(b, residual[i]) + load16(b, delta[i]));
        acc[i % 16] = fmaf(v, v, acc[i % 16]);
    }
    float r = inv_rms(fold16(acc), dim, eps);
    for (size_t i = 0; i < dim; i++) {
        float s = load16(b, residual[i]) + load16(b, delta[i]);
        residual_out[i] = store16(b, s);
        out[i] = store16(b, norm_value(p, load16(b, w[i]), round_if(p.rounded_in, s), r));
    }
}

static void rmsnorm_16_ref(const parity_policy *pol, int qk, size_t dim, const uint16_t *x,
                           const uint16_t *w, float eps, uint16_t *out) {
    const int b = buffer_format_of(pol);
    norm_points p = norm_points_of(pol, 0, qk);
    float acc[16] = {0};
    for (size_t i = 0; i < dim; i++) {
        float v = load16(b, x[i]);
        acc[i % 16] = fmaf(v, v, acc[i % 16]);
    }
    float r = inv_rms(fold16(acc), dim, eps);
    for (size_t i = 0; i < dim; i++)
        out[i] = store16(b, norm_value(p, load16(b, w[i]), load16(b, x[i]), r));
}

static void swiglu_16_ref(const parity_policy *pol, size_t n, const uint16_t *g,
                          const uint16_t *u, uint16_t *out) {
    const int b = buffer_format_of(pol);
    op_points p = swiglu_points_of(pol);
    for (size_t i = 0; i < n; i++)
        out[i] = store16(b, swiglu_value(p, load16(b, g[i]), load16(b, u[i])));
}

static void rope_16_ref(const parity_policy *pol, size_t n_heads, size_t hd, uint16_t *x,
                        const float *cos, const float *sin) {
    const int b = buffer_format_of(pol);
    op_points p = rope_points_of(pol);
    size_t half = hd / 2;
    for (size_t h = 0; h < n_heads; h++) {
        uint16_t *xh = x + h * hd;
        for (size_t i = 0; i < half; i++) {
            float a = load16(b, xh[i]), c = load16(b, xh[i + half]);
            rope_pair(p, cos[i], sin[i], &a, &c);
            xh[i] = store16(b, a);
            xh[i + half] = store16(b, c);
        }
    }
}

const kernels kernels_portable = {
    .name = "portable",
    .attn_widens_shared_blocks = 1,
    .tiles_min_m = 16,
    .dot_f32 = dot_f32_ref,
    .dot_f32_bf16 = dot_f32_bf16_ref,
    .dots_f32_bf16 = dots_f32_bf16_ref,
    .dots_f32 = dots_f32_ref,
    .sum_squares = sum_squares_ref,
    .sum_exp = sum_exp_ref,
    .max_f32 = max_f32_ref,
    .round_bf16 = round_bf16_ref,
    .scale_round = scale_round_ref,
    .round_fp16 = round_fp16_ref,
    .exp_f32 = exp_f32_ref,
    .axpy_f32 = axpy_f32_ref,
    .axpy_bf16 = axpy_bf16_ref,
    .pv_bf16 = pv_bf16_ref,
    .pv_f32 = pv_f32_ref,
    .widen_bf16 = widen_bf16_ref,
    .gemm_bf16w = gemm_bf16w_ref,
    .gemm_f32w = gemm_f32w_ref,
    .gemm_bf16w_tiles = gemm_bf16w_tiles_ref,
    .pack_xt_tiles = gemm_pack_xt_tiles,
    .rmsnorm_residual = rmsnorm_residual_ref,
    .rmsnorm = rmsnorm_ref,
    .swiglu = swiglu_ref,
    .rope = rope_ref,
    .rmsnorm_residual_16 = rmsnorm_residual_16_ref,
    .rmsnorm_16 = rmsnorm_16_ref,
    .swiglu_16 = swiglu_16_ref,
    .rope_16 = rope_16_ref,
};
