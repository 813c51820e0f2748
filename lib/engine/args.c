/* The argument checks of the public kernel calls (regions.c, ops.c): each sets the message,
 * prefixed with the function's name, and returns the status. */
#include "args.h"

#include <math.h>

#include "base/alloc.h"
#include "base/errors.h"

int arg_policy(const char *fn, const parity_policy *policy) {
    if (!policy) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: policy is NULL", fn);
    return error_prefixed(fn, parity_policy_validate(policy));
}

int arg_ptr(const char *fn, const void *p, const char *what) {
    if (!p) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    return PARITY_OK;
}

int arg_rows(const char *fn, size_t rows, size_t dim, size_t stride, const char *what) {
    uint64_t span;
    if (stride < dim)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s stride %zu is less than the row "
                         "length %zu", fn, what, stride, dim);
    if (mul_overflows((uint64_t)(rows - 1), (uint64_t)stride, &span) || span > SIZE_MAX - dim)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu rows of stride %zu overflow the "
                         "address space", fn, rows, stride);
    return PARITY_OK;
}

int arg_shape(const char *fn, size_t rows, size_t dim) {
    if (rows == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: rows is 0", fn);
    if (dim == 0) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: dim is 0", fn);
    return PARITY_OK;
}

int arg_eps(const char *fn, float eps) {
    if (!(eps > 0.0f) || !isfinite(eps))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: eps %g must be positive and finite",
                         fn, (double)eps);
    return PARITY_OK;
}

int arg_alias(const char *fn, const void *out, size_t out_stride, const void *in,
              size_t in_stride, const char *out_name, const char *in_name) {
    if (out == in && out_stride != in_stride)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s aliases %s with another stride "
                         "(%zu != %zu)", fn, out_name, in_name, out_stride, in_stride);
    return PARITY_OK;
}

int arg_buffers(const char *fn, const parity_policy *policy, size_t n, const arg_buf *bufs) {
    TRY(arg_policy(fn, policy));
    for (size_t i = 0; i < n; i++) TRY(arg_ptr(fn, bufs[i].p, bufs[i].name));
    return PARITY_OK;
}

int arg_region(const char *fn, const parity_policy *policy, size_t rows, size_t dim, size_t n,
               const arg_buf *bufs) {
    TRY(arg_buffers(fn, policy, n, bufs));
    TRY(arg_shape(fn, rows, dim));
    for (size_t i = 0; i < n; i++)
        if (bufs[i].rows) TRY(arg_rows(fn, rows, dim, bufs[i].stride, bufs[i].name));
    return PARITY_OK;
}

int arg_attention(const char *fn, size_t n_seqs, const uint32_t *lengths, size_t n_heads,
                  size_t n_kv_heads, size_t head_dim, uint64_t *total, uint32_t *longest) {
    if (n_seqs == 0) return set_error(PARITY_ERR_EMPTY_INPUT, "%s: no sequences", fn);
    if (n_heads == 0 || n_kv_heads == 0 || head_dim == 0 || n_heads % n_kv_heads ||
        n_heads > 4096 || head_dim > 4096)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "%s: %zu query heads, %zu KV heads of dimension %zu: each must be in "
                         "1..4096 and the query heads a multiple of the KV heads",
                         fn, n_heads, n_kv_heads, head_dim);
    *total = 0;
    *longest = 0;
    for (size_t i = 0; i < n_seqs; i++) {
        if (lengths[i] == 0)
            return set_error(PARITY_ERR_EMPTY_INPUT, "%s: sequence %zu is empty", fn, i);
        *total += lengths[i];
        if (lengths[i] > *longest) *longest = lengths[i];
    }
    return PARITY_OK;
}
