/*
 * The public region kernels on caller-owned bf16 buffers (parity.h), the public bf16
 * conversions and the rounding point on fp32 buffers (parity_round_f32). Each function
 * validates its arguments, then runs the current CPU path's kernel row by row. No
 * allocation: RoPE's cos/sin for one position live on the stack. Then the same four regions
 * on fp32 buffers for host learners (parity_rmsnorm_residual_f32 and the others): each row
 * cast to the 16-bit buffer format in a worker's scratch, the 16-bit kernel run on it, the
 * outputs widened back, the rows split over a pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "ops_call.h"
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

/* RoPE's shape: rows and heads at least 1, head_dim even in 2..ROPE_MAX_HEAD_DIM, and
 * *width = n_heads * head_dim without overflow. */
static int arg_rope_shape(const char *fn, size_t rows, size_t n_heads, size_t head_dim,
                          size_t *width) {
    if (rows == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: rows is 0", fn);
    if (n_heads == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n_heads is 0", fn);
    if (head_dim == 0 || head_dim % 2 != 0 || head_dim > ROPE_MAX_HEAD_DIM)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: head_dim %zu must be even, positive and at most %d", fn, head_dim,
                         ROPE_MAX_HEAD_DIM);
    uint64_t w;
    if (mul_overflows((uint64_t)n_heads, (uint64_t)head_dim, &w) || w > SIZE_MAX)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu heads of %zu overflow", fn,
                         n_heads, head_dim);
    *width = (size_t)w;
    return PARITY_OK;
}

/* RoPE's theta (positive and finite in fp32) and every position (>= 0). */
static int arg_rope_positions(const char *fn, size_t rows, const int32_t *positions,
                              double theta) {
    if (!((float)theta > 0.0f) || !isfinite((float)theta))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: theta %g must be positive and finite in fp32", fn, theta);
    for (size_t r = 0; r < rows; r++)
        if (positions[r] < 0)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: positions[%zu] = %d is negative",
                             fn, r, (int)positions[r]);
    return PARITY_OK;
}

int parity_rope(const parity_policy *policy, size_t rows, size_t n_heads, size_t head_dim,
                uint16_t *x, size_t row_stride, const int32_t *positions, double theta) {
    static const char fn[] = "parity_rope";
    clear_error();
    TRY(arg_policy(fn, policy));
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, positions, "positions"));
    size_t width;
    TRY(arg_rope_shape(fn, rows, n_heads, head_dim, &width));
    TRY(arg_rows(fn, rows, width, row_stride, "x"));
    /* Every position is checked before any row is rotated: a failed call leaves x as it was. */
    TRY(arg_rope_positions(fn, rows, positions, theta));

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

/* ---- bf16 casts of an array, on a pool ------------------------------------------------------ */

/* The elements of one task of parity_bf16_from_f32_array. */
#define BF16_CAST_BLOCK 16384

typedef struct bf16_cast_job {
    size_t n;
    const float *x;
    uint16_t *out;
} bf16_cast_job;

static void bf16_cast_blocks(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const bf16_cast_job *j = ctx;
    const size_t i1 = end * BF16_CAST_BLOCK < j->n ? end * BF16_CAST_BLOCK : j->n;
    for (size_t i = begin * BF16_CAST_BLOCK; i < i1; i++) j->out[i] = bf16_from_f32(j->x[i]);
}

