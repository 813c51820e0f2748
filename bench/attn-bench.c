/*
 * attn-bench: attention's kernels alone, on one thread, at the shapes the forward calls them
 * with, on every CPU path this machine has: where a change to one of them shows, which a whole
 * forward on a shared VM (parity-speed, ab-builds) resolves only to a percent or two.
 *
 *   attn-bench [--paths LIST|all] [--blocks B] [--reps N] [--json FILE]
 *
 * A call is one KV block (KV_BLOCK = 16 positions of head_dim 128 bf16, as the cache holds
 * them) against the query heads of the rows that read it: 2 query vectors (one decode row of
 * Qwen3-0.6B's 2 query heads per KV head, or a prefill row on the causal diagonal), 8 (the
 * quarter calls of a batch of forks, attention.c's kv_walk_split) and 32 (16 rows: a prefill
 * task, or the forks of a task over their shared prompt). Each repetition runs B calls on B
 * distinct blocks (64: 256 KB of keys, from L2; here a head's blocks lie 4 KB apart, in the
 * cache a block of every head apart, each in a page of its own, with attention's own
 * prefetches), the timed figure being the median over repetitions. Kernels (kernels.h):
 *   q.k packed   dots_packed_bf16 on queries packed once (pack_queries_bf16, untimed: once
 *                per task in the forward), where the table has it (avx512bf16)
 *   q.k          dots_f32_bf16 (the widening kernel every table has)
 *   P.V grained  pv_bf16_grained, where the table has it
 *   P.V          pv_bf16
 * and the three passes over one query head's row of n scores that the softmax adds (eager's):
 * scale_round with its rounding points and max, sum_exp, and scale_round again for the
 * normalisation with P's rounding, for rows of 512 and 4096 positions (each from a fresh copy
 * of the scores, which is timed with them: n floats copied within L1/L2).
 * Flops: 2 per product (q.k: queries x 16 x 128, P.V the same); % of the peak of the path's
 * GEMM instruction (bench_peak.h), measured here on one thread. The inputs are realistic:
 * queries, keys and values normal bf16 values, probabilities exp(-u) (u uniform in [0, 8])
 * rounded to bf16, so the packed kernels take their fast path. "(fell back)" marks a row whose
 * packed kernel said it ran the widening one for some block (pv_bf16_grained's result,
 * pack_queries_bf16's code); dots_packed_bf16 says nothing of its own fallbacks (below the
 * table's least count of queries, 8 on avx512bf16, or a block whose exponents do not fit),
 * so its rows below that count are not printed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "bench_peak.h"
#include "engine/attention.h"
#include "engine/kvcache.h"
#include "base/floats.h"
#include "kernels/kernel_common.h"
#include "kernels/kernels.h"
#include "options.h"

#define HEAD_DIM 128
#define LD_SCORES 4096 /* scores of a query lie this far apart, as max_ctx apart in the forward */
#define MAX_QUERIES 32
#define PACKED_MIN_QUERIES 8 /* kernels_avx512bf16.c's BF_ATT_MIN_QUERIES */
#define MAX_REPS 101
#define MAX_BLOCKS 1024

static const size_t query_counts[] = {2, 8, 32};
#define N_QUERY_COUNTS (sizeof query_counts / sizeof query_counts[0])

