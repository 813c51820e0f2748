/* Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): routing as policy, batch invariance, and
 * routing recorded by the sampler and replayed by the scorer bit for bit.
 *
 *   - The router (moe_route) against the definition written out here a second way (all
 *     experts sorted by descending probability, then ascending index): random bf16 logits for
 *     E in {8, 60, 128}, k in {1, 2, 4, 8}, with and without norm_topk_prob, every moe_router
 *     and moe_weights value, bf16 and fp32 compute: the same experts and weights, bitwise.
 *     Ties go to the lower index (all-equal logits give experts 0..k-1); a replay keeps its
 *     experts and recomputes their weights; a NaN logit still gives k distinct experts; the
 *     routers' renormalisations (divide, guarded divide, reciprocal) differ in some bits.
 *   - The combine (moe_combine) against the rules written out here, every moe_combine value
 *     and k, with and without a shared expert: bitwise; transformers' expert-index order and
 *     vLLM's slot order differ in some bits, as FP32 and the rounded rules do.
 *   - Models: synthetic qwen3-moe-tiny and qwen2-moe-tiny, and the checkpoints transformers
 *     made (test/data/moe), under every preset, hf-eager+fp16 and quantized experts
 *     (+fp8-block, +mxfp8, +nvfp4, +mxfp4, +ternary): a sequence's log-probs
 *     are bitwise the same scored alone or with others, in chunks of 5 rows or 256, on 1 or 2
 *     threads and on every CPU path; the sampler (record_routes, sequences stepped together
 *     and in prefill chunks of 3, fresh or forked from one prefilled prompt; and on a shape of
 *     64 experts, 32 a token, whose decode steps run many experts a pool dispatch) reports
 *     log-probs the scorer recomputes bitwise, its routing
 *     record equals the experts the scorer ran, and the scorer replaying the record returns
 *     the same bits; replayed under another preset, the record is what runs.
 *   - Against transformers 5.25 (test/data/moe/ref): the hf-eager preset is the nearest of the
 *     presets to transformers' eager log-probs, equal in most values; replaying transformers'
 *     own routing brings it closer; the fp32 preset is within 1e-5 of transformers' fp32.
 *   - Weight sync: manifests (bf16 and a quantized policy's codes) name the experts, the router,
 *     the shared expert and its gate and verify; an expert's update fails the old manifest's
 *     verify, naming it; NaN router weights are refused (PARITY_ERR_TENSOR_NONFINITE), the
 *     model unchanged.
 *   - Bad input gets a status: routes with an expert out of range or repeated, routes or
 *     record_routes on a dense model, a top-k-then-softmax router on a model without
 *     norm_topk_prob. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "base/floats.h"
#include "kernels/kernels.h"
#include "kernels/moe.h"

static parity_policy policy_of(const char *name) {
    parity_policy p;
    CHECK_OK(parity_policy_from_name(name, &p));
    return p;
}

static float rn(const parity_policy *pol, float x) {
    return pol->compute == PARITY_COMPUTE_BF16   ? round_bf16(x)
           : pol->compute == PARITY_COMPUTE_FP16 ? round_fp16(x)
                                                 : x;
}

/* ---- the router, written out a second way --------------------------------------------- */

static const float *sort_key;
static int by_key_then_index(const void *a, const void *b) {
    const uint16_t i = *(const uint16_t *)a, j = *(const uint16_t *)b;
    if (sort_key[i] > sort_key[j]) return -1;
    if (sort_key[i] < sort_key[j]) return 1;
    return i < j ? -1 : 1;
}

/* The definition of parity.h ("The policy in detail"), with the top-k taken from a full sort. */
static void route_by_definition(const parity_policy *pol, uint32_t E, uint32_t k, int norm,
                                const float *logits, uint16_t *ids, float *w) {
    float p[256];
    uint16_t order[256];
    for (uint32_t e = 0; e < E; e++) order[e] = (uint16_t)e;
    if (pol->moe_router == PARITY_MOE_ROUTER_TOPK_SOFTMAX) {
        sort_key = logits;
        qsort(order, E, sizeof *order, by_key_then_index);
        const float m = logits[order[0]];
        float sum = 0.0f;
        for (uint32_t s = 0; s < k; s++) sum = sum + parity_expf(logits[order[s]] - m);
        for (uint32_t s = 0; s < k; s++) {
            ids[s] = order[s];
            w[s] = parity_expf(logits[order[s]] - m) / sum;
        }
    } else {
        float m = -INFINITY, sum = 0.0f;
        for (uint32_t e = 0; e < E; e++) m = logits[e] > m ? logits[e] : m;
        for (uint32_t e = 0; e < E; e++) sum = sum + parity_expf(logits[e] - m);
        for (uint32_t e = 0; e < E; e++)
            p[e] = pol->moe_router == PARITY_MOE_ROUTER_HF ? parity_expf(logits[e] - m) / sum
                                                           : parity_expf(logits[e] - m) * (1.0f / sum);
        sort_key = p;
        qsort(order, E, sizeof *order, by_key_then_index);
        float chosen = 0.0f;
        for (uint32_t s = 0; s < k; s++) chosen = chosen + p[order[s]];
        for (uint32_t s = 0; s < k; s++) {
            ids[s] = order[s];
            float x = p[order[s]];
            if (norm && pol->moe_router == PARITY_MOE_ROUTER_HF) x = x / chosen;
            if (norm && pol->moe_router == PARITY_MOE_ROUTER_VLLM) x = x / (chosen > 0 ? chosen : 1);
            if (norm && pol->moe_router == PARITY_MOE_ROUTER_SGLANG) x = x * (1.0f / chosen);
            w[s] = x;
        }
    }
    if (pol->moe_weights == PARITY_MOE_WEIGHTS_ROUNDED)
        for (uint32_t s = 0; s < k; s++) w[s] = rn(pol, w[s]);
}

