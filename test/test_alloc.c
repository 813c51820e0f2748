/* Allocation failures and memory ceilings.
 *
 * The sweep (the SQLite way): for each call below, a clean run counts its allocations N
 * through the px_* hook; then for k = 1..N the k-th allocation fails, and the call must
 * return PARITY_ERR_OUT_OF_MEMORY with a message, leave its output untouched, and leak
 * nothing (LeakSanitizer checks that under scripts/sanitize.sh asan); a retry right after
 * must succeed with bitwise the same results. Calls: loading the trained model, loading a
 * sharded F32 checkpoint, a synthetic model, scorer and sampler creation, a parity_score
 * call, a sampler add + fork + step, and the forward pieces (a pool, parity_linear,
 * parity_attention, parity_head_logprobs, parity_logprobs_from_logits, with and without a
 * pool, on both backends).
 *
 * The ceilings: a max_memory below what a scorer or sampler needs fails up front with
 * PARITY_ERR_MEMORY_LIMIT before any allocation; exactly what it needs, or more, succeeds. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "base/alloc.h"
#include "model/model.h"
#include "checkpoint/safetensors.h"

#define SENTINEL ((void *)&sentinel_object)
static max_align_t sentinel_object;

#define SEQ_LEN 24
static int32_t tokens[SEQ_LEN];

/* One call under the sweep. setup (optional) runs before the counting starts; call makes
 * the call; failed checks that a failed call changed nothing; ok checks a successful call's
 * result against the reference (recorded by the first clean run) and frees it. */
typedef struct sweep_case {
    const char *name;
    void (*setup)(void *ctx);
    int (*call)(void *ctx);
    void (*failed)(void *ctx);
    void (*ok)(void *ctx);
    void *ctx;
} sweep_case;

static void sweep(const sweep_case *c) {
    if (c->setup) c->setup(c->ctx);
    px_alloc_test_reset(0);
    CHECK_OK(c->call(c->ctx));
    const long n = px_alloc_test_count();
    c->ok(c->ctx);
    long bad = 0, recovered = 0;
    for (long k = 1; k <= n; k++) {
        if (c->setup) c->setup(c->ctx);
        px_alloc_test_reset(k);
        int rc = c->call(c->ctx);
        px_alloc_test_reset(0);
        if (rc == PARITY_OK) {
            /* a site with a fallback (json_find_duplicate_key's sort buffer): the result
             * must still be the same */
            recovered++;
            c->ok(c->ctx);
            continue;
        }
        if (rc != PARITY_ERR_OUT_OF_MEMORY || !parity_last_error()[0]) {
            if (bad++ < 5)
                fprintf(stderr, "%s: allocation %ld of %ld failed: got %s (%s)\n", c->name, k, n,
                        parity_status_name(rc), parity_last_error());
            continue;
        }
        c->failed(c->ctx);
        CHECK_OK(c->call(c->ctx)); /* the retry */
        c->ok(c->ctx);
    }
    CHECK_INT(bad, 0);
    printf("alloc sweep: %-28s %4ld allocations, each failed in turn (%ld with a fallback)\n",
           c->name, n, recovered);
}

/* ---- scoring a model: the result the model cases compare ---------------------------- */

static void score_model(const parity_model *m, float *lp) {
    parity_scorer *s = new_scorer(m, (fixture){0});
    uint32_t len = SEQ_LEN;
    if (s) score_raw(s, tokens, &len, 1, lp);
    parity_scorer_free(s);
}

/* A model-making call: load or synthetic. */
typedef struct model_case {
    const char *dir;            /* NULL: synthetic tiny */
    parity_model *m;
    int have_ref;
    float ref[SEQ_LEN - 1];
} model_case;

static int model_call(void *ctx) {
    model_case *c = ctx;
    c->m = SENTINEL;
    if (c->dir) return parity_model_load(c->dir, &c->m);
    parity_config cfg;
    CHECK_OK(parity_config_builtin("tiny", &cfg));
    return parity_model_synthetic(&cfg, 9, &c->m);
}
static void model_failed(void *ctx) { CHECK(((model_case *)ctx)->m == SENTINEL); }
static void model_ok(void *ctx) {
    model_case *c = ctx;
    float lp[SEQ_LEN - 1];
    score_model(c->m, c->have_ref ? lp : c->ref);
    if (c->have_ref) CHECK_BITS_F32(c->ref, lp, SEQ_LEN - 1, "model after an allocation failure");
    c->have_ref = 1;
    parity_model_free(c->m);
}

/* ---- scorer and sampler creation ------------------------------------------------------ */

