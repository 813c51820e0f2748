/* The forward pieces (parity_embedding, parity_linear, parity_attention, parity_head_logprobs,
 * parity_logprobs_from_logits, parity_moe_route, parity_moe_combine): a whole Qwen3 forward
 * composed from them and the public region kernels, rounding at the policy's points as a host
 * would, gives parity_score's log-probs bit for bit — every preset with bf16 compute (and
 * +fp32-head), both backends, the three log-prob modes, one thread or a pool of two, on every
 * CPU path — and the head's second half on the head's own logits its log-probs and entropies;
 * so do Qwen3-MoE and Qwen2-MoE forwards under each preset's router and combine, routing the
 * experts parity_score records, and replaying a record; each piece on its own is invariant to
 * the rows beside it and the pool; and bad arguments get a status and a message, with no
 * output written. */
#include <math.h>

#include "fixtures.h"
#include "model/config.h"
#include "model/model.h"

/* ---- bf16 buffers for the region kernels ------------------------------------------------- */

static void to_bf16(const float *x, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = parity_bf16_from_f32(x[i]);
}
static void from_bf16(const uint16_t *x, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = parity_bf16_to_f32(x[i]);
}
static void round_all(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = parity_bf16_to_f32(parity_bf16_from_f32(x[i]));
}

/* The host's forward: the model's weights (bf16), the policy, the backend, a pool (or NULL);
 * writes the log-probs of positions 1..len-1 of each sequence, as parity_score does. */
typedef struct host {
    const parity_model *m;
    parity_policy pol;
    uint32_t backend;
    parity_pool *pool;
    const uint16_t *replay;  /* mixture of experts: NULL, or the routes to replay */
    uint16_t *routes;        /* mixture of experts: NULL, or where the routes run are written */
} host;

/* x W^T (+ the bias b, a bf16 weight, when it has rows), unrounded. */
static int host_linear_fp32(const host *h, size_t rows, const float *x, const weight *w,
                            const weight *b, float *y) {
    float *bias = b && b->rows ? calloc(w->rows, 4) : NULL;
    if (bias) from_bf16(b->bf16, bias, w->rows);
    const int rc = parity_linear(h->pool, &h->pol, h->backend, rows, w->cols, w->rows, x, w->cols,
                                 PARITY_DTYPE_BF16, w->bf16, w->cols, bias, y, w->rows);
    free(bias);
    return rc;
}

static int host_linear_bias(const host *h, size_t rows, const float *x, const weight *w,
                            const weight *b, float *y) {
    int rc = host_linear_fp32(h, rows, x, w, b, y);
    round_all(y, rows * w->rows);  /* every GEMM output rounded once */
    return rc;
}

static int host_linear(const host *h, size_t rows, const float *x, const weight *w, float *y) {
    return host_linear_bias(h, rows, x, w, NULL, y);
}

/* One SwiGLU expert on `rows` rows of x: gate and up rounded, the SwiGLU region, the down
 * projection's output unrounded, into y [rows][hidden]. */
static void host_expert(const host *h, size_t rows, const float *x, const weight *w_gate,
                        const weight *w_up, const weight *w_down, float *y) {
    const size_t inter = w_gate->rows;
    float *gate = calloc(rows * inter, 4), *up = calloc(rows * inter, 4);
    uint16_t *g16 = calloc(rows * inter, 2), *u16 = calloc(rows * inter, 2);
    CHECK_OK(host_linear(h, rows, x, w_gate, gate));
    CHECK_OK(host_linear(h, rows, x, w_up, up));
    to_bf16(gate, g16, rows * inter);
    to_bf16(up, u16, rows * inter);
    CHECK_OK(parity_swiglu(&h->pol, rows, inter, g16, inter, u16, inter, g16, inter));
    from_bf16(g16, gate, rows * inter);
    CHECK_OK(host_linear_fp32(h, rows, gate, w_down, NULL, y));
    free(gate), free(up), free(g16), free(u16);
}

/* A sparse layer's MLP block on T rows of xn into delta: the router's logits (rounded), each
 * row's route (parity_moe_route, replayed from h->replay where given), each (row, slot)'s
 * expert run on that row alone, the shared expert and its gate, parity_moe_combine. `sparse`
 * counts the sparse layers before this one (the routes' index). */
static void host_moe(const host *h, const layer_weights *w, uint32_t sparse, size_t T,
                     const float *xn, float *delta) {
    const parity_config *c = &h->m->config;
    const size_t dim = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const size_t stride = config_sparse_layers(c) * k;
    float *logits = calloc(T * E, 4), *weights = calloc(T * k, 4), *y = calloc(T * k * dim, 4);
    uint16_t *ids = calloc(T * k, 2), *replay = NULL;
    CHECK_OK(host_linear(h, T, xn, &w->router, logits));
    if (h->replay) {
        replay = calloc(T * k, 2);
        for (size_t r = 0; r < T; r++)
            memcpy(replay + r * k, h->replay + r * stride + sparse * k, k * 2);
    }
    CHECK_OK(parity_moe_route(&h->pol, T, (uint32_t)E, (uint32_t)k, (int)c->norm_topk_prob,
                              logits, E, replay, ids, weights));
    for (size_t r = 0; h->routes && r < T; r++)
        memcpy(h->routes + r * stride + sparse * k, ids + r * k, k * 2);
    for (size_t i = 0; i < T * k; i++)
        host_expert(h, 1, xn + i / k * dim, &w->expert_gate[ids[i]], &w->expert_up[ids[i]],
                    &w->expert_down[ids[i]], y + i * dim);
    float *y_shared = NULL, *gate = NULL;
    if (w->shared_gate.rows) {
        y_shared = calloc(T * dim, 4), gate = calloc(T, 4);
        host_expert(h, T, xn, &w->shared_gate, &w->shared_up, &w->shared_down, y_shared);
        CHECK_OK(host_linear(h, T, xn, &w->shared_expert_gate, gate));
    }
    CHECK_OK(parity_moe_combine(&h->pol, T, dim, (uint32_t)k, ids, weights, y, y_shared, gate,
                                delta));
    free(logits), free(weights), free(y), free(ids), free(replay), free(y_shared), free(gate);
}

