/* The parity contract, sampler side. Under every preset, for random prompts and sampling
 * settings, generation is run under many configurations — batch sizes 1..32, members joining
 * and leaving between steps in random subsets and orders, prefill chunks of 1..256 rows,
 * completions forked from one prefilled prompt or each prefilled afresh, 1 or 2 threads,
 * every CPU path — and:
 *   - the tokens drawn are identical across all of them;
 *   - the log-probs reported are bitwise identical across all of them;
 *   - they equal bitwise what the scorer returns for prompt + completion with the same mode
 *     and sampling parameters.
 * (Every CPU path: every policy on the tiny model, two presets on the trained one; see
 * every_path_model.)
 * Also: cache-full, unknown sequences, finished sequences and bad sampling parameters give a
 * status and change nothing; prefault commits the sampler's memory at creation and moves no
 * bit. */
#include <math.h>

#include "fixtures.h"

#define N_SEQS 32
#define MAX_NEW 16
#define MAX_PROMPT 40

typedef struct gen_case {
    int32_t prompt[MAX_PROMPT];
    uint32_t prompt_len;              /* all sequences share the prompt (a GRPO group) */
    parity_sampling sampling[N_SEQS];
} gen_case;

typedef struct gen_result {
    COMPLETION_MEMBERS(N_SEQS, MAX_NEW);
} gen_result;

typedef struct run_config {
    uint32_t threads, prefill_chunk, max_batch;
    int fork;                 /* fork the completions from one prefilled prompt */
    uint64_t schedule;        /* 0: step every live sequence each round; else a seed for random
                                 subsets in random order */
    const char *name;
    uint32_t split_k, split_kv; /* kernel-order experiments (off: 0) */
} run_config;

static void make_case(gen_case *c, uint32_t vocab, uint64_t seed) {
    uint64_t r = seed * 0x9e3779b97f4a7c15ull + 1;
    c->prompt_len = 1 + (uint32_t)(xorshift64(&r) % MAX_PROMPT);
    for (uint32_t t = 0; t < c->prompt_len; t++) c->prompt[t] = (int32_t)(xorshift64(&r) % vocab);
    static const float temps[] = {0.0f, 0.6f, 1.0f, 1.3f};
    static const uint32_t topks[] = {0, 0, 5, 40};
    static const float topps[] = {1.0f, 1.0f, 0.9f, 0.5f};
    static const float minps[] = {0.0f, 0.0f, 0.0f, 0.05f};
    for (int i = 0; i < N_SEQS; i++) {
        parity_sampling *s = &c->sampling[i];
        parity_sampling_default(s);
        s->temperature = temps[xorshift64(&r) % 4];
        s->top_k = topks[xorshift64(&r) % 4];
        s->top_p = topps[xorshift64(&r) % 4];
        s->min_p = minps[xorshift64(&r) % 4];
        s->seed = seed;
        s->max_new_tokens = 4 + (uint32_t)(xorshift64(&r) % (MAX_NEW - 4));
        s->logprob_mode = (uint32_t)(xorshift64(&r) % 3);
        if (xorshift64(&r) % 2) {
            s->n_stop = 2;
            s->stop[0] = (int32_t)(xorshift64(&r) % vocab);
            s->stop[1] = (int32_t)(xorshift64(&r) % vocab);
        }
    }
}

