/* ab-builds: two builds of libparity in one process, timed call by call in alternation.
 *
 *   ab-builds LIB_A LIB_B [--model SPEC] [--preset NAME] [--threads T] [--prompt L]
 *             [--batch B] [--context C] [--pairs N] [--layers N]
 *
 * On a shared VM the speed of one binary moves 10-30% from one run to the next, more than
 * most changes to a kernel; runs of two builds one after the other then compare phases of
 * the machine, not builds. This program loads both libraries (dlopen, each with its own
 * model, thread pool and sampler) and alternates them call by call: a prefill of L tokens
 * (the sampler taking the prompt to its first logits, as parity-speed times it), then, with
 * --batch B, decode steps of B sequences forked from a C-token prompt. It prints each
 * build's median and the median of the per-pair ratios B / A of the times, which a slow
 * phase of the machine moves much less than either median. The libraries must not share
 * a path (dlopen would return the first one twice): copy one build's libparity.so.0 aside.
 * --layers N cuts a synthetic:NAME shape to its first N layers (bench_layers.h): two models
 * of a mixture of experts' real shape do not fit in memory whole.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "bench_layers.h"
#include "options.h"
#include "parity.h"

#define MAX_PAIRS 200
#define KV_BLOCK_POSITIONS 16 /* the cache's blocks (lib/engine/kvcache.h, KV_BLOCK) */
#define MAX_BATCH 64

/* The entry points of one build. */
typedef struct build {
    const char *path;
    void *so;
    __typeof__(parity_model_open) *model_open;
    __typeof__(parity_config_builtin) *config_builtin;
    __typeof__(parity_model_synthetic) *model_synthetic;
    __typeof__(parity_model_config) *model_config;
    __typeof__(parity_policy_from_name) *policy_from_name;
    __typeof__(parity_sampler_default_params) *sampler_default_params;
    __typeof__(parity_sampler_create) *sampler_create;
    __typeof__(parity_sampling_default) *sampling_default;
    __typeof__(parity_sampler_add) *sampler_add;
    __typeof__(parity_sampler_fork) *sampler_fork;
    __typeof__(parity_sampler_step) *sampler_step;
    __typeof__(parity_sampler_release) *sampler_release;
    __typeof__(parity_last_error) *last_error;
    parity_model *model;
    parity_sampler *prefill, *decode;
    uint32_t seqs[MAX_BATCH];
} build;

static int load(build *b, const char *path) {
    b->path = path;
    b->so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!b->so) {
        fprintf(stderr, "ab-builds: %s\n", dlerror());
        return -1;
    }
#define SYM(field, name)                                                           \
    if (!(*(void **)&b->field = dlsym(b->so, name))) {                             \
        fprintf(stderr, "ab-builds: %s has no %s\n", path, name);                   \
        return -1;                                                                 \
    }
    SYM(model_open, "parity_model_open")
    SYM(config_builtin, "parity_config_builtin")
    SYM(model_synthetic, "parity_model_synthetic")
    SYM(model_config, "parity_model_config")
    SYM(policy_from_name, "parity_policy_from_name")
    SYM(sampler_default_params, "parity_sampler_default_params")
    SYM(sampler_create, "parity_sampler_create")
    SYM(sampling_default, "parity_sampling_default")
    SYM(sampler_add, "parity_sampler_add")
    SYM(sampler_fork, "parity_sampler_fork")
    SYM(sampler_step, "parity_sampler_step")
    SYM(sampler_release, "parity_sampler_release")
    SYM(last_error, "parity_last_error")
#undef SYM
    return 0;
}

static int fail(const build *b, const char *what) {
    fprintf(stderr, "ab-builds: %s: %s: %s\n", b->path, what, b->last_error());
    return -1;
}

static uint32_t n_threads = 2;

/* A sampler of `seqs` sequences of up to `len` positions sharing `cache` KV positions (0:
 * room for all of them sharing nothing). */
