/* The argument checks of the public kernel calls (args.c): each sets the message, prefixed
 * with the function's name fn, and returns the status (PARITY_OK when the check passes). */
#ifndef PARITY_ENGINE_ARGS_H
#define PARITY_ENGINE_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

/* A policy given and valid (parity_policy_validate's message, prefixed). */
int arg_policy(const char *fn, const parity_policy *policy);
int arg_ptr(const char *fn, const void *p, const char *what);
/* `rows` rows of `dim` elements, `stride` apart: dim <= stride, and the last element's index
 * (rows - 1) * stride + dim - 1 fits in size_t. */
int arg_rows(const char *fn, size_t rows, size_t dim, size_t stride, const char *what);
/* rows and dim both at least 1. */
int arg_shape(const char *fn, size_t rows, size_t dim);
int arg_eps(const char *fn, float eps);
/* A buffer argument of a public kernel call: its pointer and name, and whether it holds rows
 * of the call's shape, `stride` elements apart. */
typedef struct arg_buf {
    const void *p;
    const char *name;
    int rows;
    size_t stride;
} arg_buf;
/* The policy (arg_policy), then each of the n buffers given (arg_ptr), in their order. */
int arg_buffers(const char *fn, const parity_policy *policy, size_t n, const arg_buf *bufs);
/* A region call's checks: arg_buffers; rows and dim at least 1 (arg_shape); then each buffer
 * of rows holding `rows` rows of `dim` elements (arg_rows), in their order. */
int arg_region(const char *fn, const parity_policy *policy, size_t rows, size_t dim, size_t n,
               const arg_buf *bufs);
/* An output may alias an input only exactly: the same rows (same pointer, same stride). */
int arg_alias(const char *fn, const void *out, size_t out_stride, const void *in,
              size_t in_stride, const char *out_name, const char *in_name);

/* An attention call's shapes: at least one sequence, none empty; heads and head_dim in
 * 1..4096, the query heads a multiple of the KV heads; *total and *longest of the lengths. */
int arg_attention(const char *fn, size_t n_seqs, const uint32_t *lengths, size_t n_heads,
                  size_t n_kv_heads, size_t head_dim, uint64_t *total, uint32_t *longest);

#endif /* PARITY_ENGINE_ARGS_H */
