/* The profile (parity_sampler_set_profiling, parity_scorer_set_profiling): switching it on
 * changes no result bit; its counters count what ran (calls, forwards, rows, the pool's
 * loops) exactly; its times are consistent (every phase within the calls' wall time, the
 * phases together no more than it); off reads zeros; a wrong size or a NULL is refused; the
 * phase names are the documented ones. No figure is judged by how fast it is. */
#include <math.h>
#include <string.h>

#include "fixtures.h"

#define PROMPT 40
#define STEPS 6
#define BATCH 3

static void check_times(const parity_profile *p, const char *what) {
    double sum = 0;
    for (int i = 0; i < PARITY_PHASE_COUNT; i++) {
        CHECK(p->phase_seconds[i] >= 0 && p->phase_seconds[i] <= p->call_seconds);
        sum += p->phase_seconds[i];
    }
    /* the phases are laps of the calls' own clock: their sum cannot exceed the calls */
    if (!(sum <= p->call_seconds)) printf("%s: phases %.9f s > calls %.9f s\n", what, sum, p->call_seconds);
    CHECK(sum <= p->call_seconds);
    CHECK(p->phase_seconds[PARITY_PHASE_GEMM] > 0);
    CHECK(p->phase_seconds[PARITY_PHASE_ATTENTION] > 0);
    CHECK(p->dispatch_seconds >= 0 && p->dispatch_seconds <= p->call_seconds);
}

/* One prompt, BATCH forks of it, STEPS steps: the tokens and log-probs, with the sampler's
 * profile after the run when `profiled` (switched on before the prompt). */
static void sample(const parity_model *m, uint32_t threads, int profiled, int32_t *tokens,
                   float *lps, parity_profile *prof) {
    parity_sampler *s = new_sampler(m, (fixture){.n_threads = threads, .max_seqs = BATCH + 1,
                                                 .max_len = PROMPT + STEPS + 1});
    if (!s) return;
    if (profiled) CHECK_OK(parity_sampler_set_profiling(s, 1));
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 37 + 11) % 256);
    parity_sampling g;
    parity_sampling_default(&g);
    g.seed = 5;
    uint32_t parent, seqs[BATCH], fin[BATCH];
    CHECK_OK(parity_sampler_add(s, prompt, PROMPT, &g, 0, &parent));
    seqs[0] = parent;
    for (int b = 1; b < BATCH; b++) CHECK_OK(parity_sampler_fork(s, parent, &g, (uint64_t)b, &seqs[b]));
    for (int k = 0; k < STEPS; k++)
        CHECK_OK(parity_sampler_step(s, seqs, BATCH, tokens + k * BATCH, lps + k * BATCH, fin, 0,
                                     NULL, NULL));
    prof->size = sizeof *prof;
    CHECK_OK(parity_sampler_profile(s, prof));
    parity_sampler_free(s);
}