/* xorshift64* uniform in (0, 1) and a Box-Muller normal */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return ((double)((rng * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static uint16_t bf16_of(float x) { return (uint16_t)(f32_bits(round_bf16(x)) >> 16); }

typedef struct inputs {
    size_t blocks;
    uint16_t *keys, *vals;  /* blocks x KV_BLOCK x HEAD_DIM */
    float *q;               /* MAX_QUERIES x HEAD_DIM, bf16 values */
    uint16_t *qp;           /* the packed queries (pack_queries_bf16) */
    int qcode;              /* its code */
    float *p;               /* MAX_QUERIES x LD_SCORES probabilities, bf16 values */
    float *scores;          /* MAX_QUERIES x LD_SCORES */
    float *o;               /* MAX_QUERIES x HEAD_DIM accumulators */
    float *row;             /* a row of scores for the softmax passes */
    float *row_src;
} inputs;

typedef struct result {
    const char *path, *kernel;
    size_t queries, n;   /* n: positions of a softmax row (0 for the block kernels) */
    double ns, gflops, peak, peak_frac; /* peak_frac < 0: no peak */
    int fast;            /* the packed kernels: whether they took their fast path */
} result;

static result results[256];
static size_t n_results;

/* The median seconds of one repetition of `fn` over the inputs. */
typedef int (*rep_fn)(const kernels *k, inputs *in, size_t queries);

static double median_time(const kernels *k, inputs *in, size_t queries, rep_fn fn, int reps,
                          int *fast) {
    double t[MAX_REPS];
    for (int r = -1; r < reps; r++) {
        memset(in->o, 0, MAX_QUERIES * HEAD_DIM * sizeof *in->o);
        const double t0 = bench_now();
        const int f = fn(k, in, queries);
        const double t1 = bench_now();
        if (r >= 0) t[r] = t1 - t0; /* the first warms the caches */
        if (fast) *fast = f;
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmp_double);
    return t[reps / 2];
}

static int rep_qk_packed(const kernels *k, inputs *in, size_t queries) {
    for (size_t b = 0; b < in->blocks; b++)
        k->dots_packed_bf16(in->qp, in->qcode, in->q, HEAD_DIM, queries,
                            in->keys + b * KV_BLOCK * HEAD_DIM, HEAD_DIM, KV_BLOCK, HEAD_DIM,
                            in->scores + (b * KV_BLOCK) % (LD_SCORES - KV_BLOCK), LD_SCORES);
    return in->qcode >= 0;
}

static int rep_qk(const kernels *k, inputs *in, size_t queries) {
    for (size_t b = 0; b < in->blocks; b++)
        k->dots_f32_bf16(in->q, HEAD_DIM, queries, in->keys + b * KV_BLOCK * HEAD_DIM, HEAD_DIM,
                         KV_BLOCK, HEAD_DIM,
                         in->scores + (b * KV_BLOCK) % (LD_SCORES - KV_BLOCK), LD_SCORES);
    return 1;
}

static int rep_pv_grained(const kernels *k, inputs *in, size_t queries) {
    int all = 1;
    for (size_t b = 0; b < in->blocks; b++)
        all &= k->pv_bf16_grained(in->o, HEAD_DIM,
                                  in->p + (b * KV_BLOCK) % (LD_SCORES - KV_BLOCK), LD_SCORES,
                                  queries, in->vals + b * KV_BLOCK * HEAD_DIM, HEAD_DIM,
                                  KV_BLOCK, HEAD_DIM);
    return all;
}

static int rep_pv(const kernels *k, inputs *in, size_t queries) {
    for (size_t b = 0; b < in->blocks; b++)
        k->pv_bf16(in->o, HEAD_DIM, in->p + (b * KV_BLOCK) % (LD_SCORES - KV_BLOCK), LD_SCORES,
                   queries, in->vals + b * KV_BLOCK * HEAD_DIM, HEAD_DIM, KV_BLOCK, HEAD_DIM);
    return 1;
}

/* The softmax passes over a row of n = queries positions (eager: the scores rounded before
 * and after the scaling, then the exponentials and their sum), from a fresh copy each time. */
static int rep_softmax(const kernels *k, inputs *in, size_t n) {
    for (size_t b = 0; b < 8; b++) {
        memcpy(in->row, in->row_src, n * sizeof *in->row);
        float m;
        k->scale_round(in->row, n, 0.08838834764831845f, FMT_BF16, FMT_BF16, &m);
        const float l = k->sum_exp(in->row, n, m, in->row);
        k->scale_round(in->row, n, 1.0f / l, FMT_NONE, FMT_BF16, NULL);
    }
    return 1;
}

static void add(const char *path, const char *kernel, size_t queries, size_t n, double seconds,
                double flops, double peak, int fast) {
    if (n_results == sizeof results / sizeof results[0]) return;
    result *r = &results[n_results++];
    r->path = path, r->kernel = kernel, r->queries = queries, r->n = n, r->fast = fast;
    r->peak = peak;
    r->ns = seconds * 1e9;
    r->gflops = flops ? flops / seconds * 1e-9 : 0;
    r->peak_frac = flops && peak > 0 ? r->gflops / peak : -1;
}

/* The peak of kind's loop on this thread, GFLOP/s (0 where the path has none). */
static double peak_of(bench_peak_kind kind) {
    if (kind == BENCH_PEAK_NONE) return 0;
    const long iters = 20000000;
    double best = 0;
    for (int r = 0; r < 3; r++) {
        const double t0 = bench_now();
        volatile double sink = bench_peak_loop(iters, kind);
        (void)sink;
        const double g = (double)iters * bench_peak_flops_per_iter(kind) / (bench_now() - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

static int usage(void) {
    fprintf(stderr, "usage: attn-bench [--paths LIST|all] [--blocks B] [--reps N] [--json FILE]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *paths_arg = "all", *json_path = NULL;
    int wanted[PARITY_CPU_AVX512BF16 + 1] = {0};
    size_t blocks = 64;
    int reps = 21;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!option_value(argc, argv, &i, &v)) return usage();
        if (!strcmp(a, "--paths")) paths_arg = v;
        else if (!strcmp(a, "--blocks")) blocks = (size_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--json")) json_path = v;
        else return usage();
    }
    if (blocks < 1 || blocks > MAX_BLOCKS || reps < 1 || reps > MAX_REPS) return usage();
    if (!strcmp(paths_arg, "all")) {
        for (int p = PARITY_CPU_PORTABLE; p <= PARITY_CPU_AVX512BF16; p++) wanted[p] = 1;
    } else {
        char list[256];
        snprintf(list, sizeof list, "%s", paths_arg);
        for (char *save = NULL, *name = strtok_r(list, ",", &save); name;
             name = strtok_r(NULL, ",", &save)) {
            parity_cpu_path p;
            if (parity_cpu_path_from_name(name, &p) != PARITY_OK || p > PARITY_CPU_AVX512BF16) {
                fprintf(stderr, "attn-bench: --paths: unknown CPU path '%s'\n", name);
                return 2;
            }
            wanted[p] = 1;
        }
    }

    inputs in = {.blocks = blocks};
    const size_t kv = blocks * KV_BLOCK * HEAD_DIM;
    in.keys = malloc(kv * sizeof *in.keys);
    in.vals = malloc(kv * sizeof *in.vals);
    in.q = malloc(MAX_QUERIES * HEAD_DIM * sizeof *in.q);
    in.qp = aligned_alloc(64, MAX_QUERIES * HEAD_DIM * sizeof *in.qp);
    in.p = malloc(MAX_QUERIES * LD_SCORES * sizeof *in.p);
    in.scores = malloc(MAX_QUERIES * LD_SCORES * sizeof *in.scores);
    in.o = malloc(MAX_QUERIES * HEAD_DIM * sizeof *in.o);
    in.row = malloc(LD_SCORES * sizeof *in.row);
    in.row_src = malloc(LD_SCORES * sizeof *in.row_src);
    if (!in.keys || !in.vals || !in.q || !in.qp || !in.p || !in.scores || !in.o || !in.row ||
        !in.row_src) {
        fprintf(stderr, "attn-bench: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < kv; i++) in.keys[i] = bf16_of((float)normal());
    for (size_t i = 0; i < kv; i++) in.vals[i] = bf16_of((float)normal());
    for (size_t i = 0; i < MAX_QUERIES * HEAD_DIM; i++) in.q[i] = round_bf16((float)normal());
    for (size_t i = 0; i < MAX_QUERIES * LD_SCORES; i++)
        in.p[i] = round_bf16((float)exp(-8 * uniform()));
    for (size_t i = 0; i < LD_SCORES; i++) in.row_src[i] = (float)(4 * normal());
    memset(in.scores, 0, MAX_QUERIES * LD_SCORES * sizeof *in.scores);

    printf("attn-bench: 1 thread, head_dim %d, blocks of %d positions, %zu blocks (%zu KB of keys) "
           "a repetition, median of %d\n",
           HEAD_DIM, KV_BLOCK, blocks, kv * 2 / 1024, reps);
    const parity_cpu_path saved = parity_get_cpu_path();
    for (int pi = PARITY_CPU_PORTABLE; pi <= PARITY_CPU_AVX512BF16; pi++) {
        const parity_cpu_path path = (parity_cpu_path)pi;
        const char *name = parity_cpu_path_name(path);
        if (!wanted[pi]) continue;
        if (parity_set_cpu_path(path) != PARITY_OK) { /* not on this CPU */
            if (strcmp(paths_arg, "all")) printf("\npath %s: not on this CPU\n", name);
            continue;
        }
        const kernels *k = kernel_table(path);
        const bench_peak_kind kind = bench_peak_of_path(path);
        const double peak = peak_of(kind);
        printf("\npath %s: peak %s %.1f GFLOP/s (one thread)\n", name,
               bench_peak_instruction(kind), peak);
        printf("%-14s %8s %11s %9s %7s\n", "kernel", "queries", "ns/call", "GFLOP/s", "%peak");
        for (size_t qi = 0; qi < N_QUERY_COUNTS; qi++) {
            const size_t Q = query_counts[qi];
            const double flops = 2.0 * (double)Q * KV_BLOCK * HEAD_DIM * (double)blocks;
            const struct {
                const char *name;
                rep_fn fn;
                int present;
            } ks[] = {{"q.k packed", rep_qk_packed, k->dots_packed_bf16 != NULL},
                      {"q.k", rep_qk, 1},
                      {"P.V grained", rep_pv_grained, k->pv_bf16_grained != NULL},
                      {"P.V", rep_pv, 1}};
            if (k->pack_queries_bf16)
                in.qcode = k->pack_queries_bf16(in.q, HEAD_DIM, Q, HEAD_DIM, in.qp);
            for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
                if (!ks[j].present || (ks[j].fn == rep_qk_packed && Q < PACKED_MIN_QUERIES))
                    continue;
                int fast = 1;
                const double t = median_time(k, &in, Q, ks[j].fn, reps, &fast);
                add(name, ks[j].name, Q, 0, t, flops, peak, fast);
                const result *r = &results[n_results - 1];
                char pk[16] = "-";
                if (r->peak_frac >= 0) snprintf(pk, sizeof pk, "%.1f%%", 100 * r->peak_frac);
                printf("%-14s %8zu %11.1f %9.1f %7s%s\n", r->kernel, Q, r->ns / (double)blocks,
                       r->gflops, pk, fast ? "" : "  (fell back)");
            }
        }
        for (size_t n = 512; n <= LD_SCORES; n *= 8) {
            const double t = median_time(k, &in, n, rep_softmax, reps, NULL) / 8;
            add(name, "softmax", 1, n, t, 0, 0, 1);
            printf("%-14s %8s %11.1f  (%zu positions: %.2f ns each)\n", "softmax", "1", t * 1e9, n,
                   t * 1e9 / (double)n);
        }
    }
    parity_set_cpu_path(saved);

    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            fprintf(stderr, "attn-bench: cannot write %s\n", json_path);
            return 1;
        }
        fprintf(f, "{\"head_dim\": %d, \"block\": %d, \"blocks\": %zu, \"reps\": %d, \"results\": [",
                HEAD_DIM, KV_BLOCK, blocks, reps);
        for (size_t i = 0; i < n_results; i++) {
            const result *r = &results[i];
            char peak[32] = "null", frac[32] = "null";
            if (r->peak_frac >= 0) {
                snprintf(peak, sizeof peak, "%.2f", r->peak);
                snprintf(frac, sizeof frac, "%.4f", r->peak_frac);
            }
            /* softmax rows: one query head's row of `positions` scores a call, no flops counted */
            fprintf(f, "%s\n  {\"path\": \"%s\", \"kernel\": \"%s\", \"queries\": %zu, "
                       "\"positions\": %zu, \"ns_per_call\": %.1f, \"gflops\": %.2f, "
                       "\"peak_gflops\": %s, \"peak_fraction\": %s, \"fast_path\": %s}",
                    i ? "," : "", r->path, r->kernel, r->n ? 1 : r->queries, r->n,
                    r->n ? r->ns : r->ns / (double)blocks, r->gflops, peak, frac,
                    r->fast ? "true" : "false");
        }
        fprintf(f, "\n]}\n");
        fclose(f);
    }
    free(in.keys), free(in.vals), free(in.q), free(in.qp), free(in.p), free(in.scores);
    free(in.o), free(in.row), free(in.row_src);
    return 0;
}
