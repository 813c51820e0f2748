/* parity-generate: n completions of one prompt, with the log-prob of every drawn token.
 *
 *   parity-generate --model DIR|synthetic:NAME[:SEED] --policy PRESET
 *                   (--prompt-bytes FILE | --prompt-tokens FILE) [--n N] [--max-tokens M]
 *                   [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
 *                   [--batch B] [--threads N] [--logprob-mode MODE] [--stop ID]...
 *                   [--backend BACKEND]
 *                   [--exit-rule full|threshold|fixed] [--exit-threshold X] [--min-depth D]
 *                   [--max-depth D] [--loop-kv last-exited|full]
 *
 * MODE and BACKEND are the library's names (raw | processed | processed-truncated,
 * bf16 | openblas); usage lists them.
 *
 * The prompt is prefilled once; each completion is a fork of it (as a GRPO group's are) with
 * its own random stream: its index. At most B completions decode together; as one finishes
 * the next starts (continuous batching). The output does not depend on B.
 * One JSON object per completion on stdout, in index order:
 *   {"index": i, "prompt_len": L, "tokens": [...], "logprobs": [...]}
 * (the generated part only; log-probs "%.9g"), and for a looped model (Ouro)
 * "exit_depths": [...], the loops of the step that produced each token, with the KV rule as
 * "loop_kv": the schedule that parity-score --depths replays (the exit options are
 * parity_sampling's; the defaults run every loop). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "parity.h"

static void usage(void) {
    fprintf(stderr,
            "usage: parity-generate --model DIR|synthetic:NAME[:SEED] --policy PRESET\n"
            "         (--prompt-bytes FILE | --prompt-tokens FILE) [--n N] [--max-tokens M]\n"
            "         [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--batch B]\n"
            "         [--threads N] [--logprob-mode MODE] [--stop ID]... [--backend BACKEND]\n"
            "         [--exit-rule full|threshold|fixed] [--exit-threshold X] [--min-depth D]\n"
            "         [--max-depth D] [--loop-kv last-exited|full]   (looped models)\n");
    print_choices();
}

typedef struct completion {
    uint32_t n;
    int32_t *tokens;
    float *logprobs;
    uint32_t *depths;
} completion;

/* name -> index in names[] (n of them); 0 if not there, after saying so */
static int parse_name(const char *opt, const char *v, const char *const *names, uint32_t n,
                      uint32_t *out) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return 1;
        }
    fprintf(stderr, "error: %s '%s' is not one of", opt, v);
    for (uint32_t i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
    fprintf(stderr, "\n");
    return 0;
}

static const char *const exit_rules[] = {"full", "threshold", "fixed"}; /* parity_exit_rule */
static const char *const loop_kvs[] = {"last-exited", "full"};           /* parity_loop_kv */

