/* Concurrency: one model shared by four threads, each with its own scorer (one also with a
 * sampler), all starting together; every result must be bitwise the single-threaded one.
 * The model is loaded afresh for the threaded run, so that the fp32 weights the "fp32"
 * scorer needs are built while the other threads read the model. Then the misuse the API
 * forbids: two threads on one scorer, and on one sampler — the library must refuse the
 * second call with PARITY_ERR_BUSY (seen at least once), and the first thread's results
 * stay right. Run under ThreadSanitizer by scripts/sanitize.sh tsan. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "fixtures.h"

#define N_THREADS 4
#define N_SEQS 3
#define SEQ_LEN 96
#define N_OUT (N_SEQS * (SEQ_LEN - 1))
#define N_GEN 12
#define ROUNDS 3

typedef struct job {
    const char *policy;
    uint32_t pool_threads;     /* the scorer's own threads */
    int sample;                /* this thread also generates with a sampler */
    int32_t tokens[N_SEQS * SEQ_LEN];
    float ref[N_OUT], got[N_OUT];
    float gen_ref[2 * N_GEN], gen_got[2 * N_GEN];
    const parity_model *model;
    pthread_barrier_t *start;
    int failures;              /* results that differed or calls that failed */
} job;

static const uint32_t lengths[N_SEQS] = {SEQ_LEN, SEQ_LEN, SEQ_LEN};

static int score(const parity_model *m, const job *j, float *out) {
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    if (parity_policy_from_name(j->policy, &p.policy)) return 0;
    p.n_threads = j->pool_threads;
    p.max_tokens = 128; /* two groups: the cache is reused within the call */
    parity_scorer *s = NULL;
    if (parity_scorer_create(m, &p, &s)) return 0;
    parity_score_options o;
    parity_score_default_options(&o);
    o.mode = PARITY_LOGPROB_PROCESSED;
    o.temperature = 0.9f;
    int rc = parity_score(s, &o, j->tokens, lengths, N_SEQS, out, NULL, NULL, NULL);
    parity_scorer_free(s);
    return rc == PARITY_OK;
}

/* Two completions forked from one prompt, N_GEN / 2 steps together: tokens and log-probs. */
static int generate(const parity_model *m, const job *j, float *out) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.max_seqs = 2;
    p.max_len = 64;
    parity_sampler *s = NULL;
    if (parity_sampler_create(m, &p, &s)) return 0;
    parity_sampling sp;
    parity_sampling_default(&sp);
    sp.seed = 77;
    uint32_t seqs[2];
    int rc = parity_sampler_add(s, j->tokens, 20, &sp, 0, &seqs[0]);
    if (!rc) rc = parity_sampler_fork(s, seqs[0], &sp, 1, &seqs[1]);
    for (int i = 0; i < N_GEN / 2 && !rc; i++) {
        int32_t tok[2];
        uint32_t fin[2];
        rc = parity_sampler_step(s, seqs, 2, tok, &out[4 * i], fin, 0, NULL, NULL);
        out[4 * i + 2] = (float)tok[0], out[4 * i + 3] = (float)tok[1];
    }
    parity_sampler_free(s);
    return rc == PARITY_OK;
}

static void *run_job(void *arg) {
    job *j = arg;
    pthread_barrier_wait(j->start);
    for (int r = 0; r < ROUNDS; r++) {
        memset(j->got, 0, sizeof j->got);
        if (!score(j->model, j, j->got) || memcmp(j->got, j->ref, sizeof j->ref)) j->failures++;
        if (j->sample) {
            memset(j->gen_got, 0, sizeof j->gen_got);
            if (!generate(j->model, j, j->gen_got) ||
                memcmp(j->gen_got, j->gen_ref, sizeof j->gen_ref))
                j->failures++;
        }
    }
    return NULL;
}

static void test_shared_model(const char *dir) {
    static job jobs[N_THREADS] = {
        {.policy = "aligned", .pool_threads = 1, .sample = 1},
        {.policy = "hf-eager", .pool_threads = 2},
        {.policy = "fp32", .pool_threads = 1},
        {.policy = "vllm+fp32-head", .pool_threads = 2},
    };
    parity_model *ref_model = NULL, *shared = NULL;
    CHECK_OK(parity_model_load(dir, &ref_model));
    CHECK_OK(parity_model_load(dir, &shared));
    if (!ref_model || !shared) return;
    const uint32_t vocab = parity_model_config(shared)->vocab_size;

    /* the single-threaded results */
    for (int t = 0; t < N_THREADS; t++) {
        for (int i = 0; i < N_SEQS * SEQ_LEN; i++)
            jobs[t].tokens[i] = (int32_t)((uint32_t)(i * 131 + t * 977 + 5) % vocab);
        CHECK(score(ref_model, &jobs[t], jobs[t].ref));
        if (jobs[t].sample) CHECK(generate(ref_model, &jobs[t], jobs[t].gen_ref));
    }

    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N_THREADS);
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        jobs[t].model = shared;
        jobs[t].start = &start;
        CHECK(pthread_create(&th[t], NULL, run_job, &jobs[t]) == 0);
    }
    for (int t = 0; t < N_THREADS; t++) {
        pthread_join(th[t], NULL);
        CHECK_INT(jobs[t].failures, 0);
        printf("thread %d (%s, %u pool threads%s): %d rounds, %s\n", t, jobs[t].policy,
               jobs[t].pool_threads, jobs[t].sample ? ", and a sampler" : "", ROUNDS,
               jobs[t].failures ? "DIFFERENT from the single-threaded run" : "bitwise equal");
    }
    pthread_barrier_destroy(&start);
    parity_model_free(shared);
    parity_model_free(ref_model);
}