static void check_router(void) {
    uint64_t r = 42;
    float logits[128], scratch[256], w[8], w_ref[8];
    uint16_t ids[8], ids_ref[8];
    const uint32_t Es[] = {8, 60, 128}, ks[] = {1, 2, 4, 8};
    int renorm_differ = 0, cases = 0;
    for (size_t ei = 0; ei < 3; ei++)
        for (size_t ki = 0; ki < 4; ki++)
            for (int trial = 0; trial < 40; trial++) {
                const uint32_t E = Es[ei], k = ks[ki];
                if (k > E) continue;
                for (uint32_t e = 0; e < E; e++)
                    logits[e] = round_bf16((float)((int64_t)(xorshift64(&r) % 4001) - 2000) / 500.0f);
                for (int norm = 0; norm <= 1; norm++) {
                    float w_vllm[8] = {0};
                    for (uint8_t router = 0; router <= PARITY_MOE_ROUTER_TOPK_SOFTMAX; router++)
                        for (uint8_t weights = 0; weights <= PARITY_MOE_WEIGHTS_FP32; weights++)
                            for (int fp32 = 0; fp32 <= 1; fp32++) {
                                parity_policy pol = policy_of(fp32 ? "fp32" : "hf-eager");
                                pol.moe_router = router;
                                pol.moe_weights = weights;
                                moe_route(&pol, E, k, norm, logits, NULL, ids, w, scratch);
                                route_by_definition(&pol, E, k, norm, logits, ids_ref, w_ref);
                                CHECK(!memcmp(ids, ids_ref, k * sizeof *ids));
                                CHECK_BITS_F32(w, w_ref, k, "router weights");
                                cases++;
                                if (fp32 || weights != PARITY_MOE_WEIGHTS_FP32 || !norm) continue;
                                if (router == PARITY_MOE_ROUTER_VLLM) memcpy(w_vllm, w, sizeof w);
                                if (router == PARITY_MOE_ROUTER_SGLANG)
                                    renorm_differ += memcmp(w_vllm, w, k * sizeof *w) != 0;
                            }
                }
            }
    printf("router: %d cases; vLLM's and SGLang's renormalisations differ in %d\n", cases,
           renorm_differ);
    CHECK(renorm_differ > 0);

    /* ties: all equal, lowest indices first; a tie at the k-th place goes to the lower index */
    parity_policy pol = policy_of("vllm");
    for (uint32_t e = 0; e < 8; e++) logits[e] = 0.5f;
    moe_route(&pol, 8, 4, 1, logits, NULL, ids, w, scratch);
    for (uint16_t s = 0; s < 4; s++) CHECK_INT(ids[s], s);
    for (uint32_t e = 0; e < 8; e++) logits[e] = (float)e * 0.25f;
    logits[1] = logits[5] = 1.0f, logits[7] = logits[6] = 3.0f;
    moe_route(&pol, 8, 3, 1, logits, NULL, ids, w, scratch);
    CHECK_INT(ids[0], 6);
    CHECK_INT(ids[1], 7);
    CHECK_INT(ids[2], 1); /* 1.0 at experts 1, 4 and 5 */
    /* a replay keeps its experts, in its order, and weighs them by this policy's router */
    const uint16_t replay[3] = {0, 7, 3};
    moe_route(&pol, 8, 3, 1, logits, replay, ids, w, scratch);
    CHECK(!memcmp(ids, replay, sizeof replay));
    CHECK(w[1] > w[2] && w[2] > w[0]);
    CHECK(fabsf(w[0] + w[1] + w[2] - 1.0f) < 1e-6f);
    /* a NaN logit: k distinct experts all the same */
    logits[2] = NAN;
    moe_route(&pol, 8, 4, 1, logits, NULL, ids, w, scratch);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < a; b++) CHECK(ids[a] != ids[b] && ids[a] < 8);
}

/* ---- the combine, written out ------------------------------------------------------------- */

