/* The interface of a checkpoint layout (checkpoint_layout) and the types its functions share;
 * one row per layout, each in its own file (layout_plain.c: bf16, fp16, fp32;
 * layout_fp8_block.c; layout_bitnet.c; layout_nvfp4.c; layout_mxfp4.c), listed once in
 * layouts.c (layouts.h). A row names the tensors a quantized linear weight is stored as (its
 * codes and companion tensors), imports them when a checkpoint is loaded (load.c), plans and
 * writes them when a model is saved (save.c), and writes its quantization_config. A new layout
 * is a row in its own file, its line in layouts.c, and its tests. The functions here are
 * shipped.c's. */
#ifndef PARITY_LAYOUT_H
#define PARITY_LAYOUT_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "model/weights.h"

/* A shipped weight as imported: codes and scales as quant_weight holds them (its values are
 * dequantized from them when a reader asks: shipped_dequantize, model_weight_values). */
typedef struct shipped_values {
    uint8_t *codes;
    uint8_t codes_mapped;  /* codes are the mapped checkpoint's (block-FP8): not freed, not
                              owned by the model */
    uint8_t scales_mapped; /* the scale bytes are the mapped checkpoint's (NVFP4, MXFP4): the
                              same */
    union {                /* the block scales, as quant_weight's: fp32 values (block-FP8), */
        float *scales;
        uint8_t *scale_codes; /* or the format's scale bytes (NVFP4's E4M3, MXFP4's E8M0) */
    };
    uint8_t scale_dtype;
    float tensor_scale;    /* ternary: s_w, the GEMM's multiplier; NVFP4: weight_scale_2 */
    float input_scale;     /* NVFP4: the checkpoint's input_scale, 0 if none */
    float value_scale;     /* ternary: the checkpoint's weight_scale, which the values divide
                              by (bitlinear) or multiply by (autobitlinear: scale_is_mean) */
    uint8_t scale_is_mean;
} shipped_values;
void shipped_values_free(shipped_values *v);

/* A tensor_source's dtype for a U8 tensor (packed codes; parity_dtype has no U8). */
#define TENSOR_SOURCE_U8 (UINT32_MAX - 1)

/* The most companion tensors a layout stores beside a weight's codes. */
#define LAYOUT_COMPANIONS 3

/* One tensor of a saved file: a weight's values in the layout's dtype, or a quantized weight's
 * codes, block scales, tensor scale (NVFP4's weight_scale_2) or input_scale (NVFP4's). */
enum { OUT_VALUES, OUT_CODES, OUT_SCALES, OUT_TENSOR_SCALE, OUT_INPUT_SCALE };
typedef struct saved_tensor {
    const char *name;
    char scale_name[128];  /* the name when it is not the weight's: "<weight>_scale_inv" (fp8),
                              "<weight>_scale" (bitnet, NVFP4), "<weight>_blocks" (MXFP4), ... */
    char shape[48];        /* the shape as the header writes it, where it is not the weight's */
    const weight *w;
    int is_vector, kind;
    const char *dtype;     /* "BF16", "F16", "F32", "F8_E4M3", "U8" */
    uint64_t bytes;
    const quant_weight *q;   /* OUT_CODES/OUT_SCALES: the shipped codes, or `made` */
    quant_weight made;       /* codes and scales quantized for the file (owned by the save) */
    int scales_bf16;       /* OUT_SCALES: stored as BF16 (shipped so, or hf-bitlinear's) */
    int scales_f16;        /* OUT_SCALES: stored as F16 (a BitNet checkpoint's) */
} saved_tensor;

/* A quantized weight's tensors as a checkpoint holds them, for a layout's import. */
typedef struct layout_tensors {
    const tensor_source *codes;
    const tensor_source *companion[LAYOUT_COMPANIONS]; /* NULL where the files have none */
    const expected *slot;                 /* the weight's entry in the blueprint */
    const quant_checkpoint *settings;     /* the checkpoint's quantization_config */
} layout_tensors;

typedef struct checkpoint_layout {
    const char *name;      /* parity_model_save_as's name: "bf16", "fp8-block", "nvfp4", ... */
    int method;            /* the QUANT_METHOD_* of the checkpoints it reads (NONE: plain) */
    int gemm;              /* the format of the codes it ships, PARITY_GEMM_* (BF16: plain) */
    const char *values_dtype; /* the dtype its values are saved in: "BF16", "F16" or "F32" */
    /* Load. The codes are "<weight><codes_suffix>"; companion i is "<weight><companions[i]>",
     * or the module's ("<module><suffix>", the weight's name less ".weight") when the suffix
     * starts with '.'; the list ends at the first NULL. */
    const char *codes_suffix;
    const char *companions[LAYOUT_COMPANIONS + 1];
    /* The checked values of a weight's codes and companions into new buffers; sets the error
     * naming the tensor at fault. */
    int (*import)(const layout_tensors *in, shipped_values *out);
    /* Save: the quantizer a "NAME:RULE" layout names, into *rule. */
    int (*rule_from_name)(const char *rule_name, int *rule);
    /* Save: w's codes entry v (its name and w set, the rest to fill) and the entries after it
     * (more[0 .. LAYOUT_COMPANIONS - 1]): the shipped codes of the layout's format, or those of
     * `rule` quantizing w's values into buffers v owns. Returns the number of entries written to
     * `more`, or a negative status. */
    int (*plan)(const weight *w, int rule, saved_tensor *v, saved_tensor *more);
    /* Save: the bytes of a codes or scales entry; 1 when written. */
    int (*write)(FILE *fp, const saved_tensor *t);
    /* Save: the start of the quantization_config object, up to the kept modules' key, into
     * buf (hf_quant_config.json's "quantization" with `modelopt_file`); the planned entries say
     * whether every scale is a power of two, `settings` how the model was loaded. Returns
     * snprintf's count. */
    int (*config_head)(char *buf, size_t size, const saved_tensor *entries, size_t n, int rule,
                       const quant_checkpoint *settings, int modelopt_file);
    int writes_modelopt_file; /* hf_quant_config.json beside config.json (ModelOpt's NVFP4) */
} checkpoint_layout;

/* The row of a quantized layout `id` whose functions are id_import, id_rule, id_plan, id_write
 * and id_config_head; the companions' suffixes follow. */
#define QUANTIZED_LAYOUT(id, save_name, quant_method, gemm_format, modelopt_file, codes_name, ...) \
    const checkpoint_layout layout_##id = {                                                   \
        .name = save_name, .method = quant_method, .gemm = gemm_format, .values_dtype = "BF16", \
        .codes_suffix = codes_name, .companions = {__VA_ARGS__}, .import = id##_import,        \
        .rule_from_name = id##_rule, .plan = id##_plan, .write = id##_write,                    \
        .config_head = id##_config_head, .writes_modelopt_file = modelopt_file}

/* Codes and n_scales scales (held as the rule's format holds them) of w quantized with `rule`
 * into new buffers *made (px_free them): what a save (or a manifest) makes of a weight without
 * the codes it needs. On failure PARITY_ERR_OUT_OF_MEMORY, nothing left allocated. */
int quant_weight_make(const weight *w, int rule, uint64_t n_scales, quant_weight *made,
                      const char *what);

#endif