static int make_sampler(build *b, const char *preset, uint32_t seqs, uint32_t len, uint32_t cache,
                        parity_sampler **s) {
    parity_sampler_params p;
    b->sampler_default_params(&p);
    p.n_threads = n_threads;
    if (b->policy_from_name(preset, &p.policy)) return fail(b, preset);
    p.max_seqs = seqs;
    p.max_len = len;
    p.cache_tokens = cache;
    p.max_batch = seqs;
    p.prefault = 1;
    return b->sampler_create(b->model, &p, s) ? fail(b, "sampler") : 0;
}

/* Seconds for a prefill of the L tokens: add, first step, release (the last untimed). */
static double prefill_time(build *b, const int32_t *tokens, uint32_t L) {
    parity_sampling g;
    b->sampling_default(&g);
    g.temperature = 0;
    uint32_t q, fin;
    int32_t tok;
    float lp;
    const double t0 = bench_now();
    int rc = b->sampler_add(b->prefill, tokens, L, &g, 0, &q);
    if (!rc) rc = b->sampler_step(b->prefill, &q, 1, &tok, &lp, &fin, 0, NULL, NULL);
    const double dt = bench_now() - t0;
    if (!rc) rc = b->sampler_release(b->prefill, q);
    return rc ? fail(b, "prefill") : dt;
}

/* Seconds per step over `steps` decode steps of the batch. */
static double decode_time(build *b, uint32_t batch, uint32_t steps) {
    int32_t tok[MAX_BATCH];
    float lp[MAX_BATCH];
    uint32_t fin[MAX_BATCH];
    int rc = 0;
    const double t0 = bench_now();
    for (uint32_t i = 0; i < steps && !rc; i++)
        rc = b->sampler_step(b->decode, b->seqs, batch, tok, lp, fin, 0, NULL, NULL);
    const double dt = (bench_now() - t0) / steps;
    return rc ? fail(b, "decode") : dt;
}

