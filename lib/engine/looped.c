/*
 * The looped (Ouro) forward and its exit rules.
 *
 * One stack of N layers runs up to T = config_loops times per row. The loop index goes
 * outside the layer loop; RoPE is the row's position in every loop; loop t, layer l reads and
 * writes KV plane t * N + l. Ouro's layer (OuroDecoderLayer) norms each sublayer's output
 * before its residual add:
 *     h = h + norm2(attn(norm1(h)));  h = h + norm4(mlp(norm3(h)))
 * and the final norm ends every loop: its output is the next loop's input, and the head's and
 * the gate's input. Here the adds join the next norm as everywhere in the forward (region:
 * residual + RMSNorm): norm2 and norm4 are plain RMSNorms of the sublayer output, in place,
 * whose result is the delta the next residual region adds.
 *
 * Each row runs to its depth: a fixed one (rows[r].depth: a replayed schedule, a fixed-depth
 * rule, or all loops) or the first loop at which its exit rule fires on the gate's exit
 * distribution (policy->exit_dist). Its logits read its output at that loop (h_exit). After
 * its exit, under PARITY_LOOP_KV_LAST_EXITED the row runs no further loop and its K/V of
 * the exit loop are copied into the deeper planes of every layer, before the next loop runs,
 * so that later positions attend to them there; under PARITY_LOOP_KV_FULL it runs every loop
 * and computes every plane. Rows are independent: a row's values depend on its own depth,
 * its exit rule and the cache, never on which rows share the forward, so a sampler that exits
 * early and a scorer replaying the depths it recorded compute the same bits.
 */
#include "looped.h"

#include <string.h>

#include "base/errors.h"
#include "kernels/kernels.h"
#include "kvcache.h"
#include "layer.h"
#include "model/config.h"
#include "profile.h"


/* A step of the exit distribution, rounded to the model's format under PARITY_EXIT_DIST_MODEL
 * (nothing rounds under PARITY_COMPUTE_FP32). */
static float exit_round(const fwd_ctx *ctx, float x) {
    if (ctx->pol.exit_dist == PARITY_EXIT_DIST_MODEL) round_to_policy(&ctx->pol, &x, 1);
    return x;
}

/* The row's exit distribution after loop `depth` (1-based) of `loops`, given the gate's output
 * there (exit_pdf_step: that loop's p, the state advanced); exit_rule_fires: whether its rule
 * exits. OuroForCausalLM.forward: lambda = sigmoid(gate),
 * p = lambda * remaining and remaining *= 1 - lambda before the last loop, p = remaining at
 * it; the CDF is the running sum of the p (torch.cumsum: summed in fp32, each value rounded
 * to the tensor's dtype), compared with the threshold (a Python float against a bf16 tensor:
 * the threshold is rounded to bf16 first). */
static float exit_pdf_step(const fwd_ctx *ctx, loop_state *st, float gate, uint32_t depth,
                           uint32_t loops) {
    const float logit = exit_round(ctx, gate);
    const float lambda = exit_round(ctx, 1.0f / (1.0f + parity_expf(-logit)));
    float p;
    if (depth < loops) {
        p = exit_round(ctx, lambda * st->remaining);
        st->remaining = exit_round(ctx, st->remaining * exit_round(ctx, 1.0f - lambda));
    } else {
        p = st->remaining;
    }
    return p;
}

static int exit_rule_fires(const fwd_ctx *ctx, const fwd_exit *e, loop_state *st, float gate,
                           uint32_t depth, uint32_t loops) {
    const float p = exit_pdf_step(ctx, st, gate, depth, loops);
    st->cdf_sum += p;
    const float cdf = exit_round(ctx, st->cdf_sum);
    return depth >= e->max_depth || (depth >= e->min_depth && cdf >= exit_round(ctx, e->threshold));
}

/* Position pos's K and V of plane `from` into plane `to` (a row that exited: LAST_EXITED). */
static void kv_copy_plane(const kv_cache *kv, uint32_t from, uint32_t to, const uint32_t *blocks,
                          uint32_t pos) {
    const size_t hd = kv->head_dim, elem = kv->fp32 ? 4 : 2;
    for (size_t h = 0; h < kv->width / hd; h++) {
        const size_t src = kv_offset(kv, from, blocks, pos, h), dst = kv_offset(kv, to, blocks, pos, h);
        memcpy((char *)kv->k + dst * elem, (const char *)kv->k + src * elem, hd * elem);
        memcpy((char *)kv->v + dst * elem, (const char *)kv->v + src * elem, hd * elem);
    }
}

/* The N layers of loop `loop` on the R rows packed in s->h: leaves in s->delta the last
 * layer's normed MLP output, which the loop's final norm adds. */