static void host_score(const host *h, const parity_score_options *o, const int32_t *tokens,
                       const uint32_t *lengths, size_t n_seqs, float *logprobs) {
    const parity_model *m = h->m;
    const parity_config *c = &m->config;
    const parity_policy *pol = &h->pol;
    size_t T = 0;
    for (size_t i = 0; i < n_seqs; i++) T += lengths[i];
    const size_t dim = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads,
                 nkv = c->num_key_value_heads, inter = c->intermediate_size;
    const float eps = c->rms_norm_eps;
    float *hs = calloc(T * dim, 4), *delta = calloc(T * dim, 4), *xn = calloc(T * dim, 4);
    float *q = calloc(T * nh * hd, 4), *k = calloc(T * nkv * hd, 4), *v = calloc(T * nkv * hd, 4);
    float *att = calloc(T * nh * hd, 4), *gate = calloc(T * inter, 4), *up = calloc(T * inter, 4);
    size_t widest = inter > nh * hd ? inter : nh * hd;
    uint16_t *b1 = calloc(T * widest, 2), *b2 = calloc(T * widest, 2), *b3 = calloc(T * widest, 2);
    int32_t *pos = calloc(T, 4);
    for (size_t i = 0, at = 0; i < n_seqs; i++)
        for (uint32_t t = 0; t < lengths[i]; t++) pos[at++] = (int32_t)t;

    CHECK_OK(parity_embedding(T, tokens, c->vocab_size, dim, PARITY_DTYPE_BF16, m->embed.bf16,
                              dim, hs, dim));
    for (uint32_t l = 0, sparse = 0; l < c->num_hidden_layers; l++) {
        const layer_weights *w = &m->layers[l];
        if (l == 0) {
            to_bf16(hs, b1, T * dim);
            CHECK_OK(parity_rmsnorm(pol, 0, T, dim, b1, dim, w->attn_norm.bf16, eps, b2, dim));
        } else {
            to_bf16(delta, b1, T * dim);
            to_bf16(hs, b3, T * dim);
            CHECK_OK(parity_rmsnorm_residual(pol, T, dim, b1, dim, b3, dim, w->attn_norm.bf16,
                                             eps, b3, dim, b2, dim));
            from_bf16(b3, hs, T * dim);
        }
        from_bf16(b2, xn, T * dim);
        CHECK_OK(host_linear_bias(h, T, xn, &w->wq, &w->bq, q));
        CHECK_OK(host_linear_bias(h, T, xn, &w->wk, &w->bk, k));
        CHECK_OK(host_linear_bias(h, T, xn, &w->wv, &w->bv, v));
        to_bf16(q, b1, T * nh * hd);
        to_bf16(k, b2, T * nkv * hd);
        if (c->qk_norm) {
            CHECK_OK(parity_rmsnorm(pol, 1, T * nh, hd, b1, hd, w->q_norm.bf16, eps, b1, hd));
            CHECK_OK(parity_rmsnorm(pol, 1, T * nkv, hd, b2, hd, w->k_norm.bf16, eps, b2, hd));
        }
        CHECK_OK(parity_rope(pol, T, nh, hd, b1, nh * hd, pos, c->rope_theta));
        CHECK_OK(parity_rope(pol, T, nkv, hd, b2, nkv * hd, pos, c->rope_theta));
        from_bf16(b1, q, T * nh * hd);
        from_bf16(b2, k, T * nkv * hd);
        CHECK_OK(parity_attention(h->pool, pol, n_seqs, lengths, nh, nkv, hd, q, nh * hd, k,
                                  nkv * hd, v, nkv * hd, att, nh * hd));
        CHECK_OK(host_linear(h, T, att, &w->wo, delta));
        to_bf16(delta, b1, T * dim);
        to_bf16(hs, b3, T * dim);
        CHECK_OK(parity_rmsnorm_residual(pol, T, dim, b1, dim, b3, dim, w->mlp_norm.bf16, eps, b3,
                                         dim, b2, dim));
        from_bf16(b3, hs, T * dim);
        from_bf16(b2, xn, T * dim);
        if (config_layer_is_sparse(c, l)) {
            host_moe(h, w, sparse++, T, xn, delta);
            continue;
        }
        CHECK_OK(host_linear(h, T, xn, &w->w_gate, gate));
        CHECK_OK(host_linear(h, T, xn, &w->w_up, up));
        to_bf16(gate, b1, T * inter);
        to_bf16(up, b2, T * inter);
        CHECK_OK(parity_swiglu(pol, T, inter, b1, inter, b2, inter, b1, inter));
        from_bf16(b1, gate, T * inter);
        CHECK_OK(host_linear(h, T, gate, &w->w_down, delta));
    }
    /* the head on every position but each sequence's last, predicting the next token */
    size_t n_out = 0;
    int32_t *targets = calloc(T, 4);
    for (size_t i = 0, at = 0; i < n_seqs; at += lengths[i++])
        for (uint32_t t = 0; t + 1 < lengths[i]; t++) {
            memmove(hs + n_out * dim, hs + (at + t) * dim, dim * 4);
            memmove(delta + n_out * dim, delta + (at + t) * dim, dim * 4);
            targets[n_out++] = tokens[at + t + 1];
        }
    const size_t V = c->vocab_size;
    float *logits = calloc(n_out * (V + 3), 4), *entropy = calloc(n_out, 4);
    float *again = calloc(n_out, 4), *entropy_again = calloc(n_out, 4);
    CHECK_OK(parity_head_logprobs(h->pool, pol, h->backend, o, n_out, dim, V, hs, dim, delta, dim,
                                  PARITY_DTYPE_BF16, m->final_norm.bf16, eps, m->lm_head.bf16,
                                  dim, targets, logprobs, entropy, logits, V + 3));
    /* the head's second half on the logits it returned: its log-probs and entropies bit for
     * bit (the rows V + 3 apart, so that the call packs them) */
    CHECK_OK(parity_logprobs_from_logits(h->pool, pol, o, n_out, V, logits, V + 3, targets, again,
                                         entropy_again));
    CHECK_BITS_F32(again, logprobs, n_out, "parity_logprobs_from_logits: log-probs");
    CHECK_BITS_F32(entropy_again, entropy, n_out, "parity_logprobs_from_logits: entropies");
    free(logits), free(entropy), free(again), free(entropy_again);
    free(targets);
    free(hs), free(delta), free(xn), free(q), free(k), free(v), free(att), free(gate), free(up);
    free(b1), free(b2), free(b3), free(pos);
}

