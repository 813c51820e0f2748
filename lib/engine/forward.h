/* The one forward pass, shared by the scorer (learner) and the sampler: the rows of a batch,
 * the KV cache they read and write, and the GEMM backends. */
#ifndef PARITY_FORWARD_H
#define PARITY_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "parity.h"
#include "base/threadpool.h"

/* ---- KV cache ---------------------------------------------------------------------------
 * Cells hold the K and V vectors of one position of one sequence, for every layer. Cells are
 * grouped in blocks of KV_BLOCK positions; a sequence owns a block table, and position p of
 * it lives in cell blocks[p / KV_BLOCK] * KV_BLOCK + p % KV_BLOCK. Within a layer, a block is
 * one contiguous run of KV_BLOCK * width elements laid out head by head: KV head h's vectors
 * of the block's KV_BLOCK positions follow each other (KV_BLOCK * head_dim elements), so
 * attention streams each head's keys and values in runs of KV_BLOCK vectors, and copying a
 * block is one memcpy per layer. K is stored after q/k-norm and RoPE. Values are bf16 (exact:
 * the forward rounded them), or fp32 cells under PARITY_COMPUTE_FP32 and PARITY_COMPUTE_FP16
 * (kv_cells_fp32). */
#define KV_BLOCK 16

typedef struct kv_cache {
    uint32_t n_layers, n_cells, width;  /* n_layers: planes (config_kv_planes: a looped model
                                           has one per loop and layer); width =
                                           num_key_value_heads * head_dim */
    uint32_t head_dim;
    int fp32;
    void *k, *v;                        /* [n_layers][n_cells / KV_BLOCK][kv heads][KV_BLOCK][head_dim] */
} kv_cache;

/* Whether a policy's KV cache cells are fp32: under PARITY_COMPUTE_FP32, and under
 * PARITY_COMPUTE_FP16, whose fp16 keys and values are held in fp32 cells (exact; twice the
 * bytes of a 16-bit cell). bf16 cells otherwise. */
static inline int kv_cells_fp32(const parity_policy *pol) {
    return pol->compute != PARITY_COMPUTE_BF16;
}
uint64_t kv_cache_bytes(const parity_config *c, uint32_t n_cells, int fp32);
/* prefault: every page written (zeros) now rather than at a step's first store into it */
int kv_cache_init(kv_cache *kv, const parity_config *c, uint32_t n_cells, int fp32, int prefault);
void kv_cache_free(kv_cache *kv);

static inline size_t kv_cell(const uint32_t *blocks, uint32_t pos) {
    return (size_t)blocks[pos / KV_BLOCK] * KV_BLOCK + pos % KV_BLOCK;
}

/* The element offset in K or V of KV head `head`'s vector at position pos of a sequence with
 * block table `blocks`, in layer `layer`. The next positions of the same block follow at
 * strides of head_dim elements. */
static inline size_t kv_offset(const kv_cache *kv, uint32_t layer, const uint32_t *blocks,
                               uint32_t pos, size_t head) {
    const size_t block = blocks[pos / KV_BLOCK], slot = pos % KV_BLOCK;
    return ((size_t)layer * kv->n_cells + block * KV_BLOCK) * kv->width +
           (head * KV_BLOCK + slot) * kv->head_dim;
}

/* A looped model's row in a forward: the depth it runs to (0: its exit rule decides), its
 * exit distribution so far, and whether it has exited. */
typedef struct loop_state {
    float remaining;   /* survival mass: the product of (1 - lambda) over the loops run */
    float cdf_sum;     /* the sum of the exit probabilities so far (fp32, as torch.cumsum) */
    uint32_t target;   /* 1..loops, 0 = decided by the exit rule */
    uint32_t exited;   /* its output has been taken (h_exit) */
} loop_state;

/* ---- a batch ------------------------------------------------------------------------------
 * One row = one token of one sequence at one position. A row attends to positions 0..pos of
 * its sequence (the cells its block table names); rows of the same sequence in one batch
 * must come in position order, and positions before the batch's first row must already be in
 * the cache. */
/* A looped model's exit rule for one row (the threshold rule: parity_sampling). */
typedef struct fwd_exit {
    float threshold;              /* exit after the first loop whose exit CDF >= threshold */
    uint32_t min_depth, max_depth; /* 1 <= min_depth <= max_depth <= loops */
} fwd_exit;