static float combine_by_definition(const parity_policy *pol, uint32_t k, const uint16_t *ids,
                                   const float *w, const float *y, size_t H, size_t h,
                                   const float *y_sh, float g) {
    const float sig = 1.0f / (1.0f + parity_expf(-g));
    if (pol->moe_combine == PARITY_MOE_COMBINE_FP32) {
        float f = 0.0f;
        for (uint32_t s = 0; s < k; s++) f = f + y[s * H + h] * w[s];
        if (y_sh) f = f + sig * y_sh[h];
        return rn(pol, f);
    }
    float a = 0.0f;
    if (pol->moe_combine == PARITY_MOE_COMBINE_HF) {
        for (uint32_t e = 0; e < 256; e++) /* experts in ascending index */
            for (uint32_t s = 0; s < k; s++)
                if (ids[s] == e) a = rn(pol, a + rn(pol, rn(pol, y[s * H + h]) * w[s]));
    } else {
        float t[8];
        for (uint32_t s = 0; s < k; s++) t[s] = rn(pol, y[s * H + h] * w[s]);
        if (pol->moe_combine == PARITY_MOE_COMBINE_SGLANG && k == 1) a = t[0];
        else if (pol->moe_combine == PARITY_MOE_COMBINE_SGLANG && k == 2) a = rn(pol, t[0] + t[1]);
        else if (pol->moe_combine == PARITY_MOE_COMBINE_VLLM && k <= 4)
            for (uint32_t s = 0; s < k; s++) a = rn(pol, a + t[s]);
        else {
            for (uint32_t s = 0; s < k; s++) a = a + t[s];
            a = rn(pol, a);
        }
    }
    if (y_sh) a = rn(pol, a + rn(pol, rn(pol, sig) * rn(pol, y_sh[h])));
    return a;
}

static void check_combine(void) {
    enum { H = 96 };
    uint64_t r = 7;
    float y[8 * H], y_sh[H], out[H], w[8], rule_out[4][H];
    uint16_t ids[8];
    int orders_differ = 0, rules_differ = 0;
    for (int trial = 0; trial < 60; trial++) {
        const uint32_t k = 1 + (uint32_t)(xorshift64(&r) % 8);
        /* k distinct experts of 32 in a random slot order, and their weights */
        for (uint32_t s = 0; s < k; s++) {
            int dup;
            do {
                ids[s] = (uint16_t)(xorshift64(&r) % 32);
                dup = 0;
                for (uint32_t t = 0; t < s; t++) dup |= ids[t] == ids[s];
            } while (dup);
            w[s] = (float)(xorshift64(&r) % 1000 + 1) / 1777.0f;
        }
        for (size_t i = 0; i < k * H; i++)
            y[i] = (float)((int64_t)(xorshift64(&r) % 200001) - 100000) / 37813.0f;
        for (size_t i = 0; i < H; i++)
            y_sh[i] = (float)((int64_t)(xorshift64(&r) % 200001) - 100000) / 41113.0f;
        const float g = (float)((int64_t)(xorshift64(&r) % 2001) - 1000) / 300.0f;
        for (int shared = 0; shared <= 1; shared++)
            for (uint8_t rule = 0; rule <= PARITY_MOE_COMBINE_FP32; rule++)
                for (int fp32 = 0; fp32 <= 1; fp32++) {
                    parity_policy pol = policy_of(fp32 ? "fp32" : "hf-eager");
                    pol.moe_combine = rule;
                    moe_combine(&pol, H, k, ids, w, y, shared ? y_sh : NULL, round_bf16(g), out);
                    float want[H];
                    for (size_t h = 0; h < H; h++)
                        want[h] = combine_by_definition(&pol, k, ids, w, y, H, h,
                                                        shared ? y_sh : NULL, round_bf16(g));
                    CHECK_BITS_F32(out, want, H, "combine");
                    if (!fp32 && !shared) memcpy(rule_out[rule], out, sizeof out);
                }
        /* transformers' expert order against vLLM's slot order (both bf16 running sums of
         * round(y * w) where k <= 4, the weights being equal) and fp32 against rounded */
        if (k >= 2 && k <= 4) {
            parity_policy hf = policy_of("hf-eager"), vllm = policy_of("hf-eager");
            vllm.moe_combine = PARITY_MOE_COMBINE_VLLM;
            float a[H], b[H], yr[8 * H];
            for (size_t i = 0; i < k * H; i++) yr[i] = round_bf16(y[i]);
            moe_combine(&hf, H, k, ids, w, yr, NULL, 0.0f, a);
            moe_combine(&vllm, H, k, ids, w, yr, NULL, 0.0f, b);
            orders_differ += memcmp(a, b, sizeof a) != 0;
        }
        rules_differ += memcmp(rule_out[PARITY_MOE_COMBINE_FP32], rule_out[PARITY_MOE_COMBINE_HF],
                               sizeof out) != 0;
    }
    printf("combine: expert order and slot order differ in %d trials, fp32 and hf in %d\n",
           orders_differ, rules_differ);
    CHECK(orders_differ > 0 && rules_differ > 0);
}

/* ---- models: invariance, record and replay ------------------------------------------------- */

enum { N_SEQS = 3, NEW_TOKENS = 10, MAX_LEN = 128 };

/* Scores the sequences (concatenated in tokens) in one call with `routes` replayed (NULL:
 * routed), into lp, and the experts run into routes_out (NULL: not asked). */
