/* The model in memory: the blueprint (config), the weights, the RoPE tables. */
#ifndef PARITY_MODEL_H
#define PARITY_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "parity.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

struct st_file;

/* One weight tensor: rows x cols (a vector has rows = 1). */
typedef struct weight {
    uint32_t rows, cols;
    const uint16_t *bf16;  /* bf16 values [rows][cols]: mapped from a BF16 checkpoint, or owned
                              (RNE cast of F16/F32, or synthetic) */
    const float *master;   /* fp32 master values [rows][cols] when the checkpoint is F32
                              (mapped or owned) or F16 (widened, owned); NULL for BF16 */
    float *wide;           /* bf16 widened to fp32, owned, built on demand (model_prepare) */
    float *fp16;           /* the fp16 values PARITY_COMPUTE_FP16 reads (the master, else the
                              bf16 values, rounded once to nearest even; exact for an F16
                              checkpoint), held in fp32, owned, built on demand */
    quant_weight *quant[QUANTIZERS]; /* the decoder layers' linear weights quantized with each
                              quantizer a policy asked for, owned, built on demand */
    quant_weight *shipped;   /* codes and scales as a checkpoint (or, block-FP8, an update)
                              shipped them, owned: block-FP8, ternary, NVFP4 or MXFP4 (the
                              layouts of lib/checkpoint/layout_*.c, and update.c); every
                              policy of that format reads them as they are; NULL if none. bf16
                              and master then hold the dequantized values */
    uint8_t shipped_gemm;  /* the format of the shipped codes: PARITY_GEMM_FP8_BLOCK, _NVFP4,
                              _MXFP4 or _TERNARY */
    uint8_t shipped_scale_dtype; /* PARITY_DTYPE_F32, _BF16 (or _F16, ternary): how the shipped
                              scales were stored */
    uint8_t keep_bf16;     /* named by the checkpoint's modules_to_not_convert / ignored_layers:
                              no fp8 policy quantizes it */
} weight;

/* How a checkpoint quantizes its decoder linear layers (lib/checkpoint/quant_config.c). */
enum {
    QUANT_METHOD_NONE = 0,  /* not at all: every weight holds values */
    QUANT_METHOD_FP8_BLOCK, /* "fp8": F8_E4M3 codes, 128 x 128 block scales (layout_fp8_block.c) */
    QUANT_METHOD_BITNET,    /* "bitnet": packed ternary codes and weight_scale (layout_bitnet.c) */
    QUANT_METHOD_NVFP4,     /* "modelopt" NVFP4: packed E2M1, E4M3 block scales, weight_scale_2
                               (layout_nvfp4.c) */
    QUANT_METHOD_MXFP4      /* "mxfp4": *_blocks and E8M0 *_scales (layout_mxfp4.c) */
};

/* A checkpoint's quantization settings (lib/checkpoint/quant_config.c), kept with the model:
 * a save writes them back. */
typedef struct quant_checkpoint {
    int method;            /* QUANT_METHOD_* */
    int bitnet_scale_is_mean; /* linear_class "autobitlinear": weight_scale = mean|W| (else
                              "bitlinear": 1 / mean|W|) */
    int scale_ue8m0;       /* fp8 "scale_fmt": "ue8m0": every scale a power of two */
    char **not_converted;  /* the modules kept unquantized, as the lists name them */
    size_t n_not_converted;
} quant_checkpoint;

typedef struct layer_weights {
    weight attn_norm;              /* input_layernorm            [hidden] */
    weight wq, wk, wv, wo;         /* q_proj [n_heads*hd][hidden], k/v_proj [n_kv*hd][hidden],
                                      o_proj [hidden][n_heads*hd] */
    weight bq, bk, bv;             /* Qwen2 biases [n_heads*hd], [n_kv*hd] (rows = 0 if none) */
    weight q_norm, k_norm;         /* Qwen3 [hd] (rows = 0 if none) */
    weight mlp_norm;               /* post_attention_layernorm   [hidden] */
    weight attn_out_norm;          /* Ouro: input_layernorm_2 on the attention output [hidden]
                                      (rows = 0 for other architectures) */
    weight mlp_out_norm;           /* Ouro: post_attention_layernorm_2 on the MLP output */
    weight w_gate, w_up;           /* [intermediate][hidden] */
    weight w_down;                 /* [hidden][intermediate] */
} layer_weights;