int main(void) {
    parity_model *m = NULL;
    load_model(TRAINED_MODEL, &m);
    if (!m) return check_report("profile");
    const parity_config *c = parity_model_config(m);

    /* names */
    static const char *const names[PARITY_PHASE_COUNT] = {"embed", "gemm", "rounding", "regions",
                                                          "attention", "head", "sampling"};
    for (int i = 0; i < PARITY_PHASE_COUNT; i++) CHECK(!strcmp(parity_phase_name((uint32_t)i), names[i]));
    CHECK(parity_phase_name(PARITY_PHASE_COUNT) == NULL);

    /* the sampler: bits unchanged, counts exact, on 1 and 2 threads */
    for (uint32_t threads = 1; threads <= 2; threads++) {
        int32_t tok_off[STEPS * BATCH], tok_on[STEPS * BATCH];
        float lp_off[STEPS * BATCH], lp_on[STEPS * BATCH];
        parity_profile off, on;
        sample(m, threads, 0, tok_off, lp_off, &off);
        sample(m, threads, 1, tok_on, lp_on, &on);
        CHECK(!memcmp(tok_off, tok_on, sizeof tok_on));
        CHECK_BITS_F32(lp_off, lp_on, STEPS * BATCH, "sampler log-probs, profiled vs not");

        CHECK_INT(off.enabled, 0);
        CHECK(off.calls == 0 && off.forwards == 0 && off.rows == 0 && off.loops == 0);
        CHECK(off.call_seconds == 0 && off.dispatch_seconds == 0);
        for (int i = 0; i < PARITY_PHASE_COUNT; i++) CHECK(off.phase_seconds[i] == 0);

        CHECK_INT(on.enabled, 1);
        /* one add and STEPS steps ran the model (a fork does not) */
        CHECK_INT(on.calls, 1 + STEPS);
        /* the prompt but its last token in one chunk (prefill_chunk 256), then one forward
         * per step, the first of which runs the prompt's last token for every fork */
        CHECK_INT(on.forwards, 1 + STEPS);
        CHECK_INT(on.rows, PROMPT - 1 + STEPS * BATCH);
        check_times(&on, "sampler");
        CHECK(on.phase_seconds[PARITY_PHASE_SAMPLING] > 0);
        CHECK(on.phase_seconds[PARITY_PHASE_HEAD] > 0);
        if (threads == 1) CHECK(on.loops == 0 && on.dispatch_seconds == 0);
        else CHECK(on.loops > 0);
    }

    /* the scorer: the same, and switching it off zeroes the counters */
    {
        parity_scorer *s = new_scorer(m, (fixture){.n_threads = 2, .max_tokens = 128, .chunk_rows = 16});
        if (s) {
            int32_t tokens[2 * PROMPT];
            for (int i = 0; i < 2 * PROMPT; i++) tokens[i] = (int32_t)((i * 53 + 3) % 256);
            const uint32_t lengths[2] = {PROMPT, PROMPT};
            float a[2 * PROMPT], b[2 * PROMPT];
            score_raw(s, tokens, lengths, 2, a);
            CHECK_OK(parity_scorer_set_profiling(s, 1));
            score_raw(s, tokens, lengths, 2, b);
            score_raw(s, tokens, lengths, 2, b);
            CHECK_BITS_F32(a, b, 2 * (PROMPT - 1), "scorer log-probs, profiled vs not");
            parity_profile p = {.size = sizeof p};
            CHECK_OK(parity_scorer_profile(s, &p));
            CHECK_INT(p.calls, 2);
            /* 80 rows in chunks of 16: 5 forwards a call */
            CHECK_INT(p.forwards, 2 * 5);
            CHECK_INT(p.rows, 2 * 2 * PROMPT);
            check_times(&p, "scorer");
            CHECK(p.phase_seconds[PARITY_PHASE_EMBED] >= 0);
            CHECK_OK(parity_scorer_set_profiling(s, 0));
            CHECK_OK(parity_scorer_profile(s, &p));
            CHECK(p.enabled == 0 && p.calls == 0 && p.forwards == 0 && p.call_seconds == 0);

            /* refusals: a wrong size (the output untouched), NULLs */
            parity_profile bad;
            memset(&bad, 0x5a, sizeof bad);
            bad.size = sizeof bad - 8;
            CHECK_STATUS(parity_scorer_profile(s, &bad), PARITY_ERR_INVALID_ARGUMENT);
            CHECK(strstr(parity_last_error(), "size") != NULL);
            CHECK(bad.calls == 0x5a5a5a5a5a5a5a5aull);
            CHECK_STATUS(parity_scorer_profile(s, NULL), PARITY_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(parity_scorer_profile(NULL, &p), PARITY_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(parity_scorer_set_profiling(NULL, 1), PARITY_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(parity_sampler_profile(NULL, &p), PARITY_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(parity_sampler_set_profiling(NULL, 1), PARITY_ERR_INVALID_ARGUMENT);
            parity_scorer_free(s);
        }
    }
    (void)c;
    parity_model_free(m);
    return check_report("profile");
}
