/* What a scorer or a sampler takes, told before it is made: parity_scorer_bytes and
 * parity_sampler_bytes equal, byte for byte, what creation allocates through the library's
 * allocation funnel, for defaults and for every setting that sizes something; max_memory at
 * that figure passes and one byte less fails before anything is allocated. And the cache a
 * set of forked groups needs (parity_sampler_cache_tokens) is enough however the sequences
 * are stepped, and, where no block is shared partly filled, not a block more than needed.
 * A sampler made with prefault is resident once it is made; a lazy one is not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "base/alloc.h"

static uint64_t xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* For an object kind (scorer, sampler): the told bytes equal the allocated bytes, and
 * max_memory at the figure passes while one byte less fails before any allocation. The two
 * kinds differ only in their types and function names. */
#define DEFINE_CHECK_BYTES(kind)                                                              \
    static void check_##kind(const parity_model *m, const char *what,                         \
                             const parity_##kind##_params *p) {                               \
        uint64_t told = 0;                                                                    \
        CHECK_OK(parity_##kind##_bytes(m, p, &told));                                         \
        parity_##kind *s = NULL;                                                              \
        px_alloc_test_reset(0);                                                               \
        CHECK_OK(parity_##kind##_create(m, p, &s));                                           \
        const uint64_t taken = px_alloc_test_bytes();                                         \
        parity_##kind##_free(s);                                                              \
        printf("memory: %-7s %-36s told %10llu bytes, allocated %10llu\n", #kind, what,       \
               (unsigned long long)told, (unsigned long long)taken);                          \
        CHECK(told == taken);                                                                 \
        parity_##kind##_params q = *p;                                                        \
        q.max_memory = told;                                                                  \
        CHECK_OK(parity_##kind##_create(m, &q, &s));                                          \
        parity_##kind##_free(s);                                                              \
        q.max_memory = told - 1;                                                              \
        s = NULL;                                                                             \
        px_alloc_test_reset(0);                                                               \
        CHECK_STATUS(parity_##kind##_create(m, &q, &s), PARITY_ERR_MEMORY_LIMIT);             \
        CHECK_INT(px_alloc_test_count(), 0);                                                  \
        CHECK(s == NULL);                                                                     \
    }
DEFINE_CHECK_BYTES(scorer)
DEFINE_CHECK_BYTES(sampler)

static void test_bytes(const parity_model *m) {
    /* the fp32 copies of the weights belong to the model: built once here, before measuring */
    const int openblas = parity_backend_check(PARITY_BACKEND_OPENBLAS) == PARITY_OK;
    parity_scorer_params warm;
    parity_scorer_default_params(&warm);
    warm.backend = PARITY_BACKEND_OPENBLAS;
    if (!openblas) { /* a build without OpenBLAS: the fp32 policy builds the same fp32 copies */
        CHECK_OK(parity_policy_from_name("fp32", &warm.policy));
        warm.backend = PARITY_BACKEND_BF16;
    }
    parity_scorer *w = NULL;
    CHECK_OK(parity_scorer_create(m, &warm, &w));
    parity_scorer_free(w);

    parity_scorer_params sp;
    parity_scorer_default_params(&sp);
    check_scorer(m, "defaults", &sp);
    sp.n_threads = 2;
    check_scorer(m, "2 threads", &sp);
    sp.chunk_rows = 7;
    sp.max_tokens = 100;
    check_scorer(m, "2 threads, chunk 7, max_tokens 100", &sp);
    parity_scorer_default_params(&sp);
    CHECK_OK(parity_policy_from_name("fp32", &sp.policy));
    check_scorer(m, "fp32 policy", &sp);
    parity_scorer_default_params(&sp);
    sp.backend = PARITY_BACKEND_OPENBLAS;
    sp.n_threads = 3;
    if (openblas) check_scorer(m, "openblas, 3 threads", &sp);

    parity_sampler_params pp;
    parity_sampler_default_params(&pp);
    pp.max_len = 256;
    check_sampler(m, "max_len 256", &pp);
    pp.n_threads = 2;
    pp.max_seqs = 5;
    pp.cache_tokens = 200;
    check_sampler(m, "2 threads, 5 seqs, cache_tokens 200", &pp);
    pp.split_k = 4;
    pp.prefill_chunk = 3;
    pp.max_batch = 9;
    check_sampler(m, "split_k 4, prefill 3, batch 9", &pp);
    parity_sampler_default_params(&pp);
    pp.max_len = 100;
    CHECK_OK(parity_policy_from_name("fp32", &pp.policy));
    check_sampler(m, "fp32 policy, max_len 100", &pp);

    /* bad params: the status creation would give, and the output untouched */
    uint64_t untouched = 77;
    sp.size = 3;
    CHECK_STATUS(parity_scorer_bytes(m, &sp, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    pp.max_len = 1u << 30;
    CHECK_STATUS(parity_sampler_bytes(m, &pp, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_sampler_bytes(NULL, &pp, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_sampler_bytes(m, &pp, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_INT(untouched, 77);
}

/* ---- the cache forked groups need ------------------------------------------------------ */

typedef struct groups {
    size_t n;
    uint32_t prompt_len[4], completions[4];
    uint32_t max_new;
} groups;

/* Adds every group's prompt, forks it, and steps all sequences to max_new tokens (all live
 * ones each step, or random subsets when schedule != 0). Returns the first failing status. */
static int run_groups(const parity_model *m, const groups *g, uint64_t cache_tokens,
                      uint64_t schedule) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 32;
    p.max_len = 128;
    p.cache_tokens = (uint32_t)cache_tokens;
    parity_sampler *s = NULL;
    int rc = parity_sampler_create(m, &p, &s);
    if (rc) return rc;
    parity_sampling sg;
    parity_sampling_default(&sg);
    sg.max_new_tokens = g->max_new;
    uint32_t seqs[32];
    size_t n = 0;
    for (size_t i = 0; i < g->n && !rc; i++) {
        int32_t prompt[128];
        for (uint32_t t = 0; t < g->prompt_len[i]; t++) prompt[t] = (int32_t)((t * 7 + i) % 256);
        rc = parity_sampler_add(s, prompt, g->prompt_len[i], &sg, n, &seqs[n]);
        const uint32_t parent = seqs[n++];
        for (uint32_t c = 1; c < g->completions[i] && !rc; c++, n++)
            rc = parity_sampler_fork(s, parent, &sg, n, &seqs[n]);
    }
    uint32_t finished[32] = {0};
    uint64_t r = schedule;
    while (!rc) {
        uint32_t live[32];
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (!finished[i] && (!schedule || xorshift(&r) % 2)) live[k++] = seqs[i];
        if (k == 0) {
            int any = 0;
            for (size_t i = 0; i < n; i++) any |= !finished[i];
            if (!any) break;
            continue;
        }
        int32_t tok[32];
        float lp[32];
        uint32_t fin[32];
        rc = parity_sampler_step(s, live, k, tok, lp, fin, 0, NULL, NULL);
        for (size_t j = 0; j < k && !rc; j++)
            for (size_t i = 0; i < n; i++)
                if (seqs[i] == live[j]) finished[i] = fin[j];
    }
    parity_sampler_free(s);
    return rc;
}

static void test_cache_tokens(const parity_model *m) {
    CHECK_INT(parity_kv_block_tokens(), 16);
    static const groups cases[] = {
        {1, {1}, {1}, 5},                 /* nothing prefilled */
        {1, {17}, {4}, 40},               /* prompt ends on a block boundary: nothing shared partly */
        {2, {9, 33}, {1, 1}, 20},         /* no forks */
        {1, {12}, {4}, 3},                /* forks share a partly filled block, and stay in it */
        {3, {12, 40, 5}, {4, 2, 3}, 30},  /* forks of partly filled blocks, growing past them */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const groups *g = &cases[i];
        uint64_t need = 0;
        CHECK_OK(parity_sampler_cache_tokens(g->n, g->prompt_len, g->completions, g->max_new, &need));
        CHECK(need % 16 == 0);
        CHECK_OK(run_groups(m, g, need, 0));
        CHECK_OK(run_groups(m, g, need, 0x5eed + i));
        int shares_partly = 0;
        for (size_t k = 0; k < g->n; k++)
            shares_partly |= g->completions[k] > 1 && (g->prompt_len[k] - 1) % 16 != 0;
        if (!shares_partly && need > 16)
            CHECK_STATUS(run_groups(m, g, need - 16, 0), PARITY_ERR_CACHE_FULL);
        printf("memory: cache for case %zu: %llu positions\n", i, (unsigned long long)need);
    }
    /* completions NULL: one sequence per prompt */
    uint32_t lens[2] = {9, 33};
    uint64_t a = 0, b = 0;
    CHECK_OK(parity_sampler_cache_tokens(2, lens, NULL, 20, &a));
    CHECK_OK(parity_sampler_cache_tokens(2, lens, cases[2].completions, 20, &b));
    CHECK(a == b);
    uint64_t untouched = 5;
    CHECK_STATUS(parity_sampler_cache_tokens(2, lens, NULL, 0, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    uint32_t empty[1] = {0};
    CHECK_STATUS(parity_sampler_cache_tokens(1, empty, NULL, 4, &untouched), PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_sampler_cache_tokens(1, NULL, NULL, 4, &untouched), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_INT(untouched, 5);
}

/* The process's resident bytes (/proc/self/statm), -1 where that file is not there. */
static long resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, pages = 0;
    if (!f) return -1;
    const int got = fscanf(f, "%ld %ld", &size, &pages);
    fclose(f);
    return got == 2 ? pages * sysconf(_SC_PAGESIZE) : -1;
}

/* prefault: creation grows the process by nearly all of parity_sampler_bytes, a lazy
 * creation by under half of it. The cache is 64 MB a plane, above glibc's largest mmap
 * threshold, so that its pages are fresh ones, not a heap's already touched; meson sets
 * MALLOC_PERTURB_ to 0 for this test (a perturbing allocator writes every page it hands out). */
static void test_prefault(const parity_model *m) {
    const char *perturb = getenv("MALLOC_PERTURB_");
    if (resident_bytes() < 0 || (perturb && strcmp(perturb, "0") != 0)) {
        printf("prefault: resident bytes not checked (%s)\n",
               resident_bytes() < 0 ? "no /proc/self/statm" : "MALLOC_PERTURB_ is set");
        return;
    }
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 4;
    p.max_len = 64;
    p.cache_tokens = 1u << 19; /* tiny: 2 layers x 32 cells x 2 bytes a position and plane */
    for (uint32_t pf = 0; pf < 2; pf++) {
        p.prefault = pf;
        uint64_t bytes = 0;
        CHECK_OK(parity_sampler_bytes(m, &p, &bytes));
        parity_sampler *s = NULL;
        const long before = resident_bytes();
        CHECK_OK(parity_sampler_create(m, &p, &s));
        const long grown = resident_bytes() - before;
        if (pf)
            CHECK(grown >= (long)(bytes / 10 * 9));
        else
            CHECK(grown < (long)(bytes / 2));
        parity_sampler_free(s);
    }
}

int main(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:3", &m));
    if (!m) return check_report("memory");
    test_bytes(m);
    test_cache_tokens(m);
    test_prefault(m);
    parity_model_free(m);
    return check_report("memory");
}