typedef struct object_case {
    parity_model *m;            /* the model (fresh per call when fresh_model) */
    int fresh_model;            /* the fp32 copies are built anew by each call */
    parity_scorer_params sp;
    parity_sampler_params pp;
    int sampler;
    void *obj;
    int have_ref;
    float ref[SEQ_LEN];
} object_case;

static void object_setup(void *ctx) {
    object_case *c = ctx;
    if (!c->fresh_model) return;
    parity_model_free(c->m);
    c->m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:4", &c->m));
}
static int object_call(void *ctx) {
    object_case *c = ctx;
    c->obj = SENTINEL;
    if (c->sampler) return parity_sampler_create(c->m, &c->pp, (parity_sampler **)&c->obj);
    return parity_scorer_create(c->m, &c->sp, (parity_scorer **)&c->obj);
}
static void object_failed(void *ctx) { CHECK(((object_case *)ctx)->obj == SENTINEL); }

/* Generates 8 greedy tokens after a prompt: their log-probs (and ids) are the result. */
static void sampler_result(parity_sampler *s, float *out) {
    parity_sampling sp;
    parity_sampling_default(&sp);
    sp.temperature = 0.8f;
    sp.seed = 3;
    uint32_t seq;
    CHECK_OK(parity_sampler_add(s, tokens, 8, &sp, 0, &seq));
    for (int i = 0; i < 8; i++) {
        int32_t tok;
        uint32_t fin;
        CHECK_OK(parity_sampler_step(s, &seq, 1, &tok, &out[2 * i], &fin, 0, NULL, NULL));
        out[2 * i + 1] = (float)tok;
    }
    CHECK_OK(parity_sampler_release(s, seq));
}

static void object_ok(void *ctx) {
    object_case *c = ctx;
    float got[SEQ_LEN] = {0};
    float *dst = c->have_ref ? got : c->ref;
    if (c->sampler) {
        sampler_result(c->obj, dst);
        parity_sampler_free(c->obj);
    } else {
        parity_score_options o;
        parity_score_default_options(&o);
        uint32_t len = SEQ_LEN;
        CHECK_OK(parity_score(c->obj, &o, tokens, &len, 1, dst, NULL, NULL, NULL));
        parity_scorer_free(c->obj);
    }
    if (c->have_ref) CHECK_BITS_F32(c->ref, got, SEQ_LEN, "object after an allocation failure");
    c->have_ref = 1;
}

/* ---- calls on existing objects: parity_score, sampler add + fork + step ------------------ */

typedef struct use_case {
    parity_scorer *scorer;
    parity_sampler *sampler;
    float lp[SEQ_LEN];
    int have_ref;
    float ref[SEQ_LEN];
} use_case;

static int score_call(void *ctx) {
    use_case *c = ctx;
    parity_score_options o;
    parity_score_default_options(&o);
    o.top_n = 1;
    uint32_t len = SEQ_LEN;
    int32_t top[SEQ_LEN];
    float top_lp[SEQ_LEN];
    return parity_score(c->scorer, &o, tokens, &len, 1, c->lp, NULL, top, top_lp);
}

static int generate_call(void *ctx) {
    use_case *c = ctx;
    parity_sampling sp;
    parity_sampling_default(&sp);
    sp.seed = 5;
    uint32_t seqs[2];
    int rc = parity_sampler_add(c->sampler, tokens, 10, &sp, 0, &seqs[0]);
    if (!rc) rc = parity_sampler_fork(c->sampler, seqs[0], &sp, 1, &seqs[1]);
    for (int i = 0; i < 4 && !rc; i++) {
        int32_t tok[2];
        uint32_t fin[2];
        rc = parity_sampler_step(c->sampler, seqs, 2, tok, &c->lp[4 * i], fin, 0, NULL, NULL);
        c->lp[4 * i + 2] = (float)tok[0], c->lp[4 * i + 3] = (float)tok[1];
    }
    parity_sampler_release(c->sampler, seqs[0]);
    parity_sampler_release(c->sampler, seqs[1]);
    return rc;
}

static void use_failed(void *ctx) { (void)ctx; }
static void use_ok(void *ctx) {
    use_case *c = ctx;
    if (c->have_ref) CHECK_BITS_F32(c->ref, c->lp, SEQ_LEN, "results after an allocation failure");
    else memcpy(c->ref, c->lp, sizeof c->ref);
    c->have_ref = 1;
}

/* ---- the forward pieces (parity_linear, parity_attention, the head and its second half) ---- */

