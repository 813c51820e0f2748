/* The one way in for weight values: a tensor from a checkpoint (parity_model_load) or from a
 * learner (parity_model_update) is checked against the model's table of tensors, converted
 * to bf16 with one round-to-nearest-even, tested for NaN and Inf, and widened to fp32 where a
 * path reads fp32 weights; and the values of a weight's shipped codes (shipped_dequantize). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "quant/codecs.h"
#include "quant/rules.h"
#include "weights.h"

void tensor_values_free(tensor_values *v) {
    px_free(v->owned[0]);
    px_free(v->owned[1]);
    *v = (tensor_values){0};
}

static int check_shape(const tensor_source *src, const expected *slot) {
    const int ok = slot->rows ? (src->ndim == 2 && src->shape[0] == slot->rows &&
                                 src->shape[1] == slot->cols)
                              : (src->ndim == 1 && src->shape[0] == slot->cols);
    if (ok) return PARITY_OK;
    char got[160];
    int k = snprintf(got, sizeof got, "[");
    for (uint32_t d = 0; d < src->ndim && d < 8 && k < (int)sizeof got - 24; d++)
        k += snprintf(got + k, sizeof got - (size_t)k, "%s%" PRIu64, d ? ", " : "", src->shape[d]);
    snprintf(got + k, sizeof got - (size_t)k, "%s]", src->ndim > 8 ? ", ..." : "");
    return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: shape %s does not match the config: expected %s",
                     src->where, got, slot->shape_doc);
}

/* The source's value i as fp32 (BF16 and F16 widened exactly) and as bf16 (the RNE cast). */
static inline uint16_t source_value(const tensor_source *src, uint64_t i, float *f32) {
    const uint8_t *data = src->data;
    uint16_t h;
    if (src->dtype == PARITY_DTYPE_F32) {
        memcpy(f32, data + 4 * i, 4);
        return bf16_from_f32(*f32);
    }
    memcpy(&h, data + 2 * i, 2);
    if (src->dtype == PARITY_DTYPE_BF16) {
        *f32 = bf16_to_f32(h);
        return h;
    }
    *f32 = f16_to_f32(h);
    return bf16_from_f32(*f32);
}

int tensor_check_format(const tensor_source *src, const expected *slot) {
    TRY(check_shape(src, slot));
    if (src->dtype != PARITY_DTYPE_BF16 && src->dtype != PARITY_DTYPE_F16 &&
        src->dtype != PARITY_DTYPE_F32)
        return src->dtype_name
                   ? set_error(PARITY_ERR_TENSOR_DTYPE,
                               "%s: dtype %s is not a weight dtype (BF16, F16 or F32)", src->where,
                               src->dtype_name)
                   : set_error(PARITY_ERR_TENSOR_DTYPE,
                               "%s: dtype %u is not a weight dtype (BF16 = 0, F16 = 1 or F32 = 2)",
                               src->where, src->dtype);
    if (!src->data) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", src->where);
    return PARITY_OK;
}

/* Whether an aligned source's values are all finite as bf16: blocks scanned without a branch
 * per value (the loops vectorize), stopping at the first block with a non-finite one. */
int tensor_values_finite(const tensor_source *src, uint64_t n) {
    const uintptr_t at = (uintptr_t)src->data;
    enum { BLOCK = 4096 };
    if (src->dtype == PARITY_DTYPE_F32 && (at & 3u) == 0) {
        const float *f = src->data;
        for (uint64_t b = 0; b < n; b += BLOCK) {
            const uint64_t e = n - b < BLOCK ? n : b + BLOCK;
            unsigned bad = 0;
            for (uint64_t i = b; i < e; i++) bad |= (bf16_from_f32(f[i]) & 0x7f80u) == 0x7f80u;
            if (bad) return 0;
        }
        return 1;
    }
    if (src->dtype == PARITY_DTYPE_BF16 && (at & 1u) == 0) {
        const uint16_t *h = src->data;
        for (uint64_t b = 0; b < n; b += BLOCK) {
            const uint64_t e = n - b < BLOCK ? n : b + BLOCK;
            unsigned bad = 0;
            for (uint64_t i = b; i < e; i++) bad |= (h[i] & 0x7f80u) == 0x7f80u;
            if (bad) return 0;
        }
        return 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        float f;
        if ((source_value(src, i, &f) & 0x7f80u) == 0x7f80u) return 0;
    }
    return 1;
}

int tensor_check(const tensor_source *src, const expected *slot) {
    TRY(tensor_check_format(src, slot));
    /* finite values only: a NaN or Inf in the source, or an fp32 value beyond bf16's range */
    const uint64_t n = (uint64_t)(slot->rows ? slot->rows : 1) * slot->cols;
    if (tensor_values_finite(src, n)) return PARITY_OK;
    for (uint64_t i = 0; i < n; i++) {
        float f;
        const uint16_t b = source_value(src, i, &f);
        if ((b & 0x7f80u) == 0x7f80u)
            return set_error(PARITY_ERR_TENSOR_NONFINITE,
                             "%s: element %" PRIu64 " is %s (weights must be finite)", src->where,
                             i,
                             src->dtype != PARITY_DTYPE_BF16 && isfinite(f)
                                 ? "Inf in bf16 (an fp32 value beyond bf16's range)"
                             : (b & 0x7fu) ? "NaN" : "Inf");
    }
    return PARITY_OK;
}

