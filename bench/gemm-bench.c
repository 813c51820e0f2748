/*
 * gemm-bench: speed of the bf16-weight GEMM on the shapes of a Qwen3-0.6B forward, called as
 * the forward calls it (gemm_bf16w_pool: x packed over the pool, then output columns in
 * blocks split over the library's thread pool in contiguous ranges; gemm_bf16w below the
 * table's tiles_min_m rows, gemm_bf16w_tiles from there on).
 *
 *   prefill shapes (M = 64, 512): GFLOP/s, against the FMA peak of the active CPU path's
 *     instruction that the bench measures itself (bench_peak.h, on every thread);
 *   decode shapes (M = 1): GB/s of weight traffic (N * K * 2 bytes per call);
 *   the round trip of an empty pool_run.
 *
 * Weights are bf16 with random values. Every call reads a different copy of the weight
 * matrix (copies of at least 128 MB in all, 4 times the L3 of the machine this was written
 * on), so that weights come from memory as they do in a forward pass over a 1.2 GB model.
 * Packing x is part of every timed call, as in the forward. Times are wall clock; the median and the
 * best of the repetitions are reported.
 *
 *   gemm-bench [--json] [--threads 1,2] [--m 1,64,512] [--shape NAME] [--min-time S]
 *              [--reps N] [--check] [--thp] [--hot] [--quick]
 *
 * --check compares sampled outputs of every case bitwise with the portable kernels.
 * --thp also runs each M with the weights in buffers advised MADV_HUGEPAGE (2 MB pages).
 * --hot uses one copy of the weights (cache-resident when they fit: the kernel alone).
 * --quick skips lm_head at M = 512 (160 GFLOP a call).
 * --groups instead of the table: the GEMMs a layer runs on one x (q, k, v; gate, up), one
 *   call each (gemm_bf16w_pool) against one grouped call (gemm_bf16w_group_pool: x packed
 *   once, one parallel loop), the two timed alternately call by call; GB/s of weights from
 *   the median times, and the grouped outputs checked bitwise against the separate ones.
 */
#include <errno.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench_clock.h"
#include "bench_peak.h"
#include "engine/gemm.h"
#include "kernels/kernels.h"
#include "base/threadpool.h"
#include "options.h"

#define MAX_REPS 64

typedef struct shape {
    const char *name;
    size_t N, K;
} shape;

/* Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, intermediate 3072. */
static const shape SHAPES[] = {
    {"q", 2048, 1024},      {"kv", 1024, 1024},   {"o", 1024, 2048},
    {"gate/up", 3072, 1024}, {"down", 1024, 3072}, {"lm_head", 151936, 1024},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A value of about N(0, 0.02)'s size, as bf16 bits: random sign, exponent and mantissa. */
static uint16_t random_weight(uint64_t r) {
    uint16_t exp = (uint16_t)(0x73 + (r >> 8) % 9); /* 2^-12 .. 2^-4 */
    return (uint16_t)((r & 1) << 15 | exp << 7 | ((r >> 16) & 0x7f));
}

/* ---- the FMA peak (bench_peak.h) ------------------------------------------------------ */

typedef struct peak_job {
    long iters;
    bench_peak_kind kind;
    double sink[64];
} peak_job;

static void peak_task(void *ctx, size_t begin, size_t end, unsigned worker) {
    peak_job *j = ctx;
    for (size_t t = begin; t < end; t++) j->sink[worker % 64] += bench_peak_loop(j->iters, j->kind);
}

/* GFLOP/s of kind's peak loop on every worker of the pool (one task per worker), the best
 * of 10. Short loops first, so that every worker is awake and on a core of its own (a worker
 * woken from sleep may first be queued on the waker's core). */
static double fma_peak(threadpool *pool, bench_peak_kind kind) {
    const unsigned n = pool_size(pool);
    peak_job j = {.iters = 20000, .kind = kind};
    if (kind == BENCH_PEAK_NONE) return 0;
    for (int rep = 0; rep < 200; rep++) pool_run(pool, peak_task, &j, n);
    j.iters = 2000000;
    double best = 0;
    for (int rep = 0; rep < 10; rep++) {
        double t = bench_now();
        pool_run(pool, peak_task, &j, n);
        t = bench_now() - t;
        double g = (double)n * (double)j.iters * bench_peak_flops_per_iter(kind) / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

/* ---- the pool round trip --------------------------------------------------------------- */

static void empty_task(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)ctx, (void)begin, (void)end, (void)worker;
}

/* Median microseconds of an empty pool_run with n_tasks = workers (back to back, as a
 * decode step issues them). */
static double pool_round_trip(threadpool *pool) {
    enum { CALLS = 2000, ROUNDS = 9 };
    double t[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = bench_now();
        for (int i = 0; i < CALLS; i++) pool_run(pool, empty_task, NULL, pool_size(pool));
        t[r] = (bench_now() - t0) / CALLS * 1e6;
    }
    qsort(t, ROUNDS, sizeof *t, bench_cmp_double);
    return t[ROUNDS / 2];
}

/* ---- one GEMM case --------------------------------------------------------------------- */

typedef struct weights {
    uint16_t *data;
    void *base; /* what to munmap (thp) */
    size_t copies, bytes_each, alloc_bytes;
    int mmapped;
} weights;

/* `copies` weight matrices of N x K, one after the other, at least 128 MB in all. With
 * thp, in an mmap advised MADV_HUGEPAGE before the first touch. */
static int weights_make(weights *wt, size_t N, size_t K, int thp, int hot) {
    const size_t min_total = hot ? 1 : (size_t)128 << 20;
    wt->bytes_each = (N * K * sizeof(uint16_t) + 4095) / 4096 * 4096;
    wt->copies = (min_total + wt->bytes_each - 1) / wt->bytes_each;
    if (wt->copies == 0) wt->copies = 1;
    wt->alloc_bytes = wt->copies * wt->bytes_each;
    wt->mmapped = thp;
    if (thp) {
        /* 2 MB aligned, so that every 2 MB of the weights can be one page */
        const size_t huge = (size_t)2 << 20;
        wt->alloc_bytes += huge;
        void *p = mmap(NULL, wt->alloc_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED) return -1;
        wt->base = p;
        char *aligned = (char *)(((uintptr_t)p + huge - 1) & ~(uintptr_t)(huge - 1));
        if (madvise(aligned, wt->copies * wt->bytes_each, MADV_HUGEPAGE) != 0)
            fprintf(stderr, "gemm-bench: madvise(MADV_HUGEPAGE): %s\n", strerror(errno));
        wt->data = (uint16_t *)aligned;
    } else {
        wt->data = aligned_alloc(64, wt->alloc_bytes);
        if (!wt->data) return -1;
    }
    /* the same values in every copy: rows are a function of their index */
    for (size_t c = 0; c < wt->copies; c++) {
        uint16_t *w = (uint16_t *)((char *)wt->data + c * wt->bytes_each);
        if (c == 0) {
            for (size_t i = 0; i < N * K; i++) w[i] = random_weight(rng());
        } else {
            memcpy(w, wt->data, N * K * sizeof(uint16_t));
        }
    }
    return 0;
}

static void weights_free(weights *wt) {
    if (wt->mmapped)
        munmap(wt->base, wt->alloc_bytes);
    else
        free(wt->data);
}

typedef struct result {
    const char *shape;
    size_t M, N, K;
    unsigned threads;
    int thp;
    int reps;
    double median_s, best_s;
    double gflops, gflops_best; /* from the median / best time */
    double gbps, gbps_best;     /* weight bytes / time */
    int checked, check_ok;
} result;

/* Bitwise comparison with the portable kernels on sampled columns (first, middle and last
 * 40, every row), for the weight copy the last timed call used. */
static int check_case(size_t M, size_t N, size_t K, const float *x, const uint16_t *w,
                      const float *y) {
    size_t ranges[3][2] = {{0, 40}, {N / 2 - 20, N / 2 + 20}, {N - 40, N}};
    float *ref = malloc(M * N * sizeof *ref);
    float *xp = malloc(M * gemm_packed_row(K) * sizeof *xp);
    if (!ref || !xp) return free(ref), free(xp), 0;
    gemm_pack_x(M, K, x, K, xp);
    int ok = 1;
    for (int r = 0; r < 3; r++) {
        size_t n0 = ranges[r][0], n1 = ranges[r][1];
        kernels_portable.gemm_bf16w(M, K, xp, w, K, ref, N, n0, n1);
        for (size_t m = 0; m < M && ok; m++)
            if (memcmp(ref + m * N + n0, y + m * N + n0, (n1 - n0) * sizeof *y) != 0) ok = 0;
    }
    free(ref), free(xp);
    return ok;
}

typedef struct options {
    int json, check, thp, quick, hot, groups, reps_max;
    double min_time;
    unsigned threads[8];
    int n_threads;
    size_t ms[8];
    int n_ms;
    const char *only;
} options;

static result run_case(const options *o, threadpool *pool, const shape *s, size_t M,
                       const weights *wt, const float *x, const gemm_scratch *gs, float *y) {
    result r = {.shape = s->name, .M = M, .N = s->N, .K = s->K, .threads = pool_size(pool),
                .thp = wt->mmapped};
    const double flop = 2.0 * (double)M * (double)s->N * (double)s->K;
    const double bytes = (double)s->N * (double)s->K * 2.0;
    double t[MAX_REPS];
    double spent = 0;
    size_t copy = 0;
    const uint16_t *w = wt->data; /* the copy of the last timed call */
    /* one untimed call (page faults, first touch of y) */
    gemm_bf16w_pool(pool, M, s->K, x, s->K, w, s->K, y, s->N, s->N, gs);
    int n = 0;
    while (n < o->reps_max && (n < 3 || spent < o->min_time)) {
        copy = (copy + 1) % wt->copies;
        w = (const uint16_t *)((const char *)wt->data + copy * wt->bytes_each);
        double t0 = bench_now();
        gemm_bf16w_pool(pool, M, s->K, x, s->K, w, s->K, y, s->N, s->N, gs);
        t[n] = bench_now() - t0;
        spent += t[n++];
    }
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    r.reps = n;
    r.median_s = t[n / 2];
    r.best_s = t[0];
    r.gflops = flop / r.median_s * 1e-9;
    r.gflops_best = flop / r.best_s * 1e-9;
    r.gbps = bytes / r.median_s * 1e-9;
    r.gbps_best = bytes / r.best_s * 1e-9;
    if (o->check) {
        r.checked = 1;
        r.check_ok = check_case(M, s->N, s->K, x, w, y);
    }
    return r;
}

/* ---- --groups: one call per GEMM against one grouped call ---------------------------- */

typedef struct group_shape {
    const char *name;
    size_t n, K, N[GEMM_GROUP_MAX];
} group_shape;

static const group_shape GROUPS[] = {
    {"q,k,v", 3, 1024, {2048, 1024, 1024}},
    {"gate,up", 2, 1024, {3072, 3072}},
};

/* The median seconds of the separate calls and of the grouped call, timed alternately on
 * the same weight copies; 0 from a failed allocation. *same: the outputs agree bitwise. */
static int run_group(const options *o, threadpool *pool, const group_shape *g, size_t M,
                     double *t_sep, double *t_grp, int *same) {
    size_t total = 0, off[GEMM_GROUP_MAX];
    for (size_t i = 0; i < g->n; i++) off[i] = total, total += g->N[i];
    weights wt;
    float *x = malloc(M * g->K * sizeof *x), *y = malloc(M * total * sizeof *y),
          *y2 = malloc(M * total * sizeof *y2);
    const size_t nxp = gemm_scratch_xpack_floats(M, g->K);
    gemm_scratch gs = {aligned_alloc(64, (nxp * sizeof(float) + 63) / 64 * 64),
                       aligned_alloc(64, gemm_panel_floats(g->K) * pool_size(pool) * sizeof(float)),
                       g->K};
    if (!x || !y || !y2 || !gs.xpack || !gs.panels || weights_make(&wt, total, g->K, 0, o->hot)) {
        free(x), free(y), free(y2), free(gs.xpack), free(gs.panels);
        return -1;
    }
    for (size_t i = 0; i < M * g->K; i++)
        x[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)((int)(rng() % 2001) - 1000) / 1000.0f));
    double ts[MAX_REPS], tg[MAX_REPS], spent = 0;
    int n = 0;
    size_t copy = 0;
    *same = 1;
    for (int rep = -1; rep < o->reps_max && (rep < 3 || spent < o->min_time); rep++) {
        const uint16_t *w = (const uint16_t *)((const char *)wt.data + copy * wt.bytes_each);
        gemm_part parts[GEMM_GROUP_MAX];
        for (size_t i = 0; i < g->n; i++)
            parts[i] = (gemm_part){w + off[i] * g->K, g->K, g->N[i], y2 + M * off[i], g->N[i], NULL};
        double t0 = bench_now();
        for (size_t i = 0; i < g->n; i++)
            gemm_bf16w_pool(pool, M, g->K, x, g->K, w + off[i] * g->K, g->K, y + M * off[i], g->N[i],
                            g->N[i], &gs);
        const double t1 = bench_now();
        copy = (copy + 1) % wt.copies;
        w = (const uint16_t *)((const char *)wt.data + copy * wt.bytes_each);
        for (size_t i = 0; i < g->n; i++) parts[i].w = w + off[i] * g->K;
        const double t2 = bench_now();
        gemm_bf16w_group_pool(pool, M, g->K, x, g->K, g->n, parts, &gs);
        const double t3 = bench_now();
        copy = (copy + 1) % wt.copies;
        if (memcmp(y, y2, M * total * sizeof *y) != 0) *same = 0;
        if (rep < 0) continue; /* the untimed first round */
        ts[n] = t1 - t0, tg[n] = t3 - t2;
        spent += ts[n] + tg[n];
        n++;
    }
    qsort(ts, (size_t)n, sizeof *ts, bench_cmp_double);
    qsort(tg, (size_t)n, sizeof *tg, bench_cmp_double);
    *t_sep = ts[n / 2], *t_grp = tg[n / 2];
    weights_free(&wt);
    free(x), free(y), free(y2), free(gs.xpack), free(gs.panels);
    return 0;
}