static int run(const parity_model *m, const char *policy, uint32_t backend, const gen_case *c,
               const run_config *rc, gen_result *out) {
    parity_sampler_params p = sampler_params((fixture){
        .policy = policy, .backend = backend, .n_threads = rc->threads,
        .prefill_chunk = rc->prefill_chunk, .max_batch = rc->max_batch,
        .max_seqs = N_SEQS + 1, .max_len = MAX_PROMPT + MAX_NEW});
    p.split_k = rc->split_k;
    p.split_kv = rc->split_kv;
    uint32_t ids[N_SEQS];
    parity_sampler *s = sampler_generate(
        m, &p, (generation){c->prompt, c->prompt_len, c->sampling, rc->fork, 1 /* shuffled */, 10 * MAX_NEW,
                            rc->schedule}, ids, COMPLETIONS_OF(out));
    if (!s) return 0;
    /* the sampler's own record of the tokens agrees */
    for (int i = 0; i < N_SEQS; i++) {
        const int32_t *toks;
        uint32_t len, plen;
        CHECK_OK(parity_sampler_tokens(s, ids[i], &toks, &len, &plen));
        CHECK_INT(len, plen + out->n[i]);
        CHECK(!memcmp(toks + plen, out->tokens[i], out->n[i] * sizeof *toks));
    }
    parity_sampler_free(s);
    return 1;
}

static void compare(gen_result *a, gen_result *b, const char *what) {
    check_same_completions(COMPLETIONS_OF(a), COMPLETIONS_OF(b), what);
}

/* The scorer on prompt + completion, with each sequence's mode and sampling parameters. */
static void check_against_scorer(const parity_model *m, const char *policy, uint32_t backend,
                                 const gen_case *c, const gen_result *g) {
    parity_scorer *s = new_scorer(m, (fixture){.policy = policy, .backend = backend});
    if (!s) return;
    for (int i = 0; i < N_SEQS; i++) {
        int32_t seq[MAX_PROMPT + MAX_NEW];
        uint32_t len = prompt_then(seq, c->prompt, c->prompt_len, g->tokens[i], g->n[i]);
        const parity_sampling *sp = &c->sampling[i];
        const parity_score_options o = score_options_of(sp);
        float lp[MAX_PROMPT + MAX_NEW];
        CHECK_OK(parity_score(s, &o, seq, &len, 1, lp, NULL, NULL, NULL));
        char what[160];
        snprintf(what, sizeof what, "%s/%s: scorer vs sampler, sequence %d (mode %u, T %g, k %u, p %g, min_p %g)",
                 policy, parity_backend_name((int)backend), i, sp->logprob_mode, (double)sp->temperature,
                 sp->top_k, (double)sp->top_p, (double)sp->min_p);
        CHECK_BITS_F32(lp + c->prompt_len - 1, g->logprobs[i], g->n[i], what);
    }
    parity_scorer_free(s);
}

/* The model every policy runs on every CPU path with (configs[1]: batches, forks, chunks and
 * threads on each path). The other model does so for two presets only: test_golden pins the
 * sampler's bits on every path for every preset on both models, and the portable path, the
 * scalar specification, is a hundred times slower than the SIMD ones. In quick mode (the
 * sanitizer tiers) only this model sweeps the paths: its shapes (K = 64 and 160, a partial
 * chunk) reach more of the kernels' edges than the trained model's. */
static const parity_model *every_path_model;

static int sweeps_paths(const parity_model *m, const char *policy, uint32_t backend) {
    return m == every_path_model ||
           (!quick() && backend == PARITY_BACKEND_BF16 &&
            (!strcmp(policy, "hf-eager") || !strcmp(policy, "vllm")));
}

