/*
 * The ModelOpt NVFP4 checkpoint layout (a row of layout.h; the packed codes' part both FP4
 * layouts share is fp4_packed.c).
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
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "fp4_packed.h"
#include "layout.h"
#include "quant/codecs.h"

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


/* The block scales: what they are, for the checks and their messages. */
static const fp4_scales e4m3_scales = {16, PARITY_DTYPE_F8_E4M3, "_scale", "F8_E4M3",
                                       "NVFP4 codes without their block scales",
                                       "NVFP4 block scales are F8_E4M3"};

static int nvfp4_import(const layout_tensors *in, shipped_values *out) {
    const tensor_source *codes = in->codes, *block_scales = in->companion[0],
                        *scale_2 = in->companion[1], *input_scale = in->companion[2];
    const expected *slot = in->slot;
    *out = (shipped_values){0};
    const uint64_t packed_cols = ((uint64_t)slot->cols + 1) / 2, grid_cols = ((uint64_t)slot->cols + 15) / 16;
    TRY(fp4_check_packed(codes, slot, packed_cols, 0, "NVFP4"));
    TRY(fp4_check_scales(codes, block_scales, slot, &e4m3_scales));
    if (!scale_2)
        return set_error(PARITY_ERR_SCALE_MISSING, "%s: NVFP4 codes without their tensor scale "
                         "(%s_scale_2, F32)", codes->where, slot->name);
    float s2, input = 0.0f;
    TRY(check_scalar(scale_2, "weight_scale_2", &s2));
    if (input_scale) TRY(check_scalar(input_scale, "input_scale", &input));
    const uint8_t *sf = block_scales->data;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++)
        if ((sf[i] & 0x7f) == 0x7f || (sf[i] & 0x80))
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: block [%" PRIu64 ", %" PRIu64 "] has "
                             "scale code 0x%02x (%s): a block scale is a finite E4M3 value, zero "
                             "or positive", block_scales->where, i / grid_cols, i % grid_cols,
                             sf[i], (sf[i] & 0x7f) == 0x7f ? "NaN" : "negative");
    TRY(fp4_values(codes, slot, packed_cols, 16, s2, block_scales, e4m3_to_f32, out));
    out->tensor_scale = s2;
    out->input_scale = input;
    out->scale_dtype = PARITY_DTYPE_F8_E4M3;
    return PARITY_OK;
}

static int nvfp4_rule(const char *name, int *rule) {
    return parity_quantizer_from_name(PARITY_GEMM_NVFP4, name, rule);
}

/* The codes, their block scales "<weight>_scale", weight_scale_2 and, when the model has one,
 * "<module>.input_scale". */
static int nvfp4_plan(const weight *w, int rule, saved_tensor *v, saved_tensor *more) {
    const char *base = v->name;
    TRY(fp4_plan(w, PARITY_GEMM_NVFP4, rule, 16, "nvfp4", "F8_E4M3", "_scale", v, &more[0]));
    const quant_weight *q = v->q;
    v->bytes = (uint64_t)w->rows * ((w->cols + 1) / 2);
    snprintf(v->shape, sizeof v->shape, "%u,%u", w->rows, (w->cols + 1) / 2);
    int k = 1;
    saved_tensor *s2 = &more[k++];
    *s2 = (saved_tensor){.w = w, .kind = OUT_TENSOR_SCALE, .q = q, .dtype = "F32", .bytes = 4};
    snprintf(s2->scale_name, sizeof s2->scale_name, "%s_scale_2", base);
    s2->name = s2->scale_name;
    if (q->input_scale > 0) {
        saved_tensor *in = &more[k++];
        *in = (saved_tensor){.w = w, .kind = OUT_INPUT_SCALE, .q = q, .dtype = "F32", .bytes = 4};
        snprintf(in->scale_name, sizeof in->scale_name, "%.*s.input_scale",
                 (int)(strlen(base) - 7), base);
        in->name = in->scale_name;
    }
    return k;
}

static int nvfp4_write(FILE *fp, const saved_tensor *t) {
    return fp4_write(fp, t);
}

static int nvfp4_config_head(char *buf, size_t size, const saved_tensor *entries, size_t n,
                             int rule, const quant_checkpoint *settings, int modelopt_file) {
    (void)entries, (void)n, (void)rule, (void)settings;
    return snprintf(buf, size, "{%s\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null, "
                    "\"group_size\": 16, \"exclude_modules\": ",
                    modelopt_file ? "" : "\"quant_method\": \"modelopt\", ");
}

QUANTIZED_LAYOUT(nvfp4, "nvfp4", QUANT_METHOD_NVFP4, PARITY_GEMM_NVFP4, 1, "", "_scale", "_scale_2",
                 ".input_scale");