typedef struct fwd_row {
    int32_t token;
    uint32_t pos;
    const uint32_t *blocks;
    /* Looped models (config_loops > 1, or arch ouro), ignored by the others. In: the loops
     * the row runs, 1..loops (0 = all), unless `exit` names a rule, which then decides it
     * from the gate after each loop. Out: the loops whose output the row's logits read (its
     * exit depth). */
    uint32_t depth;
    const fwd_exit *exit;
} fwd_row;



/* The bf16-weight GEMM's scratch: x packed in either layout (gemm_scratch_xpack_floats of the
 * largest M and K), and one weight panel of gemm_panel_floats(max_k) floats per worker. */
typedef struct gemm_scratch {
    float *xpack;
    float *panels;
    size_t max_k;
} gemm_scratch;
size_t gemm_scratch_xpack_floats(size_t max_rows, size_t max_k);

/* Scratch for batches of up to max_rows rows and contexts up to max_ctx positions. */
typedef struct fwd_scratch {
    uint32_t max_rows, max_ctx;
    float *h;       /* [max_rows][hidden]       the residual stream */
    float *delta;   /* [max_rows][hidden]       a sublayer's output, added to h */
    float *xn;      /* [max_rows][hidden]       a norm's output, the next GEMM's input */
    float *q;       /* [max_rows][heads*hd]     queries */
    float *k, *v;   /* [max_rows][kv_heads*hd]  this batch's keys and values */
    float *att;     /* [max_rows][heads*hd]     attention output */
    float *gate;    /* [max_rows][intermediate] */
    float *up;      /* [max_rows][intermediate] */
    gemm_scratch gemm; /* packed GEMM input, per-worker weight panels */
    float *scores;  /* [workers][ATTN_TASK_ROWS][group][max_ctx] attention scores / probabilities */
    float *pv;      /* [workers][attn_pv_floats(group, head_dim)] attention accumulators, sums, blocks */
    uint32_t *attn_fresh; /* [max_rows] per row: the first position of its sequence in the forward */
    float *partial; /* [max_rows][widest GEMM output] split-K partial sums (only when asked) */
    /* looped models only (NULL otherwise): */
    float *h_exit;  /* [max_rows][hidden]       each row's output at its exit loop */
    struct loop_state *loop_state; /* [max_rows] per row: its target and exit distribution */
    fwd_row *loop_rows; /* [max_rows]           the rows still running a loop, packed */
    uint32_t *loop_slot; /* [max_rows]          the batch row of each of them */
} fwd_scratch;

uint64_t fwd_scratch_bytes(const parity_config *c, uint32_t max_rows, uint32_t max_ctx,
                           unsigned n_workers, int split_k);
int fwd_scratch_init(fwd_scratch *s, const parity_config *c, uint32_t max_rows,
                     uint32_t max_ctx, unsigned n_workers, int split_k, int prefault);
void fwd_scratch_free(fwd_scratch *s);

/* The weights of one GEMM: rows x cols, rows ld elements apart, as bf16 values (the bf16
 * backend under a bf16 policy) and/or as fp32 (the openblas backend: bf16 widened; the fp32
 * policy: the masters). */
typedef struct gemm_weights {
    size_t rows, cols, ld;
    const uint16_t *bf16;
    const float *f32;
} gemm_weights;

/* A profile's counters (parity_profile), kept by an engine while profiling is on. */
typedef struct fwd_profile {
    double phase_s[PARITY_PHASE_COUNT];
    uint64_t calls, forwards, rows;
    double call_s;
} fwd_profile;

/* The monotonic clock in seconds, for the profile. */
double profile_now(void);

/* Everything a forward needs besides the batch. */
typedef struct fwd_ctx {
    const parity_model *model;  /* NULL in a kernel entry point (ops.c) */
    const parity_config *config;  /* the shapes: the model's, or a kernel entry point's */
    parity_policy pol;
    uint32_t backend;       /* parity_backend */
    threadpool *pool;
    kv_cache *kv;
    fwd_scratch *s;
    /* kernel-order experiments (parity_sampler_params): 0 = the contract's orders */
    uint32_t split_k, split_kv;
    fwd_profile *prof;      /* NULL unless the caller profiles (parity_*_set_profiling) */
    uint32_t loop_kv;       /* parity_loop_kv: looped models' K/V after a row's exit depth */
    /* Looped models, the dense learner's readouts (the scorer's): NULL, or every row's output
     * after every loop it runs, loop_out[loop][row][hidden] (rows s->max_rows apart), and the
     * exit distribution of the rows with a fixed depth, loop_pdf[row][loop] (p of each loop
     * they run; a model with an exit gate) */
    float *loop_out;
    float *loop_pdf;
} fwd_ctx;

