/* The argument checks of the public kernel calls (args.c): each sets the message, prefixed
 * with the function's name fn, and returns the status (PARITY_OK when the check passes). */
#ifndef PARITY_ENGINE_ARGS_H
#define PARITY_ENGINE_ARGS_H

#include <stddef.h>

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
/* An output may alias an input only exactly: the same rows (same pointer, same stride). */
int arg_alias(const char *fn, const void *out, size_t out_stride, const void *in,
              size_t in_stride, const char *out_name, const char *in_name);

#endif /* PARITY_ENGINE_ARGS_H */
