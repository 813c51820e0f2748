/*
 * What the SIMD tables compute alike, written once over each table's vector mapping (as
 * ggml's SIMD mapping does): parity_expf on a vector, the region kernels (rmsnorm_residual,
 * rmsnorm, swiglu and rope, on fp32 buffers and on the public API's 16-bit ones), and the list
 * of the entries every SIMD kernel file sets in its table. The arithmetic is the
 * specification's (kernels.h, kernels_ref.c) in the order written, one IEEE operation per lane
 * and step; kernels_avx2.c and kernels_avx512.c each include this header once, after their
 * mapping, so every function here is compiled with that file's instruction set and under its
 * own name (RV_NAME).
 *
 * The mapping, macros or always-inline functions of the including file:
 *   rv, rv_int          the fp32 vector and the int32 vector of RV_LANES lanes
 *   rv_tail             which lanes of a block of RV_LANES are in the row (a count or a mask)
 *   rv_tail_at(n, i)    the lanes of the block at i in a row of n (i < n)
 *   rv_load(elt, p, i, t), rv_store(elt, p, i, t, v)
 *                       lanes i .. of a row of fp32 (elt FMT_NONE), bf16 or fp16 values
 *                       (FMT_BF16, FMT_FP16): a load widens exactly and reads +0 past t, a
 *                       16-bit store rounds to its format, nothing is stored past t
 *   rv_round_if(fmt, v) round_bf16, round_fp16 or nothing (FMT_*)
 *   rv_set1, rv_add, rv_sub, rv_mul, rv_div, rv_min, rv_max, rv_xor, rv_fmadd, rv_fnmadd
 *   rv_int_set1, rv_int_add, rv_int_sub, rv_int_srli, rv_int_slli, rv_trunc_int, rv_from_int
 *                       (the bits of an rv_int as an rv)
 *   rv_replace_if(y, v, x, c, pred)
 *                       y with the lanes where the comparison x pred c holds replaced by v
 *   rv_squares, rv_squares_zero(), rv_squares_add(acc, i, v), rv_squares_sum(acc)
 *                       the dot16 accumulators of a sum of squares: acc = fma(v, v, acc) on
 *                       the dot16 lanes of the block at i, then the dot16 fold
 *   RV_NAME(f)          f's name in this table (f ## _avx2, ...)
 */
#ifndef PARITY_SIMD_SHARED_H
#define PARITY_SIMD_SHARED_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernel_common.h"
#include "kernels.h"
#include "kernels_x86.h"

/* ---- exp ---------------------------------------------------------------------------------- */

/* parity_expf on RV_LANES lanes (its constants: kernel_common.h; its algorithm: kernels_ref.c).
 * The scalar form branches on NaN and the range; here every lane computes on x clamped to
 * [EXP_LO, EXP_HI] (where the clamp is the identity, the operations are the scalar ones), and
 * the out-of-range and NaN lanes are then replaced by what the scalar branches return. */
static inline rv rv_exp(rv x) {
    const rv hi = rv_set1(EXP_HI), lo = rv_set1(EXP_LO);
    const rv magic = rv_set1(ROUND_MAGIC);
    const rv xc = rv_min(rv_max(x, lo), hi);

    const rv t = rv_mul(xc, rv_set1(LOG2E));
    const rv n = rv_sub(rv_add(t, magic), magic);
    /* fmaf(-n, c, r) == -(n * c) + r: fnmadd, the same single rounding */
    rv r = rv_fnmadd(n, rv_set1(LN2_HI), xc);
    r = rv_fnmadd(n, rv_set1(LN2_LO), r);

    rv p = rv_set1(EXP_C7);
    p = rv_fmadd(p, r, rv_set1(EXP_C6));
    p = rv_fmadd(p, r, rv_set1(EXP_C5));
    p = rv_fmadd(p, r, rv_set1(EXP_C4));
    p = rv_fmadd(p, r, rv_set1(EXP_C3));
    p = rv_fmadd(p, r, rv_set1(EXP_C2));
    p = rv_fmadd(p, r, rv_set1(1.0f));
    p = rv_fmadd(p, r, rv_set1(1.0f));

    const rv_int ni = rv_trunc_int(n); /* n is an integer: exact */
    const rv_int n1 = rv_int_sub(rv_int_srli(rv_int_add(ni, rv_int_set1(EXP_SCALE_BIAS)), 1),
                                 rv_int_set1(EXP_SCALE_BIAS / 2));
    const rv_int n2 = rv_int_sub(ni, n1);
    const rv_int bias = rv_int_set1(127);
    const rv s1 = rv_from_int(rv_int_slli(rv_int_add(n1, bias), 23));
    const rv s2 = rv_from_int(rv_int_slli(rv_int_add(n2, bias), 23));
    rv y = rv_mul(rv_mul(p, s1), s2);

    y = rv_replace_if(y, rv_set1(INFINITY), x, hi, _CMP_GT_OQ);
    y = rv_replace_if(y, rv_set1(0.0f), x, lo, _CMP_LT_OQ);
    return rv_replace_if(y, rv_add(x, x), x, x, _CMP_UNORD_Q);
}