static int run_groups(const options *o, threadpool *const *pools) {
    int failed = 0, first = 1;
    if (!o->json)
        printf("\n%-8s %5s %5s %3s %14s %14s %8s  %s\n", "group", "M", "K", "thr",
               "separate GB/s", "grouped GB/s", "speedup", "bits");
    for (int mi = 0; mi < o->n_ms; mi++)
        for (size_t gi = 0; gi < sizeof GROUPS / sizeof GROUPS[0]; gi++)
            for (int t = 0; t < o->n_threads; t++) {
                const group_shape *g = &GROUPS[gi];
                const size_t M = o->ms[mi];
                double ts, tg;
                int same;
                if (run_group(o, pools[t], g, M, &ts, &tg, &same)) {
                    fprintf(stderr, "gemm-bench: out of memory\n");
                    return 1;
                }
                size_t total = 0;
                for (size_t i = 0; i < g->n; i++) total += g->N[i];
                const double bytes = 2.0 * (double)total * (double)g->K;
                if (!same) failed = 1;
                if (!o->json)
                    printf("%-8s %5zu %5zu %3u %14.2f %14.2f %7.3fx  %s\n", g->name, M, g->K,
                           o->threads[t], bytes / ts * 1e-9, bytes / tg * 1e-9, ts / tg,
                           same ? "same" : "DIFFER");
                else
                    printf("%s\n    {\"group\": \"%s\", \"M\": %zu, \"K\": %zu, \"threads\": %u, "
                           "\"separate_s\": %.6e, \"grouped_s\": %.6e, \"same_bits\": %s}",
                           first ? "" : ",", g->name, M, g->K, o->threads[t], ts, tg,
                           same ? "true" : "false");
                first = 0;
            }
    return failed;
}