/* RoPE tables for positions 0 .. n_positions-1, hd/2 frequencies each. */
typedef struct rope_tables {
    uint32_t n_positions, half;
    float *cos_f32, *sin_f32;      /* [n_positions][half] fp32 */
    float *cos_bf16, *sin_bf16;    /* the same rounded to bf16 (held in fp32) */
    float *cos_fp16, *sin_fp16;    /* the same rounded to fp16 (held in fp32) */
} rope_tables;

struct parity_model {
    parity_config config;
    weight embed;                  /* [vocab][hidden] */
    weight final_norm;             /* [hidden] */
    weight lm_head;                /* [vocab][hidden]; a copy of embed's pointers when tied */
    weight exit_gate, exit_gate_bias; /* Ouro: model.early_exit_gate [1][hidden] and its bias
                                      [1] (rows = 0 without the gate) */
    layer_weights *layers;         /* [num_hidden_layers] */
    rope_tables rope;

    struct st_file **files;        /* mapped checkpoint files (lib/checkpoint/load.c) */
    size_t n_files;
    void (*release_source)(parity_model *m); /* set by the loader: closes the files, frees ckpt */
    void **owned;                  /* owned weight buffers, freed with the model */
    size_t n_owned, cap_owned;
    pthread_mutex_t prepare_lock;  /* guards building the fp32 copies (wide) */
    int wide_ready;
    int fp16_ready;                /* every weight's fp16 copy is built (model_prepare) */
    int quant_ready[QUANTIZERS]; /* the fp8 copies of that quantizer are built */
    pthread_rwlock_t use_lock;     /* shared by calls that read weights, exclusive for updates */
    uint64_t version;              /* +1 per weight update (read under use_lock) */
    struct expected *tensors;      /* the architecture's tensors, in checkpoint order */
    size_t n_tensors;
    quant_checkpoint ckpt;         /* the loaded checkpoint's quantization settings (zero if none) */
};

/* One tensor of the blueprint: its checkpoint name, where it goes, its shape and how the
 * shape follows from the config (for messages). */
struct expected {
    char name[96];
    weight *dst;
    uint32_t rows, cols;  /* rows = 0: a vector of cols */
    char shape_doc[96];
    int linear;           /* a decoder layer's linear weight: what the fp8 formats quantize */
};
typedef struct expected expected;

/* The tensors of m's architecture, in checkpoint order: the table built once when the model
 * is made (m->tensors, m->n_tensors). */
static inline const expected *model_tensors(const parity_model *m, size_t *n) {
    *n = m->n_tensors;
    return m->tensors;
}
/* The entry of a checkpoint name, NULL if the architecture has no such tensor. */
const expected *model_find_tensor(const parity_model *m, const char *name);

/* A model of the config with its blueprint built and no weights (NULL when out of memory). */
parity_model *model_new(const parity_config *c);
/* The end of every way a model is made, once its weights are bound (rc == PARITY_OK) or not:
 * the tied head, the vectors widened to fp32, the RoPE tables; *out on success, everything
 * freed on failure. */
int model_finish(parity_model *m, int rc, parity_model **out);

/* ---- the one way in for weight values (weights.c) ----------------------------------------- */

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
/* The n values of a checked source into bf16[n] (the RNE cast, or the BF16 values as they
 * are) and, for F16/F32 sources, master[n] (the exact fp32 values; NULL to skip). */
void tensor_convert_into(const tensor_source *src, uint64_t n, uint16_t *bf16, float *master);
void tensor_values_free(tensor_values *v);
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
/* Registers a buffer the model frees; on failure frees it and returns NULL. */
void *model_own(parity_model *m, void *p);
/* Frees a buffer registered with model_own (no-op for others, e.g. mapped data). */
void model_disown(parity_model *m, const void *p);
/* Whether p is a buffer registered with model_own (not mapped data). */
int model_owns(const parity_model *m, const void *p);

