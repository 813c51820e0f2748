/*
 * The public region kernels on caller-owned bf16 buffers (parity.h), the public bf16
 * conversions and the rounding point on fp32 buffers (parity_round_f32). Each function
 * validates its arguments, then runs the current CPU path's kernel row by row. No
 * allocation: RoPE's cos/sin for one position live on the stack.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "kernels/kernels.h"
#include "model/rope.h"

/* The largest head_dim parity_rope takes (its per-position tables are on the stack). */
#define ROPE_MAX_HEAD_DIM 1024

uint16_t parity_bf16_from_f32(float x) { return bf16_from_f32(x); }

float parity_bf16_to_f32(uint16_t x) { return bf16_to_f32(x); }

int parity_round_f32(uint32_t dtype, size_t n, const float *x, float *out) {
    static const char fn[] = "parity_round_f32";
    clear_error();
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, out, "out"));
    if (dtype != PARITY_DTYPE_BF16 && dtype != PARITY_DTYPE_F16)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: dtype %u; it must be "
                         "PARITY_DTYPE_BF16 or PARITY_DTYPE_F16", fn, dtype);
    if (n > SIZE_MAX / sizeof(float) ||
        (uintptr_t)x > UINTPTR_MAX - n * sizeof(float) ||
        (uintptr_t)out > UINTPTR_MAX - n * sizeof(float))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu values reach past the address "
                         "space", fn, n);
    if (out != x && (const float *)out < x + n && x < (const float *)out + n)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: out overlaps x without being x", fn);
    const kernels *k = kern();
    /* in blocks that stay in the L1 between the copy and the rounding */
    for (size_t i = 0; i < n; i += 4096) {
        const size_t len = n - i < 4096 ? n - i : 4096;
        if (out != x) memcpy(out + i, x + i, len * sizeof(float));
        if (dtype == PARITY_DTYPE_BF16)
            k->round_bf16(out + i, len);
        else
            k->round_fp16(out + i, len);
    }
    return PARITY_OK;
}

/* ---- regions ------------------------------------------------------------------------------ */

int parity_rmsnorm_residual(const parity_policy *policy, size_t rows, size_t dim,
                            const uint16_t *delta, size_t delta_stride,
                            const uint16_t *residual, size_t residual_stride,
                            const uint16_t *weight, float eps, uint16_t *residual_out,
                            size_t residual_out_stride, uint16_t *out, size_t out_stride) {
    static const char fn[] = "parity_rmsnorm_residual";
    clear_error();
    const arg_buf bufs[] = {{delta, "delta", 1, delta_stride},
                            {residual, "residual", 1, residual_stride},
                            {weight, "weight", 0, 0},
                            {residual_out, "residual_out", 1, residual_out_stride},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_alias(fn, residual_out, residual_out_stride, residual, residual_stride,
                    "residual_out", "residual"));
    TRY(arg_alias(fn, out, out_stride, delta, delta_stride, "out", "delta"));
    if ((const void *)out == (const void *)residual_out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: out and residual_out are the same "
                         "buffer", fn);
    TRY(arg_eps(fn, eps));

    const kernels *k = kern();
    for (size_t r = 0; r < rows; r++)
        k->rmsnorm_residual_16(policy, dim, delta + r * delta_stride,
                                 residual + r * residual_stride, weight, eps,
                                 residual_out + r * residual_out_stride, out + r * out_stride);
    return PARITY_OK;
}

int parity_rmsnorm(const parity_policy *policy, int is_qk_norm, size_t rows, size_t dim,
                   const uint16_t *x, size_t x_stride, const uint16_t *weight, float eps,
                   uint16_t *out, size_t out_stride) {
    static const char fn[] = "parity_rmsnorm";
    clear_error();
    const arg_buf bufs[] = {{x, "x", 1, x_stride}, {weight, "weight", 0, 0},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_alias(fn, out, out_stride, x, x_stride, "out", "x"));
    TRY(arg_eps(fn, eps));

    const kernels *k = kern();
    for (size_t r = 0; r < rows; r++)
        k->rmsnorm_16(policy, is_qk_norm != 0, dim, x + r * x_stride, weight, eps,
                        out + r * out_stride);
    return PARITY_OK;
}

int parity_swiglu(const parity_policy *policy, size_t rows, size_t dim, const uint16_t *gate,
                  size_t gate_stride, const uint16_t *up, size_t up_stride, uint16_t *out,
                  size_t out_stride) {
    static const char fn[] = "parity_swiglu";
    clear_error();
    const arg_buf bufs[] = {{gate, "gate", 1, gate_stride}, {up, "up", 1, up_stride},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_alias(fn, out, out_stride, gate, gate_stride, "out", "gate"));
    TRY(arg_alias(fn, out, out_stride, up, up_stride, "out", "up"));

    const kernels *k = kern();
    for (size_t r = 0; r < rows; r++)
        k->swiglu_16(policy, dim, gate + r * gate_stride, up + r * up_stride,
                       out + r * out_stride);
    return PARITY_OK;
}

/* One position's cos/sin (rope.c, as the forward's tables), rounded to bf16 (fp16 under
 * PARITY_COMPUTE_FP16) when the policy keeps a rounded table. */
static void position_cos_sin(const parity_policy *policy, const float *inv, uint32_t half,
                             int32_t pos, float *cos_out, float *sin_out) {
    rope_cos_sin(inv, half, (uint32_t)pos, 1.0f, cos_out, sin_out);
    if (policy->rope_table == PARITY_ROPE_TABLE_BF16) {
        round_to_policy(policy, cos_out, half);
        round_to_policy(policy, sin_out, half);
    }
}

int parity_rope(const parity_policy *policy, size_t rows, size_t n_heads, size_t head_dim,
                uint16_t *x, size_t row_stride, const int32_t *positions, double theta) {
    static const char fn[] = "parity_rope";
    clear_error();
    TRY(arg_policy(fn, policy));
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, positions, "positions"));
    if (rows == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: rows is 0", fn);
    if (n_heads == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n_heads is 0", fn);
    if (head_dim == 0 || head_dim % 2 != 0 || head_dim > ROPE_MAX_HEAD_DIM)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: head_dim %zu must be even, positive and at most %d", fn, head_dim,
                         ROPE_MAX_HEAD_DIM);
    uint64_t width;
    if (mul_overflows((uint64_t)n_heads, (uint64_t)head_dim, &width) || width > SIZE_MAX)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu heads of %zu overflow", fn,
                         n_heads, head_dim);
    TRY(arg_rows(fn, rows, (size_t)width, row_stride, "x"));
    if (!((float)theta > 0.0f) || !isfinite((float)theta))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: theta %g must be positive and finite in fp32", fn, theta);
    /* Every position is checked before any row is rotated: a failed call leaves x as it was. */
    for (size_t r = 0; r < rows; r++)
        if (positions[r] < 0)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: positions[%zu] = %d is negative",
                             fn, r, (int)positions[r]);

    float inv[ROPE_MAX_HEAD_DIM / 2], cos_t[ROPE_MAX_HEAD_DIM / 2], sin_t[ROPE_MAX_HEAD_DIM / 2];
    const uint32_t half = (uint32_t)(head_dim / 2);
    rope_default_inv_freq((float)theta, (uint32_t)head_dim, inv);
    const kernels *k = kern();
    for (size_t r = 0; r < rows; r++) {
        position_cos_sin(policy, inv, half, positions[r], cos_t, sin_t);
        k->rope_16(policy, n_heads, head_dim, x + r * row_stride, cos_t, sin_t);
    }
    return PARITY_OK;
}
