/* Weight updates and sync checks, as an RL loop uses them: the learner pushes fp32 master
 * weights, writes a manifest of what it sent (computed here independently of the library:
 * its own RNE cast and its own FNV-1a), and the sampler side verifies. Every failure kind
 * that happens in practice is provoked and must be reported: a wrong dtype cast, a skipped
 * tensor, a stale shard, a transposed view, truncation instead of rounding, a version that
 * differs; the probe of log-probs; KV caches computed under old weights are refused; an
 * update while a call runs is refused; the first update of fp32 masters casts into the bf16
 * buffers the model owns and keeps the new masters, and when it fails (a NaN, out of memory
 * at any of its allocations, a call in flight) the model is as it was. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/alloc.h"
#include "fixtures.h"
#include "model/model.h"

/* ---- the learner's side, written independently of the library ----------------------- */

static uint16_t learner_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t learner_truncate(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

/* fp32 -> IEEE half, round to nearest even (normal range only: the weights are small). */
static uint16_t to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign; /* tiny: flush (not reached by these weights' bulk) */
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static uint64_t learner_fnv(const uint16_t *x, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint8_t b[2] = {(uint8_t)(x[i] & 0xff), (uint8_t)(x[i] >> 8)};
        for (int k = 0; k < 2; k++) h = (h ^ b[k]) * 0x100000001b3ull;
    }
    return h;
}

/* Manifest version 2's checksum (parity.h, "Sync checks"): FNV-1a 64 of each 65536-byte
 * chunk of the bf16 bytes, those checksums' little-endian bytes hashed in order. */