/* ---- regions ------------------------------------------------------------------------------ */

/* norm_points_of, swiglu_points_of, rope_points_of, inv_rms: kernel_common.h. */

/* round_if(out, w * round_if(twice, v * r)) */
static inline rv rv_norm_value(norm_points p, rv w, rv v, rv r) {
    return rv_round_if(p.out, rv_mul(w, rv_round_if(p.twice, rv_mul(v, r))));
}

/* The bodies serve every buffer type (`elt`, a constant after inlining); the fp32 forms pass
 * the residual as both input and output. Pass 1 accumulates the squares (padded lanes hold
 * v = +0 and add +0, which is harmless here: a sum of squares is never -0); pass 2 recomputes
 * the sum s, as the specification does. */
ALWAYS_INLINE void rv_rmsnorm_residual_body(int elt, const parity_policy *pol, size_t dim,
                                            const void *delta, const void *residual,
                                            const void *w, float eps, void *residual_out,
                                            void *out) {
    const norm_points p = norm_points_of(pol, 1, 0);
    rv_squares acc = rv_squares_zero();
    for (size_t i = 0; i < dim; i += RV_LANES) {
        const rv_tail t = rv_tail_at(dim, i);
        const rv s = rv_add(rv_load(elt, residual, i, t), rv_load(elt, delta, i, t));
        const rv v = rv_round_if(p.rounded_in, s);
        rv_squares_add(&acc, i, v);
    }
    const rv r = rv_set1(inv_rms(rv_squares_sum(acc), dim, eps));
    for (size_t i = 0; i < dim; i += RV_LANES) {
        const rv_tail t = rv_tail_at(dim, i);
        const rv s = rv_add(rv_load(elt, residual, i, t), rv_load(elt, delta, i, t));
        const rv o = rv_norm_value(p, rv_load(elt, w, i, t), rv_round_if(p.rounded_in, s), r);
        rv_store(elt, residual_out, i, t, rv_round_if(p.out, s));
        rv_store(elt, out, i, t, o);
    }
}

ALWAYS_INLINE void rv_rmsnorm_body(int elt, const parity_policy *pol, int qk, size_t dim,
                                   const void *x, const void *w, float eps, void *out) {
    const norm_points p = norm_points_of(pol, 0, qk);
    rv_squares acc = rv_squares_zero();
    for (size_t i = 0; i < dim; i += RV_LANES) {
        const rv v = rv_load(elt, x, i, rv_tail_at(dim, i));
        rv_squares_add(&acc, i, v);
    }
    const rv r = rv_set1(inv_rms(rv_squares_sum(acc), dim, eps));
    for (size_t i = 0; i < dim; i += RV_LANES) {
        const rv_tail t = rv_tail_at(dim, i);
        rv_store(elt, out, i, t, rv_norm_value(p, rv_load(elt, w, i, t), rv_load(elt, x, i, t), r));
    }
}

ALWAYS_INLINE void rv_swiglu_body(int elt, const parity_policy *pol, size_t n, const void *g,
                                  const void *u, void *out) {
    const op_points p = swiglu_points_of(pol);
    const rv one = rv_set1(1.0f), sign = rv_set1(-0.0f);
    for (size_t i = 0; i < n; i += RV_LANES) {
        const rv_tail t = rv_tail_at(n, i);
        const rv gv = rv_load(elt, g, i, t), uv = rv_load(elt, u, i, t);
        /* silu(g) = g / (1 + exp(-g)); -g flips the sign bit, as C's unary minus does */
        const rv silu = rv_div(gv, rv_add(one, rv_exp(rv_xor(gv, sign))));
        rv_store(elt, out, i, t, rv_round_if(p.out, rv_mul(rv_round_if(p.per_op, silu), uv)));
    }
}