/* A phase's lap: adds the time since *t to the phase and restarts *t; no clock is read
 * without a profile. Start with t = phase_start(ctx). */
static inline double phase_start(const fwd_ctx *ctx) { return ctx->prof ? profile_now() : 0.0; }
static inline void phase_lap(const fwd_ctx *ctx, parity_phase phase, double *t) {
    if (!ctx->prof) return;
    const double now = profile_now();
    ctx->prof->phase_s[phase] += now - *t;
    *t = now;
}

/* Runs the rows through the model, writing their K/V to the cache. For the n_out rows listed
 * in out_rows (indices into rows, ascending), writes the logits to logits[n_out][vocab]
 * (rounded to bf16 unless the policy keeps an fp32 head). n_rows <= s->max_rows. A looped
 * model's rows run to their depth or exit rule and have their exit depth written to
 * rows[r].depth (forward_looped). */
void forward(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
             const uint32_t *out_rows, float *logits);

/* The pieces of the forward that the kernel entry points (ops.c) run too. */

/* The embedding rows of tokens[0..n-1] (in range) into out (rows out_stride apart): the bf16
 * table widened exactly, or the fp32 table copied. */
void embed_rows(size_t n, const int32_t *tokens, size_t dim, const uint16_t *table_bf16,
                const float *table_f32, size_t table_stride, float *out, size_t out_stride);

/* The head: h[r] += delta[r] with the final RMSNorm (region: residual + RMSNorm) into
 * xn [n][dim] (h updated to the rounded residual stream), then logits[n][N] = xn . lm_head^T,
 * rounded to bf16 unless the policy keeps an fp32 head. norm: the fp32 values of the norm
 * weight; eps the model's. */
void forward_head(const fwd_ctx *ctx, size_t n, float *delta, float *h, const float *norm,
                  float eps, float *xn, const gemm_weights *lm_head, float *logits);

/* A looped model's logits of loop `loop` (0-based) for the n_out rows out_rows of the last
 * forward, from ctx->loop_out: the head as forward() applies it at a row's exit loop. */
void forward_loop_logits(const fwd_ctx *ctx, uint32_t loop, size_t n_out,
                         const uint32_t *out_rows, float *logits);

/* ---- GEMM backends (gemm.c) -------------------------------------------------------------- */
/* y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n]) for m < M, n < w->rows, fp32, unrounded (the
 * caller rounds); x has w->cols columns, rows ldx apart; y rows ldy apart. The order of each
 * sum is the backend's (bf16: pair32 on bf16 weights, dot16 on fp32 weights under
 * PARITY_COMPUTE_FP32; openblas: one-row cblas_sgemm); the bias joins the fp32 sum. */
void linear_weights(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                    const gemm_weights *w, const float *bias, float *y, size_t ldy);
/* The quantized linear layer (lib/gemm_quant.c): y = x . w^T (+ bias) under the policy's
 * quantized gemm and quantizer, with wq the weight's codes and scales (quant_weight_for:
 * shipped, or the copy model_prepare_quant built); x rows ldx apart, y rows ldy apart; the
 * activations are quantized into the GEMM scratch (xpack), which holds
 * linear_quantized_scratch(quantizer, M, K) bytes. */
struct weight;
struct quant_weight;
void linear_quantized(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                      const struct weight *w, const struct quant_weight *wq, const float *bias,
                      float *y, size_t ldy);
size_t linear_quantized_scratch(int quantizer, size_t M, size_t K);

/* The fp32 values of a model weight that the context's GEMM reads: the masters (or the bf16
 * widened) under PARITY_COMPUTE_FP32, the widened copy on the openblas backend, else NULL. */
const float *linear_f32_weights(const fwd_ctx *ctx, const weight *w);
/* linear_weights, then the rounding point of its output (round_to_policy of each of y's M
 * rows), done by the GEMM's tasks where the backend is bf16 (as linear_round_point below). */
void linear_weights_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t ldx,
                                const gemm_weights *w, const float *bias, float *y, size_t ldy);
/* linear_weights on a model weight (and bias: rows = 0 for none), x and y contiguous. */
void linear(const fwd_ctx *ctx, size_t M, const float *x, const weight *w, const weight *bias,
            float *y);
/* linear, then the rounding point of its output (round_to_policy of all of y), the rounding
 * done by the GEMM's own tasks on the columns each computed where the backend is bf16 (the
 * same bits as a pass after the GEMM, without one core rounding all of y alone). */
