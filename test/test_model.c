/* Known answers for the whole model: the trained Qwen3 in models/ scored on the held-out
 * sequences of test/data/reference/, against log-probs an independent PyTorch implementation
 * computed (test/data/reference/README.md):
 *   - preset fp32 on the bf16 checkpoint: within 1e-4 max |dlogp| of fp32_bf16w;
 *   - presets hf-eager and aligned: within 0.0065 mean |dlogp| of their own reference, and
 *     nearer their own reference than the other preset's.
 * Summation order alone moves the bf16 presets by 0.003-0.0055 mean |dlogp|, so these are
 * bounds, not bitwise checks. Prints the figures for every sequence and backend. */
#include <math.h>

#include "fixtures.h"

#define N_EVAL 4
#define LEN 512

static int read_exact(const char *path, void *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 0;
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, got, n);
    return got == n;
}

static void diff(const float *a, const float *b, size_t n, double *mean_abs, double *max_abs) {
    double sum = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        sum += d;
        if (d > mx) mx = d;
    }
    *mean_abs = sum / (double)n;
    *max_abs = mx;
}

int main(void) {
    char path[4096];
    parity_model *m = NULL;
    load_model(TRAINED_MODEL, &m);
    if (!m) return check_report("model");

    static int32_t tokens[N_EVAL][LEN];
    static float ref_fp32w[N_EVAL][LEN - 1], ref_hf[N_EVAL][LEN - 1], ref_al[N_EVAL][LEN - 1];
    for (int e = 0; e < N_EVAL; e++) {
        unsigned char bytes[LEN];
        snprintf(path, sizeof path, "%s/test/data/reference/eval_%02d.bin", source_root(), e);
        CHECK(read_exact(path, bytes, LEN));
        for (int t = 0; t < LEN; t++) tokens[e][t] = bytes[t];
        const char *modes[] = {"fp32_bf16w", "hf_bf16", "aligned_bf16"};
        float *dst[] = {ref_fp32w[e], ref_hf[e], ref_al[e]};
        for (int k = 0; k < 3; k++) {
            snprintf(path, sizeof path, "%s/test/data/reference/eval_%02d.%s.logp.f32",
                     source_root(), e, modes[k]);
            CHECK(read_exact(path, dst[k], (LEN - 1) * sizeof(float)));
        }
    }

    const char *backends[] = {"bf16", "openblas", "amx"};
    /* quick mode: the library's own GEMM only */
    const uint32_t last_backend = quick() ? PARITY_BACKEND_BF16 : PARITY_BACKEND_AMX;
    for (uint32_t backend = PARITY_BACKEND_BF16; backend <= last_backend; backend++) {
        const char *presets[] = {"fp32", "hf-eager", "aligned"};
        for (int pi = 0; pi < 3; pi++) {
            if (!backend_runs(backend)) continue; /* amx: AMX CPUs only */
            parity_scorer *s = new_scorer(
                m, (fixture){.policy = presets[pi], .backend = backend, .n_threads = 2});
            if (!s) continue;
            uint32_t lengths[N_EVAL] = {LEN, LEN, LEN, LEN};
            static float lp[N_EVAL][LEN - 1];
            score_raw(s, &tokens[0][0], lengths, N_EVAL, &lp[0][0]);
            parity_scorer_free(s);
            double sum_own = 0, sum_other = 0;
            for (int e = 0; e < N_EVAL; e++) {
                double mean_own, max_own, mean_other, max_other;
                if (pi == 0) {
                    diff(lp[e], ref_fp32w[e], LEN - 1, &mean_own, &max_own);
                    printf("%-8s %-8s eval_%02d: vs fp32_bf16w mean |d| %.3g, max |d| %.3g\n",
                           backends[backend], presets[pi], e, mean_own, max_own);
                    CHECK(max_own <= 1e-4);
                    continue;
                }
                diff(lp[e], pi == 1 ? ref_hf[e] : ref_al[e], LEN - 1, &mean_own, &max_own);
                diff(lp[e], pi == 1 ? ref_al[e] : ref_hf[e], LEN - 1, &mean_other, &max_other);
                printf("%-8s %-8s eval_%02d: vs own reference mean |d| %.5f (max %.4f), "
                       "vs the other preset's %.5f (max %.4f)\n",
                       backends[backend], presets[pi], e, mean_own, max_own, mean_other, max_other);
                CHECK(mean_own <= 0.0065);
                sum_own += mean_own;
                sum_other += mean_other;
            }
            if (pi > 0) {
                printf("%-8s %-8s all: mean |d| own %.5f, other %.5f\n", backends[backend],
                       presets[pi], sum_own / N_EVAL, sum_other / N_EVAL);
                CHECK(sum_own < sum_other);
            }
        }
    }
    parity_model_free(m);
    return check_report("model");
}
