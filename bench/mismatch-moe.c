/* The mixture-of-experts section of parity-mismatch. On each MoE model (--moe-models), for each
 * sampler/learner policy pair (--moe-pairs): the sampler's rollouts with its routing record
 * (record_routes), then the learner scoring the same tokens twice, once routing every position
 * itself under its own policy (recomputation) and once replaying the sampler's record. For
 * each of the two: how many (position, sparse layer) routing decisions chose another expert
 * set than the sampler's (the learner's routes_out against the record), how many positions
 * have at least one such layer, and the log-prob metrics of the other sections. The positions
 * are those whose outputs give the generated tokens' log-probs: the prompt's last and every
 * generated token but the last. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_clock.h"
#include "mismatch.h"

/* A sampler/learner pair of --moe-pairs. */
typedef struct moe_pair {
    spec sampler, learner;
} moe_pair;

/* "S/L,S/L,...": policy names never hold a slash. */
static size_t parse_moe_pairs(const char *list, moe_pair *out) {
    size_t n = 0;
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            char item[2 * NAME_MAX_LEN + 2];
            if (len >= sizeof item) die("--moe-pairs: entry too long in '%s'", list);
            memcpy(item, p, len);
            item[len] = '\0';
            char *slash = strchr(item, '/');
            if (!slash || strchr(slash + 1, '/') || slash == item || !slash[1])
                die("--moe-pairs: '%s' is not SAMPLER/LEARNER", item);
            *slash = '\0';
            if (n == MAX_SPECS) die("--moe-pairs: more than %d pairs", MAX_SPECS);
            spec_from_name(item, &out[n].sampler);
            spec_from_name(slash + 1, &out[n].learner);
            n++;
        }
        p = comma ? comma + 1 : p + len;
    }
    return n;
}

static int is_moe(const parity_config *c) {
    return (c->arch == PARITY_ARCH_QWEN3_MOE || c->arch == PARITY_ARCH_QWEN2_MOE) &&
           c->num_experts;
}

/* The section's model specs: --moe-models, else the run's model if it has experts, else the
 * trained byte-level Qwen3-MoE of models/ (a trained router: scripts/train_moe.py) and the
 * transformers-made Qwen2-MoE of test/data/moe (a shared expert and top-4; its router is
 * random but not near-flat, a logit spread of about 2.4: test/data/moe/README.md), those of
 * them present, else a synthetic tiny MoE. */
static size_t moe_model_specs(const bench *b, char specs[MAX_MOE_MODELS][1024]) {
    size_t n = 0;
    if (b->o.moe_models) {
        if (!strcmp(b->o.moe_models, "none")) return 0;
        for (const char *p = b->o.moe_models; *p;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if (len) {
                if (n == MAX_MOE_MODELS) die("--moe-models: more than %d models", MAX_MOE_MODELS);
                if (len >= sizeof specs[0]) die("--moe-models: model spec too long");
                snprintf(specs[n++], sizeof specs[0], "%.*s", (int)len, p);
            }
            p = comma ? comma + 1 : p + len;
        }
        return n;
    }
    if (is_moe(parity_model_config(b->model))) {
        snprintf(specs[0], sizeof specs[0], "%s", b->model_spec);
        return 1;
    }
    static const char *const dirs[] = {"models/qwen3-moe-bytes-8.4m", "test/data/moe/qwen2-moe-tiny"};
    for (size_t i = 0; i < 2; i++) {
        char cfg[1200];
        struct stat st;
        snprintf(specs[n], sizeof specs[0], "%s/%s", source_root(), dirs[i]);
        snprintf(cfg, sizeof cfg, "%s/config.json", specs[n]);
        if (stat(cfg, &st) == 0) n++;
    }
    if (!n) snprintf(specs[n++], sizeof specs[0], "synthetic:qwen3-moe-tiny");
    return n;
}

/* Opens a model of the section and fits a copy of the run's prompts to it. */
static parity_model *open_moe_model(bench *b, const char *model_spec, moe_model *mm) {
    parity_model *model = NULL;
    int rc = parity_model_open(model_spec, &model);
    if (rc) die_parity(model_spec, rc);
    const parity_config *c = parity_model_config(model);
    if (!is_moe(c)) die("--moe-models: %s has no experts", model_spec);
    snprintf(mm->spec, sizeof mm->spec, "%s", model_spec);
    const char *slash = strrchr(model_spec, '/');
    snprintf(mm->name, sizeof mm->name, "%s", slash && slash[1] ? slash + 1 : model_spec);
    snprintf(mm->arch, sizeof mm->arch, "%s", parity_arch_name((int)c->arch));
    mm->experts = c->num_experts;
    mm->top_k = c->num_experts_per_tok;
    for (size_t i = 0; i < b->prompts.n; i++)
        prompt_push(&mm->prompts, b->prompts.tok[i], b->prompts.len[i], b->prompts.source[i]);
    if (b->o.max_tokens + 1 >= c->max_position_embeddings)
        die("--max-tokens exceeds %s's context", model_spec);
    fit_prompts(&mm->prompts, c, b->o.max_tokens + 1);
    return model;
}