static int score(parity_scorer *sc, const int32_t *tokens, const uint32_t *lengths, size_t n,
                 const uint16_t *routes, uint16_t *routes_out, float *lp) {
    parity_score_options o;
    parity_score_default_options(&o);
    o.routes = routes;
    o.routes_out = routes_out;
    return parity_score(sc, &o, tokens, lengths, n, lp, NULL, NULL, NULL);
}

/* The parity contract on model m under `preset`, the sampler stepping up to max_batch
 * sequences together and prefilling in chunks of prefill_chunk rows: returns the routing
 * decisions (position x sparse layer) compared and how many differed between sampler and a
 * replay-free learner of `learner` (another preset) in *decisions, *differ. */
static void check_model(const char *what, const parity_model *m, const char *preset,
                        const char *learner, uint32_t prefill_chunk, uint32_t max_batch,
                        uint64_t seed, int fork, int *decisions, int *differ) {
    const parity_config *c = parity_model_config(m);
    uint64_t r = seed;
    /* prompts of random lengths, each followed by the sampled completion */
    int32_t prompts[N_SEQS][MAX_LEN];
    uint32_t prompt_len[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        prompt_len[i] = 2 + (uint32_t)(xorshift64(&r) % 40);
        for (uint32_t t = 0; t < prompt_len[i]; t++)
            prompts[i][t] = (int32_t)(xorshift64(&r) % c->vocab_size);
    }
    parity_sampler_params sp = sampler_params((fixture){.policy = preset, .n_threads = 2,
                                                         .max_seqs = 8, .max_len = MAX_LEN,
                                                         .prefill_chunk = prefill_chunk,
                                                         .max_batch = max_batch});
    sp.record_routes = 1;
    parity_sampler *s = sampler_with(m, &sp);
    if (!s) return;
    parity_sampling sampling;
    parity_sampling_default(&sampling);
    sampling.seed = seed;
    sampling.max_new_tokens = NEW_TOKENS;
    uint32_t ids[N_SEQS], parent = 0;
    if (fork) { /* every sequence forked from one prefilled prompt: its record is theirs */
        CHECK_OK(parity_sampler_add(s, prompts[0], prompt_len[0], &sampling, 99, &parent));
        for (int i = 0; i < N_SEQS; i++) {
            memcpy(prompts[i], prompts[0], prompt_len[0] * sizeof prompts[0][0]);
            prompt_len[i] = prompt_len[0];
            CHECK_OK(parity_sampler_fork(s, parent, &sampling, (uint64_t)i, &ids[i]));
        }
    } else {
        for (int i = 0; i < N_SEQS; i++)
            CHECK_OK(parity_sampler_add(s, prompts[i], prompt_len[i], &sampling, (uint64_t)i,
                                        &ids[i]));
    }
    struct {
        COMPLETION_MEMBERS(N_SEQS, NEW_TOKENS);
    } gen;
    sampler_step_to_end(s, ids, seed, 1, 100, COMPLETIONS_OF(&gen));

    /* the sequences, their sampled log-probs where the scorer puts them, and the record */
    int32_t tokens[N_SEQS * MAX_LEN];
    uint32_t lengths[N_SEQS];
    float want[N_SEQS * MAX_LEN], lp[N_SEQS * MAX_LEN], lp_solo[MAX_LEN];
    uint32_t stride = 0;
    size_t at = 0, out_at = 0;
    uint16_t *record = calloc((size_t)N_SEQS * MAX_LEN * 64 * 64, sizeof *record);
    uint16_t *ran = calloc((size_t)N_SEQS * MAX_LEN * 64 * 64, sizeof *ran);
    if (!record || !ran) exit(2);
    for (int i = 0; i < N_SEQS; i++) {
        lengths[i] = prompt_then(tokens + at, prompts[i], prompt_len[i], gen.tokens[i], gen.n[i]);
        const uint16_t *rec;
        uint32_t n;
        CHECK_OK(parity_sampler_routes(s, ids[i], &rec, &n, &stride));
        CHECK_INT(n, lengths[i] - 1);
        memcpy(record + at * stride, rec, (size_t)n * stride * sizeof *rec);
        for (uint32_t t = 0; t + 1 < lengths[i]; t++) want[out_at + t] = NAN;
        for (uint32_t t = 0; t < gen.n[i]; t++)
            want[out_at + prompt_len[i] - 1 + t] = gen.logprobs[i][t];
        at += lengths[i];
        out_at += lengths[i] - 1;
    }
    /* the scorer: recomputed, and replaying the record, on 2 threads in chunks of 256 */
    parity_scorer *sc = new_scorer(m, (fixture){.policy = preset, .n_threads = 2});
    parity_scorer *sc5 = new_scorer(m, (fixture){.policy = preset, .n_threads = 1, .chunk_rows = 5});
    parity_scorer *other = new_scorer(m, (fixture){.policy = learner, .n_threads = 2});
    if (sc && sc5 && other) {
        CHECK_OK(score(sc, tokens, lengths, N_SEQS, NULL, ran, lp));
        for (size_t j = 0; j < out_at; j++)
            if (!isnan(want[j])) CHECK_BITS_F32(&lp[j], &want[j], 1, what);
        at = 0;
        for (int i = 0; i < N_SEQS; i++) { /* the routes the scorer ran are the record */
            CHECK(!memcmp(ran + at * stride, record + at * stride,
                          (size_t)(lengths[i] - 1) * stride * sizeof *ran));
            at += lengths[i];
        }
        float lp_replay[N_SEQS * MAX_LEN];
        CHECK_OK(score(sc5, tokens, lengths, N_SEQS, record, NULL, lp_replay));
        CHECK_BITS_F32(lp_replay, lp, out_at, what);
        /* each sequence alone, 1 thread, chunks of 5 */
        at = out_at = 0;
        for (int i = 0; i < N_SEQS; i++) {
            CHECK_OK(score(sc5, tokens + at, &lengths[i], 1, NULL, NULL, lp_solo));
            CHECK_BITS_F32(lp_solo, lp + out_at, lengths[i] - 1, what);
            at += lengths[i];
            out_at += lengths[i] - 1;
        }
        /* another preset's learner: its own routes, then the sampler's replayed */
        CHECK_OK(score(other, tokens, lengths, N_SEQS, NULL, ran, lp));
        at = 0;
        for (int i = 0; i < N_SEQS; i++) {
            for (uint32_t t = 0; t + 1 < lengths[i]; t++)
                for (uint32_t l = 0; l < stride; l += c->num_experts_per_tok) {
                    const size_t x = (at + t) * stride + l;
                    /* the same expert set? (slot orders may differ) */
                    int same = 1;
                    for (uint32_t a = 0; a < c->num_experts_per_tok; a++) {
                        int found = 0;
                        for (uint32_t b = 0; b < c->num_experts_per_tok; b++)
                            found |= ran[x + a] == record[x + b];
                        same &= found;
                    }
                    (*decisions)++;
                    *differ += !same;
                }
            at += lengths[i];
        }
        CHECK_OK(score(other, tokens, lengths, N_SEQS, record, ran, lp));
        at = 0;
        for (int i = 0; i < N_SEQS; i++) {
            CHECK(!memcmp(ran + at * stride, record + at * stride,
                          (size_t)(lengths[i] - 1) * stride * sizeof *ran));
            at += lengths[i];
        }
    }
    parity_scorer_free(sc);
    parity_scorer_free(sc5);
    parity_scorer_free(other);
    parity_sampler_free(s);
    free(record);
    free(ran);
}

