/*
 * What every kernel table shares, written once so that no table can drift from the
 * specification (kernels_ref.c) by a constant or by a reading of the policy: the constants
 * of parity_expf, and the decoding of a policy into the rounding points of the norm, SwiGLU
 * and RoPE regions. Included by the kernel files only.
 */
#ifndef PARITY_KERNEL_COMMON_H
#define PARITY_KERNEL_COMMON_H

#include <math.h>
#include <stddef.h>

#include "parity.h"

/* ---- parity_expf's constants (kernels_ref.c documents the algorithm) --------------------- */

/* exp(x) is finite for x <= EXP_HI (exp(EXP_HI) = 0.99999 * 2^128) and +inf above (the next
 * float's exp rounds to infinity); it is nonzero for x >= EXP_LO (exp(EXP_LO) is just above
 * 2^-150, half the smallest subnormal, and rounds up to it) and rounds to 0 below. */
#define EXP_HI 0x1.62e42ep+6f   /* 88.7228317 */
#define EXP_LO -0x1.9fe368p+6f  /* -103.972076 */
#define LOG2E 0x1.715476p+0f
#define LN2_HI 0x1.62e430p-1f   /* ln 2 rounded to fp32 */
#define LN2_LO -0x1.05c610p-29f /* ln 2 - LN2_HI */
/* Adding then subtracting 1.5 * 2^23 rounds an fp32 of magnitude < 2^22 to an integer, to
 * nearest even (the default rounding mode), as vroundps does: no libm call. */
#define ROUND_MAGIC 0x1.8p+23f
/* exp(r) ~= 1 + r * (1 + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * (C6 + r * C7))))))
 * for |r| <= ln2 / 2: a Chebyshev fit of (exp(r) - 1 - r) / r^2 on [-0.3466, 0.3466];
 * with the coefficients rounded to fp32 the relative error is < 7e-10 (0.012 ulp), so the
 * fp32 rounding of the evaluation dominates. */
#define EXP_C2 0x1.000000p-1f
#define EXP_C3 0x1.555556p-3f
#define EXP_C4 0x1.5554eap-5f
#define EXP_C5 0x1.1110e0p-7f
#define EXP_C6 0x1.6d4320p-10f
#define EXP_C7 0x1.a124eep-13f
/* The two-step scale 2^n1 * 2^n2 (n1 = floor(n / 2), n2 = n - n1), with n in [-150, 128]:
 * n1 is computed on the biased, non-negative n + EXP_SCALE_BIAS, so that it does not depend on
 * how >> treats negative numbers: n1 = ((n + EXP_SCALE_BIAS) >> 1) - EXP_SCALE_BIAS / 2. */
#define EXP_SCALE_BIAS 256

/* ---- rounding points of the regions, decoded from a policy -------------------------------- */

/* What a rounding point rounds to: nothing (PARITY_COMPUTE_FP32, or a point the policy
 * switches off), bf16 (PARITY_COMPUTE_BF16) or fp16 (PARITY_COMPUTE_FP16). The same values
 * name the element type of a region's buffers: fp32, or 16-bit bf16 / fp16 patterns. */
enum { FMT_NONE = 0, FMT_BF16 = 1, FMT_FP16 = 2 };

/* The format every rounding point of a policy rounds to. */
static inline int round_format_of(const parity_policy *pol) {
    return pol->compute == PARITY_COMPUTE_BF16   ? FMT_BF16
           : pol->compute == PARITY_COMPUTE_FP16 ? FMT_FP16
                                                 : FMT_NONE;
}

/* The element type of the public region API's 16-bit buffers: fp16 patterns under
 * PARITY_COMPUTE_FP16, bf16 patterns otherwise (PARITY_COMPUTE_FP32 included). */
static inline int buffer_format_of(const parity_policy *pol) {
    return pol->compute == PARITY_COMPUTE_FP16 ? FMT_FP16 : FMT_BF16;
}

/* The rounding points of the norms, decoded once per row: each is the format it rounds to,
 * FMT_NONE where it does not round. */
typedef struct norm_points {
    int out;         /* the outputs and the residual stream */
    int rounded_in;  /* the norm reads round(s) */
    int twice;       /* round(x * r) before the weight */
} norm_points;

/* `residual`: the residual-add form (norm_input applies); `qk`: q/k-norm (qk_norm instead of
 * norm_weight). */
static inline norm_points norm_points_of(const parity_policy *pol, int residual, int qk) {
    norm_points p;
    p.out = round_format_of(pol);
    p.rounded_in = residual && pol->norm_input == PARITY_NORM_INPUT_ROUNDED ? p.out : FMT_NONE;
    p.twice = (qk ? pol->qk_norm : pol->norm_weight) == PARITY_NORM_ROUND_TWICE ? p.out : FMT_NONE;
    return p;
}

/* r = 1 / sqrt(mean of squares + eps), from the dot16 sum of squares. */
static inline float inv_rms(float sum_sq, size_t dim, float eps) {
    float ms = sum_sq / (float)dim;
    return 1.0f / sqrtf(ms + eps);
}

/* The rounding points of SwiGLU and RoPE: `out`, the output; `per_op`, every intermediate
 * product too (PER_OP). Each the format it rounds to, FMT_NONE where it does not. */
typedef struct op_points {
    int out, per_op;
} op_points;

static inline op_points op_points_of(const parity_policy *pol, int per_op_switch) {
    op_points p;
    p.out = round_format_of(pol);
    p.per_op = per_op_switch ? p.out : FMT_NONE;
    return p;
}

static inline op_points swiglu_points_of(const parity_policy *pol) {
    return op_points_of(pol, pol->swiglu == PARITY_SWIGLU_PER_OP);
}

static inline op_points rope_points_of(const parity_policy *pol) {
    return op_points_of(pol, pol->rope_apply == PARITY_ROPE_PER_OP);
}

#endif /* PARITY_KERNEL_COMMON_H */
