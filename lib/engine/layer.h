/* The per-layer jobs of the forward (layer.c): the row-parallel region calls (RMSNorm, the
 * residual add with RMSNorm), a layer's attention block and MLP block, the embedding and the
 * head. The dense forward (forward.c) and the looped one (looped.c) are made of these. */
#ifndef PARITY_ENGINE_LAYER_H
#define PARITY_ENGINE_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "forward_types.h"
#include "gemm.h"
#include "model/model.h"

/* The model's RMSNorm with weight `norm` (its values as the policy reads them: weight_values)
 * of the R rows of x [R][hidden] into out (may be x), over the pool (region: RMSNorm). */
void rows_rmsnorm(const fwd_ctx *ctx, size_t R, const weight *norm, float *x, float *out);
/* h[r] += delta[r] (h updated to the rounded residual stream), then the model's RMSNorm with
 * weight `norm` into out, over the pool (region: residual + RMSNorm). */
void rows_rmsnorm_residual(const fwd_ctx *ctx, size_t R, const weight *norm, float *delta,
                           float *h, float *out);

/* A layer's input norm (its weight w->attn_norm) into s->xn: layer 0 reads the residual
 * stream s->h; a later layer first adds the previous layer's output s->delta to it. */
void layer_input_norm(const fwd_ctx *ctx, const layer_weights *w, uint32_t layer, size_t R,
                      double *t);
/* A layer's attention block on s->xn: the q, k, v projections (with their biases where
 * `bias`), each output rounded; Qwen3's q/k-norm over each head (where `qk_norm`), then RoPE
 * at each row's position; the rows' keys and values into KV plane `plane`, attention over the
 * cache there, and the output projection, rounded, into s->delta. */
void layer_attention(const fwd_ctx *ctx, const layer_weights *w, uint32_t plane, size_t R,
                     const fwd_row *rows, int bias, int qk_norm, double *t);
/* silu(x . w_gate^T) * (x . w_up^T) for the M rows of x (its own rows: s->xn, or an
 * expert's gathered rows), the two projections rounded, the product by the policy's swiglu
 * (region: SwiGLU), into s->gate [M][w_gate->rows]. */
void mlp_swiglu(const fwd_ctx *ctx, size_t M, const float *x, const weight *w_gate,
                const weight *w_up, double *t);
/* gate = the policy's swiglu(gate, up) on M rows of `width`, over the pool (region: SwiGLU). */
void rows_swiglu(const fwd_ctx *ctx, size_t M, float *gate, float *up, size_t width);
/* A layer's SwiGLU MLP on s->xn: gate and up projections rounded, silu(gate) * up (region:
 * SwiGLU), the down projection rounded, into s->delta. */
void layer_mlp(const fwd_ctx *ctx, const layer_weights *w, size_t R, double *t);

/* The embedding rows of tokens[0..n-1] (in range) into out (rows out_stride apart): the bf16
 * table widened exactly, or the fp32 table copied. */
void embed_rows(size_t n, const int32_t *tokens, size_t dim, const uint16_t *table_bf16,
                const float *table_f32, size_t table_stride, float *out, size_t out_stride);
/* The model's embedding of each row's token into h [R][hidden] (exact). */
void embed_tokens(const fwd_ctx *ctx, size_t R, const fwd_row *rows, float *h);

/* The model's lm_head as the GEMM reads it. */
gemm_weights head_weights(const fwd_ctx *ctx);
/* logits[n][N] = xn . lm_head^T (xn [n][lm_head->cols]), rounded to bf16 unless the policy
 * keeps an fp32 head. */
void head_logits(const fwd_ctx *ctx, size_t n, const float *xn, const gemm_weights *lm_head,
                 float *logits);
/* The head: h[r] += delta[r] with the final RMSNorm (region: residual + RMSNorm) into
 * xn [n][dim] (h updated to the rounded residual stream), then head_logits. norm: the fp32
 * values of the norm weight; eps the model's. */
void forward_head(const fwd_ctx *ctx, size_t n, float *delta, float *h, const float *norm,
                  float eps, float *xn, const gemm_weights *lm_head, float *logits);

#endif /* PARITY_ENGINE_LAYER_H */
