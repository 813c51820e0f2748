/* The one way in for weight values: a tensor from a checkpoint (parity_model_load) or from a
 * learner (parity_model_update) is checked against the model's table of tensors, converted
 * to bf16 with one round-to-nearest-even, tested for NaN and Inf, and widened to fp32 where a
 * path reads fp32 weights. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "internal.h"
#include "model.h"

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

int tensor_import(const tensor_source *src, const expected *slot, tensor_values *out) {
    *out = (tensor_values){0};
    int rc = check_shape(src, slot);
    if (rc) return rc;
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
    const uint64_t n = (uint64_t)(slot->rows ? slot->rows : 1) * slot->cols;
    const uint8_t *data = src->data;

    /* in place where the data outlives the model and is aligned; else a copy */
    if (src->dtype == PARITY_DTYPE_BF16) {
        if (src->may_map && ((uintptr_t)data & 1u) == 0) {
            out->bf16 = (const uint16_t *)data;
        } else {
            uint16_t *copy = out->owned[0] = px_weight_alloc(n * 2, slot->name);
            if (!copy) return PARITY_ERR_OUT_OF_MEMORY;
            memcpy(copy, data, n * 2);
            out->bf16 = copy;
        }
    } else {
        if (src->dtype == PARITY_DTYPE_F32 && src->may_map && ((uintptr_t)data & 3u) == 0) {
            out->master = (const float *)data;
        } else {
            float *wide = out->owned[1] = px_weight_alloc(n * 4, slot->name);
            if (!wide) return PARITY_ERR_OUT_OF_MEMORY;
            for (uint64_t i = 0; i < n; i++) {
                if (src->dtype == PARITY_DTYPE_F32) {
                    memcpy(&wide[i], data + 4 * i, 4);
                } else {
                    uint16_t h;
                    memcpy(&h, data + 2 * i, 2);
                    wide[i] = f16_to_f32(h);
                }
            }
            out->master = wide;
        }
        /* the learner's cast: round to nearest even */
        uint16_t *cast = out->owned[0] = px_weight_alloc(n * 2, slot->name);
        if (!cast) {
            tensor_values_free(out);
            return PARITY_ERR_OUT_OF_MEMORY;
        }
        for (uint64_t i = 0; i < n; i++) cast[i] = bf16_from_f32(out->master[i]);
        out->bf16 = cast;
    }

    /* finite values only: a NaN or Inf in the source, or an fp32 value beyond bf16's range */
    for (uint64_t i = 0; i < n; i++)
        if ((out->bf16[i] & 0x7f80u) == 0x7f80u) {
            const int beyond = out->master && isfinite(out->master[i]);
            rc = set_error(PARITY_ERR_TENSOR_NONFINITE,
                           "%s: element %" PRIu64 " is %s (weights must be finite)", src->where, i,
                           beyond ? "Inf in bf16 (an fp32 value beyond bf16's range)"
                           : (out->bf16[i] & 0x7fu) ? "NaN" : "Inf");
            tensor_values_free(out);
            return rc;
        }
    return PARITY_OK;
}

void weight_widen_into(const weight *w, float *wide) {
    const uint64_t n = (uint64_t)w->rows * w->cols;
    for (uint64_t i = 0; i < n; i++) wide[i] = bf16_to_f32(w->bf16[i]);
}