static void check_policy(const parity_model *m, const char *policy, uint32_t backend, uint64_t seed) {
    if (!backend_runs(backend)) return; /* amx: AMX CPUs only; openblas: builds with OpenBLAS */
    gen_case c;
    make_case(&c, parity_model_config(m)->vocab_size, seed);
    static const run_config configs[] = {
        {1, 256, 32, 0, 0, "fresh prefill, one batch, 1 thread", 0, 0},
        {2, 5, 3, 1, 0, "forked, batches of 3, chunks of 5, 2 threads", 0, 0},
        {1, 1, 1, 1, 77, "forked, batch 1, chunks of 1, random subsets", 0, 0},
        {2, 7, 32, 0, 1234, "fresh prefill, random subsets and order, 2 threads", 0, 0},
    };
    gen_result ref, got;
    if (!run(m, policy, backend, &c, &configs[0], &ref)) return;
    char what[200];
    for (size_t k = 1; k < sizeof configs / sizeof configs[0]; k++) {
        if (!run(m, policy, backend, &c, &configs[k], &got)) continue;
        snprintf(what, sizeof what, "%s/%s: %s", policy, parity_backend_name((int)backend), configs[k].name);
        compare(&ref, &got, what);
    }
    parity_cpu_path saved = parity_get_cpu_path();
    const int paths = sweeps_paths(m, policy, backend);
    for (int path = PARITY_CPU_PORTABLE; paths && path <= PARITY_CPU_AVX512BF16; path++) {
        if (parity_set_cpu_path((parity_cpu_path)path) != PARITY_OK) continue;
        if (!run(m, policy, backend, &c, &configs[1], &got)) continue;
        snprintf(what, sizeof what, "%s/%s: cpu path %s", policy, parity_backend_name((int)backend),
                 parity_cpu_path_name((parity_cpu_path)path));
        compare(&ref, &got, what);
    }
    parity_set_cpu_path(saved);
    check_against_scorer(m, policy, backend, &c, &ref);
}

/* The kernel-order experiments: still independent of batching (every row is computed on its
 * own), but no longer equal to the scorer, which keeps the contract's orders. */
static void check_kernel_order(const parity_model *m) {
    gen_case c;
    make_case(&c, parity_model_config(m)->vocab_size, 4242);
    for (int i = 0; i < N_SEQS; i++) c.sampling[i].logprob_mode = PARITY_LOGPROB_RAW;
    const run_config a = {1, 256, 32, 0, 0, "split_k=4, split_kv=8, one batch", 4, 8};
    const run_config b = {2, 3, 5, 1, 99, "split_k=4, split_kv=8, forked, random subsets", 4, 8};
    gen_result ra, rb;
    if (!run(m, "vllm", PARITY_BACKEND_BF16, &c, &a, &ra)) return;
    if (!run(m, "vllm", PARITY_BACKEND_BF16, &c, &b, &rb)) return;
    compare(&ra, &rb, "vllm: split-K / split-KV sampler under two batchings");

    parity_scorer *s = new_scorer(m, (fixture){.policy = "vllm"});
    if (!s) return;
    size_t differ = 0, total = 0;
    for (int i = 0; i < N_SEQS; i++) {
        int32_t seq[MAX_PROMPT + MAX_NEW];
        memcpy(seq, c.prompt, c.prompt_len * sizeof *seq);
        memcpy(seq + c.prompt_len, ra.tokens[i], ra.n[i] * sizeof *seq);
        uint32_t len = c.prompt_len + ra.n[i];
        float lp[MAX_PROMPT + MAX_NEW];
        score_raw(s, seq, &len, 1, lp);
        for (uint32_t t = 0; t < ra.n[i]; t++) {
            differ += memcmp(&lp[c.prompt_len - 1 + t], &ra.logprobs[i][t], sizeof(float)) != 0;
            total++;
        }
    }
    printf("split_k=4, split_kv=8 sampler vs scorer (vllm): %zu of %zu log-probs differ\n", differ, total);
    CHECK(differ > 0);
    parity_scorer_free(s);
}

/* Bad input and a full cache: a status, and nothing changed. */
/* prefault: beyond 1 rejected; a prefaulted sampler draws the same tokens with the same
 * log-probs as a lazy one, bit for bit, its sequences crossing into new cache blocks
 * (test_memory checks that its memory is resident once it is created). */