static int open_decode(build *b, const char *preset, uint32_t batch, uint32_t context,
                       uint32_t steps) {
    /* the forks share the prompt's blocks: the cache holds the prompt and each sequence's own
     * blocks (its copy of the prompt's last, partial block and the steps after it), not
     * batch + 1 whole sequences (at --context 4096 --batch 32 two builds' caches of 15 GB
     * each had the process killed) */
    const uint32_t own = steps + 2 + 2 * KV_BLOCK_POSITIONS;
    if (make_sampler(b, preset, batch + 1, context + steps + 2,
                     context + KV_BLOCK_POSITIONS + (batch + 1) * own,
                     &b->decode))
        return -1;
    int32_t *prompt = malloc(context * sizeof *prompt);
    if (!prompt) return fail(b, "out of memory");
    bench_prompt(prompt, context, b->model_config(b->model)->vocab_size);
    parity_sampling g;
    b->sampling_default(&g);
    g.temperature = 0;
    uint32_t parent;
    int rc = b->sampler_add(b->decode, prompt, context, &g, 0, &parent);
    for (uint32_t i = 0; i < batch && !rc; i++) rc = b->sampler_fork(b->decode, parent, &g, i, &b->seqs[i]);
    free(prompt);
    if (rc) return fail(b, "decode");
    return decode_time(b, batch, 1) < 0 ? -1 : 0;  /* the first step copies the shared block */
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[MAX_PAIRS];
    memcpy(s, v, (size_t)n * sizeof *v);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* Prints the medians of A's and B's times (as `unit` per second) and of the ratios. */
static void report(const char *what, const double *ta, const double *tb, int n, double units,
                   const char *unit) {
    double ratio[MAX_PAIRS];
    int b_faster = 0;
    for (int i = 0; i < n; i++) {
        ratio[i] = tb[i] / ta[i];
        b_faster += tb[i] < ta[i];
    }
    printf("%-28s A %8.1f %s  B %8.1f %s  time B/A median %.3f (%d of %d pairs B faster)\n", what,
           units / median(ta, n), unit, units / median(tb, n), unit, median(ratio, n), b_faster, n);
}

int main(int argc, char **argv) {
    const char *spec = "synthetic:qwen3-0.6b", *preset = "aligned";
    uint32_t L = 512, batch = 0, context = 128, layers = 0;
    int pairs = 8;
    if (argc < 3) {
        fprintf(stderr, "usage: ab-builds LIB_A LIB_B [--model SPEC] [--preset NAME] [--threads T] "
                        "[--prompt L] [--batch B] [--context C] [--pairs N] [--layers N]\n");
        return 2;
    }
    /* options in pairs after the two builds; a last option without a value is ignored */
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!option_value(argc, argv, &i, &v)) break;
        if (!strcmp(a, "--model")) spec = v;
        else if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--threads")) n_threads = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--prompt")) L = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--batch")) batch = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--context")) context = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--pairs")) pairs = atoi(v);
        else if (!strcmp(a, "--layers")) {
            if (bench_layers_option("ab-builds", v, &layers)) return 2;
        }
        else {
            fprintf(stderr, "ab-builds: unknown option %s\n", a);
            return 2;
        }
    }
    if (pairs < 1 || pairs > MAX_PAIRS || batch > MAX_BATCH || L == 0 || context == 0) {
        fprintf(stderr, "ab-builds: --pairs 1..%d, --batch 0..%d, --prompt and --context >= 1\n",
                MAX_PAIRS, MAX_BATCH);
        return 2;
    }
    build b[2];
    memset(b, 0, sizeof b);
    for (int v = 0; v < 2; v++) {
        if (load(&b[v], argv[1 + v])) return 1;
        if (layers) {
            parity_config c;
            uint64_t seed;
            uint32_t whole;
            if (bench_cut_shape("ab-builds", spec, layers, b[v].config_builtin, &c, &seed, &whole))
                return 1;
            if (b[v].model_synthetic(&c, seed, &b[v].model)) return fail(&b[v], spec), 1;
        } else if (b[v].model_open(spec, &b[v].model)) {
            return fail(&b[v], spec), 1;
        }
        if (make_sampler(&b[v], preset, 1, L + 1, 0, &b[v].prefill)) return 1;
        if (batch && open_decode(&b[v], preset, batch, context, 4 * (uint32_t)pairs + 8)) return 1;
    }
    int32_t *tokens = malloc(L * sizeof *tokens);
    if (!tokens) return 1;
    bench_prompt(tokens, L, b[0].model_config(b[0].model)->vocab_size);
    printf("ab-builds: A %s, B %s; %s", argv[1], argv[2], spec);
    if (layers) printf(" cut to %u layers (--layers)", layers);
    printf(", preset %s, %u thread(s); %d pairs, alternating call by call\n", preset, n_threads,
           pairs);
    double t[2][MAX_PAIRS];
    for (int v = 0; v < 2; v++)
        if (prefill_time(&b[v], tokens, L) < 0) return 1;  /* untimed: first touches */
    for (int i = 0; i < pairs; i++)
        for (int v = 0; v < 2; v++) {
            /* A first in even pairs, B first in odd ones: neither always follows the other */
            const int w = i % 2 ? 1 - v : v;
            if ((t[w][i] = prefill_time(&b[w], tokens, L)) < 0) return 1;
        }
    char what[64];
    snprintf(what, sizeof what, "prefill %u", L);
    report(what, t[0], t[1], pairs, L, "tok/s");
    if (batch) {
        for (int i = 0; i < pairs; i++)
            for (int v = 0; v < 2; v++) {
                const int w = i % 2 ? 1 - v : v;
                if ((t[w][i] = decode_time(&b[w], batch, 4)) < 0) return 1;
            }
        snprintf(what, sizeof what, "decode batch %u context %u", batch, context);
        report(what, t[0], t[1], pairs, batch, "tok/s");
    }
    free(tokens);
    return 0;
}
