/* parity-score: the log-probs a learner computes for one sequence.
 *
 *   parity-score --model DIR|synthetic:NAME[:SEED] --policy PRESET [--bytes FILE | --tokens FILE]
 *                [--temperature T] [--logprob-mode MODE] [--top-k K] [--top-p P]
 *                [--min-p P] [--threads N] [--backend BACKEND] [--out FILE]
 *                [--depths FILE [--loop-kv last-exited|full]]
 *                [--readout exit|expected-logits|K] [--every-loop]
 *
 * MODE and BACKEND are the library's names (parity_logprob_mode_name, parity_backend_name):
 * raw | processed | processed-truncated, bf16 | openblas; usage lists them.
 *
 * Prints log p(x_t | x_<t) for t = 1 .. n-1, one per line ("%.9g", which round-trips a
 * float), or with --out writes them as little-endian float32. The mode is "raw" unless
 * --temperature is given ("processed": log-probs of logits / T) or --logprob-mode says
 * otherwise; processed-truncated renormalises over the top-k/top-p/min-p support, as
 * parity-generate's sampler does. A looped model (Ouro) replays the depth schedule in
 * --depths (whitespace-separated, one per token: the prompt's positions at every loop, then
 * each exit depth parity-generate printed; the last position's is not used) with the KV rule
 * the completion was sampled with; without --depths every position runs every loop (the dense
 * learner), whose --readout is the last loop ("exit"), loop K (1..total_ut_steps) or HF's
 * expected logits, and --every-loop prints every loop's log-prob of each position on its line
 * (loop 1 first, space-separated; with --out, total_ut_steps float32 values per position). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "parity.h"

static void usage(void) {
    fprintf(stderr,
            "usage: parity-score --model DIR|synthetic:NAME[:SEED] --policy PRESET\n"
            "                    (--bytes FILE | --tokens FILE) [--temperature T]\n"
            "                    [--logprob-mode MODE] [--top-k K] [--top-p P] [--min-p P]\n"
            "                    [--threads N] [--backend BACKEND] [--out FILE]\n"
            "                    [--depths FILE [--loop-kv last-exited|full]]   (looped models)\n"
            "                    [--readout exit|expected-logits|K] [--every-loop]  (looped, dense)\n");
    print_choices();
}

int main(int argc, char **argv) {
    const char *model_spec = NULL, *policy_name = NULL, *bytes = NULL, *toks = NULL, *out = NULL;
    const char *backend = "bf16", *mode = NULL, *depths_path = NULL, *loop_kv = "last-exited";
    const char *readout = "exit";
    int every_loop = 0;
    float temperature = -1, top_p = 1.0f, min_p = 0.0f;
    uint32_t threads = 1, top_k = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--every-loop")) { /* a flag, without a value */
            every_loop = 1;
            continue;
        }
        const char *a, *v;
        int done = next_option(argc, argv, &i, usage, &a, &v);
        if (done >= 0) return done;
        if (!strcmp(a, "--model")) model_spec = v;
        else if (!strcmp(a, "--policy")) policy_name = v;
        else if (!strcmp(a, "--bytes")) bytes = v;
        else if (!strcmp(a, "--tokens")) toks = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--depths")) depths_path = v;
        else if (!strcmp(a, "--loop-kv")) loop_kv = v;
        else if (!strcmp(a, "--readout")) readout = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--logprob-mode")) mode = v;
        else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p") || !strcmp(a, "--min-p") ||
                 !strcmp(a, "--top-k")) {
            int ok = !strcmp(a, "--top-k") ? parse_u32(v, &top_k)
                     : parse_float(v, !strcmp(a, "--temperature") ? &temperature
                                      : !strcmp(a, "--top-p")     ? &top_p
                                                                  : &min_p);
            if (!strcmp(a, "--temperature") && !(temperature >= 0)) ok = 0;
            if (!ok) {
                fprintf(stderr, "error: bad value for %s: '%s'\n", a, v);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            if (!parse_u32(v, &threads) || threads == 0) {
                fprintf(stderr, "error: --threads must be a positive integer\n");
                return 2;
            }
        } else {
            fprintf(stderr, "error: unknown option %s\n", a);
            usage();
            return 2;
        }
    }
    if (!model_spec || !policy_name || (!bytes == !toks)) {
        usage();
        return 2;
    }

    parity_scorer_params params;
    parity_scorer_default_params(&params);
    params.n_threads = threads;
    if (!parse_policy_backend(policy_name, backend, &params.policy, &params.backend)) return 2;

    uint32_t n;
    int32_t *tokens = read_tokens(bytes ? bytes : toks, bytes != NULL, &n);
    if (!tokens) return 1;
    int32_t *depths = NULL;
    if (depths_path) {
        uint32_t nd;
        depths = read_tokens(depths_path, 0, &nd);
        if (!depths) {
            free(tokens);
            return 1;
        }
        if (nd != n) {
            fprintf(stderr, "error: %s has %u depths, the sequence %u tokens: one per token\n",
                    depths_path, nd, n);
            free(tokens);
            free(depths);
            return 2;
        }
    }
    if (strcmp(loop_kv, "last-exited") && strcmp(loop_kv, "full")) {
        fprintf(stderr, "error: --loop-kv '%s' is not last-exited or full\n", loop_kv);
        free(tokens);
        free(depths);
        return 2;
    }
    parity_model *model = NULL;
    parity_scorer *scorer = NULL;
    float *lp = malloc((n ? n : 1) * sizeof *lp), *loop_lp = NULL;
    int status = 1;
    if (!lp) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    int rc;
    if ((rc = parity_model_open(model_spec, &model))) {
        fail(model_spec, rc);
        goto done;
    }
    if (n > params.max_tokens && n <= parity_model_config(model)->max_position_embeddings)
        params.max_tokens = n;
    if ((rc = parity_scorer_create(model, &params, &scorer))) {
        fail("creating the scorer", rc);
        goto done;
    }
    parity_score_options opt;
    parity_score_default_options(&opt);
    if (temperature >= 0) {
        opt.mode = PARITY_LOGPROB_PROCESSED;
        opt.temperature = temperature;
    }
    if (mode && !parse_logprob_mode(mode, &opt.mode)) goto done;
    opt.top_k = top_k;
    opt.top_p = top_p;
    opt.min_p = min_p;
    /* a negative depth read as uint32 is above any model's loops: the library refuses it */
    opt.depths = (const uint32_t *)depths;
    opt.loop_kv = strcmp(loop_kv, "full") ? PARITY_LOOP_KV_LAST_EXITED : PARITY_LOOP_KV_FULL;
    if (!strcmp(readout, "expected-logits")) {
        opt.readout = PARITY_READOUT_EXPECTED_LOGITS;
    } else if (strcmp(readout, "exit")) {
        opt.readout = PARITY_READOUT_LOOP;
        if (!parse_u32(readout, &opt.readout_loop)) {
            fprintf(stderr, "error: --readout '%s' is not exit, expected-logits or a loop number\n",
                    readout);
            goto done;
        }
    }
    const uint32_t loops = every_loop ? parity_model_config(model)->total_ut_steps : 1;
    if (every_loop && !(loop_lp = malloc((size_t)(n ? n : 1) * loops * sizeof *loop_lp))) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    opt.loop_logprobs = loop_lp;
    if ((rc = parity_score(scorer, &opt, tokens, &n, 1, lp, NULL, NULL, NULL))) {
        fail("scoring", rc);
        goto done;
    }
    const float *values = every_loop ? loop_lp : lp;
    const size_t per_line = every_loop ? loops : 1;
    if (out) {
        FILE *f = fopen(out, "wb");
        const size_t count = (size_t)(n - 1) * per_line;
        if (!f || fwrite(values, sizeof *values, count, f) != count || fclose(f) != 0) {
            fprintf(stderr, "error: %s: cannot write\n", out);
            goto done;
        }
    } else {
        for (uint32_t t = 0; t + 1 < n; t++)
            for (size_t k = 0; k < per_line; k++)
                printf("%.9g%c", (double)values[t * per_line + k], k + 1 < per_line ? ' ' : '\n');
    }
    status = 0;
done:
    parity_scorer_free(scorer);
    parity_model_free(model);
    free(lp);
    free(loop_lp);
    free(tokens);
    free(depths);
    return status;
}