static void check_prefault(const parity_model *m) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 4;
    p.max_len = 64;
    p.prefault = 2;
    parity_sampler *s[2] = {NULL, NULL};
    CHECK_STATUS(parity_sampler_create(m, &p, &s[0]), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(s[0] == NULL);
    for (uint32_t pf = 0; pf < 2; pf++) {
        p.prefault = pf;
        CHECK_OK(parity_sampler_create(m, &p, &s[pf]));
    }
    if (!s[0] || !s[1]) goto done;
    int32_t prompt[20], tok[2][4 * 40];
    float lp[2][4 * 40];
    for (int i = 0; i < 20; i++) prompt[i] = (i * 37 + 5) % 256;
    parity_sampling sp;
    parity_sampling_default(&sp);
    for (int pf = 0; pf < 2; pf++) {
        uint32_t seqs[4], fin[4];
        for (uint32_t q = 0; q < 4; q++) CHECK_OK(parity_sampler_add(s[pf], prompt, 20, &sp, q, &seqs[q]));
        /* 40 steps: the sequences cross into new cache blocks at 32 and 48 */
        for (int t = 0; t < 40; t++)
            CHECK_OK(parity_sampler_step(s[pf], seqs, 4, tok[pf] + 4 * t, lp[pf] + 4 * t, fin, 0, NULL, NULL));
    }
    CHECK(memcmp(tok[0], tok[1], sizeof tok[0]) == 0);
    CHECK_BITS_F32(lp[0], lp[1], 4 * 40, "prefaulted sampler's log-probs");
done:
    parity_sampler_free(s[0]);
    parity_sampler_free(s[1]);
}

static void check_errors(const parity_model *m) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 3;
    p.max_len = 40;
    p.cache_tokens = 48; /* three blocks of 16 */
    parity_sampler *s = NULL;
    CHECK_OK(parity_sampler_create(m, &p, &s));
    if (!s) return;
    parity_sampling sp;
    parity_sampling_default(&sp);
    int32_t prompt[40] = {0};
    uint32_t a = 99, b = 99, c = 99;

    parity_sampling bad = sp;
    bad.top_p = 0;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    bad = sp;
    bad.top_p = 1.5f;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    bad = sp;
    bad.temperature = -1;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    bad = sp;
    bad.min_p = 1;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    bad = sp;
    bad.top_k = parity_model_config(m)->vocab_size + 1;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    bad = sp;
    bad.n_stop = 1;
    bad.stop[0] = -3;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_TOKEN_RANGE);
    bad = sp;
    bad.size = 8;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &bad, 0, &a), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_sampler_add(s, prompt, 0, &sp, 0, &a), PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_sampler_add(s, prompt, 41, &sp, 0, &a), PARITY_ERR_TOO_LONG);
    prompt[2] = 1 << 20;
    CHECK_STATUS(parity_sampler_add(s, prompt, 4, &sp, 0, &a), PARITY_ERR_TOKEN_RANGE);
    prompt[2] = 0;
    CHECK_INT(a, 99);

    /* a 33-token prompt takes 2 blocks (positions 0..31), its first step a third */
    CHECK_OK(parity_sampler_add(s, prompt, 33, &sp, 0, &a));
    CHECK_STATUS(parity_sampler_add(s, prompt, 33, &sp, 1, &b), PARITY_ERR_CACHE_FULL);
    CHECK_OK(parity_sampler_fork(s, a, &sp, 1, &b));
    CHECK_STATUS(parity_sampler_fork(s, 77, &sp, 2, &c), PARITY_ERR_UNKNOWN_SEQUENCE);
    int32_t tok[3];
    float lp[3];
    uint32_t fin[3], both[2] = {a, b};
    /* both need a block for position 32: only one is free */
    CHECK_STATUS(parity_sampler_step(s, both, 2, tok, lp, fin, 0, NULL, NULL), PARITY_ERR_CACHE_FULL);
    const int32_t *toks;
    uint32_t len;
    CHECK_OK(parity_sampler_tokens(s, a, &toks, &len, NULL));
    CHECK_INT(len, 33);
    CHECK_OK(parity_sampler_step(s, &a, 1, tok, lp, fin, 0, NULL, NULL));
    CHECK_STATUS(parity_sampler_step(s, &b, 1, tok, lp, fin, 0, NULL, NULL), PARITY_ERR_CACHE_FULL);
    uint32_t twice[2] = {a, a};
    CHECK_STATUS(parity_sampler_step(s, twice, 2, tok, lp, fin, 0, NULL, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_sampler_step(s, &a, 0, tok, lp, fin, 0, NULL, NULL), PARITY_ERR_EMPTY_INPUT);
    CHECK_OK(parity_sampler_release(s, b));
    CHECK_STATUS(parity_sampler_release(s, b), PARITY_ERR_UNKNOWN_SEQUENCE);
    CHECK_STATUS(parity_sampler_tokens(s, b, &toks, &len, NULL), PARITY_ERR_UNKNOWN_SEQUENCE);
    CHECK_OK(parity_sampler_release(s, a)); /* the last holder: its three blocks are free again */

    /* max_new_tokens, then a step on the finished sequence */
    parity_sampling one = sp;
    one.max_new_tokens = 1;
    CHECK_OK(parity_sampler_add(s, prompt, 3, &one, 5, &c));
    CHECK_OK(parity_sampler_step(s, &c, 1, tok, lp, fin, 0, NULL, NULL));
    CHECK_INT(fin[0], PARITY_FINISHED_LENGTH);
    CHECK_STATUS(parity_sampler_step(s, &c, 1, tok, lp, fin, 0, NULL, NULL), PARITY_ERR_SEQUENCE_FINISHED);
    parity_sampler_free(s);
    parity_sampler_free(NULL);

    /* bad params */
    parity_sampler_default_params(&p);
    p.max_len = parity_model_config(m)->max_position_embeddings + 1;
    CHECK_STATUS(parity_sampler_create(m, &p, &s), PARITY_ERR_INVALID_ARGUMENT);
    parity_sampler_default_params(&p);
    p.size = 1;
    CHECK_STATUS(parity_sampler_create(m, &p, &s), PARITY_ERR_INVALID_ARGUMENT);
}