/* The same scores on every CPU path this machine runs (the bf16 backend's contract). */
static void check_cpu_paths(const parity_model *m, const char *preset) {
    int32_t tokens[90];
    uint64_t r = 5;
    for (int t = 0; t < 90; t++) tokens[t] = (int32_t)(xorshift64(&r) % 256);
    uint32_t len = 90;
    float first[89], lp[89];
    int paths = 0;
    for (int path = PARITY_CPU_PORTABLE; path <= PARITY_CPU_AVX512BF16; path++) {
        if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
        parity_scorer *sc = new_scorer(m, (fixture){.policy = preset, .n_threads = 2});
        if (!sc) continue;
        CHECK_OK(score(sc, tokens, &len, 1, NULL, NULL, paths ? lp : first));
        if (paths) CHECK_BITS_F32(lp, first, 89, parity_cpu_path_name((parity_cpu_path)path));
        paths++;
        parity_scorer_free(sc);
    }
    CHECK(paths >= 1);
    parity_set_cpu_path((parity_cpu_path)-1);
}

/* ---- against transformers ------------------------------------------------------------------ */

static int read_file(const char *rel, void *buf, size_t size, size_t *got) {
    char path[4096];
    FILE *f = fopen(source_path(path, sizeof path, rel), "rb");
    if (!f) return 0;
    *got = fread(buf, 1, size, f);
    fclose(f);
    return 1;
}

/* transformers' log-probs (mode "hf_eager" or "fp32") of the four reference sequences of
 * `name` against the preset's, replaying transformers' routing or not: values equal and the
 * mean |difference|. */
static void against_transformers(const parity_model *m, const char *name, const char *mode,
                                 const char *preset, int replay, int *equal, int *total,
                                 double *mean) {
    parity_scorer *sc = new_scorer(m, (fixture){.policy = preset, .n_threads = 2});
    if (!sc) return;
    double sum = 0;
    *equal = *total = 0;
    for (int i = 0; i < 4; i++) {
        char rel[256];
        int32_t tokens[128];
        float ref[128], lp[128];
        uint16_t routes[128 * 3 * 4];
        size_t n_tok = 0, n_ref = 0, n_routes = 0;
        snprintf(rel, sizeof rel, "test/data/moe/ref/%s.seq%d.tokens.i32", name, i);
        CHECK(read_file(rel, tokens, sizeof tokens, &n_tok));
        snprintf(rel, sizeof rel, "test/data/moe/ref/%s.seq%d.%s.logp.f32", name, i, mode);
        CHECK(read_file(rel, ref, sizeof ref, &n_ref));
        snprintf(rel, sizeof rel, "test/data/moe/ref/%s.seq%d.%srouting.i16", name, i,
                 strcmp(mode, "fp32") ? "" : "fp32.");
        CHECK(read_file(rel, routes, sizeof routes, &n_routes));
        const uint32_t len = (uint32_t)(n_tok / 4);
        CHECK_INT(n_ref / 4, len - 1);
        if (len < 2 || n_ref / 4 != len - 1) break;
        CHECK_OK(score(sc, tokens, &len, 1, replay ? routes : NULL, NULL, lp));
        for (uint32_t t = 0; t + 1 < len; t++) {
            *equal += lp[t] == ref[t];
            sum += fabs((double)lp[t] - ref[t]);
        }
        *total += (int)len - 1;
    }
    *mean = *total ? sum / *total : 1.0;
    parity_scorer_free(sc);
}

