/*
 * quant-decode-bench: speed of the quantized GEMMs' column kernels (quant/dot.h) at the small M
 * of decoding, on the linear shapes of a Qwen3-0.6B layer, as the forward calls them: the
 * activations quantized once, then the rule's GEMM entry on the active CPU path over the
 * library's thread pool, the output columns split in contiguous ranges between the workers
 * (engine/gemm_quant.c's pool_run).
 *
 *   quant-decode-bench [--formats LIST] [--m 1,4] [--threads 1,2] [--reps N] [--hot]
 *                      [--thp] [--paths LIST]
 *
 * Per format (nvfp4, mxfp4, ternary, fp8-block, mxfp8; a rule each: modelopt, ocp, bitnet,
 * deepseek, ocp), shape and M: GB/s counted in the bytes a call reads (the weight's codes as
 * held and its scales as held), the median and the best of the repetitions, each repetition
 * about 0.1 s of calls; beside them the median over the process's CPU time (with one thread:
 * the time the calls had a core, on a machine that runs other work too), and that median as
 * G multiply-adds a second (M N K a call: the measure at the large M of a prefill). Every call
 * reads a different copy of the weight (copies of at least 128 MB in all, so that the codes
 * come from memory as in a forward over the whole model); --hot uses one copy (the kernel
 * alone, its codes in cache where they fit); --thp puts the copies in 2 MB pages (advised
 * MADV_HUGEPAGE; the model's weights under 2 MB are in 4 KB ones). --paths runs the rows on
 * each CPU path named (portable, avx2, avx512, avx512bf16; default: the library's choice), one
 * after the other.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/threadpool.h"
#include "bench_clock.h"
#include "kernels/kernels.h"
#include "parity.h"
#include "options.h"
#include "quant/dot.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

#define MAX_REPS 64

typedef struct shape {
    const char *name;
    size_t N, K;
} shape;

/* Qwen3-0.6B's linear layers: hidden 1024, 16 query heads and 8 KV heads of 128, intermediate
 * 3072. */
static const shape SHAPES[] = {
    {"q", 2048, 1024}, {"kv", 1024, 1024}, {"o", 1024, 2048}, {"gate/up", 3072, 1024},
    {"down", 1024, 3072},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

typedef struct format_case {
    const char *name;
    int quantizer;
} format_case;

static const format_case FORMATS[] = {
    {"nvfp4", PARITY_QUANT_NVFP4_MODELOPT}, {"mxfp4", PARITY_QUANT_MXFP4_OCP},
    {"ternary", PARITY_QUANT_TERNARY_BITNET}, {"fp8-block", PARITY_FP8Q_DEEPSEEK},
    {"mxfp8", PARITY_FP8Q_MX_OCP},
};
#define N_FORMATS (sizeof FORMATS / sizeof FORMATS[0])

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A value of about N(0, 1)'s size: the sum of four uniforms in [-1, 1). */
static float random_value(void) {
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)(rng() >> 40) / (float)(1 << 23) - 1.0f;
    return s;
}

/* One weight quantized under a rule, held as the model holds it, in `copies` copies. */
typedef struct held_weight {
    uint8_t *codes, *scales;
    size_t copies, code_bytes, scale_bytes;
    float tensor_scale;
} held_weight;

/* bytes (a multiple of 4096) 4096-aligned, or with thp 2 MB aligned and advised
 * MADV_HUGEPAGE before the first touch. */
static uint8_t *big_alloc(size_t bytes, int thp) {
    const size_t align = thp ? (size_t)2 << 20 : 4096;
    uint8_t *p = aligned_alloc(align, (bytes + align - 1) / align * align);
    if (p && thp) (void)madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
    return p;
}