/* Calls that read the weights hold the model's use lock (shared); a weight update holds it
 * exclusively. Neither waits: both fail with PARITY_ERR_BUSY instead. */
int model_enter(const parity_model *m);
void model_leave(const parity_model *m);

/* Which fp32 weights a forward needs, built once per model (thread-safe): the bf16 values
 * widened, and the fp16 values. The fp16 copies fail with PARITY_ERR_TENSOR_NONFINITE when a
 * value is beyond fp16's range (it would round to infinity), naming the tensor. */
enum { MODEL_NEED_WIDE = 1, MODEL_NEED_FP16 = 2 };
int model_prepare(parity_model *m, int need);
/* The quantized copies of the decoder layers' linear weights with `quantizer` (thread-safe,
 * once). */
int model_prepare_quant(parity_model *m, int quantizer);
/* Quantizes w (its master, else its bf16 values widened into `scratch`) with `quantizer` into
 * q (quant/quant_weight.c); scratch holds quant_scratch_floats(w, quantizer) floats (128 rows
 * of the fp8 rules' blocks, the whole tensor for the per-tensor rules, none for a master). */
static inline void quant_weight_quantize(const weight *w, int quantizer, quant_weight *q,
                                         float *scratch) {
    quant_weight_quantize_values(quantizer, w->rows, w->cols, w->master, w->bf16, w->cols, q,
                                 scratch);
}
static inline size_t quant_scratch_floats(const weight *w, int quantizer) {
    return quant_weight_scratch_floats(quantizer, w->rows, w->cols, w->master != NULL);
}
/* A quantized copy for w, allocated (codes and scales, owned by m) but not filled; NULL when
 * out of memory (model.c). */
quant_weight *quant_weight_alloc(parity_model *m, const weight *w, int quantizer);

/* The fp8 weights a policy's GEMM reads for w: the shipped ones under an fp8-block policy
 * where w has them, else the copy of the policy's quantizer (NULL: w runs in bf16). */
static inline const quant_weight *quant_weight_for(const parity_policy *pol, const weight *w) {
    if (pol->gemm == PARITY_GEMM_BF16 || w->keep_bf16) return NULL;
    if (w->shipped && pol->gemm == w->shipped_gemm) return w->shipped;
    return w->quant[pol->quantizer];
}

/* fp32 values of a weight for PARITY_COMPUTE_FP32: the master if any, else the widened bf16
 * (model_prepare(MODEL_NEED_WIDE) must have run). */
static inline const float *weight_f32(const weight *w) { return w->master ? w->master : w->wide; }

/* The fp32 values a policy reads for a weight: weight_f32 under PARITY_COMPUTE_FP32, the
 * fp16 values under PARITY_COMPUTE_FP16 (MODEL_NEED_FP16), else the bf16 values widened
 * (MODEL_NEED_WIDE; the region kernels read the vectors so under bf16). */
static inline const float *weight_values(const parity_policy *pol, const weight *w) {
    return pol->compute == PARITY_COMPUTE_FP32   ? weight_f32(w)
           : pol->compute == PARITY_COMPUTE_FP16 ? w->fp16
                                                 : w->wide;
}

/* RoPE (rope.c): inv_freq and attention factor for a config (rope_type, scaling), as
 * transformers' modeling_rope_utils computes them, in fp32. inv_freq has head_dim/2 values. */
int rope_inv_freq(const parity_config *c, float *inv_freq, float *attention_factor);
/* Fills the tables: angle = (float)pos * inv_freq[i] (fp32), cos/sin evaluated in double
 * on that fp32 angle and rounded to fp32, times attention_factor (fp32 multiply, skipped
 * when 1). */
int rope_tables_build(const parity_config *c, uint32_t n_positions, rope_tables *t);
void rope_tables_free(rope_tables *t);

#endif