static void check_transformers(const parity_model *m, const char *name) {
    const char *presets[] = {"hf-eager", "hf-sdpa", "vllm", "sglang", "aligned"};
    int equal, total;
    double mean, best = 1e9;
    const char *nearest = NULL;
    for (size_t i = 0; i < 5; i++) {
        against_transformers(m, name, "hf_eager", presets[i], 0, &equal, &total, &mean);
        printf("%s vs transformers eager, %-8s: %3d / %d equal, mean |d logp| %.6f\n", name,
               presets[i], equal, total, mean);
        if (mean < best) best = mean, nearest = presets[i];
        if (!strcmp(presets[i], "hf-eager")) CHECK(2 * equal > total);
    }
    CHECK(nearest && !strcmp(nearest, "hf-eager"));
    against_transformers(m, name, "hf_eager", "hf-eager", 1, &equal, &total, &mean);
    printf("%s vs transformers eager, hf-eager replaying its routing: %d / %d equal, mean %.6f\n",
           name, equal, total, mean);
    CHECK(mean <= best && mean < 1e-3 && 4 * equal > 3 * total);
    against_transformers(m, name, "fp32", "fp32", 1, &equal, &total, &mean);
    printf("%s vs transformers fp32, fp32 replaying its routing: mean |d logp| %.2e\n", name, mean);
    CHECK(mean < 1e-5);
}

/* ---- bad input ------------------------------------------------------------------------------ */

static void check_bad_input(const parity_model *moe, const parity_model *dense,
                            const parity_model *no_norm) {
    const parity_config *c = parity_model_config(moe);
    const uint32_t k = c->num_experts_per_tok, stride = 2 * k; /* qwen3-moe-tiny: 2 sparse */
    int32_t tokens[6] = {1, 2, 3, 4, 5, 6};
    uint32_t len = 6;
    uint16_t routes[6 * 4];
    float lp[5];
    for (uint32_t i = 0; i < 6 * stride; i++) routes[i] = (uint16_t)(i % k);
    parity_scorer *sc = new_scorer(moe, (fixture){.policy = "vllm"});
    if (sc) {
        CHECK_OK(score(sc, tokens, &len, 1, routes, NULL, lp));
        routes[2 * stride + 1] = (uint16_t)c->num_experts; /* out of range */
        CHECK_STATUS(score(sc, tokens, &len, 1, routes, NULL, lp), PARITY_ERR_INVALID_ARGUMENT);
        routes[2 * stride + 1] = routes[2 * stride]; /* repeated */
        CHECK_STATUS(score(sc, tokens, &len, 1, routes, NULL, lp), PARITY_ERR_INVALID_ARGUMENT);
        routes[2 * stride + 1] = (uint16_t)(routes[2 * stride] + 1);
        routes[5 * stride] = 999; /* the last position is not read */
        CHECK_OK(score(sc, tokens, &len, 1, routes, NULL, lp));
    }
    parity_scorer_free(sc);
    parity_scorer *ds = new_scorer(dense, (fixture){.policy = "vllm"});
    if (ds) CHECK_STATUS(score(ds, tokens, &len, 1, routes, NULL, lp), PARITY_ERR_INVALID_ARGUMENT);
    parity_scorer_free(ds);
    parity_sampler_params sp = sampler_params((fixture){.policy = "vllm"});
    sp.record_routes = 1;
    parity_sampler *s = NULL;
    CHECK_STATUS(parity_sampler_create(dense, &sp, &s), PARITY_ERR_INVALID_ARGUMENT);
    sp.record_routes = 0;
    s = sampler_with(moe, &sp);
    if (s) {
        parity_sampling sampling;
        parity_sampling_default(&sampling);
        uint32_t id;
        const uint16_t *rec;
        uint32_t n, st;
        CHECK_OK(parity_sampler_add(s, tokens, 4, &sampling, 0, &id));
        CHECK_STATUS(parity_sampler_routes(s, id, &rec, &n, &st), PARITY_ERR_INVALID_ARGUMENT);
    }
    parity_sampler_free(s);
    /* top-k-then-softmax renormalises: refused where the model does not */
    parity_scorer_params p = scorer_params((fixture){.policy = "vllm"});
    p.policy.moe_router = PARITY_MOE_ROUTER_TOPK_SOFTMAX;
    parity_scorer *bad = NULL;
    CHECK_STATUS(parity_scorer_create(no_norm, &p, &bad), PARITY_ERR_POLICY);
    CHECK_OK(parity_scorer_create(moe, &p, &bad));
    parity_scorer_free(bad);
    p.policy.moe_combine = PARITY_MOE_COMBINE_FP32 + 1;
    CHECK_STATUS(parity_scorer_create(moe, &p, &bad), PARITY_ERR_POLICY);
}