#define OPS_ROWS 20
#define OPS_OUT (OPS_ROWS * 256)
typedef struct ops_case {
    const parity_model *m;
    parity_pool *pool;      /* NULL: the call makes its own one-thread pool */
    uint32_t backend;
    int which;              /* 0 linear, 1 attention, 2 head, 3 log-probs from logits */
    float x[OPS_ROWS * 256], out[OPS_OUT], ref[OPS_OUT];
    int have_ref;
} ops_case;

/* Before each call: the output filled with a pattern no result has, and a fresh pool (a pool
 * keeps its calls' scratch for the next ones: a used one would not allocate again). */
static void ops_setup(void *ctx) {
    ops_case *c = ctx;
    memset(c->out, 0xff, sizeof c->out);
    if (c->pool) {
        parity_pool_free(c->pool);
        c->pool = NULL;
        CHECK_OK(parity_pool_create(2, &c->pool));
    }
}

static int ops_call(void *ctx) {
    ops_case *c = ctx;
    const parity_config *cf = &c->m->config;
    const layer_weights *w = &c->m->layers[0];
    parity_policy pol;
    parity_policy_from_name("hf-eager", &pol);
    if (c->which == 0)
        return parity_linear(c->pool, &pol, c->backend, OPS_ROWS, w->w_up.cols, w->w_up.rows, c->x,
                             w->w_up.cols, PARITY_DTYPE_BF16, w->w_up.bf16, w->w_up.cols, NULL,
                             c->out, w->w_up.rows);
    const size_t hd = cf->head_dim, nh = cf->num_attention_heads, nkv = cf->num_key_value_heads;
    if (c->which == 1) {
        const uint32_t lengths[2] = {7, OPS_ROWS - 7};
        return parity_attention(c->pool, &pol, 2, lengths, nh, nkv, hd, c->x, nh * hd, c->x,
                                nkv * hd, c->x + 8, nkv * hd, c->out, nh * hd);
    }
    parity_score_options o;
    parity_score_default_options(&o);
    o.mode = PARITY_LOGPROB_PROCESSED_TRUNCATED;
    o.top_k = 5;
    if (c->which == 3) /* rows of 250 logits 256 apart: the call packs them in its scratch */
        return parity_logprobs_from_logits(c->pool, &pol, &o, OPS_ROWS, 250, c->x, 256, tokens,
                                           c->out, c->out + OPS_ROWS);
    const size_t dim = cf->hidden_size;
    return parity_head_logprobs(c->pool, &pol, c->backend, &o, OPS_ROWS, dim, cf->vocab_size, c->x,
                                dim, c->x + 1, dim, PARITY_DTYPE_BF16, c->m->final_norm.bf16,
                                cf->rms_norm_eps, c->m->lm_head.bf16, dim, tokens, c->out, NULL,
                                NULL, 0);
}

static void ops_failed(void *ctx) {
    ops_case *c = ctx;
    uint32_t u;
    int untouched = 1;
    for (size_t i = 0; i < OPS_OUT; i++) {
        memcpy(&u, &c->out[i], 4);
        untouched &= u == 0xffffffffu;
    }
    CHECK(untouched);
}

static void ops_ok(void *ctx) {
    ops_case *c = ctx;
    if (c->have_ref) CHECK_BITS_F32(c->ref, c->out, OPS_OUT, "forward piece after a failure");
    else memcpy(c->ref, c->out, sizeof c->ref);
    c->have_ref = 1;
}

static int pool_call(void *ctx) {
    parity_pool **p = ctx;
    return parity_pool_create(2, p);
}
static void pool_failed(void *ctx) { CHECK(*(parity_pool **)ctx == NULL); }
static void pool_ok(void *ctx) {
    parity_pool **p = ctx;
    CHECK_INT(parity_pool_threads(*p), 2);
    parity_pool_free(*p);
    *p = NULL;
}

