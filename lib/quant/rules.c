/*
 * The rows of the table of quantized formats and quantizer rules (rules.h), the lookups every
 * "which rule is this" question goes through, the rules' names (parity.h, "quantizer names"),
 * and the argument checks the public quantize calls share.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "rules.h"

#include "base/errors.h"
#include "kernels/kernels.h"
#include "dot.h"
#include "fp8.h"
#include "mxfp4.h"
#include "nvfp4.h"
#include "ternary.h"

/* The formats in PARITY_GEMM_* order, from PARITY_GEMM_FP8_BLOCK: gemm, name, element, the
 * bits a weight's code takes as held, a weight's scale block (rows, cols), the block scales'
 * type and the bytes one takes as held, whether it has a tensor scale, the rows of bf16 weights
 * widened at once, and the entries: F's quantize_weight and quantize_activations (F.c), the
 * GEMM's quant_gemm_G (dot.c). */
#define FORMAT(gemm, name, element, bits, rows, cols, scale, sbytes, tensor, widen, F, G, ...)   \
    {gemm, name, QUANT_ELEMENT_##element, bits, rows, cols, QUANT_SCALE_##scale, sbytes, tensor, \
     widen, F##_quantize_weight, F##_quantize_activations, quant_gemm_##G, {__VA_ARGS__}}
/* The last arguments of FORMAT: the format's SIMD variants, [QUANT_SIMD_*] = {quantize_rows,
 * gemm_columns}, as a macro its header defines under the ISAs' PARITY_HAVE_* (an #if cannot
 * stand among a macro's arguments); NO_SIMD: none. */
#define NO_SIMD {NULL, NULL}
static const quant_format formats[] = {
    FORMAT(PARITY_GEMM_FP8_BLOCK, "fp8-block", E4M3, 8, 128, 128, F32, 4, 0, 128, fp8, blocked,
           FP8_SIMD),
    FORMAT(PARITY_GEMM_MXFP8, "mxfp8", E4M3, 8, 1, 32, E8M0, 4, 0, 128, fp8, blocked, FP8_SIMD),
    FORMAT(PARITY_GEMM_NVFP4, "nvfp4", E2M1, 4, 1, 16, E4M3, 1, 1, 0, nvfp4, blocked,
           NVFP4_SIMD),
    FORMAT(PARITY_GEMM_MXFP4, "mxfp4", E2M1, 4, 1, 32, E8M0, 1, 0, 0, mxfp4, blocked,
           MXFP4_SIMD),
    FORMAT(PARITY_GEMM_TERNARY, "ternary", TERNARY, 2, 0, 0, NONE, 4, 1, 0, ternary, ternary,
           TERNARY_SIMD),
};
#define N_FORMATS (sizeof formats / sizeof formats[0])
#define FP8_BLOCK (&formats[0])
#define MXFP8 (&formats[1])
#define NVFP4 (&formats[2])
#define MXFP4 (&formats[3])
#define TERNARY (&formats[4])

/* The rules in PARITY_FP8Q_* / PARITY_QUANT_* order: the value and its name in parity.h, the
 * name as the policy
 * strings spell it after the format ("+fp8-block:deepseek"), the format, the tensor scale's
 * type (BF16: the rule computes in bf16), whether every block scale is a power of two. */
#define RULE(id, ...) [id] = {id, #id, __VA_ARGS__}
static const quant_rule rules[QUANTIZERS] = {
    RULE(PARITY_FP8Q_DEEPSEEK, "deepseek", FP8_BLOCK, QUANT_SCALE_NONE, 0),
    RULE(PARITY_FP8Q_SGLANG, "sglang", FP8_BLOCK, QUANT_SCALE_NONE, 0),
    RULE(PARITY_FP8Q_TE, "te", FP8_BLOCK, QUANT_SCALE_NONE, 0),
    RULE(PARITY_FP8Q_DEEPGEMM, "deepgemm", FP8_BLOCK, QUANT_SCALE_NONE, 0),
    RULE(PARITY_FP8Q_TE_POW2, "te-pow2", FP8_BLOCK, QUANT_SCALE_NONE, 1),
    RULE(PARITY_FP8Q_MX_OCP, "ocp", MXFP8, QUANT_SCALE_NONE, 1),
    RULE(PARITY_FP8Q_MX_RCEIL, "te", MXFP8, QUANT_SCALE_NONE, 1),
    RULE(PARITY_QUANT_NVFP4_MODELOPT, "modelopt", NVFP4, QUANT_SCALE_F32, 0),
    RULE(PARITY_QUANT_NVFP4_TE, "te", NVFP4, QUANT_SCALE_F32, 0),
    RULE(PARITY_QUANT_NVFP4_TORCHAO, "torchao", NVFP4, QUANT_SCALE_F32, 0),
    RULE(PARITY_QUANT_MXFP4_OCP, "ocp", MXFP4, QUANT_SCALE_NONE, 1),
    RULE(PARITY_QUANT_MXFP4_RCEIL, "rceil", MXFP4, QUANT_SCALE_NONE, 1),
    RULE(PARITY_QUANT_MXFP4_MICROXCALING, "microxcaling", MXFP4, QUANT_SCALE_NONE, 1),
    RULE(PARITY_QUANT_TERNARY_BITNET, "bitnet", TERNARY, QUANT_SCALE_F32, 0),
    RULE(PARITY_QUANT_TERNARY_HF_BITLINEAR, "hf-bitlinear", TERNARY, QUANT_SCALE_BF16, 0),
    RULE(PARITY_QUANT_TERNARY_ONEBITLLMS, "onebitllms", TERNARY, QUANT_SCALE_F32, 0),
    RULE(PARITY_QUANT_NVFP4_TE_2D, "te-2d", NVFP4, QUANT_SCALE_F32, 0),
};

const quant_rule *quant_rule_of(int quantizer) {
    return quantizer >= 0 && quantizer < QUANTIZERS ? &rules[quantizer] : NULL;
}

const quant_format *quant_format_row(uint32_t gemm) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (formats[i].gemm == gemm) return &formats[i];
    return NULL;
}

