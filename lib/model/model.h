/* The model in memory (model.c): struct parity_model with its layers' weights, RoPE tables and
 * checkpoint quantization settings; making one, its table of tensors, the buffers it owns, its
 * use lock and the copies built on demand (shipped codes' values, fp32, fp16, quantized). */
#ifndef PARITY_MODEL_H
#define PARITY_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "parity.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"
#include "rope.h"
#include "weight_types.h"

struct st_file;

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
    /* Mixture of experts, a sparse layer (config_layer_is_sparse: w_gate, w_up and w_down are
     * then absent, rows = 0); NULL / rows = 0 elsewhere: */
    weight router;                 /* mlp.gate [num_experts][hidden]: the router, never
                                      quantized (vLLM's and SGLang's gate has no quant_config) */
    weight *expert_gate, *expert_up; /* [num_experts]: mlp.experts.N.gate_proj, up_proj
                                      [moe_intermediate][hidden] */
    weight *expert_down;           /* [num_experts]: mlp.experts.N.down_proj
                                      [hidden][moe_intermediate] */
    weight shared_gate, shared_up; /* Qwen2-MoE mlp.shared_expert.gate_proj, up_proj
                                      [shared_expert_intermediate][hidden] */
    weight shared_down;            /* Qwen2-MoE mlp.shared_expert.down_proj [hidden][shared_I] */
    weight shared_expert_gate;     /* Qwen2-MoE mlp.shared_expert_gate [1][hidden], not quantized */
} layer_weights;

struct parity_model {
    parity_config config;
    weight embed;                  /* [vocab][hidden] */
    weight final_norm;             /* [hidden] */
    weight lm_head;                /* [vocab][hidden]; a copy of embed's pointers when tied */
    weight exit_gate, exit_gate_bias; /* Ouro: model.early_exit_gate [1][hidden] and its bias
                                      [1] (rows = 0 without the gate) */
    layer_weights *layers;         /* [num_hidden_layers] */
    weight *experts;               /* mixture of experts: the routed experts' weights, 3 x
                                      num_experts for each sparse layer (the layers point in) */
    rope_tables rope;

    struct st_file **files;        /* mapped checkpoint files (lib/checkpoint/load.c) */
    size_t n_files;
    void (*release_source)(parity_model *m); /* set by the loader: closes the files, frees ckpt */
    void **owned;                  /* owned weight buffers, freed with the model */
    size_t n_owned, cap_owned;
    pthread_mutex_t prepare_lock;  /* guards building the copies: shipped codes' values, fp32
                                      (wide), fp16 and quantized */
    int wide_ready;
    int fp16_ready;                /* every weight's fp16 copy is built (model_prepare) */
    int quant_ready[QUANTIZERS]; /* the fp8 copies of that quantizer are built */
    int masters_read;              /* an fp32-compute scorer or sampler was made: it reads
                                      every weight's master (weight_f32), so updates keep them */
    pthread_rwlock_t use_lock;     /* shared by calls that read weights, exclusive for updates */
    uint64_t version;              /* +1 per weight update (read under use_lock) */
    struct expected *tensors;      /* the architecture's tensors, in checkpoint order */
    size_t n_tensors;
    quant_checkpoint ckpt;         /* the loaded checkpoint's quantization settings (zero if none) */
};

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

/* Which copies of the weights a forward needs, built once per model (thread-safe): the bf16
 * values widened, the fp16 values, every weight's fp32 master where it has one
 * (MODEL_NEED_MASTERS: an fp32-compute policy; fails with PARITY_ERR_NO_MASTERS for a weight
 * whose master an update dropped, else marks the model's masters read, masters_read), and the
 * values of the weights that hold shipped codes
 * (MODEL_NEED_VALUES: every weight's master and bf16, dequantized with shipped_dequantize;
 * a model loaded from a quantized checkpoint holds only the codes until something asks). The
 * fp16 copies fail with PARITY_ERR_TENSOR_NONFINITE when a value is beyond fp16's range (it
 * would round to infinity), naming the tensor. */
enum { MODEL_NEED_WIDE = 1, MODEL_NEED_FP16 = 2, MODEL_NEED_VALUES = 4, MODEL_NEED_MASTERS = 8 };
int model_prepare(parity_model *m, int need);
/* The values of one weight (w->bf16 and, for shipped codes, w->master), built once under the
 * prepare lock where w holds shipped codes and no values yet: what every reader of a weight's
 * values calls first (a save, a manifest, a call returning values). Call it inside
 * model_enter. PARITY_ERR_OUT_OF_MEMORY if the copies cannot be made. */
int model_weight_values(parity_model *m, weight *w);
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
/* The quantized copies w needs once its shipped codes go (for codes of the gemm format `next`,
 * or for values: next = -1): one for each quantizer of the shipped codes' format that the
 * model has prepared (model_prepare_quant skipped w for it), allocated (owned by m) into
 * fresh[] but not filled, NULL elsewhere; with `scratch` not NULL, *scratch gets the floats
 * quant_copies_install needs (px_free it). PARITY_ERR_OUT_OF_MEMORY on failure. */
int quant_copies_unshipped(parity_model *m, const weight *w, int next,
                           quant_weight *fresh[QUANTIZERS], float **scratch);
/* Whether a copy the model has built reads w's fp32 master: the fp32 values of an
 * fp32-compute policy (masters_read), w's fp16 values, a quantizer's codes of w. */
int model_reads_master(const parity_model *m, const weight *w);
/* Quantizes w's values into each copy quant_copies_unshipped made and gives it to w. */
void quant_copies_install(weight *w, quant_weight *const fresh[QUANTIZERS], float *scratch);
/* Room in m's list of owned buffers for `more` more, so that model_own cannot fail until
 * they are taken; 0 when out of memory. */
int model_reserve_owned(parity_model *m, size_t more);

#endif