static void looped_layers(const fwd_ctx *ctx, uint32_t loop, size_t R, const fwd_row *rows,
                          double *t) {
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *w = &m->layers[l];

        /* input_layernorm: layer 0 reads the loop's input; later layers first add the previous
         * layer's normed MLP output (region: residual + RMSNorm) */
        layer_input_norm(ctx, w, l, R, t);

        /* q, k, v projections without biases, each rounded; RoPE (no q/k-norm); this loop's
         * plane of the layer; attention; the output projection */
        layer_attention(ctx, w, loop * c->num_hidden_layers + l, R, rows, 0, 0, t);

        /* input_layernorm_2 on the attention output (region: RMSNorm, in place), then the
         * residual add and post_attention_layernorm (region: residual + RMSNorm) */
        rows_rmsnorm(ctx, R, &w->attn_out_norm, s->delta, s->delta);
        rows_rmsnorm_residual(ctx, R, &w->mlp_norm, s->delta, s->h, s->xn);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);

        /* SwiGLU MLP, as in forward() */
        layer_mlp(ctx, w, R, t);

        /* post_attention_layernorm_2 on the MLP output (region: RMSNorm, in place) */
        rows_rmsnorm(ctx, R, &w->mlp_out_norm, s->delta, s->delta);
        phase_lap(ctx, PARITY_PHASE_REGIONS, t);
    }
}

/* The head on the n normed rows in s->xn: logits[n][vocab], rounded unless the policy keeps
 * an fp32 head. */
static void looped_head(const fwd_ctx *ctx, size_t n, float *logits) {
    const gemm_weights head = head_weights(ctx);
    head_logits(ctx, n, ctx->s->xn, &head, logits);
}

