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

/* The rounding points of the norms, decoded once per row. Under PARITY_COMPUTE_FP32 no point
 * rounds (the other switches are ignored). */
typedef struct norm_points {
    int bf16;        /* compute in bf16: outputs and the residual stream round */
    int rounded_in;  /* the norm reads round(s) */
    int twice;       /* round(x * r) before the weight */
} norm_points;

/* `residual`: the residual-add form (norm_input applies); `qk`: q/k-norm (qk_norm instead of
 * norm_weight). */
static inline norm_points norm_points_of(const parity_policy *pol, int residual, int qk) {
    norm_points p;
    p.bf16 = pol->compute == PARITY_COMPUTE_BF16;
    p.rounded_in = p.bf16 && residual && pol->norm_input == PARITY_NORM_INPUT_ROUNDED;
    p.twice = p.bf16 && (qk ? pol->qk_norm : pol->norm_weight) == PARITY_NORM_ROUND_TWICE;
    return p;
}

/* r = 1 / sqrt(mean of squares + eps), from the dot16 sum of squares. */
static inline float inv_rms(float sum_sq, size_t dim, float eps) {
    float ms = sum_sq / (float)dim;
    return 1.0f / sqrtf(ms + eps);
}

/* The rounding points of SwiGLU and RoPE: `bf16`, the output rounds; `per_op`, every
 * intermediate product rounds too (PER_OP). Nothing rounds under PARITY_COMPUTE_FP32. */
typedef struct op_points {
    int bf16, per_op;
} op_points;

static inline op_points op_points_of(const parity_policy *pol, int per_op_switch) {
    op_points p;
    p.bf16 = pol->compute == PARITY_COMPUTE_BF16;
    p.per_op = p.bf16 && per_op_switch;
    return p;
}

static inline op_points swiglu_points_of(const parity_policy *pol) {
    return op_points_of(pol, pol->swiglu == PARITY_SWIGLU_PER_OP);
}

static inline op_points rope_points_of(const parity_policy *pol) {
    return op_points_of(pol, pol->rope_apply == PARITY_ROPE_PER_OP);
}

#endif /* PARITY_KERNEL_COMMON_H */