/* The rollouts of `sampler` on the model's prompts, with its routing record laid out
 * like the tokens (r->routes); kept in the run's rollout list, freed with it. */
static rollouts *moe_rollouts(bench *b, const run_env *env, moe_model *mm, const spec *sampler) {
    rollouts *r = xcalloc(1, sizeof *r);
    r->v = (variant){sampler->policy, 0, 0, VARIANT_RUN_BACKEND, 1};
    snprintf(r->label, sizeof r->label, "%s on %s", sampler->name, mm->name);
    r->prompts = &mm->prompts;
    r->per_prompt = b->o.n;
    r->max_new = b->o.max_tokens;
    r->temperature = b->o.temperature;
    completion_record rec = {0};
    rec.max_len = max_prompt_len(r->prompts) + r->max_new;
    rec.route_stride = mm->sparse_layers * mm->top_k; /* checked against the sampler's */
    rec.routes = xcalloc(r->prompts->n * r->per_prompt * rec.max_len * rec.route_stride,
                         sizeof *rec.routes);
    parity_sampling sp;
    sampling_for(env, r->temperature, r->max_new, &sp);
    double t0 = bench_now();
    generate_recorded(env, &sp, r, &rec);
    r->route_stride = rec.route_stride;
    r->routes = xcalloc(r->tok_off[r->n_seqs] * r->route_stride, sizeof *r->routes);
    for (size_t c = 0; c < r->n_seqs; c++) {
        uint16_t *to = r->routes + r->tok_off[c] * r->route_stride;
        memcpy(to, rec.routes + c * rec.max_len * rec.route_stride,
               (size_t)(r->length[c] - 1) * r->route_stride * sizeof *to);
        /* the last position is not replayed; experts 0 .. k-1 keep its ids valid */
        for (uint32_t s = 0; s < r->route_stride; s++)
            to[(size_t)(r->length[c] - 1) * r->route_stride + s] = (uint16_t)(s % mm->top_k);
    }
    free(rec.routes);
    b->rollouts.v = realloc(b->rollouts.v, (b->rollouts.n + 1) * sizeof *b->rollouts.v);
    if (!b->rollouts.v) die("out of memory");
    b->rollouts.v[b->rollouts.n++] = r;
    progress("moe     %s: %zu prompts x %u x %u tokens, routes recorded (%.1f s)", r->label,
             r->prompts->n, r->per_prompt, r->max_new, bench_now() - t0);
    return r;
}

/* The model's sparse layers, by the rule parity_config states (transformers' and vLLM's). */
static uint32_t count_sparse_layers(const parity_model *model) {
    const parity_config *c = parity_model_config(model);
    uint32_t n = 0;
    for (uint32_t i = 0; i < c->num_hidden_layers; i++) {
        const uint32_t step = c->decoder_sparse_step ? c->decoder_sparse_step : 1;
        const int dense = (int)((c->mlp_only_layers[i / 64 % 16] >> (i % 64)) & 1);
        n += (i + 1) % step == 0 && !dense;
    }
    return n;
}

/* Whether the k experts at a and at b are the same set (each holds k distinct ids). */
static int same_expert_set(const uint16_t *a, const uint16_t *b, uint32_t k) {
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = 0;
        while (j < k && b[j] != a[i]) j++;
        if (j == k) return 0;
    }
    return 1;
}

/* The learner's routes (laid out as r->routes) against the sampler's record, over the scored
 * positions. */
static void compare_routes(const rollouts *r, const uint16_t *learner, uint32_t k,
                           moe_routing *out) {
    const uint32_t S = r->route_stride, layers = S / k;
    out->decisions = out->differing = out->positions = out->positions_differing = 0;
    for (size_t c = 0; c < r->n_seqs; c++)
        for (size_t j = r->prompt_len[c] - 1; j + 1 < r->length[c]; j++) {
            const size_t at = (r->tok_off[c] + j) * S;
            int any = 0;
            for (uint32_t l = 0; l < layers; l++) {
                const int same = same_expert_set(r->routes + at + l * k, learner + at + l * k, k);
                out->differing += !same;
                any |= !same;
            }
            out->decisions += layers;
            out->positions++;
            out->positions_differing += any;
        }
}