int quant_format_of(int quantizer) {
    const quant_rule *r = quant_rule_of(quantizer);
    return r ? (int)r->format->gemm : -1;
}

const char *quant_format_name(uint32_t gemm) {
    const quant_format *f = quant_format_row(gemm);
    return f ? f->name : NULL;
}

const quant_simd *quant_simd_variant(const quant_format *f, int v) {
    switch (v) {
    case QUANT_SIMD_AVX2:
        return cpu_path_supported(PARITY_CPU_AVX2) ? &f->simd[v] : NULL;
    case QUANT_SIMD_AVX512:
        return cpu_path_supported(PARITY_CPU_AVX512) ? &f->simd[v] : NULL;
    case QUANT_SIMD_AVX512VNNI:
        return cpu_path_supported(PARITY_CPU_AVX512) && cpu_has_avx512_vnni() ? &f->simd[v]
                                                                               : NULL;
    }
    return NULL;
}

/* The widest variant the current CPU path runs, -1 on the portable path. */
static int current_variant(void) {
    switch (parity_get_cpu_path()) {
    case PARITY_CPU_AVX2:
        return QUANT_SIMD_AVX2;
    case PARITY_CPU_AVX512:
    case PARITY_CPU_AVX512BF16:
        return cpu_has_avx512_vnni() ? QUANT_SIMD_AVX512VNNI : QUANT_SIMD_AVX512;
    case PARITY_CPU_PORTABLE:
        break;
    }
    return -1;
}

quant_fn *quant_rows_entry(const quant_format *f) {
    for (int v = current_variant(); v >= 0; v--)
        if (f->simd[v].quantize_rows) return f->simd[v].quantize_rows;
    return f->quantize_rows;
}

quant_gemm_fn *quant_gemm_entry(const quant_format *f) {
    for (int v = current_variant(); v >= 0; v--)
        if (f->simd[v].gemm_columns) return f->simd[v].gemm_columns;
    return f->gemm_columns;
}

uint64_t quant_scale_count(const quant_format *f, uint64_t rows, uint64_t cols) {
    if (!f->block_cols) return 1;
    const uint64_t grid_rows = (rows + f->block_rows - 1) / f->block_rows;
    return grid_rows * ((cols + f->block_cols - 1) / f->block_cols);
}