static uint64_t learner_fnv_chunked(const uint16_t *x, size_t n) {
    uint64_t outer = 0xcbf29ce484222325ull;
    for (size_t c = 0; c < n; c += 32768) {
        const uint64_t h = learner_fnv(x + c, n - c < 32768 ? n - c : 32768);
        for (int k = 0; k < 8; k++) outer = (outer ^ ((h >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
    }
    return outer;
}

/* The whole text of a file (NULL if it cannot be read), NUL-terminated. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = f ? calloc(1, 1 << 20) : NULL;
    if (text && fread(text, 1, (1 << 20) - 1, f) == 0) text[0] = '\0';
    if (f) fclose(f);
    return text;
}

typedef struct learner {
    size_t n;
    expected slots[128];
    float *master[128];      /* the new fp32 weights */
    uint16_t *sent[128];     /* what the learner believes it sent: RNE(master) */
} learner;

static uint64_t rng = 99;
static float noise(void) {
    return ((float)(xorshift64(&rng) >> 40) / 16777216.0f - 0.5f) * 0.002f;
}

/* New fp32 weights: the model's values plus small noise (an optimizer step). */
static void learner_step(learner *L, parity_model *m) {
    const expected *table = model_tensors(m, &L->n);
    memcpy(L->slots, table, L->n * sizeof *table);
    for (size_t i = 0; i < L->n; i++) {
        const weight *w = L->slots[i].dst;
        size_t count = (size_t)w->rows * w->cols;
        L->master[i] = malloc(count * 4);
        L->sent[i] = malloc(count * 2);
        for (size_t k = 0; k < count; k++) {
            uint32_t u = (uint32_t)w->bf16[k] << 16;
            float v;
            memcpy(&v, &u, 4);
            L->master[i][k] = v + noise();
            L->sent[i][k] = learner_rne(L->master[i][k]);
        }
    }
}

static void learner_free(learner *L) {
    for (size_t i = 0; i < L->n; i++) {
        free(L->master[i]);
        free(L->sent[i]);
    }
}

static void write_manifest(const learner *L, uint64_t version, const char *path) {
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"version\": %" PRIu64 ", \"tensors\": {", version);
    for (size_t i = 0; i < L->n; i++) {
        const weight *w = L->slots[i].dst;
        fprintf(f, "%s\"%s\": {\"dtype\": \"BF16\", \"shape\": [", i ? ", " : "", L->slots[i].name);
        if (L->slots[i].rows) fprintf(f, "%u, %u", w->rows, w->cols);
        else fprintf(f, "%u", w->cols);
        fprintf(f, "], \"fnv1a64\": \"%016" PRIx64 "\"}", learner_fnv(L->sent[i], (size_t)w->rows * w->cols));
    }
    fprintf(f, "}}\n");
    fclose(f);
}

static parity_tensor_data as_f32(const learner *L, size_t i) {
    const expected *e = &L->slots[i];
    parity_tensor_data t = {e->name, PARITY_DTYPE_F32, e->rows ? 2u : 1u,
                            {e->rows ? e->rows : e->cols, e->cols}, L->master[i]};
    return t;
}

/* Pushes every tensor as fp32 masters (the correct path). */
static void push_all(parity_model *m, const learner *L) {
    parity_tensor_data t[128];
    for (size_t i = 0; i < L->n; i++) t[i] = as_f32(L, i);
    CHECK_OK(parity_model_update(m, t, L->n));
}

static size_t slot_index(const learner *L, const char *name) {
    for (size_t i = 0; i < L->n; i++)
        if (!strcmp(L->slots[i].name, name)) return i;
    fprintf(stderr, "no tensor %s\n", name);
    exit(1);
}

static int verify(parity_model *m, const char *manifest, char *report, size_t size) {
    int rc = parity_model_verify(m, manifest, report, size);
    if (rc) printf("verify: %s\n%s", parity_last_error(), report);
    return rc;
}

/* What the model holds for each of a learner's tensors: the buffers and the bf16 values. */
typedef struct held {
    const uint16_t *bf16[128];
    const float *master[128];
    uint16_t *values[128];
} held;

static void hold(const learner *L, held *h) {
    for (size_t i = 0; i < L->n; i++) {
        const weight *w = L->slots[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        h->bf16[i] = w->bf16;
        h->master[i] = w->master;
        h->values[i] = malloc(count * 2);
        memcpy(h->values[i], w->bf16, count * 2);
    }
}

/* Whether the model holds what h recorded: the same buffers, the same values. */
static int still_held(const learner *L, const held *h) {
    int same = 1;
    for (size_t i = 0; i < L->n; i++) {
        const weight *w = L->slots[i].dst;
        same &= w->bf16 == h->bf16[i] && w->master == h->master[i] &&
                !memcmp(w->bf16, h->values[i], (size_t)w->rows * w->cols * 2);
    }
    return same;
}

static void held_free(const learner *L, held *h) {
    for (size_t i = 0; i < L->n; i++) free(h->values[i]);
}

/* An update of n tensors under `masters`: PARITY_MASTERS_KEEP through parity_model_update (no
 * pool) and parity_model_update_on, the calls without a masters argument; the others through
 * parity_model_update_with. */
static int update_as(parity_pool *pool, parity_model *m, const parity_tensor_data *t, size_t n,
                     uint32_t masters) {
    if (masters != PARITY_MASTERS_KEEP) return parity_model_update_with(pool, m, t, n, masters);
    return pool ? parity_model_update_on(pool, m, t, n) : parity_model_update(m, t, n);
}

/* The update of L's tensors t (fp32 masters) under `masters`, after the ways it fails, each
 * leaving the model as `before` recorded (buffers and values, version 0, its values as loaded
 * still given): a NaN in its last tensor, a call in flight (it would overwrite the values a
 * reader reads), out of memory at each of its allocations in turn, on a pool of 2 threads.
 * Returns the number of allocations that failed before it succeeded. */
static long update_after_failures(parity_model *m, const learner *L, parity_tensor_data *t,
                                  const held *before, uint32_t masters) {
    const weight *last = L->slots[L->n - 1].dst;
    const size_t last_count = (size_t)last->rows * last->cols;
    float *nan_last = malloc(last_count * 4), *values = malloc(last_count * 4);
    memcpy(nan_last, L->master[L->n - 1], last_count * 4);
    nan_last[0] = NAN;
    t[L->n - 1].data = nan_last;
    CHECK_STATUS(update_as(NULL, m, t, L->n, masters), PARITY_ERR_TENSOR_NONFINITE);
    CHECK(still_held(L, before));
    t[L->n - 1].data = L->master[L->n - 1];

    CHECK_OK(model_enter(m));
    CHECK_STATUS(update_as(NULL, m, t, L->n, masters), PARITY_ERR_BUSY);
    model_leave(m);
    CHECK(still_held(L, before));

    /* allocation k of the update fails, for k = 1, 2, ... until the update succeeds */
    long failed = 0;
    for (long k = 1; k < 10000; k++) {
        parity_pool *pool = NULL;
        CHECK_OK(parity_pool_create(2, &pool));
        px_alloc_test_reset(k);
        const int rc = update_as(pool, m, t, L->n, masters);
        px_alloc_test_reset(0);
        parity_pool_free(pool);
        if (rc == PARITY_OK) break;
        failed++;
        CHECK_INT(rc, PARITY_ERR_OUT_OF_MEMORY);
        CHECK(parity_last_error()[0] != '\0');
        CHECK_INT(parity_model_version(m), 0);
        CHECK(still_held(L, before));
        CHECK_OK(parity_model_weight_values(m, L->slots[L->n - 1].name, values, last_count));
    }
    free(values);
    free(nan_last);
    return failed;
}

/* The first update of fp32 masters on a model that owns its bf16 values (a synthetic one, or
 * one an earlier update copied): the RNE cast goes into the bf16 buffers the model holds and
 * the masters into new buffers, which later updates write in place; an update that fails
 * leaves the model as it was, buffers and values: a NaN in its last tensor, a call in flight
 * (it would overwrite the values a reader reads), out of memory at each of its allocations
 * in turn. */
static void test_first_update(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny", &m));
    if (!m) return;
    learner L, L2;
    learner_step(&L, m);
    learner_step(&L2, m);
    CHECK(L.n > 2 && L.n <= 128);
    held before;
    hold(&L, &before);
    for (size_t i = 0; i < L.n; i++) CHECK(model_owns(m, before.bf16[i]) && !before.master[i]);
    parity_tensor_data t[128];
    for (size_t i = 0; i < L.n; i++) t[i] = as_f32(&L, i);

    const long failed = update_after_failures(m, &L, t, &before, PARITY_MASTERS_KEEP);
    CHECK(failed >= 3); /* the staging, its ranges, a master at least */
    CHECK_INT(parity_model_version(m), 1);
    for (size_t i = 0; i < L.n; i++) {
        const weight *w = L.slots[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        CHECK(w->bf16 == before.bf16[i] && !memcmp(w->bf16, L.sent[i], count * 2));
        CHECK(w->master && model_owns(m, w->master) && !memcmp(w->master, L.master[i], count * 4));
    }

    /* the masters are kept: the next update writes both buffers in place */
    held first;
    hold(&L, &first);
    for (size_t i = 0; i < L2.n; i++) t[i] = as_f32(&L2, i);
    CHECK_OK(parity_model_update(m, t, L2.n));
    for (size_t i = 0; i < L2.n; i++) {
        const weight *w = L2.slots[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        CHECK(w->bf16 == first.bf16[i] && w->master == first.master[i]);
        CHECK(!memcmp(w->bf16, L2.sent[i], count * 2) && !memcmp(w->master, L2.master[i], count * 4));
    }
    held_free(&L, &first);
    held_free(&L, &before);
    learner_free(&L);
    learner_free(&L2);
    parity_model_free(m);
}

/* parity_model_update_with under `masters` of every tensor of L as fp32 (CHECK_OK). */
static void push_all_with(parity_model *m, const learner *L, uint32_t masters) {
    parity_tensor_data t[128];
    for (size_t i = 0; i < L->n; i++) t[i] = as_f32(L, i);
    CHECK_OK(parity_model_update_with(NULL, m, t, L->n, masters));
}

/* Whether the model holds master i of L: parity_weight_info says so and
 * parity_model_weight_values returns exactly L's fp32 values; else that it refuses them with
 * PARITY_ERR_NO_MASTERS rather than return the bf16 cast (want_master 0). */
static void check_master(parity_model *m, const learner *L, size_t i, int want_master) {
    const weight *w = L->slots[i].dst;
    const size_t count = (size_t)w->rows * w->cols;
    parity_weight_info info = {.size = sizeof info};
    CHECK_OK(parity_model_weight_info(m, L->slots[i].name, &info));
    CHECK_INT(info.has_master, want_master);
    float *values = malloc(count * 4);
    const int rc = parity_model_weight_values(m, L->slots[i].name, values, count);
    if (want_master) {
        CHECK_OK(rc);
        CHECK(!memcmp(values, L->master[i], count * 4));
    } else {
        CHECK_INT(rc, PARITY_ERR_NO_MASTERS);
        CHECK(strstr(parity_last_error(), L->slots[i].name) != NULL);
    }
    free(values);
}

/* Raw log-probs of a fixed sequence under `preset` on m (a scorer made for the call). */
static void score_preset(const parity_model *m, const char *preset, float lp[15]) {
    const int32_t tokens[16] = {1, 5, 9, 2, 7, 3, 8, 4, 6, 11, 13, 10, 12, 14, 15, 16};
    uint32_t len = 16;
    parity_scorer *s = new_scorer(m, (fixture){.policy = preset});
    if (s) score_raw(s, tokens, &len, 1, lp);
    parity_scorer_free(s);
}

/* PARITY_MASTERS_WHERE_READ: a learner's first sync of fp32 masters into a bf16 model whose
 * only reader is bf16 allocates no masters (parity_model_bytes' held unchanged: nothing new
 * but the casts into the bf16 buffers the model owns), fails all or nothing as a KEEP update
 * does (a NaN in its last tensor, a call in flight, out of memory at each of its allocations),
 * and every reader of the masters it dropped is then refused with PARITY_ERR_NO_MASTERS (fp32,
 * fp16 and quantized scorers, weight values and codes, save_as fp32 and fp8-block, a quantized
 * manifest) or reported by verify ("fp32 masters"), never served the bf16 cast; the bf16
 * policy, a bf16 manifest and save keep working. Where a reader was built before (a quantized
 * scorer: the linear weights; an fp32 scorer: every weight) the update keeps the masters, and
 * the readers give what a KEEP model gives bit for bit. A KEEP update brings the masters back. */
static void test_masters_where_read(void) {
    parity_model *m = NULL, *keep = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny", &m));
    CHECK_OK(parity_model_open("synthetic:tiny", &keep));
    if (!m || !keep) return;
    learner L, K;
    learner_step(&L, m);
    memcpy(K.slots, model_tensors(keep, &K.n), L.n * sizeof *L.slots);
    for (size_t i = 0; i < L.n; i++) K.master[i] = L.master[i], K.sent[i] = L.sent[i];
    push_all_with(keep, &K, PARITY_MASTERS_KEEP); /* the reference: masters kept */
    held before;
    hold(&L, &before);
    const parity_weight_bytes bytes_before = weight_bytes_of(m, "aligned", PARITY_BACKEND_BF16);
    parity_tensor_data t[128];
    for (size_t i = 0; i < L.n; i++) t[i] = as_f32(&L, i);

    CHECK_STATUS(parity_model_update_with(NULL, m, t, L.n, 2), PARITY_ERR_INVALID_ARGUMENT);
    const long failed = update_after_failures(m, &L, t, &before, PARITY_MASTERS_WHERE_READ);
    CHECK(failed >= 2); /* the staging and its ranges */
    CHECK_INT(parity_model_version(m), 1);
    const parity_weight_bytes bytes_after = weight_bytes_of(m, "aligned", PARITY_BACKEND_BF16);
    CHECK(bytes_after.held == bytes_before.held); /* no master allocated */
    for (size_t i = 0; i < L.n; i++) {
        const weight *w = L.slots[i].dst;
        CHECK(w->bf16 == before.bf16[i] && !w->master &&
              !memcmp(w->bf16, L.sent[i], (size_t)w->rows * w->cols * 2));
        check_master(m, &L, i, 0);
    }

    /* the bf16 policy reads what it read under KEEP; the readers of masters are refused */
    float lp[15], lp_keep[15];
    score_preset(m, "aligned", lp);
    score_preset(keep, "aligned", lp_keep);
    CHECK_BITS_F32(lp, lp_keep, 15, "bf16 scores after a WHERE_READ update vs KEEP");
    const char *refused[] = {"fp32", "hf-eager+fp16", "vllm+fp8-block:deepseek", "vllm+nvfp4:modelopt"};
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        parity_scorer_params p = scorer_params((fixture){.policy = refused[k]});
        parity_scorer *s = NULL;
        CHECK_STATUS(parity_scorer_create(m, &p, &s), PARITY_ERR_NO_MASTERS);
        CHECK(!s);
    }
    const size_t lin = slot_index(&L, "model.layers.0.mlp.up_proj.weight");
    const weight *wl = L.slots[lin].dst;
    const uint64_t n_codes = (uint64_t)wl->rows * wl->cols;
    const uint64_t n_scales = parity_quant_scale_count(PARITY_FP8Q_DEEPSEEK, wl->rows, wl->cols) + 1;
    uint8_t *codes = malloc(n_codes), *codes_keep = malloc(n_codes);
    float *scales = malloc(n_scales * 4), *scales_keep = malloc(n_scales * 4);
    CHECK_STATUS(parity_model_weight_codes(m, L.slots[lin].name, PARITY_FP8Q_DEEPSEEK, codes,
                                           n_codes, scales, n_scales),
                 PARITY_ERR_NO_MASTERS);
    char tmp[] = "/tmp/parity-masters-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    char qpath[sizeof tmp + 32], bpath[sizeof tmp + 32];
    snprintf(qpath, sizeof qpath, "%s/fp8.json", tmp);
    snprintf(bpath, sizeof bpath, "%s/bf16.json", tmp);
    CHECK_STATUS(parity_model_save_as(m, tmp, "fp32"), PARITY_ERR_NO_MASTERS);
    CHECK_STATUS(parity_model_save_as(m, tmp, "fp8-block:deepseek"), PARITY_ERR_NO_MASTERS);
    CHECK_OK(parity_model_save_as(m, tmp, "bf16"));
    parity_policy fp8;
    CHECK_OK(parity_policy_from_name("vllm+fp8-block:deepseek", &fp8));
    CHECK_STATUS(parity_model_write_manifest_for(m, &fp8, qpath), PARITY_ERR_NO_MASTERS);
    write_manifest(&L, 1, bpath); /* the learner's bf16 manifest verifies */
    char report[8192];
    CHECK_OK(verify(m, bpath, report, sizeof report));
    /* a quantized learner's manifest: the codes the sampler would have to make from the bf16
     * cast are not compared, each on an "fp32 masters" line */
    CHECK_OK(parity_model_write_manifest_for(keep, &fp8, qpath));
    CHECK_OK(parity_model_verify_for(keep, &fp8, qpath, report, sizeof report));
    CHECK_STATUS(parity_model_verify_for(m, &fp8, qpath, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "model.layers.0.mlp.up_proj.weight: fp32 masters") != NULL);
    CHECK(!strstr(report, "codes differ") && !strstr(report, "quantizer identity"));

    /* a KEEP update brings the masters back, and with them every reader */
    push_all_with(m, &L, PARITY_MASTERS_KEEP);
    for (size_t i = 0; i < L.n; i++) check_master(m, &L, i, 1);
    score_preset(m, "fp32", lp);
    score_preset(keep, "fp32", lp_keep);
    CHECK_BITS_F32(lp, lp_keep, 15, "fp32 scores after a KEEP update restores the masters");
    parity_model_free(m);

    /* readers built before the update keep the masters they read: a quantized scorer the
     * linear weights' (the rest dropped), an fp32 one every weight's */
    const char *first[] = {"vllm+fp8-block:deepseek", "fp32"};
    for (int k = 0; k < 2; k++) {
        m = NULL;
        CHECK_OK(parity_model_open("synthetic:tiny", &m));
        if (!m) break;
        learner R;
        memcpy(R.slots, model_tensors(m, &R.n), L.n * sizeof *L.slots);
        for (size_t i = 0; i < L.n; i++) R.master[i] = L.master[i], R.sent[i] = L.sent[i];
        parity_scorer *s = new_scorer(m, (fixture){.policy = first[k]});
        push_all_with(m, &R, PARITY_MASTERS_WHERE_READ);
        for (size_t i = 0; i < R.n; i++) check_master(m, &R, i, k == 1 || R.slots[i].linear);
        const int32_t tokens[16] = {1, 5, 9, 2, 7, 3, 8, 4, 6, 11, 13, 10, 12, 14, 15, 16};
        uint32_t len = 16;
        if (s) score_raw(s, tokens, &len, 1, lp);
        score_preset(keep, first[k], lp_keep);
        CHECK_BITS_F32(lp, lp_keep, 15, "a reader built before a WHERE_READ update vs KEEP");
        parity_scorer_free(s);
        if (k == 0) {
            CHECK_OK(parity_model_weight_codes(m, R.slots[lin].name, PARITY_FP8Q_DEEPSEEK, codes,
                                               n_codes, scales, n_scales));
            CHECK_OK(parity_model_weight_codes(keep, K.slots[lin].name, PARITY_FP8Q_DEEPSEEK,
                                               codes_keep, n_codes, scales_keep, n_scales));
            CHECK(!memcmp(codes, codes_keep, n_codes) &&
                  !memcmp(scales, scales_keep, n_scales * 4));
            CHECK_OK(parity_model_write_manifest_for(m, &fp8, qpath));
            CHECK_OK(parity_model_verify_for(keep, &fp8, qpath, report, sizeof report));
        }
        parity_model_free(m);
    }
    char path[sizeof tmp + 64];
    const char *files[] = {"fp8.json", "bf16.json", "config.json", "model.safetensors"};
    for (size_t k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/%s", tmp, files[k]);
        remove(path);
    }
    rmdir(tmp);
    free(codes);
    free(codes_keep);
    free(scales);
    free(scales_keep);
    held_free(&L, &before);
    learner_free(&L);
    parity_model_free(keep);
}

static const char *model_dir(void) {
    static char dir[4096];
    return source_path(dir, sizeof dir, TRAINED_MODEL);
}

int main(void) {
    char tmp[] = "/tmp/parity-update-XXXXXX", manifest[4200], report[8192];
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", tmp);

    parity_model *m = NULL;
    CHECK_OK(parity_model_load(model_dir(), &m));
    if (!m) return check_report("update");
    CHECK_INT(parity_model_version(m), 0);
    learner L;
    learner_step(&L, m);

    /* parity_tensor_checksum: the learner's FNV-1a of RNE(master), from the fp32 masters, from
     * the bf16 values, and from f16 data (RNE of its exact fp32 value), at any alignment */
    for (size_t i = 0; i < L.n; i++) {
        size_t count = (size_t)((const weight *)L.slots[i].dst)->rows *
                       ((const weight *)L.slots[i].dst)->cols;
        uint64_t want = learner_fnv(L.sent[i], count), got = 0;
        CHECK_OK(parity_tensor_checksum(PARITY_DTYPE_F32, L.master[i], count, &got));
        CHECK(got == want);
        CHECK_OK(parity_tensor_checksum(PARITY_DTYPE_BF16, L.sent[i], count, &got));
        CHECK(got == want);
        if (i == 0) {
            unsigned char *odd = malloc(count * 4 + 1);
            memcpy(odd + 1, L.master[i], count * 4);
            CHECK_OK(parity_tensor_checksum(PARITY_DTYPE_F32, odd + 1, count, &got));
            CHECK(got == want);
            uint16_t *half = malloc(count * 2), *via_half = malloc(count * 2);
            for (size_t k = 0; k < count; k++) {
                half[k] = to_f16(L.master[i][k]);
                uint32_t sign = (uint32_t)(half[k] & 0x8000u) << 16;
                uint32_t e = (half[k] >> 10) & 0x1fu, mant = half[k] & 0x3ffu;
                uint32_t u = e ? sign | ((e - 15 + 127) << 23) | (mant << 13) : sign;
                float f;
                memcpy(&f, &u, 4);
                via_half[k] = learner_rne(f);
            }
            CHECK_OK(parity_tensor_checksum(PARITY_DTYPE_F16, half, count, &got));
            CHECK(got == learner_fnv(via_half, count));
            CHECK(got != want); /* f16 lost bits of the masters: another checksum */
            free(odd);
            free(half);
            free(via_half);
        }
    }
    uint64_t empty = 1;
    CHECK_OK(parity_tensor_checksum(PARITY_DTYPE_BF16, NULL, 0, &empty));
    CHECK(empty == 0xcbf29ce484222325ull);
    CHECK_STATUS(parity_tensor_checksum(4, L.master[0], 1, &empty), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_tensor_checksum(PARITY_DTYPE_F32, NULL, 1, &empty),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_tensor_checksum(PARITY_DTYPE_F32, L.master[0], 1, NULL),
                 PARITY_ERR_INVALID_ARGUMENT);

    /* version 2 (parity_tensor_checksums): the learner's chunked FNV-1a, on no pool and on
     * pools of 1, 2 and 3 threads alike; a buffer of 5 chunks and a tail (four chunks hashed
     * at once, the rest one by one) and every weight, from fp32 masters and from bf16 */
    {
        const size_t big_n = 5 * 32768 + 777;
        float *big = malloc(big_n * 4);
        uint16_t *big_bf16 = malloc(big_n * 2);
        for (size_t k = 0; k < big_n; k++) big_bf16[k] = learner_rne(big[k] = noise());
        parity_tensor_data t[2 * 128 + 2];
        uint64_t want[2 * 128 + 2], got[2 * 128 + 2];
        size_t k = 0;
        t[k] = (parity_tensor_data){NULL, PARITY_DTYPE_F32, 1, {big_n, 1}, big};
        want[k++] = learner_fnv_chunked(big_bf16, big_n);
        t[k] = (parity_tensor_data){NULL, PARITY_DTYPE_BF16, 2, {5, big_n / 5}, big_bf16};
        want[k++] = learner_fnv_chunked(big_bf16, big_n / 5 * 5);
        for (size_t i = 0; i < L.n; i++) {
            const weight *w = L.slots[i].dst;
            t[k] = (parity_tensor_data){NULL, PARITY_DTYPE_F32, 2, {w->rows, w->cols}, L.master[i]};
            want[k++] = learner_fnv_chunked(L.sent[i], (size_t)w->rows * w->cols);
            t[k] = (parity_tensor_data){NULL, PARITY_DTYPE_BF16, 1, {(uint64_t)w->rows * w->cols, 1},
                                        L.sent[i]};
            want[k++] = learner_fnv_chunked(L.sent[i], (size_t)w->rows * w->cols);
        }
        for (uint32_t threads = 0; threads <= 3; threads++) {
            parity_pool *pool = NULL;
            if (threads) CHECK_OK(parity_pool_create(threads, &pool));
            memset(got, 0, sizeof got);
            CHECK_OK(parity_tensor_checksums(pool, 2, t, k, got));
            for (size_t i = 0; i < k; i++) CHECK(got[i] == want[i]);
            /* and version 1 on the pool: parity_tensor_checksum's */
            CHECK_OK(parity_tensor_checksums(pool, 1, t, 1, got));
            CHECK(got[0] == learner_fnv(big_bf16, big_n));
            parity_pool_free(pool);
        }
        CHECK_STATUS(parity_tensor_checksums(NULL, 3, t, 1, got), PARITY_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(parity_tensor_checksums(NULL, 0, t, 1, got), PARITY_ERR_INVALID_ARGUMENT);
        t[0].ndim = 3;
        CHECK_STATUS(parity_tensor_checksums(NULL, 2, t, 1, got), PARITY_ERR_INVALID_ARGUMENT);
        free(big);
        free(big_bf16);
    }

    /* the correct path: every tensor from fp32 masters, then verify: no difference; the
     * checkpoint's mapped bf16 values are never written: the first update gives the weights
     * new buffers */
    const weight *mapped_w = L.slots[0].dst;
    const uint16_t *mapped = mapped_w->bf16;
    const size_t mapped_count = (size_t)mapped_w->rows * mapped_w->cols;
    uint16_t *mapped_values = malloc(mapped_count * 2);
    memcpy(mapped_values, mapped, mapped_count * 2);
    CHECK(!model_owns(m, mapped));
    push_all(m, &L);
    CHECK(mapped_w->bf16 != mapped && model_owns(m, mapped_w->bf16));
    CHECK(!memcmp(mapped, mapped_values, mapped_count * 2));
    CHECK(!memcmp(mapped_w->bf16, L.sent[0], mapped_count * 2));
    free(mapped_values);
    CHECK_INT(parity_model_version(m), 1);
    write_manifest(&L, 1, manifest);
    CHECK_OK(verify(m, manifest, report, sizeof report));
    CHECK_INT(strlen(report), 0);
    /* the library's own manifest of the same weights is the learner's, byte for byte in meaning */
    char own[4200];
    snprintf(own, sizeof own, "%s/own.json", tmp);
    CHECK_OK(parity_model_write_manifest(m, own));
    CHECK_OK(verify(m, own, report, sizeof report));
    /* ... the same file written on pools of 1 and 3 threads, verified on them */
    {
        char *text = slurp(own);
        CHECK(text && strstr(text, "{\"version\": 1, \"manifest_version\": 2, ") == text);
        for (uint32_t threads = 1; threads <= 3; threads += 2) {
            parity_pool *pool = NULL;
            CHECK_OK(parity_pool_create(threads, &pool));
            CHECK_OK(parity_model_write_manifest_on(pool, m, NULL, 2, own));
            char *again = slurp(own);
            CHECK(text && again && !strcmp(text, again));
            free(again);
            CHECK_OK(parity_model_verify_on(pool, m, NULL, manifest, report, sizeof report));
            CHECK_OK(parity_model_verify_on(pool, m, NULL, own, report, sizeof report));
            parity_pool_free(pool);
        }
        CHECK_STATUS(parity_model_write_manifest_on(NULL, m, NULL, 3, own),
                     PARITY_ERR_INVALID_ARGUMENT);
        free(text);
        CHECK_OK(parity_model_write_manifest(m, own));
    }

    /* the fp32 masters are the fp32 policy's weights; bf16 policies read RNE(master) */
    int32_t probe_tokens[48];
    for (int i = 0; i < 48; i++) probe_tokens[i] = "def parse(self, text):\n    return self.items[0]"[i];
    float expected_lp[47];
    parity_scorer *scorer = new_scorer(m, (fixture){0});
    uint32_t len = 48;
    score_raw(scorer, probe_tokens, &len, 1, expected_lp);
    CHECK_OK(parity_scorer_probe(scorer, probe_tokens, 48, expected_lp));

    /* failure kinds, one by one, each reported by verify against the learner's manifest */
    /* q_proj is [256, 256] in this model: square */
    const size_t q0 = slot_index(&L, "model.layers.0.self_attn.q_proj.weight");
    const expected *e = &L.slots[q0];
    size_t count = (size_t)e->rows * e->cols;
    uint16_t *buf16 = malloc(count * 2);

    /* a wrong dtype cast: the learner cast its masters to fp16 and sent those */
    for (size_t k = 0; k < count; k++) buf16[k] = to_f16(L.master[q0][k]);
    parity_tensor_data t = {e->name, PARITY_DTYPE_F16, 2, {e->rows, e->cols}, buf16};
    CHECK_OK(parity_model_update(m, &t, 1));
    write_manifest(&L, parity_model_version(m), manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "q_proj.weight: checksum differs") != NULL);
    CHECK_STATUS(parity_scorer_probe(scorer, probe_tokens, 48, expected_lp), PARITY_ERR_VERIFY);
    push_all(m, &L);

    /* truncation instead of round-to-nearest-even */
    for (size_t k = 0; k < count; k++) buf16[k] = learner_truncate(L.master[q0][k]);
    t = (parity_tensor_data){e->name, PARITY_DTYPE_BF16, 2, {e->rows, e->cols}, buf16};
    CHECK_OK(parity_model_update(m, &t, 1));
    write_manifest(&L, parity_model_version(m), manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "layers.0.self_attn.q_proj.weight: checksum differs") != NULL);
    push_all(m, &L);

    /* a transposed view: right shape (square), the data of the transpose */
    float *tr = malloc(count * 4);
    for (size_t r = 0; r < e->rows; r++)
        for (size_t c = 0; c < e->cols; c++) tr[c * e->rows + r] = L.master[q0][r * e->cols + c];
    t = (parity_tensor_data){e->name, PARITY_DTYPE_F32, 2, {e->rows, e->cols}, tr};
    CHECK_OK(parity_model_update(m, &t, 1));
    write_manifest(&L, parity_model_version(m), manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "q_proj.weight: checksum differs") != NULL);
    /* ... and of a non-square matrix, a transposed shape is refused at the update */
    const size_t iu = slot_index(&L, "model.layers.0.mlp.up_proj.weight"); /* [768, 256] */
    const expected *up = &L.slots[iu];
    t = (parity_tensor_data){up->name, PARITY_DTYPE_F32, 2, {up->cols, up->rows}, L.master[iu]};
    CHECK_STATUS(parity_model_update(m, &t, 1), PARITY_ERR_TENSOR_SHAPE);
    push_all(m, &L);

    /* a skipped tensor: the learner stepped again, the push missed one tensor */
    learner L2;
    learner_step(&L2, m);
    parity_tensor_data all[128];
    size_t n = 0;
    for (size_t i = 0; i < L2.n; i++)
        if (i != 20) all[n++] = as_f32(&L2, i);
    CHECK_OK(parity_model_update(m, all, n));
    write_manifest(&L2, parity_model_version(m), manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    char want[200];
    snprintf(want, sizeof want, "%s: checksum differs", L2.slots[20].name);
    CHECK(strstr(report, want) != NULL);
    CHECK(strchr(report, '\n') == report + strlen(report) - 1); /* exactly one line */

    /* a stale shard: the last layers (one shard's worth) still hold the previous step */
    n = 0;
    for (size_t i = 0; i < L2.n; i++)
        all[n++] = i < L2.n - 40 ? as_f32(&L2, i) : as_f32(&L, i);
    CHECK_OK(parity_model_update(m, all, n));
    write_manifest(&L2, parity_model_version(m), manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    /* every stale tensor whose bf16 values changed in the step (norm weights near 1 did not
     * move by half a bf16 ulp) is reported, and nothing else */
    unsigned stale = 0;
    for (size_t i = L2.n - 40; i < L2.n; i++) {
        const weight *w = L2.slots[i].dst;
        stale += memcmp(L.sent[i], L2.sent[i], (size_t)w->rows * w->cols * 2) != 0;
    }
    snprintf(want, sizeof want, "%u differences", stale);
    CHECK(stale >= 20 && strstr(parity_last_error(), want) != NULL);

    /* a version that differs (everything else right) */
    push_all(m, &L2);
    write_manifest(&L2, parity_model_version(m) + 5, manifest);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    CHECK(strstr(report, "version:") == report);
    write_manifest(&L2, parity_model_version(m), manifest);
    CHECK_OK(verify(m, manifest, report, sizeof report));

    /* all or nothing: a bad tensor in a batch leaves every tensor as it was */
    uint64_t v = parity_model_version(m);
    float *bad = malloc(count * 4);
    memcpy(bad, L.master[q0], count * 4);
    bad[7] = NAN;
    parity_tensor_data mixed[2] = {as_f32(&L, 1), {e->name, PARITY_DTYPE_F32, 2, {e->rows, e->cols}, bad}};
    CHECK_STATUS(parity_model_update(m, mixed, 2), PARITY_ERR_TENSOR_NONFINITE);
    bad[7] = 3.4e38f; /* finite in fp32, beyond bf16 */
    CHECK_STATUS(parity_model_update(m, mixed, 2), PARITY_ERR_TENSOR_NONFINITE);
    mixed[1].name = "model.layers.0.mlp.nonsense.weight";
    CHECK_STATUS(parity_model_update(m, mixed, 2), PARITY_ERR_TENSOR_UNEXPECTED);
    mixed[1] = mixed[0];
    CHECK_STATUS(parity_model_update(m, mixed, 2), PARITY_ERR_ST_DUPLICATE);
    CHECK_STATUS(parity_model_update(m, mixed, 0), PARITY_ERR_EMPTY_INPUT);
    CHECK_INT(parity_model_version(m), v);
    CHECK_OK(verify(m, manifest, report, sizeof report));

    /* an update while a call holds the model is refused, and vice versa */
    CHECK_OK(model_enter(m));
    CHECK_STATUS(parity_model_update(m, all, 1), PARITY_ERR_BUSY);
    model_leave(m);

    /* a KV cache computed under old weights is refused */
    parity_sampler *s = new_sampler(m, (fixture){.max_seqs = 2, .max_len = 64});
    parity_sampling g;
    parity_sampling_default(&g);
    uint32_t seq;
    CHECK_OK(parity_sampler_add(s, probe_tokens, 10, &g, 0, &seq));
    parity_seq_info info = {.size = sizeof info};
    CHECK_OK(parity_sampler_seq_info(s, seq, &info));
    CHECK_INT(info.model_version, parity_model_version(m)); /* results carry their version */
    CHECK_INT(info.len, 10);
    push_all(m, &L);
    int32_t tok;
    float lp;
    uint32_t fin;
    CHECK_STATUS(parity_sampler_step(s, &seq, 1, &tok, &lp, &fin, 0, NULL, NULL), PARITY_ERR_STALE);
    CHECK_OK(parity_sampler_release(s, seq));
    CHECK_OK(parity_sampler_add(s, probe_tokens, 10, &g, 0, &seq));
    CHECK_OK(parity_sampler_step(s, &seq, 1, &tok, &lp, &fin, 0, NULL, NULL));
    CHECK_OK(parity_sampler_seq_info(s, seq, &info));
    CHECK_INT(info.model_version, parity_model_version(m));
    CHECK_INT(info.len, 11);
    info.size = 3;
    CHECK_STATUS(parity_sampler_seq_info(s, seq, &info), PARITY_ERR_INVALID_ARGUMENT);
    parity_sampler_free(s);

    /* manifests that are not manifests */
    FILE *f = fopen(manifest, "w");
    fputs("{\"tensors\": []}", f);
    fclose(f);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_VERIFY);
    f = fopen(manifest, "w");
    fputs("{\"version\": 1, ", f);
    fclose(f);
    CHECK_STATUS(parity_model_verify(m, manifest, report, sizeof report), PARITY_ERR_JSON_SYNTAX);
    snprintf(want, sizeof want, "%s/none.json", tmp);
    CHECK_STATUS(parity_model_verify(m, want, report, sizeof report), PARITY_ERR_IO);

    /* Updates after the first write into the buffers the model already owns: the same
     * pointers, the new values (the RNE cast and the fp32 master), and a BF16 update drops the
     * master; a failed update leaves the old values in those buffers. */
    {
        const size_t i = slot_index(&L, "model.layers.2.mlp.up_proj.weight");
        const weight *w = L.slots[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        parity_tensor_data one = as_f32(&L2, i);
        CHECK_OK(parity_model_update(m, &one, 1));
        const uint16_t *bf16_before = w->bf16;
        const float *master_before = w->master;
        CHECK(model_owns(m, bf16_before) && model_owns(m, master_before));
        one = as_f32(&L, i);
        CHECK_OK(parity_model_update(m, &one, 1));
        CHECK(w->bf16 == bf16_before && w->master == master_before);
        CHECK(memcmp(w->bf16, L.sent[i], count * 2) == 0);
        CHECK(memcmp(w->master, L.master[i], count * 4) == 0);
        float *nan_one = malloc(count * 4);
        memcpy(nan_one, L2.master[i], count * 4);
        nan_one[count - 1] = NAN;
        parity_tensor_data two[2] = {as_f32(&L2, 0), as_f32(&L2, i)};
        two[1].data = nan_one;
        CHECK_STATUS(parity_model_update(m, two, 2), PARITY_ERR_TENSOR_NONFINITE);
        CHECK(memcmp(w->bf16, L.sent[i], count * 2) == 0);
        CHECK(memcmp(w->master, L.master[i], count * 4) == 0);
        one = (parity_tensor_data){L.slots[i].name, PARITY_DTYPE_BF16, 2, {w->rows, w->cols},
                                   L2.sent[i]};
        CHECK_OK(parity_model_update(m, &one, 1));
        CHECK(w->bf16 == bf16_before && w->master == NULL);
        CHECK(memcmp(w->bf16, L2.sent[i], count * 2) == 0);
        free(nan_one);
    }

    parity_scorer_free(scorer);

    /* an fp16 policy on an updated model: the fp16 copies follow each update (the masters
     * rounded once to fp16), an update the fp16 copies cannot hold is refused whole, and the
     * scores equal those of a model loaded fresh with the same masters */
    {
        parity_scorer *s16 = new_scorer(m, (fixture){.policy = "hf-eager+fp16"});
        parity_scorer *s8 = new_scorer(m, (fixture){.policy = "vllm+fp8-block:deepseek"});
        const size_t i = slot_index(&L2, "model.layers.0.mlp.down_proj.weight");
        const weight *w = L2.slots[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        CHECK(s16 != NULL && w->fp16 != NULL);
        if (s16 && w->fp16) {
            push_all(m, &L2);
            int copies_follow = 1;
            for (size_t k = 0; k < count; k++)
                copies_follow &= w->fp16[k] == parity_fp16_to_f32(parity_fp16_from_f32(L2.master[i][k]));
            CHECK(copies_follow);
            float *big = malloc(count * 4);
            memcpy(big, L.master[i], count * 4);
            big[3] = 70000.0f; /* a bf16 value, beyond fp16's range */
            parity_tensor_data two[2] = {as_f32(&L, 0), as_f32(&L, i)};
            two[1].data = big;
            const uint64_t version = parity_model_version(m);
            CHECK_STATUS(parity_model_update(m, two, 2), PARITY_ERR_TENSOR_NONFINITE);
            CHECK(strstr(parity_last_error(), "fp16") != NULL);
            CHECK_INT(parity_model_version(m), version);
            CHECK(memcmp(w->master, L2.master[i], count * 4) == 0);
            float lp_updated[47], lp_fresh[47];
            uint32_t len = 48;
            score_raw(s16, probe_tokens, &len, 1, lp_updated);
            parity_model *fresh = NULL;
            CHECK_OK(parity_model_load(model_dir(), &fresh));
            if (fresh) {
                push_all(fresh, &L2);
                parity_scorer *f16 = new_scorer(fresh, (fixture){.policy = "hf-eager+fp16"});
                score_raw(f16, probe_tokens, &len, 1, lp_fresh);
                CHECK_BITS_F32(lp_updated, lp_fresh, 47, "fp16 scores after updates vs a fresh model");
                parity_scorer_free(f16);
                /* the fp8 copies are requantized from the new masters too */
                float lp8_updated[47], lp8_fresh[47];
                score_raw(s8, probe_tokens, &len, 1, lp8_updated);
                parity_scorer *f8 = new_scorer(fresh, (fixture){.policy = "vllm+fp8-block:deepseek"});
                score_raw(f8, probe_tokens, &len, 1, lp8_fresh);
                CHECK_BITS_F32(lp8_updated, lp8_fresh, 47, "fp8 scores after updates vs a fresh model");
                parity_scorer_free(f8);
                parity_model_free(fresh);
            }
            free(big);
        }
        parity_scorer_free(s16);
        parity_scorer_free(s8);
    }

    parity_model_free(m);
    learner_free(&L);
    learner_free(&L2);
    test_first_update();
    test_masters_where_read();
    free(buf16);
    free(tr);
    free(bad);
    remove(manifest);
    remove(own);
    rmdir(tmp);
    return check_report("update");
}