/* top-n alternatives and stop tokens behave */
static void check_top_n_and_stop(const parity_model *m) {
    parity_sampler *s = new_sampler(m, (fixture){.max_seqs = 2, .max_len = 64});
    if (!s) return;
    parity_sampling sp;
    parity_sampling_default(&sp);
    sp.temperature = 0; /* greedy */
    sp.top_n = 4;
    int32_t prompt[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t q;
    CHECK_OK(parity_sampler_add(s, prompt, 8, &sp, 0, &q));
    int32_t tok, ids[4];
    float lp, tlp[4];
    uint32_t fin;
    CHECK_OK(parity_sampler_step(s, &q, 1, &tok, &lp, &fin, 4, ids, tlp));
    CHECK_INT(ids[0], tok); /* greedy draws the most likely token */
    CHECK_BITS_F32(&tlp[0], &lp, 1, "greedy: top-1 log-prob is the drawn token's");
    CHECK(tlp[1] <= tlp[0] && tlp[2] <= tlp[1] && tlp[3] <= tlp[2]);
    /* a stop token ends the sequence: greedy will draw `tok` again from the same context */
    parity_sampling st = sp;
    st.n_stop = 1;
    st.stop[0] = tok;
    uint32_t r;
    CHECK_OK(parity_sampler_add(s, prompt, 8, &st, 0, &r));
    CHECK_OK(parity_sampler_step(s, &r, 1, &tok, &lp, &fin, 0, NULL, NULL));
    CHECK_INT(fin, PARITY_FINISHED_STOP);
    parity_sampler_free(s);
}

/* parity_sampler_add_batch: the same ids, tokens and log-prob bits as adds one by one (prompts
 * packed across prefill chunks of 5 rows), and all or nothing on bad input or a full cache. */
static void check_add_batch(const parity_model *m) {
    enum { N = 4, STEPS = 6 };
    static const uint32_t lens[N] = {1, 9, 17, 4};
    int32_t data[N][17];
    const int32_t *prompts[N];
    parity_sampling sp[N];
    uint64_t streams[N];
    const uint32_t V = parity_model_config(m)->vocab_size;
    for (int i = 0; i < N; i++) {
        for (uint32_t t = 0; t < lens[i]; t++) data[i][t] = (int32_t)((i * 31 + t * 7 + 3) % V);
        prompts[i] = data[i];
        parity_sampling_default(&sp[i]);
        sp[i].seed = 5;
        sp[i].temperature = i % 2 ? 0.8f : 1.0f;
        streams[i] = (uint64_t)(10 + i);
    }
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 6;
    p.max_len = 40;
    p.prefill_chunk = 5;
    parity_sampler *one = NULL, *batch = NULL;
    CHECK_OK(parity_sampler_create(m, &p, &one));
    CHECK_OK(parity_sampler_create(m, &p, &batch));
    if (!one || !batch) goto done;
    uint32_t ids1[N], ids2[N];
    for (int i = 0; i < N; i++)
        CHECK_OK(parity_sampler_add(one, prompts[i], lens[i], &sp[i], streams[i], &ids1[i]));
    CHECK_OK(parity_sampler_add_batch(batch, N, prompts, lens, sp, streams, ids2));
    for (int i = 0; i < N; i++) CHECK_INT(ids2[i], ids1[i]);
    for (int step = 0; step < STEPS; step++) {
        int32_t t1[N], t2[N];
        float l1[N], l2[N];
        uint32_t f1[N], f2[N];
        CHECK_OK(parity_sampler_step(one, ids1, N, t1, l1, f1, 0, NULL, NULL));
        CHECK_OK(parity_sampler_step(batch, ids2, N, t2, l2, f2, 0, NULL, NULL));
        CHECK(memcmp(t1, t2, sizeof t1) == 0 && memcmp(l1, l2, sizeof l1) == 0);
    }
    for (int i = 0; i < N; i++) CHECK_OK(parity_sampler_release(batch, ids2[i]));

    /* bad input anywhere: nothing taken, the ids untouched */
    uint32_t out[N] = {99, 99, 99, 99};
    data[2][5] = (int32_t)V;
    CHECK_STATUS(parity_sampler_add_batch(batch, N, prompts, lens, sp, streams, out),
                 PARITY_ERR_TOKEN_RANGE);
    CHECK(strstr(parity_last_error(), "prompt 2") != NULL);
    data[2][5] = 0;
    uint32_t bad_lens[N] = {1, 9, 0, 4};
    CHECK_STATUS(parity_sampler_add_batch(batch, N, prompts, bad_lens, sp, streams, out),
                 PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_sampler_add_batch(batch, 0, prompts, lens, sp, streams, out),
                 PARITY_ERR_EMPTY_INPUT);
    CHECK_STATUS(parity_sampler_add_batch(batch, N, NULL, lens, sp, streams, out),
                 PARITY_ERR_INVALID_ARGUMENT);
    /* more prompts than free slots (6), then more blocks than the cache has */
    const int32_t *seven[7];
    uint32_t seven_lens[7];
    parity_sampling seven_sp[7];
    uint64_t seven_streams[7] = {0};
    uint32_t seven_out[7];
    for (int i = 0; i < 7; i++) seven[i] = data[0], seven_lens[i] = 1, seven_sp[i] = sp[0];
    CHECK_STATUS(parity_sampler_add_batch(batch, 7, seven, seven_lens, seven_sp, seven_streams,
                                          seven_out), PARITY_ERR_CACHE_FULL);
    for (int i = 0; i < N; i++) CHECK_INT(out[i], 99);
    parity_sampler_free(batch);
    batch = NULL;
    p.cache_tokens = 32; /* two blocks: prompts 1 and 2 need three */
    CHECK_OK(parity_sampler_create(m, &p, &batch));
    if (!batch) goto done;
    CHECK_STATUS(parity_sampler_add_batch(batch, N, prompts, lens, sp, streams, out),
                 PARITY_ERR_CACHE_FULL);
    for (int i = 0; i < N; i++) CHECK_INT(out[i], 99);
    /* nothing was taken: the first two prompts fit and come out as slots 0 and 1 */
    CHECK_OK(parity_sampler_add_batch(batch, 2, prompts, lens, sp, streams, out));
    CHECK_INT(out[0], 0);
    CHECK_INT(out[1], 1);
done:
    parity_sampler_free(one);
    parity_sampler_free(batch);
}

int main(void) {
    parity_model *tiny, *trained;
    if (!load_tiny_and_trained("synthetic:tiny:11", &tiny, &trained)) return check_report("sampler");
    every_path_model = tiny;

    const char *const *presets = parity_policy_preset_names();
    uint64_t seed = 1;
    if (quick()) {
        /* quick mode: flash attention on the trained model, the fp32 reference on tiny, one
         * OpenBLAS run, and fp16 and fp8 on tiny */
        check_policy(trained, "vllm", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "fp32", PARITY_BACKEND_BF16, seed++);
        check_policy(trained, "aligned", PARITY_BACKEND_OPENBLAS, seed++);
        check_policy(tiny, "hf-eager+fp16", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "vllm+fp8-block:deepseek", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "vllm+nvfp4:te", PARITY_BACKEND_BF16, seed++);
        if (backend_runs(PARITY_BACKEND_AMX))
            check_policy(trained, "aligned", PARITY_BACKEND_AMX, seed++);
    } else {
        for (int i = 0; presets[i]; i++) {
            check_policy(trained, presets[i], PARITY_BACKEND_BF16, seed++);
            check_policy(tiny, presets[i], PARITY_BACKEND_BF16, seed++);
        }
        check_policy(trained, "vllm+aligned+fp32-head", PARITY_BACKEND_BF16, seed++);
        check_policy(trained, "hf-eager+fp16", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "vllm+fp16", PARITY_BACKEND_BF16, seed++);
        check_policy(trained, "aligned+fp16", PARITY_BACKEND_OPENBLAS, seed++);
        /* fp8 on the tiny model: its GEMM is a scalar reference (DESIGN.md, "FP8 GEMM") */
        check_policy(tiny, "vllm+fp8-block:te", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "hf-eager+mxfp8:ocp", PARITY_BACKEND_BF16, seed++);
        /* the 4-bit and ternary formats, each with a rule the scorer tests do not run */
        check_policy(tiny, "vllm+nvfp4:torchao", PARITY_BACKEND_BF16, seed++);
        check_policy(trained, "vllm+nvfp4:te-2d", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "vllm+mxfp4:rceil", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "hf-eager+mxfp4:microxcaling", PARITY_BACKEND_OPENBLAS, seed++);
        check_policy(trained, "hf-eager+ternary:hf-bitlinear", PARITY_BACKEND_BF16, seed++);
        check_policy(tiny, "aligned+ternary:onebitllms", PARITY_BACKEND_BF16, seed++);
        check_policy(trained, "hf-eager", PARITY_BACKEND_OPENBLAS, seed++);
        check_policy(trained, "aligned", PARITY_BACKEND_OPENBLAS, seed++);
        check_policy(trained, "fp32", PARITY_BACKEND_OPENBLAS, seed++);
        /* the amx backend (skipped on a CPU without AMX-BF16): eager and flash attention, an
         * fp32 head, and the fp8 gemm, whose lm_head is the backend's */
        static const char *const amx_policies[] = {"aligned", "hf-eager", "vllm",
                                                   "vllm+aligned+fp32-head",
                                                   "vllm+fp8-block:deepseek"};
        for (size_t i = 0; i < sizeof amx_policies / sizeof amx_policies[0]; i++)
            if (backend_runs(PARITY_BACKEND_AMX))
                check_policy(i == 4 ? tiny : trained, amx_policies[i], PARITY_BACKEND_AMX, seed++);
    }
    check_kernel_order(trained);
    check_errors(tiny);
    check_prefault(tiny);
    check_add_batch(trained);
    check_top_n_and_stop(trained);
    parity_model_free(tiny);
    parity_model_free(trained);
    return check_report("sampler");
}