ALWAYS_INLINE void rv_rope_body(int elt, const parity_policy *pol, size_t n_heads, size_t hd,
                                void *x, const float *cos, const float *sin) {
    const op_points p = rope_points_of(pol);
    const size_t half = hd / 2;
    for (size_t h = 0; h < n_heads; h++) {
        const size_t base = h * hd;
        for (size_t i = 0; i < half; i += RV_LANES) {
            const rv_tail t = rv_tail_at(half, i);
            const rv a = rv_load(elt, x, base + i, t), b = rv_load(elt, x, base + half + i, t);
            const rv c = rv_load(FMT_NONE, cos, i, t), s = rv_load(FMT_NONE, sin, i, t);
            const rv a2 = rv_sub(rv_round_if(p.per_op, rv_mul(a, c)),
                                 rv_round_if(p.per_op, rv_mul(b, s)));
            const rv b2 = rv_add(rv_round_if(p.per_op, rv_mul(b, c)),
                                 rv_round_if(p.per_op, rv_mul(a, s)));
            rv_store(elt, x, base + i, t, rv_round_if(p.out, a2));
            rv_store(elt, x, base + half + i, t, rv_round_if(p.out, b2));
        }
    }
}

static void RV_NAME(rmsnorm_residual)(const parity_policy *pol, size_t dim, const float *delta,
                                      float *residual, const float *w, float eps, float *out) {
    rv_rmsnorm_residual_body(FMT_NONE, pol, dim, delta, residual, w, eps, residual, out);
}

static void RV_NAME(rmsnorm)(const parity_policy *pol, int qk, size_t dim, const float *x,
                             const float *w, float eps, float *out) {
    rv_rmsnorm_body(FMT_NONE, pol, qk, dim, x, w, eps, out);
}

static void RV_NAME(swiglu)(const parity_policy *pol, size_t n, const float *g, const float *u,
                            float *out) {
    rv_swiglu_body(FMT_NONE, pol, n, g, u, out);
}

static void RV_NAME(rope)(const parity_policy *pol, size_t n_heads, size_t hd, float *x,
                          const float *cos, const float *sin) {
    rv_rope_body(FMT_NONE, pol, n_heads, hd, x, cos, sin);
}

/* The 16-bit forms: one instance of each body per buffer format. */
static void RV_NAME(rmsnorm_residual_16)(const parity_policy *pol, size_t dim,
                                         const uint16_t *delta, const uint16_t *residual,
                                         const uint16_t *w, float eps, uint16_t *residual_out,
                                         uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        rv_rmsnorm_residual_body(FMT_FP16, pol, dim, delta, residual, w, eps, residual_out, out);
    else
        rv_rmsnorm_residual_body(FMT_BF16, pol, dim, delta, residual, w, eps, residual_out, out);
}

static void RV_NAME(rmsnorm_16)(const parity_policy *pol, int qk, size_t dim, const uint16_t *x,
                                const uint16_t *w, float eps, uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        rv_rmsnorm_body(FMT_FP16, pol, qk, dim, x, w, eps, out);
    else
        rv_rmsnorm_body(FMT_BF16, pol, qk, dim, x, w, eps, out);
}

static void RV_NAME(swiglu_16)(const parity_policy *pol, size_t n, const uint16_t *g,
                               const uint16_t *u, uint16_t *out) {
    if (buffer_format_of(pol) == FMT_FP16)
        rv_swiglu_body(FMT_FP16, pol, n, g, u, out);
    else
        rv_swiglu_body(FMT_BF16, pol, n, g, u, out);
}

static void RV_NAME(rope_16)(const parity_policy *pol, size_t n_heads, size_t hd, uint16_t *x,
                             const float *cos, const float *sin) {
    if (buffer_format_of(pol) == FMT_FP16)
        rv_rope_body(FMT_FP16, pol, n_heads, hd, x, cos, sin);
    else
        rv_rope_body(FMT_BF16, pol, n_heads, hd, x, cos, sin);
}

/* The entries every SIMD kernel file has, under the names RV_NAME gives them: its reductions,
 * elementwise kernels, attention blocks and regions. Each file's set_entries takes them with
 * RV_KERNEL_ENTRIES(RV_SET_ENTRY), after its own functions. */
#define RV_KERNEL_ENTRIES(X)                                                                     \
    X(dot_f32) X(dot_f32_bf16) X(dots_f32) X(dots_f32_bf16) X(sum_squares) X(sum_exp)           \
    X(max_f32) X(round_bf16) X(round_fp16) X(scale_round) X(exp_f32) X(axpy_f32) X(axpy_bf16)   \
    X(pv_f32) X(pv_bf16) X(widen_bf16) X(rmsnorm_residual) X(rmsnorm) X(swiglu) X(rope)         \
    X(rmsnorm_residual_16) X(rmsnorm_16) X(swiglu_16) X(rope_16)
#define RV_SET_ENTRY(f) t->f = RV_NAME(f);

#endif /* PARITY_SIMD_SHARED_H */