int parity_bf16_from_f32_array(parity_pool *pool, size_t n, const float *x, uint16_t *out) {
    static const char fn[] = "parity_bf16_from_f32_array";
    clear_error();
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, out, "out"));
    if (n > SIZE_MAX / sizeof(float) ||
        (uintptr_t)x > UINTPTR_MAX - n * sizeof(float) ||
        (uintptr_t)out > UINTPTR_MAX - n * sizeof(uint16_t))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu values reach past the address "
                         "space", fn, n);
    if ((uintptr_t)out < (uintptr_t)(x + n) && (uintptr_t)x < (uintptr_t)(out + n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: out overlaps x", fn);
    if (!n) return PARITY_OK;
    op_call call;
    TRY(op_begin(&call, pool, fn));
    bf16_cast_job j = {n, x, out};
    pool_run(call.pool, bf16_cast_blocks, &j, (n + BF16_CAST_BLOCK - 1) / BF16_CAST_BLOCK);
    op_end(&call);
    return PARITY_OK;
}

/* ---- regions on fp32 buffers, on a pool ------------------------------------------------------ */

enum { REGION_RMSNORM_RESIDUAL, REGION_RMSNORM, REGION_SWIGLU, REGION_ROPE };

/* One call of a region on fp32 rows: in[0..1] the inputs (delta and residual; x; gate and
 * up; x), out[0..1] the outputs (out and residual_out; out; out; out), each rows of `dim`
 * values. work holds 2 * dim 16-bit values per worker. */
typedef struct region_f32_job {
    const kernels *k;
    const parity_policy *pol;
    int kind, fp16, qk;
    size_t dim;
    const float *in[2];
    size_t in_stride[2];
    float *out[2];
    size_t out_stride[2];
    const uint16_t *w16;
    float eps;
    size_t n_heads, head_dim;  /* RoPE */
    const int32_t *positions;
    const float *inv;
    uint16_t *work;
} region_f32_job;

/* n fp32 values as the 16-bit buffer format holds them (round to nearest even, as
 * parity_bf16_from_f32 and the fp16 conversion of the 16-bit API's callers). */
static void narrow_row(int fp16, const float *x, size_t n, uint16_t *out) {
    if (fp16)
        for (size_t i = 0; i < n; i++) out[i] = f16_from_f32(x[i]);
    else
        for (size_t i = 0; i < n; i++) out[i] = bf16_from_f32(x[i]);
}

/* n 16-bit values widened exactly to fp32. */
static void widen_row(const kernels *k, int fp16, const uint16_t *x, size_t n, float *out) {
    if (fp16)
        for (size_t i = 0; i < n; i++) out[i] = f16_to_f32(x[i]);
    else
        k->widen_bf16(x, n, out);
}

static void region_f32_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    const region_f32_job *j = ctx;
    const size_t dim = j->dim;
    uint16_t *a = j->work + (size_t)worker * 2 * dim, *b = a + dim;
    float cos_t[ROPE_MAX_HEAD_DIM / 2], sin_t[ROPE_MAX_HEAD_DIM / 2];
    for (size_t r = begin; r < end; r++) {
        const float *x0 = j->in[0] + r * j->in_stride[0];
        float *y0 = j->out[0] + r * j->out_stride[0];
        narrow_row(j->fp16, x0, dim, a);
        switch (j->kind) {
        case REGION_RMSNORM_RESIDUAL:
            /* the 16-bit kernel's own aliases: out on delta, residual_out on residual */
            narrow_row(j->fp16, j->in[1] + r * j->in_stride[1], dim, b);
            j->k->rmsnorm_residual_16(j->pol, dim, a, b, j->w16, j->eps, b, a);
            widen_row(j->k, j->fp16, b, dim, j->out[1] + r * j->out_stride[1]);
            break;
        case REGION_RMSNORM:
            j->k->rmsnorm_16(j->pol, j->qk, dim, a, j->w16, j->eps, a);
            break;
        case REGION_SWIGLU:
            narrow_row(j->fp16, j->in[1] + r * j->in_stride[1], dim, b);
            j->k->swiglu_16(j->pol, dim, a, b, a);
            break;
        default: /* REGION_ROPE */
            position_cos_sin(j->pol, j->inv, (uint32_t)(j->head_dim / 2), j->positions[r], cos_t,
                             sin_t);
            j->k->rope_16(j->pol, j->n_heads, j->head_dim, a, cos_t, sin_t);
            break;
        }
        widen_row(j->k, j->fp16, a, dim, y0);
    }
}

/* The bytes [*lo, *hi) of an fp32 buffer of a region call: `rows` rows of `dim` values
 * b->stride apart, or one vector of dim values where b->rows is 0 (arg_region has checked
 * that the span fits). */
static void f32_span(const arg_buf *b, size_t rows, size_t dim, uintptr_t *lo, uintptr_t *hi) {
    *lo = (uintptr_t)b->p;
    *hi = *lo + ((b->rows ? rows - 1 : 0) * b->stride + dim) * sizeof(float);
}

/* Each output either is an input of rows exactly (the same pointer and stride: a row is read
 * whole before it is written) or overlaps no input; and no two outputs overlap. */
static int arg_f32_overlaps(const char *fn, size_t rows, size_t dim, size_t n_in,
                            const arg_buf *in, size_t n_out, const arg_buf *out) {
    uintptr_t lo_o, hi_o, lo, hi;
    for (size_t o = 0; o < n_out; o++) {
        f32_span(&out[o], rows, dim, &lo_o, &hi_o);
        for (size_t i = 0; i < n_in; i++) {
            if (in[i].rows && out[o].p == in[i].p && out[o].stride == in[i].stride) continue;
            f32_span(&in[i], rows, dim, &lo, &hi);
            if (lo_o < hi && lo < hi_o)
                return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s without "
                                 "being it (the same pointer and stride)", fn, out[o].name,
                                 in[i].name);
        }
        for (size_t p = 0; p < o; p++) {
            f32_span(&out[p], rows, dim, &lo, &hi);
            if (lo_o < hi && lo < hi_o)
                return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s", fn,
                                 out[o].name, out[p].name);
        }
    }
    return PARITY_OK;
}

/* Runs a checked job over `rows` rows on `pool`, the weight (if any) narrowed once. */
static int run_region_f32(const char *fn, parity_pool *pool, region_f32_job *j, size_t rows,
                          const float *weight) {
    op_call call;
    TRY(op_begin(&call, pool, fn));
    const unsigned workers = pool_size(call.pool);
    j->k = kern();
    j->fp16 = j->pol->compute == PARITY_COMPUTE_FP16;
    j->work = op_alloc(&call, ((uint64_t)workers * 2 + 1) * j->dim, sizeof(uint16_t),
                       "16-bit rows");
    int rc = j->work ? PARITY_OK : PARITY_ERR_OUT_OF_MEMORY;
    if (!rc) {
        if (weight) {
            uint16_t *w16 = j->work + (size_t)workers * 2 * j->dim;
            narrow_row(j->fp16, weight, j->dim, w16);
            j->w16 = w16;
        }
        pool_run(call.pool, region_f32_rows, j, rows);
    }
    op_end(&call);
    return rc;
}

