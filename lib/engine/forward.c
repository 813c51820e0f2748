/*
 * The forward pass, read top to bottom: one function for the scorer and the sampler. They
 * differ only in which rows they send (a whole sequence, a prefill chunk, one decode token
 * per sequence) and which rows they want logits for; K/V always go through the cache. The
 * layer's jobs are in layer.c; a looped (Ouro) model runs looped.c's forward instead.
 *
 * Every buffer is fp32. Under a bf16 policy the values in it are bf16 values (fp16 values
 * under PARITY_COMPUTE_FP16), made so at each rounding point below: a GEMM's output by
 * linear_round_point / linear_weights_round_point (round_to_policy of the output, done by
 * the GEMM's tasks as they finish their columns; under PARITY_COMPUTE_FP32 nothing rounds),
 * everything else inside a region kernel, by the policy switch named at the call. Grepping
 * layer.c for round_point lists the rounding points outside the regions;
 * lib/kernels/kernels_ref.c shows the ones inside.
 */
#include "forward.h"

#include <string.h>

#include "layer.h"
#include "looped.h"
#include "model/config.h"
#include "moe_layer.h"
#include "profile.h"

void forward(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
             const uint32_t *out_rows, float *logits) {
    if (ctx->model->config.arch == PARITY_ARCH_OURO) {
        forward_looped(ctx, n_rows, rows, n_out, out_rows, logits);
        return;
    }
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    const size_t R = n_rows, dim = c->hidden_size;

    double t = phase_start(ctx);
    if (ctx->prof) ctx->prof->forwards++, ctx->prof->rows += R;

    /* token embedding: the residual stream starts as the embedding rows (exact) */
    embed_tokens(ctx, R, rows, s->h);
    phase_lap(ctx, PARITY_PHASE_EMBED, &t);

    uint32_t sparse = 0; /* the sparse layers so far: a row's route record indexes them */
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *w = &m->layers[l];

        /* attention rmsnorm: layer 0 reads the embedding; later layers first add the
         * previous MLP's output to the residual stream (region: residual + RMSNorm) */
        layer_input_norm(ctx, w, l, R, &t);

        /* attention: q, k, v projections with their biases, each rounded; Qwen3's q/k-norm,
         * RoPE; the keys and values into the cache, attention, the output projection */
        layer_attention(ctx, w, l, R, rows, 1, c->qk_norm, &t);

        /* residual connection + MLP rmsnorm (region: residual + RMSNorm) */
        rows_rmsnorm_residual(ctx, R, &w->mlp_norm, s->delta, s->h, s->xn);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* SwiGLU MLP: gate and up projections rounded, silu(gate) * up (region: SwiGLU),
         * down projection rounded; or, in a sparse layer of a mixture-of-experts model, the
         * router, the experts that each row chose and their combine (moe_layer.c) */
        if (config_layer_is_sparse(c, l))
            layer_moe(ctx, w, sparse++, R, rows, &t);
        else
            layer_mlp(ctx, w, R, &t);
    }

    if (n_out == 0) return;

    /* gather the rows that want logits (out_rows ascending, so in place is safe) */
    for (size_t i = 0; i < n_out; i++) {
        size_t r = out_rows[i];
        if (r != i) {
            memmove(s->h + i * dim, s->h + r * dim, dim * sizeof(float));
            memmove(s->delta + i * dim, s->delta + r * dim, dim * sizeof(float));
        }
    }

    /* last residual connection + final rmsnorm, then the classifier */
    const gemm_weights head = head_weights(ctx);
    forward_head(ctx, n_out, s->delta, s->h, weight_values(&ctx->pol, &m->final_norm),
                 c->rms_norm_eps, s->xn, &head, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}