/* ---- the composed forward against parity_score ---------------------------------------------- */

/* Every preset with bf16 compute (and two fp8 formats, whose weights parity_linear quantizes
 * from the same bf16 values as the model) on the CPU path the library picked; on the other
 * paths (whose kernels the other tests hold equal to it) and in quick mode (the sanitizer
 * tiers) the two presets that differ at every point. */
static void compare_with_scorer(const parity_model *m, const char *what, const int32_t *tokens,
                                const uint32_t *lengths, size_t n_seqs, parity_pool *pool2,
                                int all_presets) {
    static const char *const presets[] = {"hf-eager", "aligned+fp32-head", "hf-sdpa", "vllm",
                                          "sglang", "aligned", "vllm+fp32-head",
                                          "vllm+fp8-block:deepseek", "hf-eager+mxfp8:te",
                                          "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp",
                                          "hf-eager+ternary:bitnet"};
    const size_t n_presets = all_presets ? sizeof presets / sizeof presets[0] : 2;
    size_t n_lp = 0;
    for (size_t i = 0; i < n_seqs; i++) n_lp += lengths[i] - 1;
    float *want = calloc(n_lp, 4), *got = calloc(n_lp, 4);
    for (size_t p = 0; p < n_presets; p++)
        for (uint32_t backend = 0; backend <= PARITY_BACKEND_AMX; backend++)
            for (uint32_t mode = 0; mode <= PARITY_LOGPROB_PROCESSED_TRUNCATED; mode++) {
                if (!backend_runs(backend)) continue;
                parity_score_options o;
                parity_score_default_options(&o);
                o.mode = mode;
                if (mode) o.temperature = 0.7f;
                if (mode == PARITY_LOGPROB_PROCESSED_TRUNCATED) o.top_k = 40, o.top_p = 0.9f;
                fixture f = {.policy = presets[p], .backend = backend};
                parity_scorer *s = new_scorer(m, f);
                CHECK_OK(parity_score(s, &o, tokens, lengths, n_seqs, want, NULL, NULL, NULL));
                parity_scorer_free(s);
                host h = {m, {0}, backend, (p + mode) % 2 ? pool2 : NULL, NULL, NULL};
                CHECK_OK(parity_policy_from_name(presets[p], &h.pol));
                memset(got, 0xff, n_lp * 4);
                host_score(&h, &o, tokens, lengths, n_seqs, got);
                char label[160];
                snprintf(label, sizeof label, "%s, %s, %s, %s, mode %u, %s", what,
                         parity_cpu_path_name(parity_get_cpu_path()), presets[p],
                         parity_backend_name((int)backend), mode, h.pool ? "pool of 2" : "no pool");
                CHECK_BITS_F32(got, want, n_lp, label);
            }
    free(want);
    free(got);
}

static void test_composed_forward(parity_pool *pool2) {
    parity_model *tiny, *trained;
    if (!load_tiny_and_trained("synthetic:tiny", &tiny, &trained)) return;
    /* sequences of different lengths, across KV blocks, one of length 1 */
    static const char text[] = "def parity(x):\n    return x == x  # bit for bit\n";
    const uint32_t lengths[] = {37, 1, 20, 9};
    int32_t tokens[67];
    for (size_t i = 0; i < 67; i++) tokens[i] = (unsigned char)text[i % (sizeof text - 1)];
    int32_t tiny_tokens[67];
    uint64_t st = 7;
    for (size_t i = 0; i < 67; i++)
        tiny_tokens[i] = (int32_t)(xorshift64(&st) % tiny->config.vocab_size);

    parity_cpu_path saved = parity_get_cpu_path();
    for (int path = PARITY_CPU_PORTABLE; path <= PARITY_CPU_AVX512BF16; path++) {
        if (quick() && path != (int)saved) continue;
        if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
        const int all = path == (int)saved && !quick();
        compare_with_scorer(tiny, "synthetic:tiny", tiny_tokens, lengths, 4, pool2, all);
        compare_with_scorer(trained, "trained", tokens, lengths, 4, pool2, all);
    }
    parity_set_cpu_path(saved);
    parity_model_free(tiny);
    parity_model_free(trained);
}

