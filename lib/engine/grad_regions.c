/*
 * More of the learner's backward pieces on fp32 rows (parity_ops.h, "Backward pieces"), beside
 * train_ops.c's: parity_rope_backward, RoPE's gradient (the rotation's transpose by the
 * forward's own cos/sin tables), elementwise, the rows split over a pool.
 */
#include <stdint.h>

#include "args.h"
#include "base/alloc.h"
#include "base/errors.h"
#include "ops_call.h"

/* Rows a task of parity_rope_backward. */
#define ROPE_GRAD_ROWS 32

typedef struct rope_grad_job {
    size_t rows, n_heads, half;
    const float *d_out, *cos, *sin;
    size_t d_out_stride, table_stride;
    float *d_x;
    size_t d_x_stride;
} rope_grad_job;

/* Rows [begin, end) x ROPE_GRAD_ROWS. Each pair is read whole before it is written, so d_x may
 * be d_out itself. The products are rounded to fp32 before the sum (no contraction). */
static void rope_grad_rows(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const rope_grad_job *j = ctx;
    const size_t r1 = end * ROPE_GRAD_ROWS < j->rows ? end * ROPE_GRAD_ROWS : j->rows;
    const size_t half = j->half;
    for (size_t r = begin * ROPE_GRAD_ROWS; r < r1; r++) {
        const float *restrict c = j->cos + r * j->table_stride;
        const float *restrict s = j->sin + r * j->table_stride;
        for (size_t h = 0; h < j->n_heads; h++) {
            const float *g = j->d_out + r * j->d_out_stride + h * 2 * half;
            float *dx = j->d_x + r * j->d_x_stride + h * 2 * half;
            for (size_t i = 0; i < half; i++) {
                const float lo = g[i], hi = g[half + i];
                const float a = lo * c[i] + hi * s[i];
                const float b = hi * c[i] - lo * s[i];
                dx[i] = a;
                dx[half + i] = b;
            }
        }
    }
}

/* The bytes [*lo, *hi) of `rows` rows of `width` floats, `stride` apart (arg_rows checked that
 * the last element's index fits). */
static void float_rows_span(const float *p, size_t rows, size_t width, size_t stride,
                            uintptr_t *lo, uintptr_t *hi) {
    *lo = (uintptr_t)p;
    *hi = (uintptr_t)(p + (rows - 1) * stride + width);
}

int parity_rope_backward(parity_pool *pool, size_t rows, size_t n_heads, size_t head_dim,
                         const float *d_out, size_t d_out_stride, const float *cos,
                         const float *sin, size_t table_stride, float *d_x, size_t d_x_stride) {
    static const char fn[] = "parity_rope_backward";
    clear_error();
    TRY(arg_ptr(fn, d_out, "d_out"));
    TRY(arg_ptr(fn, cos, "cos"));
    TRY(arg_ptr(fn, sin, "sin"));
    TRY(arg_ptr(fn, d_x, "d_x"));
    if (rows == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: rows is 0", fn);
    if (n_heads == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: n_heads is 0", fn);
    if (head_dim == 0 || head_dim % 2 != 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: head_dim %zu must be even and "
                         "positive", fn, head_dim);
    uint64_t width;
    if (mul_overflows((uint64_t)n_heads, (uint64_t)head_dim, &width) || width > SIZE_MAX)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu heads of %zu overflow", fn,
                         n_heads, head_dim);
    const size_t w = (size_t)width, half = head_dim / 2;
    TRY(arg_rows(fn, rows, w, d_out_stride, "d_out"));
    TRY(arg_rows(fn, rows, half, table_stride, "cos"));
    TRY(arg_rows(fn, rows, w, d_x_stride, "d_x"));
    TRY(arg_alias(fn, d_x, d_x_stride, d_out, d_out_stride, "d_x", "d_out"));
    uintptr_t lo_x, hi_x, lo, hi;
    float_rows_span(d_x, rows, w, d_x_stride, &lo_x, &hi_x);
    const float *const in[] = {d_out, cos, sin};
    static const char *const names[] = {"d_out", "cos", "sin"};
    for (size_t i = 0; i < 3; i++) {
        if (i == 0 && (const float *)d_x == d_out) continue;  /* in place: allowed */
        float_rows_span(in[i], rows, i ? half : w, i ? table_stride : d_out_stride, &lo, &hi);
        if (lo_x < hi && lo < hi_x)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: d_x overlaps %s%s", fn, names[i],
                             i ? "" : " without being it (the same pointer and stride)");
    }
    op_call call;
    TRY(op_begin(&call, pool, fn));
    const rope_grad_job j = {rows, n_heads, half, d_out, cos, sin, d_out_stride, table_stride,
                             d_x, d_x_stride};
    pool_run(call.pool, rope_grad_rows, (void *)&j, (rows + ROPE_GRAD_ROWS - 1) / ROPE_GRAD_ROWS);
    op_end(&call);
    return PARITY_OK;
}