static int held_make(held_weight *h, const quant_rule *r, size_t N, size_t K, int hot, int thp) {
    const quant_format *f = r->format;
    float *w = malloc(N * K * sizeof *w);
    uint8_t *codes = malloc(N * K);
    const size_t n_scales = (size_t)quant_scale_count(f, N, K);
    float *ws = malloc((n_scales + 1) * sizeof *ws);
    if (!w || !codes || !ws) return -1;
    for (size_t i = 0; i < N * K; i++) w[i] = random_value() * 0.02f;
    f->quantize_weight(r, N, K, w, K, codes, K, ws, &h->tensor_scale);
    const size_t row_bytes = quant_weight_row_bytes(f, K);
    h->code_bytes = (N * row_bytes + 4095) / 4096 * 4096;
    h->scale_bytes = (n_scales * f->scale_bytes + 4095) / 4096 * 4096;
    const size_t each = h->code_bytes + h->scale_bytes;
    h->copies = hot ? 1 : (((size_t)128 << 20) + each - 1) / each;
    h->codes = big_alloc(h->copies * h->code_bytes, thp);
    h->scales = big_alloc(h->copies * h->scale_bytes, thp);
    if (!h->codes || !h->scales) return -1;
    for (size_t n = 0; n < N; n++) quant_codes_pack_row(f, codes + n * K, K, h->codes + n * row_bytes);
    if (f->scale_bytes == 1)
        for (size_t i = 0; i < n_scales; i++) h->scales[i] = quant_scale_byte(f, ws[i]);
    else
        memcpy(h->scales, ws, n_scales * sizeof(float));
    for (size_t c = 1; c < h->copies; c++) {
        memcpy(h->codes + c * h->code_bytes, h->codes, h->code_bytes);
        memcpy(h->scales + c * h->scale_bytes, h->scales, h->scale_bytes);
    }
    free(w);
    free(codes);
    free(ws);
    return 0;
}

/* The process's CPU time in seconds (all its threads): with one thread, the time the calls ran
 * on a core, whatever else the machine ran meanwhile. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct call {
    quant_gemm_fn *columns;
    quant_gemm_job job;
} call;

static void call_columns(void *p, size_t c0, size_t c1, unsigned worker) {
    (void)worker;
    const call *c = p;
    c->columns(&c->job, c0, c1);
}

/* GB/s of the bytes a call reads (median and best of reps), rule r at M x shape s. */
static int run_case(threadpool *pool, const quant_rule *r, const shape *s, size_t M, int hot,
                    int thp, int reps, double *median, double *best, double *cpu_median) {
    const quant_format *f = r->format;
    held_weight h;
    if (held_make(&h, r, s->N, s->K, hot, thp)) return -1;
    const size_t nb = f->block_cols ? (s->K + f->block_cols - 1) / f->block_cols : 0;
    float *x = malloc(M * s->K * sizeof *x), *y = malloc(M * s->N * sizeof *y);
    uint8_t *xq = malloc(M * s->K);
    float *xs = malloc((M * nb + 1) * sizeof *xs), *xt = malloc(M * sizeof *xt);
    if (!x || !y || !xq || !xs || !xt) return -1;
    for (size_t i = 0; i < M * s->K; i++) x[i] = random_value();
    quant_rows_entry(f)(r, M, s->K, x, s->K, xq, s->K, xs, xt);
    const size_t read = quant_weight_row_bytes(f, s->K) * s->N +
                        (size_t)quant_scale_count(f, s->N, s->K) * f->scale_bytes;
    call c = {quant_gemm_entry(f),
              {M, s->K, nb, f->block_cols, r, xq, xs, xt, h.codes,
               quant_weight_row_bytes(f, s->K), {NULL}, nb, h.tensor_scale, y, s->N}};
    double gbs[MAX_REPS], cpu_gbs[MAX_REPS];
    size_t copy = 0;
    for (int rep = -1; rep < reps; rep++) {
        size_t calls = 0;
        const double t0 = bench_now(), c0 = cpu_now();
        double t;
        do {
            c.job.wq = h.codes + copy * h.code_bytes;
            c.job.ws_codes = h.scales + copy * h.scale_bytes;
            if (f->scale_bytes == 4) c.job.ws = (const float *)(const void *)c.job.ws_codes;
            pool_run(pool, call_columns, &c, s->N);
            copy = (copy + 1) % h.copies;
            calls++;
            t = bench_now() - t0;
        } while (t < 0.1);
        if (rep >= 0) {
            gbs[rep] = (double)read * (double)calls / t * 1e-9;
            cpu_gbs[rep] = (double)read * (double)calls / (cpu_now() - c0) * 1e-9;
        }
    }
    qsort(gbs, (size_t)reps, sizeof *gbs, bench_cmp_double);
    qsort(cpu_gbs, (size_t)reps, sizeof *cpu_gbs, bench_cmp_double);
    *median = gbs[reps / 2];
    *best = gbs[reps - 1];
    *cpu_median = cpu_gbs[reps / 2];
    free(h.codes);
    free(h.scales);
    free(x);
    free(y);
    free(xq);
    free(xs);
    free(xt);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: quant-decode-bench [--formats LIST] [--m 1,4] [--threads 1,2] "
                    "[--reps N] [--hot] [--thp] [--paths LIST]\n");
}

/* The numbers of a comma-separated list into out (at most max): their count, 0 on an error. */
static int parse_sizes(const char *s, size_t *out, int max) {
    char buf[128];
    const char *items[16];
    snprintf(buf, sizeof buf, "%s", s);
    const int n = split_list(buf, items, max < 16 ? max : 16);
    for (int i = 0; i < n; i++) {
        uint32_t v;
        if (!parse_u32(items[i], &v) || v == 0) return 0;
        out[i] = v;
    }
    return n;
}