/* A Qwen3-MoE and a Qwen2-MoE model composed from the pieces under each preset's router and
 * combine: the log-probs and the experts each position ran equal parity_score's; then a
 * routing record another policy ran, replayed by both, gives the same log-probs again. */
static void test_composed_moe(parity_pool *pool2) {
    static const char *const models[] = {"synthetic:qwen3-moe-tiny", "synthetic:qwen2-moe-tiny"};
    static const char *const presets[] = {"hf-eager", "vllm", "sglang", "aligned",
                                          "vllm+aligned"};
    const uint32_t lengths[] = {21, 1, 14};
    const size_t n_seqs = 3, T = 36, n_lp = 33;
    for (size_t mi = 0; mi < 2; mi++) {
        parity_model *m = NULL;
        CHECK_OK(parity_model_open(models[mi], &m));
        if (!m) continue;
        const parity_config *c = &m->config;
        const size_t stride = config_sparse_layers(c) * c->num_experts_per_tok;
        int32_t tokens[36];
        uint64_t st = 11 + mi;
        for (size_t i = 0; i < T; i++) tokens[i] = (int32_t)(xorshift64(&st) % c->vocab_size);
        float want[33], got[33];
        uint16_t *want_routes = calloc(T * stride, 2), *got_routes = calloc(T * stride, 2);
        uint16_t *other = calloc(T * stride, 2);
        parity_score_options o;
        parity_score_default_options(&o);
        for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
            char label[160];
            snprintf(label, sizeof label, "%s, %s", models[mi], presets[p]);
            parity_scorer *s = new_scorer(m, (fixture){.policy = presets[p]});
            o.routes = NULL, o.routes_out = want_routes;
            CHECK_OK(parity_score(s, &o, tokens, lengths, n_seqs, want, NULL, NULL, NULL));
            host h = {m, {0}, PARITY_BACKEND_BF16, p % 2 ? pool2 : NULL, NULL, got_routes};
            CHECK_OK(parity_policy_from_name(presets[p], &h.pol));
            memset(got, 0xff, sizeof got);
            host_score(&h, &o, tokens, lengths, n_seqs, got);
            CHECK_BITS_F32(got, want, n_lp, label);
            CHECK(memcmp(got_routes, want_routes, T * stride * 2) == 0);
            /* replay the previous preset's routes (the first replays the last's) */
            if (p == 0) {
                parity_scorer *last = new_scorer(m, (fixture){.policy = "sglang"});
                o.routes_out = other;
                CHECK_OK(parity_score(last, &o, tokens, lengths, n_seqs, got, NULL, NULL, NULL));
                parity_scorer_free(last);
            }
            o.routes = other, o.routes_out = NULL;
            CHECK_OK(parity_score(s, &o, tokens, lengths, n_seqs, want, NULL, NULL, NULL));
            h.replay = other, h.routes = NULL;
            memset(got, 0xff, sizeof got);
            host_score(&h, &o, tokens, lengths, n_seqs, got);
            snprintf(label, sizeof label, "%s, %s, replayed", models[mi], presets[p]);
            CHECK_BITS_F32(got, want, n_lp, label);
            memcpy(other, want_routes, T * stride * 2);
            parity_scorer_free(s);
        }
        free(want_routes), free(got_routes), free(other);
        parity_model_free(m);
    }
}

/* The router and the combine on values worked by hand: the top-k with a tie (to the lower
 * index), the HF weights (softmax, renormalised, rounded to bf16), a replayed route, the FP32
 * combine with a shared expert; and their bad arguments, each with its status and no output
 * written. */