void linear_round_point(const fwd_ctx *ctx, size_t M, const float *x, const weight *w,
                        const weight *bias, float *y);
/* linear_round_point of n <= GEMM_GROUP_MAX layers that read the same x (q, k and v; gate and
 * up): y[i] = round(x . w[i]^T + bias[i]) (bias[i] NULL or of rows = 0 for none), each
 * output the same bits as linear_round_point's. On the bf16 backend x is packed once and one
 * parallel loop runs the column blocks of all n (gemm_bf16w_group_pool); elsewhere the n run
 * one after the other. */
void linear_group_round_point(const fwd_ctx *ctx, size_t M, const float *x, size_t n,
                              const weight *const *w, const weight *const *bias, float *const *y);
/* The bf16-weight GEMM as linear() runs it: y[M][N] = x . w^T (x rows ldx apart, w rows ldw
 * apart, y rows ldy apart, K <= s->max_k): x packed over the pool (gemm_pack_x, or
 * gemm_pack_xt from the table's tiles_min_m rows on), then output columns split over the pool
 * in blocks (bench/gemm-bench times it). */
void gemm_bf16w_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                     const uint16_t *w, size_t ldw, float *y, size_t ldy, size_t N,
                     const gemm_scratch *s);
/* What a GEMM task does to the output columns it computed, before anyone else reads them: the
 * bias added to the fp32 sums, then the policy's output rounding. The same additions and the
 * same rounding as passes over y after the GEMM, so the same bits; done by every worker on
 * columns still in its cache instead of by the caller over all of y. */
typedef struct gemm_epilogue {
    const float *bias;           /* [N], or NULL */
    const parity_policy *round;  /* round_with this policy, or NULL */
} gemm_epilogue;
/* One GEMM of a group: y[M][N] = x . w^T (w rows ldw apart, y rows ldy apart), then ep (or
 * NULL). */
typedef struct gemm_part {
    const uint16_t *w;
    size_t ldw, N;
    float *y;
    size_t ldy;
    const gemm_epilogue *ep;
} gemm_part;
#define GEMM_GROUP_MAX 3
/* A SwiGLU MLP's first half where the bf16 backend runs it in one pass (bf16 compute, bf16
 * weights, K not split): gate = x . w_gate^T and up = x . w_up^T, each rounded as
 * linear_group_round_point rounds them, and out = the policy's swiglu(gate, up) (out may be
 * gate), all in the GEMM's tasks, each on the columns it has just computed; returns 1. Returns
 * 0 having done nothing elsewhere: the caller runs the GEMMs and the region itself. The same
 * bits either way (swiglu is elementwise). */
int linear_swiglu_fused(const fwd_ctx *ctx, size_t M, const float *x, const weight *w_gate,
                        const weight *w_up, float *gate, float *up, float *out);
/* gemm_bf16w_pool of n <= GEMM_GROUP_MAX GEMMs on the same x: x packed once, then the column
 * blocks of all n split over the pool in one parallel loop, each output the same bits as
 * its own gemm_bf16w_pool's (an output depends on nothing computed beside it). */
void gemm_bf16w_group_pool(threadpool *pool, size_t M, size_t K, const float *x, size_t ldx,
                           size_t n, const gemm_part *parts, const gemm_scratch *s);

/* Rows per attention task: a prefill's rows of one sequence share each block of keys and
 * values; a worker's attention scratch holds that many rows' scores, queries and
 * accumulators. */
#define ATTN_TASK_ROWS 16
static inline size_t attn_pv_floats(size_t group, size_t head_dim) {
    const size_t slots = ATTN_TASK_ROWS * group;
    /* + the queries packed as bf16 (half a float each), 64-byte aligned */
    return 2 * slots * head_dim + slots + 2 * KV_BLOCK * head_dim + (slots * head_dim + 1) / 2 + 16;
}

/* ---- attention (attention.c) ----------------------------------------------------------
 * For every row and head: causal attention over the row's positions 0..pos from the cache
 * of `layer`, per policy->attention; q [n_rows][heads*hd] -> att [n_rows][heads*hd]. */
void attention(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
               const float *q, float *att);

/* The K and V vectors of the rows (k, v: [n_rows][kv heads * head_dim], rows k_stride and
 * v_stride apart) into the cache of `layer` at the rows' positions: fp32 as they are, or
 * bf16 (round to nearest even: exact for the bf16 values the forward passes). */
void kv_store(const fwd_ctx *ctx, uint32_t layer, size_t n_rows, const fwd_row *rows,
              const float *k, size_t k_stride, const float *v, size_t v_stride);

#endif