/* Whether the comma-separated list holds name. */
static int list_has(const char *list, const char *name) {
    char buf[256];
    const char *items[16];
    snprintf(buf, sizeof buf, "%s", list);
    const int n = split_list(buf, items, 16);
    for (int i = 0; i < n; i++)
        if (!strcmp(items[i], name)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    const char *formats = "nvfp4,mxfp4,ternary,fp8-block", *paths = "";
    size_t ms[8] = {1}, threads[4] = {2};
    int n_m = 1, n_threads = 1, reps = 5, hot = 0, thp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        uint32_t u;
        if (!strcmp(a, "--hot")) {
            hot = 1;
        } else if (!strcmp(a, "--thp")) {
            thp = 1;
        } else if (!strcmp(a, "--formats") && option_value(argc, argv, &i, &v)) {
            formats = v;
        } else if (!strcmp(a, "--paths") && option_value(argc, argv, &i, &v)) {
            paths = v;
        } else if (!strcmp(a, "--m") && option_value(argc, argv, &i, &v)) {
            if (!(n_m = parse_sizes(v, ms, 8))) return usage(), 2;
        } else if (!strcmp(a, "--threads") && option_value(argc, argv, &i, &v)) {
            if (!(n_threads = parse_sizes(v, threads, 4))) return usage(), 2;
        } else if (!strcmp(a, "--reps") && option_value(argc, argv, &i, &v)) {
            if (!parse_u32(v, &u) || u < 1 || u > MAX_REPS) return usage(), 2;
            reps = (int)u;
        } else {
            return usage(), 2;
        }
    }
    char path_buf[256];
    const char *path_names[8];
    snprintf(path_buf, sizeof path_buf, "%s", paths);
    int n_paths = split_list(path_buf, path_names, 8);
    if (n_paths == 0) path_names[n_paths++] = NULL; /* the library's choice */
    for (int pi = 0; pi < n_paths; pi++) {
        if (path_names[pi]) {
            parity_cpu_path path;
            if (parity_cpu_path_from_name(path_names[pi], &path) != PARITY_OK ||
                parity_set_cpu_path(path) != PARITY_OK) {
                fprintf(stderr, "quant-decode-bench: path %s not available here\n",
                        path_names[pi]);
                continue;
            }
        }
        printf("\nCPU path %s, %s weights%s\n", parity_cpu_path_name(parity_get_cpu_path()),
               hot ? "hot (one copy)" : "cold (copies of 128 MB)", thp ? ", 2 MB pages" : "");
        printf("%-9s %-8s %5s %5s %5s %3s %10s %10s %10s %10s\n", "format", "shape", "M", "N",
               "K", "thr", "GB/s med", "GB/s best", "GB/s cpu", "GMAC/s cpu");
        for (int ti = 0; ti < n_threads; ti++) {
            threadpool *pool;
            if (pool_create((unsigned)threads[ti], &pool)) return 1;
            for (size_t fi = 0; fi < N_FORMATS; fi++) {
                if (!list_has(formats, FORMATS[fi].name)) continue;
                const quant_rule *r = quant_rule_of(FORMATS[fi].quantizer);
                for (int mi = 0; mi < n_m; mi++)
                    for (size_t si = 0; si < N_SHAPES; si++) {
                        double med, best, cpu;
                        if (run_case(pool, r, &SHAPES[si], ms[mi], hot, thp, reps, &med, &best,
                                     &cpu)) {
                            fprintf(stderr, "quant-decode-bench: out of memory\n");
                            return 1;
                        }
                        const quant_format *f = r->format;
                        const double read = (double)(quant_weight_row_bytes(f, SHAPES[si].K) *
                                                         SHAPES[si].N +
                                                     (size_t)quant_scale_count(
                                                         f, SHAPES[si].N, SHAPES[si].K) *
                                                         f->scale_bytes);
                        const double macs =
                            (double)ms[mi] * (double)SHAPES[si].N * (double)SHAPES[si].K;
                        printf("%-9s %-8s %5zu %5zu %5zu %3zu %10.1f %10.1f %10.1f %10.1f\n",
                               FORMATS[fi].name, SHAPES[si].name, ms[mi], SHAPES[si].N,
                               SHAPES[si].K, threads[ti], med, best, cpu, cpu / read * macs);
                        fflush(stdout);
                    }
            }
            pool_free(pool);
        }
    }
    return 0;
}
