/*
 * sampling-bench: the cost of turning one row of logits into a draw and its log-prob, as the
 * sampler does it at every decode step (dist_build, dist_draw, dist_logprob on one thread),
 * for the sampling settings RL frameworks use, over a vocabulary of V entries.
 *
 *   sampling-bench [--vocab V] [--reps N] [--step-ms MS] [--rows N] [--json FILE]
 *
 * Logits are bf16 values (as every preset but fp32 gives them) drawn from a normal
 * distribution of standard deviation 2.5, so that top-p keeps thousands of tokens: a flat
 * distribution, the costly case for truncation. --step-ms gives a decode step's time (from parity-speed)
 * to print each setting's share of it; the sampler draws the rows of a step in parallel over
 * its threads, so at batch 1 one row is on the critical path (at larger batches a worker
 * draws its rows four at a time, dist_draw_rows, whose interleaved sums cost about one row's:
 * the figures here are a batch-1 row's). --rows N adds a worker's share of a batch step: N rows of
 * distinct logits at temperature 1 drawn as the sampler draws them (dist_build, then
 * dist_draw_rows on each group of four), with the time per row split into the build (max and exp) and the draw.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"
#include "base/floats.h"
#include "engine/sampling.h"
#include "options.h"

#define MAX_REPS 64
#define MAX_ROWS 64

/* xorshift64* uniform in (0, 1) and a Box-Muller normal */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return ((double)((rng * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

typedef struct setting {
    const char *name;
    dist_params draw;   /* the draw's distribution (always the truncated processed one) */
    uint32_t report;    /* the reported log-prob's mode */
} setting;

/* A worker's share of a batch step: `rows` rows of distinct logits at temperature 1, built and
 * drawn DIST_DRAW_ROWS at a time as the sampler's job_draw does; the medians over reps of the
 * ms per row spent in dist_build and in the draws (dist_draw_rows). */
static void batch_share(const parity_policy *pol, const float *logits, size_t V, size_t rows,
                        int reps, const dist_work *w, double *build_ms, double *draw_ms) {
    const dist_params p = {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 0, 1, 0};
    double tb[MAX_REPS], td[MAX_REPS];
    volatile int32_t sink = 0;
    for (int r = 0; r <= reps; r++) {
        double b = 0, dr = 0;
        for (size_t i = 0; i < rows; i += DIST_DRAW_ROWS) {
            const unsigned n = rows - i >= DIST_DRAW_ROWS ? DIST_DRAW_ROWS : (unsigned)(rows - i);
            dist d[DIST_DRAW_ROWS];
            double t0 = bench_now();
            for (unsigned k = 0; k < n; k++) dist_build(pol, &p, logits + (i + k) * V, V, &w[k], &d[k]);
            double t1 = bench_now();
            int32_t tok[DIST_DRAW_ROWS];
            double u[DIST_DRAW_ROWS];
            for (unsigned k = 0; k < n; k++) u[k] = uniform();
            dist_draw_rows(n, d, w, u, V, tok);
            sink += tok[0] + dist_logprob(&d[0], &w[0], tok[0]) > 0;
            b += t1 - t0, dr += bench_now() - t1;
        }
        if (r) tb[r - 1] = b, td[r - 1] = dr; /* the first pass warms the buffers */
    }
    (void)sink;  /* read: the draws' results were used */
    qsort(tb, (size_t)reps, sizeof *tb, bench_cmp_double);
    qsort(td, (size_t)reps, sizeof *td, bench_cmp_double);
    *build_ms = tb[reps / 2] * 1e3 / (double)rows, *draw_ms = td[reps / 2] * 1e3 / (double)rows;
}

int main(int argc, char **argv) {
    size_t V = 151936;
    int reps = 15;
    double step_ms = 0;
    const char *json = NULL;
    size_t rows = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        const int has_value = option_value(argc, argv, &i, &v);
        if (has_value && !strcmp(a, "--vocab")) V = strtoul(v, NULL, 10);
        else if (has_value && !strcmp(a, "--reps")) reps = atoi(v);
        else if (has_value && !strcmp(a, "--step-ms")) step_ms = atof(v);
        else if (has_value && !strcmp(a, "--rows")) rows = strtoul(v, NULL, 10);
        else if (has_value && !strcmp(a, "--json")) json = v;
        else {
            fprintf(stderr, "usage: sampling-bench [--vocab V] [--reps N] [--step-ms MS] [--rows N] [--json FILE]\n");
            return 2;
        }
    }
    if (V < 2 || reps < 1 || reps > MAX_REPS || rows > MAX_ROWS) {
        fprintf(stderr, "sampling-bench: --vocab >= 2, --reps 1..%d, --rows 0..%d\n", MAX_REPS, MAX_ROWS);
        return 2;
    }
    const size_t n_logits = V * (rows > 1 ? rows : 1);
    float *logits = malloc(n_logits * sizeof *logits),
          *work = malloc(DIST_DRAW_ROWS * dist_work_floats(V) * sizeof *work);
    if (!logits || !work) {
        fprintf(stderr, "sampling-bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n_logits; i++) logits[i] = round_bf16((float)(2.5 * normal()));
    const dist_work w = dist_work_at(work, V);
    parity_policy pol;
    parity_policy_from_name("aligned", &pol);

    const uint32_t RAW = PARITY_LOGPROB_RAW, PROC = PARITY_LOGPROB_PROCESSED,
                   TRUNC = PARITY_LOGPROB_PROCESSED_TRUNCATED;
    const setting S[] = {
        {"greedy", {TRUNC, 0, 0, 1, 0}, TRUNC},
        {"t=1", {TRUNC, 1, 0, 1, 0}, TRUNC},
        {"t=1, raw log-probs", {TRUNC, 1, 0, 1, 0}, RAW},
        {"t=0.7, top-k 50", {TRUNC, 0.7f, 50, 1, 0}, PROC},
        {"t=1, top-p 0.95", {TRUNC, 1, 0, 0.95f, 0}, TRUNC},
        {"t=1, top-k 50, top-p 0.9", {TRUNC, 1, 50, 0.9f, 0}, TRUNC},
        {"t=1, min-p 0.05", {TRUNC, 1, 0, 1, 0.05f}, TRUNC},
    };
    const size_t n_settings = sizeof S / sizeof S[0];
    double med[16], best[16];
    uint32_t support[16];
    for (size_t s = 0; s < n_settings; s++) {
        double t[MAX_REPS];
        for (int r = 0; r <= reps; r++) {
            double t0 = bench_now();
            dist d;
            dist_build(&pol, &S[s].draw, logits, V, &w, &d);
            const int32_t tok = dist_draw(&d, &w, V, uniform());
            support[s] = d.n;
            const dist_params rep = {S[s].report, S[s].draw.temperature, S[s].draw.top_k,
                                     S[s].draw.top_p, S[s].draw.min_p};
            if (S[s].report != TRUNC && !dist_built_as(&S[s].draw, &d, &rep))
                dist_build(&pol, &rep, logits, V, &w, &d);
            volatile float lp = dist_logprob(&d, &w, tok);
            (void)lp;
            if (r) t[r - 1] = bench_now() - t0; /* the first call warms the buffers */
        }
        qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
        med[s] = t[reps / 2] * 1e3, best[s] = t[0] * 1e3;
    }

    printf("sampling-bench: one row of %zu logits, one thread, %d repetitions (median, best)\n\n", V, reps);
    printf("%-26s %8s %10s %10s%s\n", "setting", "support", "ms", "best ms", step_ms > 0 ? "  of a step" : "");
    for (size_t s = 0; s < n_settings; s++) {
        printf("%-26s %8u %10.3f %10.3f", S[s].name, support[s], med[s], best[s]);
        if (step_ms > 0) printf("  %9.1f%%", 100 * med[s] / step_ms);
        printf("\n");
    }
    double build_ms = 0, draw_ms = 0;
    if (rows) {
        dist_work wp[DIST_DRAW_ROWS];
        for (unsigned k = 0; k < DIST_DRAW_ROWS; k++) wp[k] = dist_work_at(work + k * dist_work_floats(V), V);
        batch_share(&pol, logits, V, rows, reps, wp, &build_ms, &draw_ms);
        printf("\na worker's %zu rows at t=1, drawn four at a time: ms per row: build %.3f, draw %.3f, "
               "together %.3f", rows, build_ms, draw_ms, build_ms + draw_ms);
        if (step_ms > 0) printf(" (%zu rows: %.1f%% of a step)", rows, 100 * (build_ms + draw_ms) * (double)rows / step_ms);
        printf("\n");
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"vocab\": %zu, \"reps\": %d, \"step_ms\": %g, \"settings\": [", V, reps, step_ms);
        for (size_t s = 0; s < n_settings; s++)
            fprintf(f, "%s\n  {\"setting\": \"%s\", \"support\": %u, \"ms\": %.4f, \"best_ms\": %.4f}",
                    s ? "," : "", S[s].name, support[s], med[s], best[s]);
        fprintf(f, "\n]");
        if (rows)
            fprintf(f, ", \"batch_share\": {\"rows\": %zu, \"build_ms_per_row\": %.4f, "
                    "\"draw_ms_per_row\": %.4f}", rows, build_ms, draw_ms);
        fprintf(f, "}\n");
        fclose(f);
    }
    free(logits), free(work);
    return 0;
}