/* ---- weight sync: manifests and updates cover the experts and the router ------------------- */

static int file_has(const char *path, const char *text) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    static char buf[1 << 20];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, text) != NULL;
}

static void check_sync(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:qwen2-moe-tiny:9", &m));
    if (!m) return;
    char path[] = "/tmp/parity-moe-manifest-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    const char *names[] = {"\"model.layers.2.mlp.experts.7.down_proj.weight\"",
                           "\"model.layers.0.mlp.gate.weight\"",
                           "\"model.layers.1.mlp.shared_expert.up_proj.weight\"",
                           "\"model.layers.1.mlp.shared_expert_gate.weight\""};
    char report[512];
    /* the bf16 manifest, and the codes one under a quantized policy */
    for (int quantized = 0; quantized <= 1; quantized++) {
        const parity_policy pol = policy_of(quantized ? "vllm+nvfp4:modelopt" : "vllm");
        CHECK_OK(parity_model_write_manifest_for(m, &pol, path));
        for (size_t i = 0; i < 4; i++) CHECK(file_has(path, names[i]));
        CHECK_OK(parity_model_verify_for(m, &pol, path, report, sizeof report));
    }
    /* an expert's update is seen by a manifest verify, and changes the scores */
    const parity_policy pol = policy_of("vllm");
    CHECK_OK(parity_model_write_manifest_for(m, &pol, path));
    const parity_config *c = parity_model_config(m);
    const size_t n = (size_t)c->hidden_size * c->moe_intermediate_size;
    float *w = malloc(n * sizeof *w);
    if (!w) exit(2);
    for (size_t i = 0; i < n; i++) w[i] = (float)((i * 7919) % 101) / 1000.0f - 0.05f;
    parity_tensor_data t = {"model.layers.2.mlp.experts.3.down_proj.weight", PARITY_DTYPE_F32, 2,
                            {c->hidden_size, c->moe_intermediate_size}, w};
    CHECK_OK(parity_model_update(m, &t, 1));
    CHECK_STATUS(parity_model_verify_for(m, &pol, path, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "experts.3.down_proj") != NULL);
    /* NaN in the router: refused, the tensor named, nothing changed */
    const size_t nr = (size_t)c->num_experts * c->hidden_size;
    float *router = calloc(nr, sizeof *router);
    if (!router) exit(2);
    router[5] = NAN;
    parity_tensor_data r = {"model.layers.0.mlp.gate.weight", PARITY_DTYPE_F32, 2,
                            {c->num_experts, c->hidden_size}, router};
    const uint64_t version = parity_model_version(m);
    CHECK_STATUS(parity_model_update(m, &r, 1), PARITY_ERR_TENSOR_NONFINITE);
    CHECK(strstr(parity_last_error(), "mlp.gate.weight") != NULL);
    CHECK_INT(parity_model_version(m), version);
    free(w);
    free(router);
    unlink(path);
    parity_model_free(m);
}