static void test_ops(const parity_model *tiny) {
    static const char *const names[4][2] = {
        {"parity_linear (bf16)", "parity_linear (openblas)"},
        {"parity_attention", "parity_attention"},
        {"parity_head_logprobs (bf16)", "parity_head_logprobs (openblas)"},
        {"parity_logprobs_from_logits", "parity_logprobs_from_logits"}};
    parity_pool *pool = NULL;
    sweep(&(sweep_case){"parity_pool_create", NULL, pool_call, pool_failed, pool_ok, &pool});
    static ops_case c;
    /* the openblas backend's sweeps where this build has it (not with -Dopenblas=disabled) */
    const uint32_t backends = parity_backend_check(PARITY_BACKEND_OPENBLAS) == PARITY_OK ? 2u : 1u;
    for (int which = 0; which < 4; which++) /* attention and log-probs have no backend */
        for (uint32_t backend = 0; backend < (which % 2 ? 1u : backends); backend++)
            for (int with_pool = 0; with_pool < 2; with_pool++) {
                memset(&c, 0, sizeof c);
                c.m = tiny, c.backend = backend, c.which = which;
                if (with_pool) CHECK_OK(parity_pool_create(2, &c.pool));
                for (size_t i = 0; i < OPS_ROWS * 256; i++)
                    c.x[i] = parity_bf16_to_f32(parity_bf16_from_f32((float)((i * 37) % 101) / 50 - 1));
                char name[64];
                snprintf(name, sizeof name, "%s%s", names[which][backend],
                         with_pool ? ", pool" : "");
                sweep(&(sweep_case){name, ops_setup, ops_call, ops_failed, ops_ok, &c});
                parity_pool_free(c.pool);
            }
}

/* ---- a sharded F32 checkpoint ------------------------------------------------------------- */

/* Writes tensors [first, last) of a BF16 file as an F32 safetensors file. */
static void write_f32_shard(const st_file *f, size_t first, size_t last, const char *path) {
    size_t cap = 256 * (last - first + 1), len = 0, at = 0, data = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h, cap, "{");
    for (size_t i = first; i < last; i++) {
        const st_tensor *t = &f->tensors[i];
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu",
                                i > first ? "," : "", t->name, (unsigned long long)t->shape[0]);
        if (t->ndim == 2)
            len += (size_t)snprintf(h + len, cap - len, ",%llu", (unsigned long long)t->shape[1]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", data,
                                data + 4 * (size_t)t->n_elements);
        data += 4 * (size_t)t->n_elements;
    }
    h[len++] = '}';
    uint8_t *out = malloc(8 + len + data);
    for (int b = 0; b < 8; b++) out[at++] = (uint8_t)((uint64_t)len >> (8 * b));
    memcpy(out + at, h, len);
    at += len;
    for (size_t i = first; i < last; i++)
        for (uint64_t e = 0; e < f->tensors[i].n_elements; e++, at += 4) {
            uint16_t v;
            memcpy(&v, f->tensors[i].data + 2 * e, 2);
            float x = parity_bf16_to_f32(v);
            memcpy(out + at, &x, 4);
        }
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(out, 1, at, fp) == at);
    if (fp) fclose(fp);
    free(out);
    free(h);
}

/* Saves synthetic tiny into dir, then turns it into two F32 shards with an index. */
static void make_sharded_f32(const char *dir) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:6", &m));
    if (!m) return;
    CHECK_OK(parity_model_save(m, dir));
    parity_model_free(m);
    char path[512], index[16384];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (!f) return;
    const size_t half = f->n_tensors / 2;
    static const char *const shards[2] = {"model-00001-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors"};
    size_t len = (size_t)snprintf(index, sizeof index, "{\"weight_map\": {");
    for (size_t i = 0; i < f->n_tensors; i++)
        len += (size_t)snprintf(index + len, sizeof index - len, "%s\"%s\": \"%s\"", i ? ", " : "",
                                f->tensors[i].name, shards[i >= half]);
    len += (size_t)snprintf(index + len, sizeof index - len, "}}");
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s", dir, shards[s]);
        write_f32_shard(f, s ? half : 0, s ? f->n_tensors : half, path);
    }
    st_close(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *fp = fopen(path, "w");
    CHECK(fp && fwrite(index, 1, len, fp) == len);
    if (fp) fclose(fp);
}

