/* The model in memory: the blueprint (config), the weights, the RoPE tables. */
#ifndef PARITY_MODEL_H
#define PARITY_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "parity.h"

struct st_file;

/* One weight tensor: rows x cols (a vector has rows = 1). */
typedef struct weight {
    uint32_t rows, cols;
    const uint16_t *bf16;  /* bf16 values [rows][cols]: mapped from a BF16 checkpoint, or owned
                              (RNE cast of F16/F32, or synthetic) */
    const float *master;   /* fp32 master values [rows][cols] when the checkpoint is F32
                              (mapped or owned) or F16 (widened, owned); NULL for BF16 */
    float *wide;           /* bf16 widened to fp32, owned, built on demand (model_prepare) */
} weight;

typedef struct layer_weights {
    weight attn_norm;              /* input_layernorm            [hidden] */
    weight wq, wk, wv, wo;         /* q_proj [n_heads*hd][hidden], k/v_proj [n_kv*hd][hidden],
                                      o_proj [hidden][n_heads*hd] */
    weight bq, bk, bv;             /* Qwen2 biases [n_heads*hd], [n_kv*hd] (rows = 0 if none) */
    weight q_norm, k_norm;         /* Qwen3 [hd] (rows = 0 if none) */
    weight mlp_norm;               /* post_attention_layernorm   [hidden] */
    weight w_gate, w_up;           /* [intermediate][hidden] */
    weight w_down;                 /* [hidden][intermediate] */
} layer_weights;

/* RoPE tables for positions 0 .. n_positions-1, hd/2 frequencies each. */
typedef struct rope_tables {
    uint32_t n_positions, half;
    float *cos_f32, *sin_f32;      /* [n_positions][half] fp32 */
    float *cos_bf16, *sin_bf16;    /* the same rounded to bf16 (held in fp32) */
} rope_tables;

struct parity_model {
    parity_config config;
    weight embed;                  /* [vocab][hidden] */
    weight final_norm;             /* [hidden] */
    weight lm_head;                /* [vocab][hidden]; a copy of embed's pointers when tied */
    layer_weights *layers;         /* [num_hidden_layers] */
    rope_tables rope;

    struct st_file **files;        /* mapped checkpoint files */
    size_t n_files;
    void **owned;                  /* owned weight buffers, freed with the model */
    size_t n_owned, cap_owned;
    pthread_mutex_t prepare_lock;  /* guards building the fp32 copies (wide) */
    int wide_ready;
    pthread_rwlock_t use_lock;     /* shared by calls that read weights, exclusive for updates */
    uint64_t version;              /* +1 per weight update (read under use_lock) */
};

/* One tensor of the blueprint: its checkpoint name, where it goes, its shape and how the
 * shape follows from the config (for messages). */
typedef struct expected {
    char name[96];
    weight *dst;
    uint32_t rows, cols;  /* rows = 0: a vector of cols */
    char shape_doc[96];
} expected;

/* The tensors of m's architecture, in checkpoint order; returns their count. `e` must hold
 * model_max_tensors(&m->config) entries. */
size_t model_tensor_slots(parity_model *m, expected *e);
size_t model_max_tensors(const parity_config *c);
/* Registers a buffer the model frees; on failure frees it and returns NULL. */
void *model_own(parity_model *m, void *p);
/* Frees a buffer registered with model_own (no-op for others, e.g. mapped data). */
void model_disown(parity_model *m, const void *p);

/* Calls that read the weights hold the model's use lock (shared); a weight update holds it
 * exclusively. Neither waits: both fail with PARITY_ERR_BUSY instead. */
int model_enter(const parity_model *m);
void model_leave(const parity_model *m);

/* Which fp32 weights a forward needs, built once per model (thread-safe). */
enum { MODEL_NEED_WIDE = 1 };
int model_prepare(parity_model *m, int need);

/* fp32 values of a weight for PARITY_COMPUTE_FP32: the master if any, else the widened bf16
 * (model_prepare(MODEL_NEED_WIDE) must have run). */
static inline const float *weight_f32(const weight *w) { return w->master ? w->master : w->wide; }

/* RoPE (rope.c): inv_freq and attention factor for a config (rope_type, scaling), as
 * transformers' modeling_rope_utils computes them, in fp32. inv_freq has head_dim/2 values. */
int rope_inv_freq(const parity_config *c, float *inv_freq, float *attention_factor);
/* Fills the tables: angle = (float)pos * inv_freq[i] (fp32), cos/sin evaluated in double
 * on that fp32 angle and rounded to fp32, times attention_factor (fp32 multiply, skipped
 * when 1). */
int rope_tables_build(const parity_config *c, uint32_t n_positions, rope_tables *t);
void rope_tables_free(rope_tables *t);

/* Config (config.c): validates field values and shapes; message names the field. */
int config_validate(const parity_config *c);
/* Parses config.json text (path for messages). */
int config_parse(const char *text, size_t len, const char *path, parity_config *out);

#endif
