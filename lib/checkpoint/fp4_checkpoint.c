/*
 * 4-bit weights as checkpoints hold them. Both formats store E2M1 codes two a byte, the low
 * nibble the even column (torchao's pack_uint4, ModelOpt's q[..., 1::2] << 4 | q[..., 0::2]),
 * each code S E E M (code & 8 the sign, code & 7 the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
 *
 * ModelOpt NVFP4 (config.json "quantization_config": {"quant_method": "modelopt",
 * "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}, or the same in
 * hf_quant_config.json's "quantization"; the shapes of vLLM's ModelOptNvFp4LinearMethod):
 *   "<module>.weight"          U8 [rows, ceil(cols / 2)]
 *   "<module>.weight_scale"    F8_E4M3 [rows, ceil(cols / 16)]: each 1 x 16 block's scale
 *   "<module>.weight_scale_2"  F32 [] (or [1]): the tensor's scale, amax / (6 * 448)
 *   "<module>.input_scale"     F32 [] (or [1]), optional: ModelOpt's calibrated activation
 *                              scale. libparity scales activations per token (the rule's
 *                              activation switch, parity.h), so it is kept, to be saved back,
 *                              and not read by the GEMM.
 * A block scale may be zero (ModelOpt writes one for a block far below the tensor's amax: its
 * values are 0); a NaN or negative one, or a weight_scale_2 that is not finite and positive, is
 * refused. The values every non-NVFP4 reader sees: master = RN_fp32(e2m1 * sf * s2) (the product
 * e2m1 * sf is exact: 2 and 4 significant bits), bf16 = RN_bf16(master).
 *
 * MXFP4, the *_blocks / *_scales layout of gpt-oss (transformers' integrations/mxfp4.py reads
 * blocks [..., G, 16] and E8M0 scales [..., G]) applied to a linear module's weight:
 *   "<module>.weight_blocks"   U8 [rows, ceil(cols / 32), 16]: each 1 x 32 block's 32 codes
 *   "<module>.weight_scales"   U8 [rows, ceil(cols / 32)]: E8M0, 2^(byte - 127); 0xFF is NaN
 * config.json "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}.
 * The values: master = e2m1 * 2^(byte - 127) (exact), bf16 = RN_bf16(master).
 *
 * In both, a partial last block's padding codes (an odd column count, cols not a multiple of
 * 32) must be +0, and every dequantized value must be within bf16's range.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "base/internal.h"
#include "model/model.h"
#include "quant/codecs.h"

static uint8_t nibble(const uint8_t *row, uint64_t c) { return (uint8_t)((row[c / 2] >> (4 * (c & 1))) & 0xfu); }

void fp4_pack_rows(const uint8_t *codes, uint32_t rows, uint32_t cols, uint64_t packed_cols,
                   uint8_t *packed) {
    memset(packed, 0, (size_t)rows * packed_cols);
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < cols; c++)
            packed[r * packed_cols + c / 2] |= (uint8_t)((codes[r * cols + c] & 0xfu) << (4 * (c & 1)));
}

/* A one-value F32 tensor (shape [] or [1]) named `what`, finite and positive. */
static int check_scalar(const tensor_source *s, const char *what, float *out) {
    if (s->dtype != PARITY_DTYPE_F32)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, a %s is F32", s->where,
                         s->dtype_name ? s->dtype_name : "?", what);
    if (s->ndim > 1 || (s->ndim == 1 && s->shape[0] != 1))
        return set_error(PARITY_ERR_SCALE_GRID, "%s: a %s is one value (shape [] or [1]), not %u "
                         "dimensions [%" PRIu64 "%s", s->where, what, s->ndim,
                         s->ndim ? s->shape[0] : 0, s->ndim > 1 ? ", ...]" : "]");
    if (!s->data) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", s->where);
    memcpy(out, s->data, 4);
    if (!(isfinite(*out) && *out > 0))
        return set_error(PARITY_ERR_SCALE_VALUE, "%s: %s %g: it is finite and positive", s->where,
                         what, (double)*out);
    return PARITY_OK;
}

/* Packed codes [rows][packed_cols] of a slot: U8, the shape, zero padding; `layout` for
 * messages. */