/* The least and the most chosen expert's share of a sparse layer's choices, over the layers,
 * in the record of `r` over the scored positions: how far the routing is from uniform. */
static void expert_load(const rollouts *r, const moe_model *mm, double *lo, double *hi) {
    const uint32_t S = r->route_stride, k = mm->top_k, layers = S / k;
    size_t *count = xcalloc((size_t)layers * mm->experts, sizeof *count), total = 0;
    for (size_t c = 0; c < r->n_seqs; c++)
        for (size_t j = r->prompt_len[c] - 1; j + 1 < r->length[c]; j++, total += k)
            for (uint32_t s = 0; s < S; s++)
                count[(size_t)(s / k) * mm->experts + r->routes[(r->tok_off[c] + j) * S + s]]++;
    *lo = 1, *hi = 0;
    for (size_t i = 0; i < (size_t)layers * mm->experts; i++) {
        const double share = total ? (double)count[i] / (double)total : 0;
        if (share < *lo) *lo = share;
        if (share > *hi) *hi = share;
    }
    free(count);
}

/* One pair on one model: the learner's two scorings, a job each. */
static void run_moe_pair(bench *b, const run_env *env, size_t model, const moe_pair *p,
                         rollouts *r) {
    const moe_model *mm = &b->moe[model];
    parity_scorer *s =
        make_scorer(env, &p->learner.policy, max_prompt_len(r->prompts) + r->max_new);
    uint16_t *routes_out = xcalloc(r->tok_off[r->n_seqs] * r->route_stride, sizeof *routes_out);
    for (int replay = 0; replay < 2; replay++) {
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "%.80s%s", p->learner.name, replay ? " replay" : "");
        job *j = add_job(&b->jobs, SEC_MOE, &p->sampler, 0, 0, name, &p->learner.policy);
        snprintf(j->note, sizeof j->note, "%s", replay ? "the sampler's routes replayed"
                                                       : "routing recomputed");
        j->moe.model = model;
        j->moe.replay = replay;
        float *lp = score_rollouts(env, s, r, replay ? r->routes : NULL, routes_out);
        compare_routes(r, routes_out, mm->top_k, &j->moe);
        compute_metrics(r, lp, 0, UINT32_MAX, &j->m);
        free(lp);
    }
    free(routes_out);
    parity_scorer_free(s);
}

void run_moe(bench *b) {
    char specs[MAX_MOE_MODELS][1024];
    const size_t n_models = moe_model_specs(b, specs);
    if (!n_models) return;
    moe_pair *pairs = xcalloc(MAX_SPECS, sizeof *pairs);
    const size_t n_pairs = parse_moe_pairs(b->o.moe_pairs, pairs);
    for (size_t m = 0; m < n_models && n_pairs; m++) {
        moe_model *mm = &b->moe[b->n_moe];
        parity_model *model = open_moe_model(b, specs[m], mm);
        mm->sparse_layers = count_sparse_layers(model);
        const size_t model_index = b->n_moe++;
        run_env env = {&b->o, model};
        /* one rollout set per distinct sampler policy */
        rollouts **by_pair = xcalloc(n_pairs, sizeof *by_pair);
        for (size_t i = 0; i < n_pairs; i++) {
            for (size_t k = 0; k < i && !by_pair[i]; k++)
                if (same_policy(&pairs[k].sampler.policy, &pairs[i].sampler.policy))
                    by_pair[i] = by_pair[k];
            if (!by_pair[i]) by_pair[i] = moe_rollouts(b, &env, mm, &pairs[i].sampler);
        }
        snprintf(mm->load_sampler, sizeof mm->load_sampler, "%s", pairs[0].sampler.name);
        expert_load(by_pair[0], mm, &mm->load_min, &mm->load_max);
        double t0 = bench_now();
        for (size_t i = 0; i < n_pairs; i++)
            run_moe_pair(b, &env, model_index, &pairs[i], by_pair[i]);
        progress("moe     %s: %zu pairs scored, recomputed and replayed (%.1f s)", mm->name,
                 n_pairs, bench_now() - t0);
        free(by_pair);
        parity_model_free(model);
    }
    free(pairs);
}

void free_moe(bench *b) {
    for (size_t m = 0; m < b->n_moe; m++) free_prompts(&b->moe[m].prompts);
}