int parity_rmsnorm_residual_f32(parity_pool *pool, const parity_policy *policy, size_t rows,
                                size_t dim, const float *delta, size_t delta_stride,
                                const float *residual, size_t residual_stride,
                                const float *weight, float eps, float *residual_out,
                                size_t residual_out_stride, float *out, size_t out_stride) {
    static const char fn[] = "parity_rmsnorm_residual_f32";
    clear_error();
    const arg_buf bufs[] = {{delta, "delta", 1, delta_stride},
                            {residual, "residual", 1, residual_stride},
                            {weight, "weight", 0, 0},
                            {residual_out, "residual_out", 1, residual_out_stride},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_f32_overlaps(fn, rows, dim, 3, bufs, 2, bufs + 3));
    TRY(arg_eps(fn, eps));
    region_f32_job j = {.pol = policy, .kind = REGION_RMSNORM_RESIDUAL, .dim = dim,
                        .in = {delta, residual}, .in_stride = {delta_stride, residual_stride},
                        .out = {out, residual_out}, .out_stride = {out_stride,
                                                                   residual_out_stride},
                        .eps = eps};
    return run_region_f32(fn, pool, &j, rows, weight);
}

int parity_rmsnorm_f32(parity_pool *pool, const parity_policy *policy, int is_qk_norm,
                       size_t rows, size_t dim, const float *x, size_t x_stride,
                       const float *weight, float eps, float *out, size_t out_stride) {
    static const char fn[] = "parity_rmsnorm_f32";
    clear_error();
    const arg_buf bufs[] = {{x, "x", 1, x_stride}, {weight, "weight", 0, 0},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_f32_overlaps(fn, rows, dim, 2, bufs, 1, bufs + 2));
    TRY(arg_eps(fn, eps));
    region_f32_job j = {.pol = policy, .kind = REGION_RMSNORM, .qk = is_qk_norm != 0, .dim = dim,
                        .in = {x}, .in_stride = {x_stride}, .out = {out},
                        .out_stride = {out_stride}, .eps = eps};
    return run_region_f32(fn, pool, &j, rows, weight);
}

int parity_swiglu_f32(parity_pool *pool, const parity_policy *policy, size_t rows, size_t dim,
                      const float *gate, size_t gate_stride, const float *up, size_t up_stride,
                      float *out, size_t out_stride) {
    static const char fn[] = "parity_swiglu_f32";
    clear_error();
    const arg_buf bufs[] = {{gate, "gate", 1, gate_stride}, {up, "up", 1, up_stride},
                            {out, "out", 1, out_stride}};
    TRY(arg_region(fn, policy, rows, dim, sizeof bufs / sizeof bufs[0], bufs));
    TRY(arg_f32_overlaps(fn, rows, dim, 2, bufs, 1, bufs + 2));
    region_f32_job j = {.pol = policy, .kind = REGION_SWIGLU, .dim = dim, .in = {gate, up},
                        .in_stride = {gate_stride, up_stride}, .out = {out},
                        .out_stride = {out_stride}};
    return run_region_f32(fn, pool, &j, rows, NULL);
}

int parity_rope_f32(parity_pool *pool, const parity_policy *policy, size_t rows, size_t n_heads,
                    size_t head_dim, const float *x, size_t x_stride, float *out,
                    size_t out_stride, const int32_t *positions, double theta) {
    static const char fn[] = "parity_rope_f32";
    clear_error();
    TRY(arg_policy(fn, policy));
    TRY(arg_ptr(fn, x, "x"));
    TRY(arg_ptr(fn, out, "out"));
    TRY(arg_ptr(fn, positions, "positions"));
    size_t width;
    TRY(arg_rope_shape(fn, rows, n_heads, head_dim, &width));
    const arg_buf bufs[] = {{x, "x", 1, x_stride}, {out, "out", 1, out_stride}};
    TRY(arg_rows(fn, rows, width, x_stride, "x"));
    TRY(arg_rows(fn, rows, width, out_stride, "out"));
    TRY(arg_f32_overlaps(fn, rows, width, 1, bufs, 1, bufs + 1));
    TRY(arg_rope_positions(fn, rows, positions, theta));
    float inv[ROPE_MAX_HEAD_DIM / 2];
    rope_default_inv_freq((float)theta, (uint32_t)head_dim, inv);
    region_f32_job j = {.pol = policy, .kind = REGION_ROPE, .dim = width, .in = {x},
                        .in_stride = {x_stride}, .out = {out}, .out_stride = {out_stride},
                        .n_heads = n_heads, .head_dim = head_dim, .positions = positions,
                        .inv = inv};
    return run_region_f32(fn, pool, &j, rows, NULL);
}