static int check_packed(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
                        int blocks_3d, const char *layout) {
    if (codes->dtype != TENSOR_SOURCE_U8)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s where %s codes are U8, two a byte "
                         "(a layer kept in bf16 is named in the config's list of modules not "
                         "converted)", codes->where, codes->dtype_name ? codes->dtype_name : "?",
                         layout);
    const int ok = slot->rows && codes->data &&
                   (blocks_3d ? codes->ndim == 3 && codes->shape[0] == slot->rows &&
                                    codes->shape[1] == packed_cols / 16 && codes->shape[2] == 16
                              : codes->ndim == 2 && codes->shape[0] == slot->rows &&
                                    codes->shape[1] == packed_cols);
    if (!ok && !codes->data && slot->rows)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", codes->where);
    if (!ok) {
        char got[96];
        int k = snprintf(got, sizeof got, "[");
        for (uint32_t d = 0; d < codes->ndim && d < 4 && k > 0 && (size_t)k < sizeof got; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%" PRIu64, d ? ", " : "", codes->shape[d]);
        if (k > 0 && (size_t)k < sizeof got) snprintf(got + k, sizeof got - (size_t)k, "%s]", codes->ndim > 4 ? ", ..." : "");
        if (blocks_3d)
            return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: shape %s, not [%u, %" PRIu64 ", 16]: "
                             "the %u x %u weight %s in blocks of 32 codes, 16 bytes each",
                             codes->where, got, slot->rows, packed_cols / 16, slot->rows,
                             slot->cols, slot->shape_doc);
        return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: shape %s, not [%u, %" PRIu64 "]: two codes "
                         "a byte along the %u columns of %s", codes->where, got, slot->rows,
                         packed_cols, slot->cols, slot->shape_doc);
    }
    const uint8_t *p = codes->data;
    for (uint64_t r = 0; r < slot->rows; r++)
        for (uint64_t c = slot->cols; c < 2 * packed_cols; c++)
            if (nibble(p + r * packed_cols, c))
                return set_error(PARITY_ERR_TENSOR_SHAPE, "%s: row %" PRIu64 " has padding code "
                                 "0x%x at column %" PRIu64 " (past the weight's %u columns the "
                                 "last block is padded with +0)", codes->where, r,
                                 nibble(p + r * packed_cols, c), c, slot->cols);
    return PARITY_OK;
}

static int alloc_values(const expected *slot, uint64_t grid, shipped_values *out) {
    const uint64_t n = (uint64_t)slot->rows * slot->cols;
    out->codes = px_huge_alloc(n, slot->name);
    out->scales = px_malloc(grid * sizeof(float), "block scales");
    out->master = px_huge_alloc(n * 4, slot->name);
    out->bf16 = px_huge_alloc(n * 2, slot->name);
    if (out->codes && out->scales && out->master && out->bf16) return PARITY_OK;
    shipped_values_free(out);
    return PARITY_ERR_OUT_OF_MEMORY;
}

/* Unpacks the codes and fills master and bf16 from value(code, scale of its block); a value
 * beyond bf16's range fails naming the element. */
static int fill_values(const tensor_source *codes, const expected *slot, uint64_t packed_cols,
                       uint64_t block, float tensor_scale, shipped_values *v) {
    const uint8_t *p = codes->data;
    const uint64_t grid_cols = (slot->cols + block - 1) / block;
    for (uint64_t r = 0; r < slot->rows; r++)
        for (uint64_t c = 0; c < slot->cols; c++) {
            const uint64_t i = r * slot->cols + c;
            const uint8_t code = nibble(p + r * packed_cols, c);
            float x = e2m1_to_f32(code) * v->scales[r * grid_cols + c / block];
            if (tensor_scale) x = x * tensor_scale;
            if ((bf16_from_f32(x) & 0x7f80u) == 0x7f80u)
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: element [%" PRIu64 "][%" PRIu64
                                 "] dequantizes to %g, beyond bf16's range", codes->where, r, c,
                                 (double)x);
            v->codes[i] = code;
            v->master[i] = x;
            v->bf16[i] = bf16_from_f32(x);
        }
    return PARITY_OK;
}