static void test_moe_pieces(void) {
    parity_policy hf, fp32c;
    CHECK_OK(parity_policy_from_name("hf-eager", &hf));
    CHECK_OK(parity_policy_from_name("aligned", &fp32c));
    /* logits 0, ln 3, ln 3, 0: p = (1, 3, 3, 1) / 8; the top 2 are experts 1 and 2 (the tie
     * to the lower index), each weighted 0.5 once renormalised */
    const float logits[4] = {0.0f, logf(3.0f), logf(3.0f), 0.0f};
    uint16_t ids[2] = {99, 99};
    float w[2] = {-1, -1};
    CHECK_OK(parity_moe_route(&hf, 1, 4, 2, 1, logits, 4, NULL, ids, w));
    CHECK_INT(ids[0], 1);
    CHECK_INT(ids[1], 2);
    CHECK(w[0] == 0.5f && w[1] == 0.5f);
    /* without renormalisation: p itself, 3/8 (to the float rounding of the softmax) */
    CHECK_OK(parity_moe_route(&hf, 1, 4, 2, 0, logits, 4, NULL, ids, w));
    CHECK(fabsf(w[0] - 0.375f) < 1e-6f && w[0] == w[1]);
    /* replaying experts 3 and 0: their weights, renormalised, in the order given */
    const uint16_t replay[2] = {3, 0};
    CHECK_OK(parity_moe_route(&hf, 1, 4, 2, 1, logits, 4, replay, ids, w));
    CHECK_INT(ids[0], 3);
    CHECK_INT(ids[1], 0);
    CHECK(w[0] == 0.5f && w[1] == 0.5f);
    /* FP32 combine: 0.25 * y0 + 0.75 * y1 + sigmoid(0) * y_shared, rounded once */
    const uint16_t cid[2] = {5, 2};
    const float cw[2] = {0.25f, 0.75f}, y[4] = {4.0f, 8.0f, 8.0f, -4.0f};
    const float ysh[2] = {2.0f, 6.0f}, gate[1] = {0.0f};
    float out[2] = {0, 0};
    CHECK_OK(parity_moe_combine(&fp32c, 1, 2, 2, cid, cw, y, ysh, gate, out));
    CHECK(out[0] == 8.0f && out[1] == 2.0f);

    /* bad arguments: the status, a message, and no output written */
    static const uint16_t repeated[2] = {1, 1}, beyond[2] = {0, 4};
    float in_place[4] = {2.0f, 3.0f, 0.5f, -1.0f};
    parity_policy topk_first = hf;
    topk_first.moe_router = PARITY_MOE_ROUTER_TOPK_SOFTMAX;
    /* weights over the logits they are computed from: refused, the logits untouched */
    CHECK_STATUS(parity_moe_route(&topk_first, 1, 4, 2, 1, in_place, 4, NULL, ids, in_place),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "overlap") != NULL && in_place[0] == 2.0f);
    CHECK_STATUS(parity_moe_combine(&fp32c, 1, 2, 2, cid, cw, y, ysh, gate, (float *)y + 1),
                 PARITY_ERR_INVALID_ARGUMENT);
    ids[0] = ids[1] = 77;
    CHECK_STATUS(parity_moe_route(&hf, 1, 4, 2, 1, logits, 4, repeated, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "repeated") != NULL);
    CHECK_STATUS(parity_moe_route(&hf, 1, 4, 2, 1, logits, 4, beyond, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "not below n_experts") != NULL);
    CHECK_STATUS(parity_moe_route(&hf, 1, 4, 5, 1, logits, 4, NULL, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_route(&hf, 1, 0, 1, 1, logits, 4, NULL, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_route(&hf, 1, 4, 2, 1, logits, 3, NULL, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_route(&hf, 1, 4, 2, 1, NULL, 4, NULL, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_route(NULL, 1, 4, 2, 1, logits, 4, NULL, ids, w),
                 PARITY_ERR_INVALID_ARGUMENT);
    parity_policy topk = hf;
    topk.moe_router = PARITY_MOE_ROUTER_TOPK_SOFTMAX;
    CHECK_STATUS(parity_moe_route(&topk, 1, 4, 2, 0, logits, 4, NULL, ids, w), PARITY_ERR_POLICY);
    parity_policy bad = hf;
    bad.moe_combine = 9;
    CHECK_STATUS(parity_moe_route(&bad, 1, 4, 2, 1, logits, 4, NULL, ids, w), PARITY_ERR_POLICY);
    CHECK(ids[0] == 77 && ids[1] == 77);
    out[0] = out[1] = -3.0f;
    CHECK_STATUS(parity_moe_combine(&fp32c, 1, 2, 2, cid, cw, y, ysh, NULL, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_combine(&fp32c, 1, 2, 0, cid, cw, y, NULL, NULL, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_combine(&fp32c, 0, 2, 2, cid, cw, y, NULL, NULL, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_combine(&fp32c, 1, 2, 2, cid, NULL, y, NULL, NULL, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_moe_combine(&fp32c, 1, 2, 2, cid, cw, y, NULL, NULL, (float *)y),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK(out[0] == -3.0f && out[1] == -3.0f);
}

/* ---- each piece alone: rows beside it, the pool and fp32 compute --------------------------- */

/* A quantized linear layer's rows holding a NaN or an infinity give NaN outputs in every
 * column, bias or not, in the formats whose elements have no NaN (E2M1, int8), and the other
 * rows are bitwise what they give alone. */
static void test_quantized_nonfinite_rows(parity_pool *pool2) {
    parity_model *m = NULL;
    load_model(TRAINED_MODEL, &m);
    if (!m) return;
    const weight *w = &m->layers[1].w_up;
    const size_t M = 5, K = w->cols, N = w->rows;
    float *x = calloc(M * K, 4), *y = calloc(M * N, 4), *y1 = calloc(N, 4), *bias = calloc(N, 4);
    uint64_t st = 5;
    for (size_t i = 0; i < M * K; i++)
        x[i] = (float)((int64_t)(xorshift64(&st) % 2001) - 1000) / 512.0f;
    for (size_t j = 0; j < N; j++) bias[j] = (float)((int64_t)(xorshift64(&st) % 201) - 100) / 64.0f;
    x[2 * K + 7] = NAN;
    x[3 * K + K - 1] = -INFINITY;
    static const char *const pols[] = {"vllm+nvfp4:modelopt", "vllm+mxfp4:ocp",
                                       "vllm+ternary:bitnet", "hf-eager+ternary:hf-bitlinear"};
    for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            parity_policy pol;
            CHECK_OK(parity_policy_from_name(pols[p], &pol));
            const float *b = with_bias ? bias : NULL;
            CHECK_OK(parity_linear(pool2, &pol, 0, M, K, N, x, K, PARITY_DTYPE_BF16, w->bf16, K, b,
                                   y, N));
            size_t nan_rows = 0, finite_rows = 0;
            for (size_t r = 0; r < M; r++) {
                size_t nans = 0;
                for (size_t c = 0; c < N; c++) nans += isnan(y[r * N + c]) != 0;
                if (r == 2 || r == 3) {
                    nan_rows += nans == N;
                    continue;
                }
                CHECK_OK(parity_linear(NULL, &pol, 0, 1, K, N, x + r * K, K, PARITY_DTYPE_BF16,
                                       w->bf16, K, b, y1, N));
                finite_rows += nans == 0;
                char label[128];
                snprintf(label, sizeof label, "%s, bias %d: row %zu beside non-finite rows", pols[p],
                         with_bias, r);
                CHECK_BITS_F32(y1, y + r * N, N, label);
            }
            CHECK_INT(nan_rows, 2);
            CHECK_INT(finite_rows, 3);
        }
    free(x), free(y), free(y1), free(bias);
    parity_model_free(m);
}

static void test_invariance(parity_pool *pool2) {
    parity_model *m = NULL;
    load_model(TRAINED_MODEL, &m);
    if (!m) return;
    const weight *w = &m->layers[2].w_gate;
    const size_t M = 37, K = w->cols, N = w->rows;
    float *x = calloc(M * K, 4), *y = calloc(M * N, 4), *y1 = calloc(N, 4);
    uint64_t st = 99;
    for (size_t i = 0; i < M * K; i++)
        x[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)((int64_t)(xorshift64(&st) % 2001)
                                                               - 1000) / 256.0f));
    static const char *const pols[] = {"aligned", "fp32"};
    for (size_t p = 0; p < 2; p++)
        for (uint32_t backend = 0; backend <= PARITY_BACKEND_AMX; backend++) {
            if (!backend_runs(backend)) continue;
            parity_policy pol;
            CHECK_OK(parity_policy_from_name(pols[p], &pol));
            const int fp32 = pol.compute == PARITY_COMPUTE_FP32;
            const uint32_t dt = fp32 ? PARITY_DTYPE_F32 : PARITY_DTYPE_BF16;
            const void *wp = fp32 ? (const void *)weight_f32(w) : (const void *)w->bf16;
            if (fp32 && !weight_f32(w)) CHECK_OK(model_prepare(m, MODEL_NEED_WIDE));
            wp = fp32 ? (const void *)weight_f32(w) : (const void *)w->bf16;
            CHECK_OK(parity_linear(pool2, &pol, backend, M, K, N, x, K, dt, wp, K, NULL, y, N));
            for (size_t r = 0; r < M; r += 5) {
                CHECK_OK(parity_linear(NULL, &pol, backend, 1, K, N, x + r * K, K, dt, wp, K, NULL,
                                       y1, N));
                char label[96];
                snprintf(label, sizeof label, "linear row %zu alone, %s, %s", r, pols[p],
                         parity_backend_name((int)backend));
                CHECK_BITS_F32(y1, y + r * N, N, label);
            }
            /* the bias joins each fp32 sum as one addition after it, whether the GEMM's tasks
             * add it (the bf16 backend's epilogue, on the pool) or a pass after the GEMM does */
            float *bias = calloc(N, 4), *yb = calloc(M * N, 4);
            for (size_t j = 0; j < N; j++)
                bias[j] = (float)((int64_t)(xorshift64(&st) % 2001) - 1000) / 4096.0f;
            CHECK_OK(parity_linear(pool2, &pol, backend, M, K, N, x, K, dt, wp, K, bias, yb, N));
            for (size_t i = 0; i < M * N; i++) y[i] += bias[i % N];
            char label[96];
            snprintf(label, sizeof label, "linear with bias = without, then + bias, %s, %s",
                     pols[p], parity_backend_name((int)backend));
            CHECK_BITS_F32(y, yb, M * N, label);
            free(bias), free(yb);
        }

    /* attention: a sequence alone equals the same sequence beside others; strided q/out */
    const size_t hd = 64, nh = 4, nkv = 2, T = 50;
    float *q = calloc(T * nh * hd * 2, 4), *k = calloc(T * nkv * hd, 4), *v = calloc(T * nkv * hd, 4);
    float *o = calloc(T * nh * hd, 4), *o1 = calloc(T * nh * hd * 2, 4);
    for (size_t i = 0; i < T * nh * hd * 2; i++)
        q[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)(xorshift64(&st) % 1000) / 500.0f - 1));
    for (size_t i = 0; i < T * nkv * hd; i++) {
        k[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)(xorshift64(&st) % 1000) / 500.0f - 1));
        v[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)(xorshift64(&st) % 1000) / 500.0f - 1));
    }
    const uint32_t lengths[] = {20, 30};
    static const char *const apols[] = {"hf-eager", "vllm", "fp32"};
    for (size_t p = 0; p < 3; p++) {
        parity_policy pol;
        CHECK_OK(parity_policy_from_name(apols[p], &pol));
        CHECK_OK(parity_attention(pool2, &pol, 2, lengths, nh, nkv, hd, q, 2 * nh * hd, k, nkv * hd,
                                  v, nkv * hd, o, nh * hd));
        /* the second sequence alone, with contiguous q and a strided out */
        float *qc = calloc(30 * nh * hd, 4);
        for (size_t r = 0; r < 30; r++) memcpy(qc + r * nh * hd, q + (20 + r) * 2 * nh * hd, nh * hd * 4);
        CHECK_OK(parity_attention(NULL, &pol, 1, lengths + 1, nh, nkv, hd, qc, nh * hd,
                                  k + 20 * nkv * hd, nkv * hd, v + 20 * nkv * hd, nkv * hd, o1,
                                  2 * nh * hd));
        for (size_t r = 0; r < 30; r++) {
            char label[96];
            snprintf(label, sizeof label, "attention %s, second sequence alone, row %zu", apols[p], r);
            CHECK_BITS_F32(o1 + r * 2 * nh * hd, o + (20 + r) * nh * hd, nh * hd, label);
        }
        free(qc);
    }
    free(q), free(k), free(v), free(o), free(o1);
    free(x), free(y), free(y1);
    parity_model_free(m);
}