void forward_looped(const fwd_ctx *ctx, size_t n_rows, fwd_row *rows, size_t n_out,
                    const uint32_t *out_rows, float *logits) {
    const parity_model *m = ctx->model;
    const parity_config *c = &m->config;
    fwd_scratch *s = ctx->s;
    const size_t dim = c->hidden_size;
    const uint32_t loops = config_loops(c), N = c->num_hidden_layers;
    const int full_kv = ctx->loop_kv == PARITY_LOOP_KV_FULL;

    double t = phase_start(ctx);
    if (ctx->prof) ctx->prof->forwards++, ctx->prof->rows += n_rows;

    /* the rows, packed in the order they came: row i in slot i */
    embed_tokens(ctx, n_rows, rows, s->h);
    for (size_t r = 0; r < n_rows; r++) {
        s->loop_rows[r] = rows[r];
        s->loop_slot[r] = (uint32_t)r;
        const uint32_t d = rows[r].depth && rows[r].depth < loops ? rows[r].depth : loops;
        s->loop_state[r] = (loop_state){1.0f, 0.0f, rows[r].exit && c->early_exit_gate ? 0 : d, 0};
    }
    phase_lap(ctx, PARITY_PHASE_EMBED, &t);

    size_t A = n_rows; /* rows still running */
    for (uint32_t loop = 0; loop < loops && A > 0; loop++) {
        const uint32_t depth = loop + 1;
        looped_layers(ctx, loop, A, s->loop_rows, &t);

        /* the loop's final norm (model.norm; region: residual + RMSNorm): its output, in xn,
         * is the loop's output */
        rows_rmsnorm_residual(ctx, A, &m->final_norm, s->delta, s->h, s->xn);
        phase_lap(ctx, PARITY_PHASE_REGIONS, &t);

        /* every loop's output, for the dense readouts */
        if (ctx->loop_out)
            for (size_t i = 0; i < A; i++)
                memcpy(ctx->loop_out + ((size_t)loop * s->max_rows + s->loop_slot[i]) * dim,
                       s->xn + i * dim, dim * sizeof(float));

        /* the exit gate, where a row's rule reads it (or the readouts its distribution):
         * Linear(hidden, 1) with its bias */
        const int pdf = ctx->loop_pdf && c->early_exit_gate;
        int gate = pdf;
        for (size_t i = 0; i < A && !gate; i++)
            gate = !s->loop_state[s->loop_slot[i]].target && !s->loop_state[s->loop_slot[i]].exited;
        if (gate) linear(ctx, A, s->xn, &m->exit_gate, &m->exit_gate_bias, s->gate);
        if (pdf)
            for (size_t i = 0; i < A; i++) {
                const uint32_t r = s->loop_slot[i];
                loop_state *st = &s->loop_state[r];
                if (st->target)
                    ctx->loop_pdf[(size_t)r * loops + loop] =
                        exit_pdf_step(ctx, st, s->gate[i], depth, loops);
            }

        /* exits, and the rows that run the next loop packed again, their input the output */
        size_t kept = 0;
        for (size_t i = 0; i < A; i++) {
            const uint32_t r = s->loop_slot[i];
            loop_state *st = &s->loop_state[r];
            if (!st->exited) {
                const int exits = st->target ? depth >= st->target
                                             : exit_rule_fires(ctx, rows[r].exit, st, s->gate[i],
                                                               depth, loops);
                if (exits || depth == loops) {
                    st->exited = 1;
                    rows[r].depth = depth;
                    memcpy(s->h_exit + (size_t)r * dim, s->xn + i * dim, dim * sizeof(float));
                    if (!full_kv) {
                        const fwd_row *row = &s->loop_rows[i];
                        for (uint32_t deeper = depth; deeper < loops; deeper++)
                            for (uint32_t l = 0; l < N; l++)
                                kv_copy_plane(ctx->kv, loop * N + l, deeper * N + l, row->blocks,
                                              row->pos);
                        continue;
                    }
                }
            }
            if (kept != i) {
                s->loop_rows[kept] = s->loop_rows[i];
                s->loop_slot[kept] = r;
            }
            memcpy(s->h + kept * dim, s->xn + i * dim, dim * sizeof(float));
            kept++;
        }
        A = kept;
        phase_lap(ctx, PARITY_PHASE_HEAD, &t);
    }

    if (n_out == 0) return;
    /* the head on each wanted row's exit-loop output (Ouro's lm_head reads the normed state) */
    for (size_t i = 0; i < n_out; i++)
        memcpy(s->xn + i * dim, s->h_exit + (size_t)out_rows[i] * dim, dim * sizeof(float));
    looped_head(ctx, n_out, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}

void forward_loop_logits(const fwd_ctx *ctx, uint32_t loop, size_t n_out,
                         const uint32_t *out_rows, float *logits) {
    fwd_scratch *s = ctx->s;
    const size_t dim = ctx->model->config.hidden_size;
    double t = phase_start(ctx);
    for (size_t i = 0; i < n_out; i++)
        memcpy(s->xn + i * dim, ctx->loop_out + ((size_t)loop * s->max_rows + out_rows[i]) * dim,
               dim * sizeof(float));
    looped_head(ctx, n_out, logits);
    phase_lap(ctx, PARITY_PHASE_HEAD, &t);
}

/* ---- the exit rules ------------------------------------------------------------------------ */

int exit_rule_check(const parity_config *c, uint32_t rule, float threshold, uint32_t min_depth,
                    uint32_t max_depth) {
    const uint32_t T = config_loops(c);
    if (rule > PARITY_EXIT_FIXED)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "exit_rule %u is not a parity_exit_rule", rule);
    if (rule == PARITY_EXIT_FULL) return PARITY_OK;
    if (c->arch != PARITY_ARCH_OURO)
        return set_error(PARITY_ERR_UNSUPPORTED,
                         "exit_rule %u: the model (%s) does not loop; only PARITY_EXIT_FULL", rule,
                         parity_arch_name((int)c->arch));
    if (min_depth > T || max_depth > T)
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "min_depth %u / max_depth %u: the model runs at most %u loops "
                         "(total_ut_steps)", min_depth, max_depth, T);
    if (rule == PARITY_EXIT_THRESHOLD) {
        if (!c->early_exit_gate)
            return set_error(PARITY_ERR_UNSUPPORTED,
                             "PARITY_EXIT_THRESHOLD needs the exit gate, and this looped model "
                             "has none (a fixed-loop model): use PARITY_EXIT_FIXED or FULL");
        if (!(threshold >= 0.0f && threshold <= 1.0f))
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "exit_threshold %g is not in [0, 1]",
                             (double)threshold);
        const uint32_t lo = min_depth ? min_depth : 1, hi = max_depth ? max_depth : T;
        if (lo > hi)
            return set_error(PARITY_ERR_INVALID_ARGUMENT, "min_depth %u is above max_depth %u", lo,
                             hi);
    }
    return PARITY_OK;
}

fwd_exit exit_rule_resolve(const parity_config *c, float threshold, uint32_t min_depth,
                           uint32_t max_depth) {
    return (fwd_exit){threshold, min_depth ? min_depth : 1,
                      max_depth ? max_depth : config_loops(c)};
}

fwd_row exit_rule_row(fwd_row row, uint32_t rule, const fwd_exit *e) {
    if (rule == PARITY_EXIT_THRESHOLD) row.exit = e;
    if (rule == PARITY_EXIT_FIXED) row.depth = e->max_depth;
    return row;
}
