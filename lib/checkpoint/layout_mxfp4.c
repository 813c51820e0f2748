/*
 * The MXFP4 checkpoint layout (a row of layout.h; the packed codes' part both FP4 layouts
 * share is fp4_packed.c).
 *
 * MXFP4, the *_blocks / *_scales layout of gpt-oss (transformers' integrations/mxfp4.py reads
 * blocks [..., G, 16] and E8M0 scales [..., G]) applied to a linear module's weight:
 *   "<module>.weight_blocks"   U8 [rows, ceil(cols / 32), 16]: each 1 x 32 block's 32 codes
 *   "<module>.weight_scales"   U8 [rows, ceil(cols / 32)]: E8M0, 2^(byte - 127); 0xFF is NaN
 * config.json "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "base/errors.h"
#include "fp4_packed.h"
#include "layout.h"
#include "quant/codecs.h"

/* The block scales: what they are, for the checks and their messages. */
static const fp4_scales e8m0_scales = {32, TENSOR_SOURCE_U8, "_scales", "E8M0 as U8",
                                       "MXFP4 blocks without their scales",
                                       "MXFP4 scales are E8M0 bytes (U8)"};

static int mxfp4_import(const layout_tensors *in, shipped_values *out) {
    const tensor_source *blocks = in->codes, *scales = in->companion[0];
    const expected *slot = in->slot;
    *out = (shipped_values){0};
    const uint64_t grid_cols = ((uint64_t)slot->cols + 31) / 32, packed_cols = grid_cols * 16;
    TRY(fp4_check_packed(blocks, slot, packed_cols, 1, "MXFP4"));
    TRY(fp4_check_scales(blocks, scales, slot, &e8m0_scales));
    const uint8_t *e = scales->data;
    for (uint64_t i = 0; i < slot->rows * grid_cols; i++)
        if (e[i] == 0xff)
            return set_error(PARITY_ERR_SCALE_VALUE, "%s: block [%" PRIu64 ", %" PRIu64 "] has "
                             "scale 0xFF, E8M0's NaN", scales->where, i / grid_cols, i % grid_cols);
    return fp4_values(blocks, slot, packed_cols, 32, 0.0f, scales, e8m0_to_f32, out);
}

static int mxfp4_rule(const char *name, int *rule) {
    return parity_quantizer_from_name(PARITY_GEMM_MXFP4, name, rule);
}

/* The codes "<weight>_blocks" and the E8M0 scales "<weight>_scales". */
static int mxfp4_plan(const weight *w, int rule, saved_tensor *v, saved_tensor *more) {
    const uint64_t grid_cols = (w->cols + 31) / 32;
    TRY(fp4_plan(w, PARITY_GEMM_MXFP4, rule, 32, "mxfp4", "U8", "_scales", v, &more[0]));
    v->bytes = (uint64_t)w->rows * grid_cols * 16;
    snprintf(v->shape, sizeof v->shape, "%u,%llu,16", w->rows, (unsigned long long)grid_cols);
    snprintf(v->scale_name, sizeof v->scale_name, "%s_blocks", v->name);
    v->name = v->scale_name;
    return 1;
}

static int mxfp4_write(FILE *fp, const saved_tensor *t) { return fp4_write(fp, t); }

static int mxfp4_config_head(char *buf, size_t size, const saved_tensor *entries, size_t n,
                             int rule, const quant_checkpoint *settings, int modelopt_file) {
    (void)entries, (void)n, (void)rule, (void)settings, (void)modelopt_file;
    return snprintf(buf, size, "{\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": ");
}

QUANTIZED_LAYOUT(mxfp4, "mxfp4", QUANT_METHOD_MXFP4, PARITY_GEMM_MXFP4, 0, "_blocks", "_scales");