/* ---- bad arguments: a status, a message, nothing written ---------------------------------- */

static int untouched(const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &y[i], 4);
        if (u != 0xffffffffu) return 0;
    }
    return 1;
}

static void test_bad_arguments(void) {
    parity_policy pol, fp32;
    CHECK_OK(parity_policy_from_name("aligned", &pol));
    CHECK_OK(parity_policy_from_name("fp32", &fp32));
    uint16_t w16[8 * 4] = {0};
    float x[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, y[3 * 8], w32[8 * 4] = {0};
    memset(y, 0xff, sizeof y);
    const int E = PARITY_ERR_INVALID_ARGUMENT;
    CHECK_STATUS(parity_linear(NULL, NULL, 0, 3, 4, 8, x, 4, 0, w16, 4, NULL, y, 8), E);
    parity_policy bad = pol;
    bad.attention = 9;
    CHECK_STATUS(parity_linear(NULL, &bad, 0, 3, 4, 8, x, 4, 0, w16, 4, NULL, y, 8), PARITY_ERR_POLICY);
    CHECK_STATUS(parity_linear(NULL, &pol, 7, 3, 4, 8, x, 4, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 0, 4, 8, x, 4, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 0, 8, x, 4, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 0, x, 4, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, NULL, 4, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, 0, NULL, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, 0, w16, 4, NULL, NULL, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 3, 0, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, 0, w16, 3, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, 0, w16, 4, NULL, y, 7), E);
    /* the dtype the policy reads */
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, PARITY_DTYPE_F32, w32, 4, NULL, y, 8), E);
    CHECK(strstr(parity_last_error(), "PARITY_DTYPE_BF16") != NULL);
    CHECK_STATUS(parity_linear(NULL, &fp32, 0, 3, 4, 8, x, 4, PARITY_DTYPE_BF16, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, PARITY_DTYPE_F16, w16, 4, NULL, y, 8), E);
    CHECK_STATUS(parity_linear(NULL, &pol, 0, 3, 4, 4, x, 4, 0, w16, 4, NULL, x, 4), E);
    CHECK(untouched(y, 24));
    CHECK_OK(parity_linear(NULL, &pol, 0, 3, 4, 8, x, 4, 0, w16, 4, NULL, y, 8));
    CHECK(y[0] == 0 && y[23] == 0);

    int32_t toks[3] = {1, 5, 2};
    memset(y, 0xff, sizeof y);
    CHECK_STATUS(parity_embedding(3, toks, 5, 4, PARITY_DTYPE_BF16, w16, 4, y, 4), PARITY_ERR_TOKEN_RANGE);
    toks[1] = -1;
    CHECK_STATUS(parity_embedding(3, toks, 8, 4, PARITY_DTYPE_BF16, w16, 4, y, 4), PARITY_ERR_TOKEN_RANGE);
    CHECK(strstr(parity_last_error(), "row 1") != NULL);
    toks[1] = 3;
    CHECK_STATUS(parity_embedding(3, toks, 8, 4, 7, w16, 4, y, 4), E); /* no such dtype */
    CHECK_STATUS(parity_embedding(3, toks, 8, 4, PARITY_DTYPE_BF16, NULL, 4, y, 4), E);
    CHECK_STATUS(parity_embedding(3, toks, 8, 4, PARITY_DTYPE_BF16, w16, 3, y, 4), E);
    CHECK_STATUS(parity_embedding(0, toks, 8, 4, PARITY_DTYPE_BF16, w16, 4, y, 4), E);
    CHECK(untouched(y, 24));
    /* an fp16 table is widened exactly: the rows hold the fp16 values of their patterns */
    CHECK_OK(parity_embedding(3, toks, 8, 4, PARITY_DTYPE_F16, w16, 4, y, 4));
    int widened = 1;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 4; i++)
        {
            const float want = parity_fp16_to_f32(w16[toks[r] * 4 + i]);
            widened &= memcmp(&y[r * 4 + i], &want, 4) == 0;
        }
    CHECK(widened);

    const uint32_t lens[2] = {2, 1}, zero[2] = {2, 0};
    float q[3 * 8], o[3 * 8];
    memset(q, 0, sizeof q);
    memset(o, 0xff, sizeof o);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, lens, 3, 2, 4, q, 12, q, 8, q, 8, o, 12), E);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, lens, 2, 1, 0, q, 8, q, 4, q, 4, o, 8), E);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, zero, 2, 1, 4, q, 8, q, 4, q, 4, o, 8),
                 PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_attention(NULL, &pol, 0, lens, 2, 1, 4, q, 8, q, 4, q, 4, o, 8),
                 PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, lens, 2, 1, 4, q, 7, q, 4, q, 4, o, 8), E);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, lens, 2, 1, 4, q, 8, NULL, 4, q, 4, o, 8), E);
    CHECK_STATUS(parity_attention(NULL, &pol, 2, lens, 2, 1, 4, q, 8, q, 4, q, 4, q, 8), E);
    CHECK(untouched(o, 24));
    CHECK_OK(parity_attention(NULL, &pol, 2, lens, 2, 1, 4, q, 8, q, 4, q, 4, o, 8));

    parity_score_options opt;
    parity_score_default_options(&opt);
    float lp[3];
    int32_t tg[3] = {0, 7, 3};
    memset(lp, 0xff, sizeof lp);
    const float h[3 * 4] = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
    uint16_t nw[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
#define HEAD(pol_, opt_, tg_, eps_, dt_) \
    parity_head_logprobs(NULL, pol_, 0, opt_, 3, 4, 8, h, 4, h, 4, dt_, nw, eps_, w16, 4, tg_, lp, \
                         NULL, NULL, 0)
    CHECK_OK(HEAD(&pol, &opt, tg, 1e-6f, PARITY_DTYPE_BF16));
    memset(lp, 0xff, sizeof lp);
    tg[1] = 8;
    CHECK_STATUS(HEAD(&pol, &opt, tg, 1e-6f, PARITY_DTYPE_BF16), PARITY_ERR_TOKEN_RANGE);
    tg[1] = 7;
    CHECK_STATUS(HEAD(&pol, &opt, tg, 0.0f, PARITY_DTYPE_BF16), E);
    CHECK_STATUS(HEAD(&pol, NULL, tg, 1e-6f, PARITY_DTYPE_BF16), E);
    CHECK_STATUS(HEAD(&fp32, &opt, tg, 1e-6f, PARITY_DTYPE_BF16), E);
    opt.top_n = 2;
    CHECK_STATUS(HEAD(&pol, &opt, tg, 1e-6f, PARITY_DTYPE_BF16), E);
    opt.top_n = 0;
    opt.size = 3;
    CHECK_STATUS(HEAD(&pol, &opt, tg, 1e-6f, PARITY_DTYPE_BF16), E);
    parity_score_default_options(&opt);
    opt.top_p = 0;
    CHECK_STATUS(HEAD(&pol, &opt, tg, 1e-6f, PARITY_DTYPE_BF16), E);
    CHECK(strstr(parity_last_error(), "parity_head_logprobs: top_p") != NULL);
    CHECK(untouched(lp, 3));
#undef HEAD

    /* the head's second half: the same checks of its options, targets and buffers */
    const float lg[3 * 8] = {0};
    parity_score_default_options(&opt);
#define FROM_LOGITS(pol_, opt_, rows_, lg_, stride_, tg_, lp_) \
    parity_logprobs_from_logits(NULL, pol_, opt_, rows_, 8, lg_, stride_, tg_, lp_, NULL)
    CHECK_OK(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, lp));
    CHECK(lp[0] == lp[1] && fabsf(lp[0] + logf(8.0f)) < 1e-6f); /* uniform over 8 tokens */
    memset(lp, 0xff, sizeof lp);
    tg[2] = -1;
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, lp), PARITY_ERR_TOKEN_RANGE);
    CHECK(strstr(parity_last_error(), "parity_logprobs_from_logits: row 2") != NULL);
    tg[2] = 3;
    CHECK_STATUS(FROM_LOGITS(&bad, &opt, 3, lg, 8, tg, lp), PARITY_ERR_POLICY);
    CHECK_STATUS(FROM_LOGITS(&pol, NULL, 3, lg, 8, tg, lp), E);
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 0, lg, 8, tg, lp), E);
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, NULL, 8, tg, lp), E);
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 7, tg, lp), E);
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, NULL, lp), E);
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, NULL), E);
    CHECK_STATUS(parity_logprobs_from_logits(NULL, &pol, &opt, 3, 0, lg, 8, tg, lp, NULL), E);
    opt.top_n = 1;
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, lp), E);
    CHECK(strstr(parity_last_error(), "top_n") != NULL);
    opt.top_n = 0;
    opt.size = 3;
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, lp), E);
    parity_score_default_options(&opt);
    opt.mode = PARITY_LOGPROB_PROCESSED_TRUNCATED;
    opt.min_p = 1.5f;
    CHECK_STATUS(FROM_LOGITS(&pol, &opt, 3, lg, 8, tg, lp), E);
    CHECK(strstr(parity_last_error(), "parity_logprobs_from_logits: min_p") != NULL);
    CHECK(untouched(lp, 3));
#undef FROM_LOGITS

    parity_pool *p = NULL;
    CHECK_STATUS(parity_pool_create(0, &p), E);
    CHECK(p == NULL);
    CHECK_STATUS(parity_pool_create(2, NULL), E);
    CHECK_INT(parity_pool_threads(NULL), 1);
    parity_pool_free(NULL);
}

int main(void) {
    parity_pool *pool2 = NULL;
    CHECK_OK(parity_pool_create(2, &pool2));
    CHECK_INT(parity_pool_threads(pool2), 2);
    test_bad_arguments();
    test_moe_pieces();
    test_invariance(pool2);
    test_quantized_nonfinite_rows(pool2);
    test_composed_forward(pool2);
    test_composed_moe(pool2);
    parity_pool_free(pool2);
    return check_report("ops");
}