void tensor_convert_into(const tensor_source *src, uint64_t n, uint16_t *bf16, float *master) {
    if (src->dtype == PARITY_DTYPE_BF16) {
        memcpy(bf16, src->data, n * 2);
        return;
    }
    if (src->dtype == PARITY_DTYPE_F32 && ((uintptr_t)src->data & 3u) == 0) {
        /* aligned fp32: the cast in a loop that vectorizes, the master copied as it is */
        const float *f = src->data;
        for (uint64_t i = 0; i < n; i++) bf16[i] = bf16_from_f32(f[i]);
        if (master) memcpy(master, f, n * 4);
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        float f;
        bf16[i] = source_value(src, i, &f);
        if (master) master[i] = f;
    }
}

int tensor_import(const tensor_source *src, const expected *slot, tensor_values *out) {
    *out = (tensor_values){0};
    TRY(tensor_check(src, slot));
    const uint64_t n = (uint64_t)(slot->rows ? slot->rows : 1) * slot->cols;
    const uint8_t *data = src->data;

    /* in place where the data outlives the model and is aligned; else a copy */
    if (src->dtype == PARITY_DTYPE_BF16 && src->may_map && ((uintptr_t)data & 1u) == 0) {
        out->bf16 = (const uint16_t *)data;
        return PARITY_OK;
    }
    const int master_mapped =
        src->dtype == PARITY_DTYPE_F32 && src->may_map && ((uintptr_t)data & 3u) == 0;
    uint16_t *bf16 = out->owned[0] = px_huge_alloc(n * 2, slot->name);
    float *master = NULL;
    if (bf16 && src->dtype != PARITY_DTYPE_BF16)
        master = master_mapped ? (float *)data : (out->owned[1] = px_huge_alloc(n * 4, slot->name));
    if (!bf16 || (src->dtype != PARITY_DTYPE_BF16 && !master)) {
        tensor_values_free(out);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    /* the learner's cast: round to nearest even (the fp32 master as it is) */
    tensor_convert_into(src, n, bf16, master_mapped ? NULL : master);
    out->bf16 = bf16;
    out->master = master;
    return PARITY_OK;
}

void shipped_dequantize(const weight *w, float *master, uint16_t *bf16) {
    const quant_weight *q = w->shipped;
    const uint64_t rows = w->rows, cols = w->cols, n = rows * cols;
    if (w->shipped_gemm == PARITY_GEMM_FP8_BLOCK) {
        const uint64_t grid_cols = (cols + 127) / 128;
        parity_fp8_to_f32(PARITY_FP8_E4M3, n, q->codes, master);
        for (uint64_t i = 0; i < n; i++)
            master[i] = master[i] * q->scales[(i / cols / 128) * grid_cols + i % cols / 128];
    } else if (w->shipped_gemm == PARITY_GEMM_TERNARY) {
        const quant_format *f = quant_format_row(PARITY_GEMM_TERNARY);
        const size_t row_bytes = quant_weight_row_bytes(f, cols);
        const float s = w->shipped_value_scale;
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) {
                const float code = (float)(int8_t)quant_code_at(f, q->codes + r * row_bytes, c);
                master[r * cols + c] = w->shipped_scale_is_mean ? code * s : code / s;
            }
    } else { /* NVFP4 (1 x 16 blocks, then s2) or MXFP4 (1 x 32) */
        const quant_format *f = quant_format_row(w->shipped_gemm);
        const size_t row_bytes = quant_weight_row_bytes(f, cols);
        const uint64_t block = w->shipped_gemm == PARITY_GEMM_NVFP4 ? 16 : 32;
        const uint64_t grid_cols = (cols + block - 1) / block;
        const float s2 = w->shipped_gemm == PARITY_GEMM_NVFP4 ? q->tensor_scale : 0.0f;
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) {
                const uint8_t code = quant_code_at(f, q->codes + r * row_bytes, c);
                float x = e2m1_to_f32(code) * quant_weight_scale(f, q, r * grid_cols + c / block);
                if (s2) x = x * s2;
                master[r * cols + c] = x;
            }
    }
    for (uint64_t i = 0; i < n; i++) bf16[i] = bf16_from_f32(master[i]);
}

void weight_widen_into(const weight *w, float *wide) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    for (uint64_t i = 0; i < n; i++) wide[i] = bf16_to_f32(w->bf16[i]);
}

/* The fp16 value of element i of a weight (the master, else the bf16 value), in fp32. */
static inline float weight_fp16_value(const weight *w, uint64_t i) {
    return round_fp16(w->master ? w->master[i] : bf16_to_f32(w->bf16[i]));
}

void weight_fp16_into(const weight *w, float *fp16) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    for (uint64_t i = 0; i < n; i++) fp16[i] = weight_fp16_value(w, i);
}

int tensor_check_fp16(const tensor_source *src, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        float f;
        const uint16_t b = source_value(src, i, &f);
        /* the model holds F16/F32 sources' exact values as masters, BF16 ones as they are */
        const float v = src->dtype == PARITY_DTYPE_BF16 ? bf16_to_f32(b) : f;
        if (isinf(round_fp16(v)))
            return set_error(PARITY_ERR_TENSOR_NONFINITE,
                             "%s: element %" PRIu64 " (%g) is beyond fp16's range (|x| >= 65520 "
                             "rounds to infinity), which the fp16 policy cannot hold",
                             src->where, i, (double)v);
    }
    return PARITY_OK;
}

int weight_master_check(const weight *w, const char *name, const char *reader) {
    if (!w->master_dropped) return PARITY_OK;
    return set_error(PARITY_ERR_NO_MASTERS,
                     "tensor '%s': %s reads its fp32 masters, and the model holds only their "
                     "bf16 cast: the update that sent them kept none (PARITY_MASTERS_WHERE_READ, "
                     "no reader of masters built then); send the fp32 values again with "
                     "PARITY_MASTERS_KEEP (or make the reader before such an update)",
                     name, reader);
}