int main(int argc, char **argv) {
    const char *model_spec = NULL, *policy = NULL, *pbytes = NULL, *ptokens = NULL;
    const char *backend = "bf16", *mode = "raw";
    uint32_t n = 1, max_tokens = 64, batch = 0, threads = 1, top_k = 0;
    float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
    unsigned long long seed = 0;
    parity_sampling sp;
    parity_sampling_default(&sp);
    uint32_t loop_kv = PARITY_LOOP_KV_LAST_EXITED;
    for (int i = 1; i < argc; i++) {
        const char *a, *v;
        int done = next_option(argc, argv, &i, usage, &a, &v);
        if (done >= 0) return done;
        int ok = 1;
        uint32_t stop;
        if (!strcmp(a, "--model")) model_spec = v;
        else if (!strcmp(a, "--policy")) policy = v;
        else if (!strcmp(a, "--prompt-bytes")) pbytes = v;
        else if (!strcmp(a, "--prompt-tokens")) ptokens = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--logprob-mode")) mode = v;
        else if (!strcmp(a, "--n")) ok = parse_u32(v, &n) && n > 0;
        else if (!strcmp(a, "--max-tokens")) ok = parse_u32(v, &max_tokens) && max_tokens > 0;
        else if (!strcmp(a, "--batch")) ok = parse_u32(v, &batch) && batch > 0;
        else if (!strcmp(a, "--threads")) ok = parse_u32(v, &threads) && threads > 0;
        else if (!strcmp(a, "--top-k")) ok = parse_u32(v, &top_k);
        else if (!strcmp(a, "--temperature")) ok = parse_float(v, &temperature);
        else if (!strcmp(a, "--top-p")) ok = parse_float(v, &top_p);
        else if (!strcmp(a, "--min-p")) ok = parse_float(v, &min_p);
        else if (!strcmp(a, "--exit-rule")) {
            if (!parse_name(a, v, exit_rules, 3, &sp.exit_rule)) return 2;
        } else if (!strcmp(a, "--loop-kv")) {
            if (!parse_name(a, v, loop_kvs, 2, &loop_kv)) return 2;
        } else if (!strcmp(a, "--exit-threshold")) ok = parse_float(v, &sp.exit_threshold);
        else if (!strcmp(a, "--min-depth")) ok = parse_u32(v, &sp.min_depth);
        else if (!strcmp(a, "--max-depth")) ok = parse_u32(v, &sp.max_depth);
        else if (!strcmp(a, "--seed")) {
            char *end;
            seed = strtoull(v, &end, 10);
            ok = *v && *v != '-' && !*end;
        } else if (!strcmp(a, "--stop")) {
            ok = parse_u32(v, &stop) && sp.n_stop < PARITY_MAX_STOP;
            if (ok) sp.stop[sp.n_stop++] = (int32_t)stop;
        } else {
            fprintf(stderr, "error: unknown option %s\n", a);
            usage();
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "error: bad value for %s: '%s'\n", a, v);
            return 2;
        }
    }
    if (!model_spec || !policy || (!pbytes == !ptokens)) {
        usage();
        return 2;
    }
    if (!batch || batch > n) batch = n;
    sp.temperature = temperature;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = seed;
    sp.max_new_tokens = max_tokens;
    if (!parse_logprob_mode(mode, &sp.logprob_mode)) return 2;

    parity_sampler_params params;
    parity_sampler_default_params(&params);
    if (!parse_policy_backend(policy, backend, &params.policy, &params.backend)) return 2;
    int rc;

    uint32_t plen;
    int32_t *prompt = read_tokens(pbytes ? pbytes : ptokens, pbytes != NULL, &plen);
    if (!prompt) return 1;
    parity_model *model = NULL;
    parity_sampler *sampler = NULL;
    completion *out = calloc(n, sizeof *out);
    uint32_t *active = calloc(batch, sizeof *active), *index = calloc(batch, sizeof *index);
    uint32_t *fin = calloc(batch, sizeof *fin);
    int32_t *tok = calloc(batch, sizeof *tok);
    float *lp = calloc(batch, sizeof *lp);
    int status = 1;
    if (!out || !active || !index || !fin || !tok || !lp) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if ((rc = parity_model_open(model_spec, &model))) {
        fail(model_spec, rc);
        goto done;
    }
    uint64_t max_len = (uint64_t)plen + max_tokens;
    uint32_t context = parity_model_config(model)->max_position_embeddings;
    if (max_len > context) max_len = context;
    params.n_threads = threads;
    params.max_seqs = batch + 1;
    params.max_len = (uint32_t)max_len;
    params.max_batch = batch;
    params.loop_kv = loop_kv;
    const int looped = parity_model_config(model)->arch == PARITY_ARCH_OURO;
    if ((rc = parity_sampler_create(model, &params, &sampler))) {
        fail("creating the sampler", rc);
        goto done;
    }
    uint32_t parent;
    if ((rc = parity_sampler_add(sampler, prompt, plen, &sp, 0, &parent))) {
        fail("prefilling the prompt", rc);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) {
        out[i].tokens = malloc(max_tokens * sizeof(int32_t));
        out[i].logprobs = malloc(max_tokens * sizeof(float));
        out[i].depths = malloc(max_tokens * sizeof(uint32_t));
        if (!out[i].tokens || !out[i].logprobs || !out[i].depths) {
            fprintf(stderr, "error: out of memory\n");
            goto done;
        }
    }

    /* continuous batching: keep up to `batch` completions decoding */
    uint32_t next = 0, n_active = 0;
    while (next < n || n_active > 0) {
        while (n_active < batch && next < n) {
            if ((rc = parity_sampler_fork(sampler, parent, &sp, next, &active[n_active]))) {
                fail("forking the prompt", rc);
                goto done;
            }
            index[n_active++] = next++;
        }
        /* a prompt that fills max_len leaves nothing to generate */
        const int32_t *toks;
        uint32_t len;
        parity_sampler_tokens(sampler, active[0], &toks, &len, NULL);
        if (len >= params.max_len) {
            for (uint32_t k = 0; k < n_active; k++) parity_sampler_release(sampler, active[k]);
            n_active = 0;
            continue;
        }
        if ((rc = parity_sampler_step(sampler, active, n_active, tok, lp, fin, 0, NULL, NULL))) {
            fail("decoding", rc);
            goto done;
        }
        for (uint32_t k = 0; k < n_active;) {
            completion *c = &out[index[k]];
            c->tokens[c->n] = tok[k];
            c->logprobs[c->n] = lp[k];
            /* the depth of the step that drew it: the last cached position's */
            const uint32_t *d;
            uint32_t nd;
            parity_sampler_depths(sampler, active[k], &d, &nd);
            c->depths[c->n] = d[nd - 1];
            c->n++;
            if (fin[k]) {
                parity_sampler_release(sampler, active[k]);
                /* keep the order of the rest: the batch's order does not matter, but a stable
                 * one keeps runs easy to follow */
                memmove(&active[k], &active[k + 1], (n_active - k - 1) * sizeof *active);
                memmove(&index[k], &index[k + 1], (n_active - k - 1) * sizeof *index);
                memmove(&tok[k], &tok[k + 1], (n_active - k - 1) * sizeof *tok);
                memmove(&lp[k], &lp[k + 1], (n_active - k - 1) * sizeof *lp);
                memmove(&fin[k], &fin[k + 1], (n_active - k - 1) * sizeof *fin);
                n_active--;
            } else {
                k++;
            }
        }
    }

    for (uint32_t i = 0; i < n; i++) {
        printf("{\"index\": %u, \"prompt_len\": %u, \"tokens\": [", i, plen);
        for (uint32_t t = 0; t < out[i].n; t++) printf("%s%d", t ? ", " : "", out[i].tokens[t]);
        printf("], \"logprobs\": [");
        for (uint32_t t = 0; t < out[i].n; t++) printf("%s%.9g", t ? ", " : "", (double)out[i].logprobs[t]);
        if (looped) {
            printf("], \"exit_depths\": [");
            for (uint32_t t = 0; t < out[i].n; t++) printf("%s%u", t ? ", " : "", out[i].depths[t]);
            printf("], \"loop_kv\": \"%s\"}\n", loop_kvs[loop_kv]);
        } else {
            printf("]}\n");
        }
    }
    status = 0;
done:
    if (out)
        for (uint32_t i = 0; i < n; i++) {
            free(out[i].tokens);
            free(out[i].logprobs);
            free(out[i].depths);
        }
    free(out);
    free(active);
    free(index);
    free(fin);
    free(tok);
    free(lp);
    free(prompt);
    parity_sampler_free(sampler);
    parity_model_free(model);
    return status;
}