/* ---- misuse: one object, two threads --------------------------------------------------- */

typedef struct misuse {
    parity_scorer *scorer;
    parity_sampler *sampler;
    const int32_t *tokens;
    const float *ref;          /* the scorer's result for tokens */
    atomic_int stop;
    int ok_calls, wrong, busy; /* of the worker thread */
} misuse;

static void *score_until_stopped(void *arg) {
    misuse *m = arg;
    parity_score_options o;
    parity_score_default_options(&o);
    static float lp[N_OUT];
    while (!atomic_load(&m->stop)) {
        int rc = parity_score(m->scorer, &o, m->tokens, lengths, N_SEQS, lp, NULL, NULL, NULL);
        if (rc == PARITY_OK) {
            m->ok_calls++;
            m->wrong += memcmp(lp, m->ref, sizeof lp) != 0;
        } else {
            m->busy += rc == PARITY_ERR_BUSY;
        }
    }
    return NULL;
}

static void *generate_until_stopped(void *arg) {
    misuse *m = arg;
    parity_sampling sp;
    parity_sampling_default(&sp);
    while (!atomic_load(&m->stop)) {
        uint32_t seq;
        int rc = parity_sampler_add(m->sampler, m->tokens, 40, &sp, 0, &seq);
        const int added = rc == PARITY_OK;
        for (int i = 0; i < 4 && rc == PARITY_OK; i++) {
            int32_t tok;
            float lp;
            uint32_t fin;
            rc = parity_sampler_step(m->sampler, &seq, 1, &tok, &lp, &fin, 0, NULL, NULL);
        }
        /* the release may itself meet the other thread: retry it */
        while (added && parity_sampler_release(m->sampler, seq) == PARITY_ERR_BUSY)
            ;
        if (rc == PARITY_OK) m->ok_calls++;
        else m->busy += rc == PARITY_ERR_BUSY;
    }
    return NULL;
}

/* Calls `probe` on the object from this thread while `worker` uses it, until one call is
 * refused with PARITY_ERR_BUSY (or 60 s pass); returns the number of refusals seen. */
static int provoke_busy(misuse *m, void *(*worker)(void *), int (*probe)(misuse *)) {
    atomic_store(&m->stop, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, worker, m) == 0);
    const time_t deadline = time(NULL) + 60;
    int seen = 0;
    while (!seen && time(NULL) < deadline) seen = probe(m) == PARITY_ERR_BUSY;
    atomic_store(&m->stop, 1);
    pthread_join(th, NULL);
    return seen;
}

static int probe_scorer(misuse *m) {
    /* a call that would fail at once (no sequences) if it got in */
    parity_score_options o;
    parity_score_default_options(&o);
    float lp;
    return parity_score(m->scorer, &o, m->tokens, lengths, 0, &lp, NULL, NULL, NULL);
}

static int probe_sampler(misuse *m) {
    /* no such sequence: fails at once if it gets in */
    return parity_sampler_release(m->sampler, 1000);
}

static void test_misuse(const char *dir) {
    parity_model *model = NULL;
    CHECK_OK(parity_model_load(dir, &model));
    if (!model) return;
    static int32_t tokens[N_SEQS * SEQ_LEN];
    static float ref[N_OUT], after[N_OUT];
    for (int i = 0; i < N_SEQS * SEQ_LEN; i++) tokens[i] = (i * 7 + 1) % 256;
    parity_scorer *s = new_scorer(model, (fixture){0});
    parity_sampler *sampler = new_sampler(model, (fixture){.max_seqs = 2, .max_len = 64});
    if (!s || !sampler) return;
    score_raw(s, tokens, lengths, N_SEQS, ref);

    misuse m = {.scorer = s, .sampler = sampler, .tokens = tokens, .ref = ref};
    CHECK(provoke_busy(&m, score_until_stopped, probe_scorer));
    CHECK_INT(m.wrong, 0);
    printf("scorer misuse: PARITY_ERR_BUSY seen (\"%s\"); the other thread's %d calls that got "
           "in were right, %d were refused\n", parity_last_error(), m.ok_calls, m.busy);
    /* the scorer is intact */
    score_raw(s, tokens, lengths, N_SEQS, after);
    CHECK_BITS_F32(ref, after, N_OUT, "scorer after the misuse");

    m.ok_calls = m.busy = 0;
    CHECK(provoke_busy(&m, generate_until_stopped, probe_sampler));
    printf("sampler misuse: PARITY_ERR_BUSY seen; the other thread's %d generations that got in "
           "finished, %d were refused\n", m.ok_calls, m.busy);
    /* both sequence slots are free again: nothing leaked out of the cache */
    uint32_t a, b;
    parity_sampling sp;
    parity_sampling_default(&sp);
    CHECK_OK(parity_sampler_add(sampler, tokens, 40, &sp, 0, &a));
    CHECK_OK(parity_sampler_add(sampler, tokens, 20, &sp, 1, &b));
    parity_sampler_free(sampler);
    parity_scorer_free(s);
    parity_model_free(model);
}

int main(void) {
    char dir[4096];
    source_path(dir, sizeof dir, TRAINED_MODEL);
    test_shared_model(dir);
    test_misuse(dir);
    return check_report("test_concurrency");
}