int nvfp4_shipped_import(const tensor_source *codes, const tensor_source *block_scales,
                         const tensor_source *scale_2, const tensor_source *input_scale,
                         const expected *slot, shipped_values *out) {
    *out = (shipped_values){0};
    const uint64_t packed_cols = ((uint64_t)slot->cols + 1) / 2, grid_cols = ((uint64_t)slot->cols + 15) / 16;
    int rc = check_packed(codes, slot, packed_cols, 0, "NVFP4");
    if (rc) return rc;
    if (!block_scales)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: NVFP4 codes without their block scales "
                         "(%s_scale, F8_E4M3)", codes->where, slot->name);
    if (!scale_2)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: NVFP4 codes without their tensor scale "
                         "(%s_scale_2, F32)", codes->where, slot->name);
    if (block_scales->dtype != PARITY_DTYPE_F8_E4M3)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, NVFP4 block scales are F8_E4M3",
                         block_scales->where, block_scales->dtype_name ? block_scales->dtype_name : "?");
    if (block_scales->ndim != 2 || block_scales->shape[0] != slot->rows ||
        block_scales->shape[1] != grid_cols)
        return set_error(PARITY_ERR_SCALE_GRID, "%s: shape [%" PRIu64 "%s%" PRIu64 "] is not the "
                         "1 x 16 block grid [%u, %" PRIu64 "] of the %u x %u weight", block_scales->where,
                         block_scales->ndim ? block_scales->shape[0] : 0,
                         block_scales->ndim == 2 ? ", " : "",
                         block_scales->ndim == 2 ? block_scales->shape[1] : 0, slot->rows,
                         grid_cols, slot->rows, slot->cols);
    if (!block_scales->data)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", block_scales->where);
    float s2, in = 0.0f;
    if ((rc = check_scalar(scale_2, "weight_scale_2", &s2))) return rc;
    if (input_scale && (rc = check_scalar(input_scale, "input_scale", &in))) return rc;
    const uint8_t *sf = block_scales->data;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++)
        if ((sf[i] & 0x7f) == 0x7f || (sf[i] & 0x80))
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: block [%" PRIu64 ", %" PRIu64 "] has "
                             "scale code 0x%02x (%s): a block scale is a finite E4M3 value, zero "
                             "or positive", block_scales->where, i / grid_cols, i % grid_cols,
                             sf[i], (sf[i] & 0x7f) == 0x7f ? "NaN" : "negative");
    if ((rc = alloc_values(slot, slot->rows * grid_cols, out))) return rc;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++) out->scales[i] = e4m3_to_f32(sf[i]);
    if ((rc = fill_values(codes, slot, packed_cols, 16, s2, out))) {
        shipped_values_free(out);
        return rc;
    }
    out->tensor_scale = s2;
    out->input_scale = in;
    out->scale_dtype = PARITY_DTYPE_F8_E4M3;
    return PARITY_OK;
}

int mxfp4_shipped_import(const tensor_source *blocks, const tensor_source *scales,
                         const expected *slot, shipped_values *out) {
    *out = (shipped_values){0};
    const uint64_t grid_cols = ((uint64_t)slot->cols + 31) / 32, packed_cols = grid_cols * 16;
    int rc = check_packed(blocks, slot, packed_cols, 1, "MXFP4");
    if (rc) return rc;
    if (!scales)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: MXFP4 blocks without their scales "
                         "(%s_scales, E8M0 as U8)", blocks->where, slot->name);
    if (scales->dtype != TENSOR_SOURCE_U8)
        return set_error(PARITY_ERR_TENSOR_DTYPE, "%s: dtype %s, MXFP4 scales are E8M0 bytes (U8)",
                         scales->where, scales->dtype_name ? scales->dtype_name : "?");
    if (scales->ndim != 2 || scales->shape[0] != slot->rows || scales->shape[1] != grid_cols)
        return set_error(PARITY_ERR_SCALE_GRID, "%s: shape [%" PRIu64 "%s%" PRIu64 "] is not the "
                         "1 x 32 block grid [%u, %" PRIu64 "] of the %u x %u weight", scales->where,
                         scales->ndim ? scales->shape[0] : 0, scales->ndim == 2 ? ", " : "",
                         scales->ndim == 2 ? scales->shape[1] : 0, slot->rows, grid_cols,
                         slot->rows, slot->cols);
    if (!scales->data) return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: data is NULL", scales->where);
    const uint8_t *e = scales->data;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++)
        if (e[i] == 0xff)
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: block [%" PRIu64 ", %" PRIu64 "] has "
                             "scale 0xFF, E8M0's NaN", scales->where, i / grid_cols, i % grid_cols);
    if ((rc = alloc_values(slot, slot->rows * grid_cols, out))) return rc;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++) out->scales[i] = e8m0_to_f32(e[i]);
    if ((rc = fill_values(blocks, slot, packed_cols, 32, 0.0f, out))) {
        shipped_values_free(out);
        return rc;
    }
    return PARITY_OK;
}