static void remove_sharded_f32(const char *dir) {
    static const char *const files[] = {"config.json", "model.safetensors.index.json",
                                        "model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    char path[512];
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* ---- memory ceilings ----------------------------------------------------------------- */

/* The bytes the message of a PARITY_ERR_MEMORY_LIMIT says the object needs. */
static unsigned long long needed_bytes(void) {
    const char *at = strstr(parity_last_error(), "needs ");
    return at ? strtoull(at + 6, NULL, 10) : 0;
}

/* The scorer (sampler: the sampler), created under a ceiling of max_memory bytes: *out is
 * left as it was when the creation fails. */
static int ceiling_create(const parity_model *m, int sampler, uint64_t max_memory, void **out) {
    parity_scorer_params sp = scorer_params((fixture){.max_memory = max_memory});
    parity_sampler_params pp = sampler_params((fixture){.max_memory = max_memory});
    parity_scorer *s = *out;
    parity_sampler *q = *out;
    int rc = sampler ? parity_sampler_create(m, &pp, &q) : parity_scorer_create(m, &sp, &s);
    *out = sampler ? (void *)q : (void *)s;
    return rc;
}

static void ceiling_free(int sampler, void *obj) {
    if (sampler)
        parity_sampler_free(obj);
    else
        parity_scorer_free(obj);
}

/* A ceiling below what the default object needs is refused up front, without allocating and
 * with the bytes it needs in the message; exactly those bytes, or more, are enough. */
static void check_ceiling(const parity_model *m, int sampler) {
    void *obj = SENTINEL;
    px_alloc_test_reset(0);
    CHECK_STATUS(ceiling_create(m, sampler, 4096, &obj), PARITY_ERR_MEMORY_LIMIT);
    CHECK_INT(px_alloc_test_count(), 0);
    CHECK(obj == SENTINEL);
    const unsigned long long need = needed_bytes();
    CHECK(need > 4096);
    CHECK_STATUS(ceiling_create(m, sampler, need - 1, &obj), PARITY_ERR_MEMORY_LIMIT);
    CHECK_INT(px_alloc_test_count(), 0);
    CHECK_OK(ceiling_create(m, sampler, need, &obj));
    if (!sampler) CHECK(px_alloc_test_count() > 0);
    ceiling_free(sampler, obj);
    CHECK_OK(ceiling_create(m, sampler, 1ull << 40, &obj));
    ceiling_free(sampler, obj);
    printf("ceilings: the default %s needs %llu bytes\n", sampler ? "sampler" : "scorer", need);
}

static void test_ceilings(const parity_model *m) {
    check_ceiling(m, 0);
    check_ceiling(m, 1);
}

int main(void) {
    for (int i = 0; i < SEQ_LEN; i++) tokens[i] = (i * 29 + 3) % 256;
    char trained[4096], sharded[64] = "/tmp/parity-alloc-XXXXXX";
    source_path(trained, sizeof trained, TRAINED_MODEL);
    CHECK(mkdtemp(sharded) != NULL);
    make_sharded_f32(sharded);

    model_case load_trained = {trained, NULL, 0, {0}}, load_sharded = {sharded, NULL, 0, {0}},
               synthetic = {NULL, NULL, 0, {0}};
    sweep(&(sweep_case){"model load (trained, BF16)", NULL, model_call, model_failed, model_ok,
                        &load_trained});
    sweep(&(sweep_case){"model load (sharded, F32)", NULL, model_call, model_failed, model_ok,
                        &load_sharded});
    sweep(&(sweep_case){"parity_model_synthetic", NULL, model_call, model_failed, model_ok,
                        &synthetic});
    remove_sharded_f32(sharded);

    parity_model *tiny = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:4", &tiny));
    if (!tiny) return check_report("test_alloc");

    object_case scorer = {.m = tiny}, scorer_fp32 = {.fresh_model = 1}, sampler = {.m = tiny};
    parity_scorer_default_params(&scorer.sp);
    scorer.sp.n_threads = 2;
    parity_scorer_default_params(&scorer_fp32.sp);
    CHECK_OK(parity_policy_from_name("fp32", &scorer_fp32.sp.policy));
    parity_sampler_default_params(&sampler.pp);
    sampler.pp.max_seqs = 4;
    sampler.pp.max_len = 64;
    sampler.pp.n_threads = 2;
    sampler.sampler = 1;
    sweep(&(sweep_case){"scorer create (2 threads)", NULL, object_call, object_failed, object_ok,
                        &scorer});
    sweep(&(sweep_case){"scorer create (fp32, fresh)", object_setup, object_call, object_failed,
                        object_ok, &scorer_fp32});
    parity_model_free(scorer_fp32.m);
    sweep(&(sweep_case){"sampler create (2 threads)", NULL, object_call, object_failed,
                        object_ok, &sampler});

    use_case use = {0};
    use.scorer = new_scorer(tiny, (fixture){0});
    CHECK_OK(parity_sampler_create(tiny, &sampler.pp, &use.sampler));
    if (use.scorer && use.sampler) {
        sweep(&(sweep_case){"parity_score", NULL, score_call, use_failed, use_ok, &use});
        use.have_ref = 0;
        sweep(&(sweep_case){"sampler add + fork + step", NULL, generate_call, use_failed, use_ok,
                            &use});
    }
    parity_scorer_free(use.scorer);
    parity_sampler_free(use.sampler);

    test_ops(tiny);
    test_ceilings(tiny);
    parity_model_free(tiny);
    return check_report("test_alloc");
}