/* ---- names ---------------------------------------------------------------------------------- */

const char *parity_fp8_quantizer_name(int quantizer) {
    const quant_rule *r = quant_rule_of(quantizer);
    return r && r->format->element == QUANT_ELEMENT_E4M3 ? r->name : NULL;
}

const char *parity_quantizer_name(int quantizer) {
    const quant_rule *r = quant_rule_of(quantizer);
    return r ? r->name : NULL;
}

int parity_quantizer_from_name(uint32_t gemm, const char *name, int *out) {
    clear_error();
    if (!name || !out)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "parity_quantizer_from_name: NULL argument");
    const quant_format *f = quant_format_row(gemm);
    if (!f)
        return set_error(PARITY_ERR_POLICY, "parity_quantizer_from_name: gemm %u is not a "
                         "quantized format (PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY)", gemm);
    char names[128];
    size_t len = 0;
    names[0] = '\0';
    for (int q = 0; q < QUANTIZERS; q++) {
        if (rules[q].format != f) continue;
        if (!strcmp(name, rules[q].name)) {
            *out = q;
            return PARITY_OK;
        }
        const int k =
            snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", rules[q].name);
        if (k > 0 && (size_t)k < sizeof names - len) len += (size_t)k;
    }
    return set_error(PARITY_ERR_POLICY, "unknown %s quantizer '%s' (%s)", f->name, name, names);
}

int parity_fp8_quantizer_from_name(int mx, const char *name, int *out) {
    return parity_quantizer_from_name(mx ? PARITY_GEMM_MXFP8 : PARITY_GEMM_FP8_BLOCK, name, out);
}

/* ---- argument checks ------------------------------------------------------------------------ */

int quant_check_rule(const char *fn, int quantizer, uint32_t gemm) {
    const quant_rule *r = quant_rule_of(quantizer);
    if (r && r->format->gemm == gemm) return PARITY_OK;
    char names[160];
    size_t len = 0;
    names[0] = '\0';
    for (int q = 0; q < QUANTIZERS; q++)
        if (rules[q].format->gemm == gemm) {
            const int k = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "",
                                   rules[q].api_name);
            if (k > 0 && (size_t)k < sizeof names - len) len += (size_t)k;
        }
    return set_error(PARITY_ERR_POLICY, "%s: %d is not a quantizer of %s (%s)", fn, quantizer,
                     quant_format_name(gemm), names);
}

static int check_per_row(const char *fn, int per_row) {
    if (per_row != 0 && per_row != 1)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: per_row is %d (0: one tensor scale, "
                         "1: one per row)", fn, per_row);
    return PARITY_OK;
}

int quant_check_values(const char *fn, size_t rows, size_t cols, const float *x, size_t x_stride,
                       const void *codes, size_t codes_stride, const void *block_scales,
                       const void *tensor_scales, const char *scales_name) {
    if (!x || !codes || !block_scales || !tensor_scales)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !x ? "x" : !codes ? "codes" : scales_name);
    if (rows == 0 || cols == 0)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: %zu x %zu values", fn, rows, cols);
    if (x_stride < cols || codes_stride < cols)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: a row stride (x %zu, codes %zu) is "
                         "below cols %zu", fn, x_stride, codes_stride, cols);
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            if (!isfinite(x[r * x_stride + c]))
                return set_error(PARITY_ERR_TENSOR_NONFINITE, "%s: x[%zu][%zu] is %s", fn, r, c,
                                 isnan(x[r * x_stride + c]) ? "NaN" : "Inf");
    return PARITY_OK;
}

int quant_check_call(const char *fn, int quantizer, uint32_t gemm, int per_row, size_t rows,
                     size_t cols, const float *x, size_t x_stride, const void *codes,
                     size_t codes_stride, const void *block_scales, const void *tensor_scales,
                     const char *scales_name) {
    clear_error();
    TRY(quant_check_rule(fn, quantizer, gemm));
    if (per_row >= 0) TRY(check_per_row(fn, per_row));
    return quant_check_values(fn, rows, cols, x, x_stride, codes, codes_stride, block_scales,
                              tensor_scales, scales_name);
}