int main(void) {
    check_router();
    check_combine();

    parity_model *q3 = NULL, *q2 = NULL, *q3_hf = NULL, *q2_hf = NULL, *dense = NULL;
    CHECK_OK(parity_model_open("synthetic:qwen3-moe-tiny:3", &q3));
    CHECK_OK(parity_model_open("synthetic:qwen2-moe-tiny:4", &q2));
    CHECK_OK(parity_model_open("synthetic:tiny:5", &dense));
    load_model("test/data/moe/qwen3-moe-tiny", &q3_hf);
    load_model("test/data/moe/qwen2-moe-tiny", &q2_hf);
    if (!q3 || !q2 || !q3_hf || !q2_hf || !dense) return check_report("moe");

    const struct {
        const parity_model *m;
        const char *what, *preset, *learner;
    } runs[] = {
        {q3_hf, "qwen3-moe-tiny (transformers)", "hf-eager", "vllm"},
        {q3_hf, "qwen3-moe-tiny (transformers)", "vllm", "hf-eager"},
        {q3_hf, "qwen3-moe-tiny (transformers)", "sglang", "vllm"},
        {q3_hf, "qwen3-moe-tiny (transformers)", "aligned", "hf-eager"},
        {q2_hf, "qwen2-moe-tiny (transformers)", "hf-eager", "sglang"},
        {q2_hf, "qwen2-moe-tiny (transformers)", "vllm", "hf-eager"},
        {q2_hf, "qwen2-moe-tiny (transformers)", "sglang", "hf-eager"},
        {q2_hf, "qwen2-moe-tiny (transformers)", "aligned", "vllm"},
        {q3, "qwen3-moe-tiny", "fp32", "aligned"},
        {q3, "qwen3-moe-tiny", "hf-sdpa", "hf-eager"},
        {q3, "qwen3-moe-tiny", "hf-eager+fp16", "hf-eager"},
        {q3, "qwen3-moe-tiny", "vllm+fp8-block:deepseek", "vllm"},
        {q3, "qwen3-moe-tiny", "vllm+mxfp8:ocp", "vllm"},
        {q2, "qwen2-moe-tiny", "vllm+nvfp4:modelopt", "vllm"},
        {q2, "qwen2-moe-tiny", "aligned+mxfp4:ocp", "aligned"},
        {q2, "qwen2-moe-tiny", "hf-eager+ternary:bitnet", "hf-eager"},
    };
    int decisions = 0, differ = 0;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++)
        if (!quick() || i % 3 == 0) {
            int d = 0, x = 0;
            check_model(runs[i].what, runs[i].m, runs[i].preset, runs[i].learner, 3, 4, 100 + i,
                        (int)(i % 2), &d, &x);
            printf("%s: %s sampler, %s learner: %d of %d routing decisions differ\n",
                   runs[i].what, runs[i].preset, runs[i].learner, x, d);
            decisions += d;
            differ += x;
        }
    printf("routing decisions of the sampler that another preset's learner routes otherwise: "
           "%d of %d\n", differ, decisions);
    CHECK(differ > 0);

    /* 64 experts, 32 a token, a sampler of 128 rows: a decode step's 3 sequences run their
     * (mostly more than GEMM_EXPERTS_MAX) experts a few pool dispatches for all, bf16 or
     * quantized, which the sampler's prefill and the scorer's chunks of 256 and of 5 rows run
     * one by one */
    parity_config wide;
    CHECK_OK(parity_config_builtin("qwen3-moe-tiny", &wide));
    wide.num_experts = 64;
    wide.num_experts_per_tok = 32;
    parity_model *q3_wide = NULL;
    int wide_decisions = 0, wide_differ = 0;
    CHECK_OK(parity_model_synthetic(&wide, 6, &q3_wide));
    if (q3_wide) {
        check_model("qwen3-moe-tiny, 64 experts", q3_wide, "vllm", "hf-eager", 128, 4, 200, 0,
                    &wide_decisions, &wide_differ);
        check_model("qwen3-moe-tiny, 64 experts", q3_wide, "hf-eager", "vllm", 128, 4, 201, 1,
                    &wide_decisions, &wide_differ);
        check_model("qwen3-moe-tiny, 64 experts", q3_wide, "vllm+nvfp4:modelopt", "vllm", 128, 4,
                    202, 0, &wide_decisions, &wide_differ);
        check_model("qwen3-moe-tiny, 64 experts", q3_wide, "vllm+fp8-block:deepseek", "vllm",
                    128, 4, 203, 1, &wide_decisions, &wide_differ);
    }
    printf("on the 64-expert shape (32 a token): %d of %d\n", wide_differ, wide_decisions);
    parity_model_free(q3_wide);

    /* more experts than vocabulary and hidden width: the split-K experiment's partial sums
     * hold the router's logits too (its buffer was sized without them: ASan saw the write) */
    parity_config many;
    CHECK_OK(parity_config_builtin("qwen3-moe-tiny", &many));
    many.vocab_size = 32;
    many.num_experts = 512;
    parity_model *q3_many = NULL;
    CHECK_OK(parity_model_synthetic(&many, 7, &q3_many));
    if (q3_many) {
        parity_sampler_params sp = sampler_params((fixture){.policy = "vllm", .max_seqs = 8,
                                                             .max_len = 64, .prefill_chunk = 8,
                                                             .max_batch = 8});
        sp.split_k = 2;
        parity_sampler *s = sampler_with(q3_many, &sp);
        if (s) {
            parity_sampling sampling;
            parity_sampling_default(&sampling);
            uint32_t ids[8];
            int32_t tok[8];
            float lp[8];
            uint32_t fin[8];
            const int32_t prompt[3] = {1, 2, 3};
            for (uint32_t i = 0; i < 8; i++)
                CHECK_OK(parity_sampler_add(s, prompt, 3, &sampling, i, &ids[i]));
            CHECK_OK(parity_sampler_step(s, ids, 8, tok, lp, fin, 0, NULL, NULL));
            for (int i = 0; i < 8; i++) CHECK(tok[i] >= 0 && tok[i] < 32 && isfinite(lp[i]));
        }
        parity_sampler_free(s);
    }
    parity_model_free(q3_many);

    check_cpu_paths(q3_hf, "hf-eager");
    check_cpu_paths(q2_hf, "vllm+nvfp4:modelopt");
    check_transformers(q3_hf, "qwen3-moe-tiny");
    check_transformers(q2_hf, "qwen2-moe-tiny");
    check_bad_input(q3, dense, q2);
    check_sync();

    parity_model_free(q3);
    parity_model_free(q2);
    parity_model_free(q3_hf);
    parity_model_free(q2_hf);
    parity_model_free(dense);
    return check_report("moe");
}
