/* The one way in for weight values (weights.c): a tensor coming in (tensor_source), checked
 * against its table entry and converted to the values the model holds (tensor_values), the
 * values of shipped codes, and the fp32 and fp16 copies of a weight. */
#ifndef PARITY_MODEL_WEIGHTS_H
#define PARITY_MODEL_WEIGHTS_H

#include <stdint.h>

#include "weight_types.h"

/* A tensor coming in: from a checkpoint file or from an update. */
typedef struct tensor_source {
    const char *where;      /* for messages: "PATH: tensor 'NAME'" or "update of 'NAME'" */
    uint32_t dtype;         /* parity_dtype (another value is refused) */
    const char *dtype_name; /* the source's name of its dtype, for messages; NULL: the number */
    uint32_t ndim;
    const uint64_t *shape;  /* ndim values */
    const void *data;       /* row-major, little-endian, any alignment */
    int may_map;            /* the data outlives the model (a mapped checkpoint): used in place
                               where it is aligned, not copied */
} tensor_source;

/* A tensor's values as the model holds them. */
typedef struct tensor_values {
    const uint16_t *bf16;   /* the bf16 values: the source's, or the RNE cast of F16/F32 */
    const float *master;    /* F16/F32 sources: the exact fp32 values; NULL for BF16 */
    void *owned[2];         /* what tensor_import allocated (NULL where the data is used in
                               place): the caller takes them over, or tensor_values_free */
} tensor_values;

/* Checks the source against its table entry (shape, dtype, data), converts it (one
 * round-to-nearest-even to bf16; F16 widened exactly) and rejects NaN, Inf and fp32 values
 * beyond bf16's range (PARITY_ERR_TENSOR_NONFINITE). On failure nothing is left allocated. */
int tensor_import(const tensor_source *src, const expected *slot, tensor_values *out);
/* tensor_import's checks alone (shape, dtype, data, finite values once cast), allocating
 * nothing. */
int tensor_check(const tensor_source *src, const expected *slot);
/* tensor_check's checks but the values' (shape, dtype, data). */
int tensor_check_format(const tensor_source *src, const expected *slot);
/* Whether the n values of a source that passed tensor_check_format are all finite once cast
 * to bf16 (what tensor_check refuses: NaN, Inf, fp32 values beyond bf16's range), without a
 * message: a fast scan, for a caller that runs tensor_check where it says no. */
int tensor_values_finite(const tensor_source *src, uint64_t n);
/* The n values of a checked source into bf16[n] (the RNE cast, or the BF16 values as they
 * are) and, for F16/F32 sources, master[n] (the exact fp32 values; NULL to skip). */
void tensor_convert_into(const tensor_source *src, uint64_t n, uint16_t *bf16, float *master);
void tensor_values_free(tensor_values *v);
/* The values of w's shipped codes (w->shipped, of format w->shipped_gemm) into master[rows *
 * cols] and bf16[rows * cols], as every reader of a shipped weight's values sees them:
 * block-FP8 master = RN_fp32(e4m3(code) * scale) (DeepSeek-V3's weight_dequant); NVFP4
 * RN_fp32(e2m1 * sf * s2), the product e2m1 * sf exact; MXFP4 e2m1 * 2^(e - 127); ternary
 * RN_fp32(code / weight_scale) (bitlinear) or RN_fp32(code * weight_scale) (autobitlinear);
 * bf16 = RN_bf16(master). */
void shipped_dequantize(const weight *w, float *master, uint16_t *bf16);
/* wide[i] = the bf16 values of w widened to fp32 (exact): the copy the openblas backend and
 * the fp32 policy read. */
void weight_widen_into(const weight *w, float *wide);
/* fp16[i] = the fp16 value of w's element i (its master if it has one, else its bf16 value,
 * rounded once to nearest even), held in fp32. */
void weight_fp16_into(const weight *w, float *fp16);
/* Whether every value of a checked source fits fp16 (rounds to a finite fp16 value, from the
 * value the model would hold as master, else as bf16); if not, sets the error (naming the
 * element) and returns PARITY_ERR_TENSOR_NONFINITE. */
int tensor_check_fp16(const tensor_source *src, uint64_t n);
/* PARITY_OK unless an update dropped w's master (w->master_dropped); then sets the error,
 * naming the tensor `name` and `reader` (what reads fp32 masters: "the fp32 policy", ...),
 * and returns PARITY_ERR_NO_MASTERS: no reader of masters reads the bf16 cast in their
 * place. */
int weight_master_check(const weight *w, const char *name, const char *reader);

#endif