static int parse_list(const char *arg, size_t *out, int max) {
    int n = 0;
    for (const char *p = arg; *p && n < max;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p) return -1;
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static void usage(void) {
    fprintf(stderr, "usage: gemm-bench [--json] [--threads 1,2] [--m 1,64,512] [--shape NAME]\n"
                    "                  [--min-time S] [--reps N] [--check] [--thp] [--hot] [--quick]\n"
                    "                  [--groups]\n");
}

int main(int argc, char **argv) {
    options o = {.reps_max = 15, .min_time = 0.3, .threads = {1, 2}, .n_threads = 2,
                 .ms = {1, 64, 512}, .n_ms = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        size_t list[8];
        if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--check")) {
            o.check = 1;
        } else if (!strcmp(a, "--thp")) {
            o.thp = 1;
        } else if (!strcmp(a, "--hot")) {
            o.hot = 1;
        } else if (!strcmp(a, "--quick")) {
            o.quick = 1;
        } else if (!strcmp(a, "--groups")) {
            o.groups = 1;
        } else if (!option_value(argc, argv, &i, &v)) {
            return usage(), 2;
        } else if (!strcmp(a, "--threads")) {
            int n = parse_list(v, list, 8);
            if (n <= 0) return usage(), 2;
            for (int k = 0; k < n; k++) o.threads[k] = (unsigned)list[k];
            o.n_threads = n;
        } else if (!strcmp(a, "--m")) {
            int n = parse_list(v, o.ms, 8);
            if (n <= 0) return usage(), 2;
            o.n_ms = n;
        } else if (!strcmp(a, "--shape")) {
            o.only = v;
        } else if (!strcmp(a, "--min-time")) {
            o.min_time = atof(v);
        } else if (!strcmp(a, "--reps")) {
            o.reps_max = atoi(v);
            if (o.reps_max < 1) o.reps_max = 1;
            if (o.reps_max > MAX_REPS) o.reps_max = MAX_REPS;
        } else {
            return usage(), 2;
        }
    }

    threadpool *pools[8];
    for (int t = 0; t < o.n_threads; t++)
        if (pool_create(o.threads[t], &pools[t]) != PARITY_OK) {
            fprintf(stderr, "gemm-bench: cannot create a pool of %u threads\n", o.threads[t]);
            return 1;
        }
    const unsigned saved_env = fp_env_enter();

    /* every peak the CPU has; %peak is the active path's */
    const bench_peak_kind active = bench_peak_active();
    double peaks[8][BENCH_PEAK_KINDS] = {{0}}, peak[8], trip[8];
    for (int t = 0; t < o.n_threads; t++) {
        for (int k = 1; k < BENCH_PEAK_KINDS; k++)
            if (bench_peak_available((bench_peak_kind)k))
                peaks[t][k] = fma_peak(pools[t], (bench_peak_kind)k);
        peak[t] = peaks[t][active];
        trip[t] = pool_round_trip(pools[t]);
    }

    if (!o.json) {
        printf("kernels: %s, %%peak of %s\n", kern()->name, bench_peak_instruction(active));
        for (int t = 0; t < o.n_threads; t++) {
            printf("threads %u: peak GFLOP/s", o.threads[t]);
            for (int k = 1; k < BENCH_PEAK_KINDS; k++)
                if (bench_peak_available((bench_peak_kind)k))
                    printf(" %s %.1f,", bench_peak_instruction((bench_peak_kind)k), peaks[t][k]);
            printf(" empty pool_run %.2f us\n", trip[t]);
        }
        printf("\n%-8s %5s %7s %5s %3s %4s %10s %10s %9s %9s %6s%s\n", "shape", "M", "N", "K",
               "thr", "thp", "GFLOP/s", "(best)", "GB/s", "(best)", "%peak",
               o.check ? "  check" : "");
    } else {
        printf("{\n  \"kernels\": \"%s\",\n  \"peak_instruction\": \"%s\",\n  \"threads\": [",
               kern()->name, bench_peak_instruction(active));
        for (int t = 0; t < o.n_threads; t++) {
            printf("%s{\"threads\": %u, \"fma_peak_gflops\": %.2f, \"pool_run_us\": %.3f, "
                   "\"peaks_gflops\": {", t ? ", " : "", o.threads[t], peak[t], trip[t]);
            for (int k = 1, n = 0; k < BENCH_PEAK_KINDS; k++)
                if (bench_peak_available((bench_peak_kind)k))
                    printf("%s\"%s\": %.2f", n++ ? ", " : "", bench_peak_key((bench_peak_kind)k),
                           peaks[t][k]);
            printf("}}");
        }
        printf("],\n  \"cases\": [");
    }

    int first = 1, failed = 0;
    if (o.groups) {
        if (o.json) printf("],\n  \"groups\": [");
        failed = run_groups(&o, pools);
    }
    for (int mi = 0; mi < o.n_ms && !o.groups; mi++) {
        const size_t M = o.ms[mi];
        for (size_t si = 0; si < N_SHAPES; si++) {
            const shape *s = &SHAPES[si];
            if (o.only && strcmp(o.only, s->name) != 0) continue;
            if (o.quick && M > 64 && s->N > 100000) continue;
            float *x = malloc(M * s->K * sizeof *x);
            const size_t nxp = gemm_scratch_xpack_floats(M, s->K);
            unsigned most = 1; /* one panel per worker of the largest pool */
            for (int t = 0; t < o.n_threads; t++) most = o.threads[t] > most ? o.threads[t] : most;
            const size_t npanel = gemm_panel_floats(s->K) * most;
            gemm_scratch gs = {aligned_alloc(64, (nxp * sizeof(float) + 63) / 64 * 64),
                               aligned_alloc(64, npanel * sizeof(float)), s->K};
            float *y = malloc(M * s->N * sizeof *y);
            if (!x || !gs.xpack || !gs.panels || !y) {
                fprintf(stderr, "gemm-bench: out of memory\n");
                return 1;
            }
            /* bf16 values, as the forward's GEMM inputs are (a table with bf16 dot products
             * packs them as bf16) */
            for (size_t i = 0; i < M * s->K; i++)
                x[i] = parity_bf16_to_f32(
                    parity_bf16_from_f32((float)((int)(rng() % 2001) - 1000) / 1000.0f));
            for (int thp = 0; thp <= o.thp; thp++) {
                weights wt;
                if (weights_make(&wt, s->N, s->K, thp, o.hot) != 0) {
                    fprintf(stderr, "gemm-bench: cannot allocate weights\n");
                    return 1;
                }
                for (int t = 0; t < o.n_threads; t++) {
                    result r = run_case(&o, pools[t], s, M, &wt, x, &gs, y);
                    if (r.checked && !r.check_ok) failed = 1;
                    double pct = peak[t] > 0 ? 100.0 * r.gflops / peak[t] : 0;
                    if (!o.json) {
                        printf("%-8s %5zu %7zu %5zu %3u %4s %10.1f %10.1f %9.2f %9.2f %5.0f%%%s\n",
                               r.shape, r.M, r.N, r.K, r.threads, r.thp ? "yes" : "no", r.gflops,
                               r.gflops_best, r.gbps, r.gbps_best, pct,
                               r.checked ? (r.check_ok ? "  ok" : "  MISMATCH") : "");
                        fflush(stdout);
                    } else {
                        printf("%s\n    {\"shape\": \"%s\", \"M\": %zu, \"N\": %zu, \"K\": %zu, "
                               "\"threads\": %u, \"thp\": %s, \"reps\": %d, "
                               "\"median_s\": %.6e, \"best_s\": %.6e, \"gflops\": %.3f, "
                               "\"gflops_best\": %.3f, \"weight_gbps\": %.3f, "
                               "\"weight_gbps_best\": %.3f, \"peak_fraction\": %.4f%s}",
                               first ? "" : ",", r.shape, r.M, r.N, r.K, r.threads,
                               r.thp ? "true" : "false", r.reps, r.median_s, r.best_s, r.gflops,
                               r.gflops_best, r.gbps, r.gbps_best, pct / 100,
                               r.checked ? (r.check_ok ? ", \"check\": \"ok\""
                                                       : ", \"check\": \"mismatch\"")
                                         : "");
                        first = 0;
                    }
                }
                weights_free(&wt);
            }
            free(x), free(gs.xpack), free(gs.panels), free(y);
        }
    }
    if (o.json) printf("\n  ]\n}\n");
    fp_env_restore(saved_env);
    for (int t = 0; t < o.n_threads; t++) pool_free(pools[t]);
    if (failed)
        fprintf(stderr, o.groups ? "gemm-bench: grouped outputs differ from the separate calls\n"
                                 : "gemm-bench: outputs differ from the portable kernels\n");
    return failed;
}
