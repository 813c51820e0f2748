/* Weight sync of quantized weights, as an FP8 RL loop runs it: the learner quantizes its fp32
 * masters with its rule and writes a manifest of the codes and scales its GEMMs read
 * (parity_model_write_manifest_for); the sampler receives either the masters (and quantizes
 * them itself) or the codes and scales (an F8_E4M3 update, as a block-FP8 checkpoint holds
 * them), and verifies against the manifest with its own policy (parity_model_verify_for).
 * Each check is provoked by exactly its failure and must give exactly its report lines:
 * codes, scales, scale format (dtype, powers of two), block geometry, quantizer identity
 * (the sampler re-quantizing with power-of-two scales, as engines re-quantize FP8 weights to
 * UE8M0), layers kept in bf16 (both directions), version; and the log-prob probe. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "model/model.h"

#define SEQ_LEN 40
#define N_LINEAR 14 /* tiny: 2 layers x 7 linear weights */
#define GATE0 "model.layers.0.mlp.gate_proj.weight"
#define Q0 "model.layers.0.self_attn.q_proj.weight"

static char dir[64];
static int32_t tokens[SEQ_LEN];

/* ---- the learner ------------------------------------------------------------------------- */

/* A model whose weights are fp32 masters: tiny's bf16 values plus a small perturbation below
 * bf16's precision, pushed as F32 (so that quantizing from the masters differs from
 * quantizing from their bf16 cast). */
static parity_model *learner_model(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:7", &m));
    if (!m) return NULL;
    size_t n;
    const expected *e = model_tensors(m, &n);
    parity_tensor_data *t = calloc(n, sizeof *t);
    float **bufs = calloc(n, sizeof *bufs);
    for (size_t i = 0; i < n; i++) {
        const weight *w = e[i].dst;
        const size_t count = (size_t)w->rows * w->cols;
        bufs[i] = malloc(count * sizeof(float));
        for (size_t k = 0; k < count; k++) {
            const float v = parity_bf16_to_f32(w->bf16[k]);
            bufs[i][k] = v + v * 0x1p-11f * (float)((int)((k * 2654435761u) >> 29) - 4);
        }
        t[i] = (parity_tensor_data){e[i].name, PARITY_DTYPE_F32, e[i].rows ? 2u : 1u,
                                    {e[i].rows ? w->rows : w->cols, w->cols}, bufs[i]};
    }
    CHECK_OK(parity_model_update(m, t, n));
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    free(t);
    return m;
}

/* The masters of `from` pushed into `to` as F32 (the sampler receives unquantized weights). */
static void push_masters(parity_model *to, const parity_model *from) {
    size_t n;
    const expected *e = model_tensors(from, &n);
    parity_tensor_data *t = calloc(n, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const weight *w = e[i].dst;
        t[i] = (parity_tensor_data){e[i].name, PARITY_DTYPE_F32, e[i].rows ? 2u : 1u,
                                    {e[i].rows ? w->rows : w->cols, w->cols}, w->master};
    }
    CHECK_OK(parity_model_update(to, t, n));
    free(t);
}

/* The learner's codes and scales of one linear weight under a block rule, made with the
 * public quantizer from its masters; optionally changed, and pushed to the sampler as an
 * F8_E4M3 update with F32 (or BF16-rounded) scales. */
typedef struct shipment {
    uint8_t *codes;
    float *scales;
    uint16_t *scales_bf16;
    uint32_t rows, cols, grid_rows, grid_cols;
} shipment;

static shipment quantize(const parity_model *L, const char *name, int rule) {
    const weight *w = model_find_tensor(L, name)->dst;
    shipment s = {0};
    s.rows = w->rows;
    s.cols = w->cols;
    s.grid_rows = (w->rows + 127) / 128;
    s.grid_cols = (w->cols + 127) / 128;
    s.codes = malloc((size_t)w->rows * w->cols);
    s.scales = malloc((size_t)s.grid_rows * s.grid_cols * sizeof(float));
    s.scales_bf16 = malloc((size_t)s.grid_rows * s.grid_cols * 2);
    CHECK_OK(parity_fp8_quantize_blocks(rule, w->rows, w->cols, w->master, w->cols, 128, 128,
                                        s.codes, w->cols, s.scales));
    for (size_t i = 0; i < (size_t)s.grid_rows * s.grid_cols; i++)
        s.scales_bf16[i] = parity_bf16_from_f32(s.scales[i]);
    return s;
}

static void shipment_free(shipment *s) {
    free(s->codes);
    free(s->scales);
    free(s->scales_bf16);
}

/* Every linear weight of L shipped to S with `rule`; `tweak` may change one (by name). */
typedef void tweak_fn(const char *name, shipment *s, int *bf16_scales);
static void ship_all(parity_model *S, const parity_model *L, int rule, tweak_fn *tweak) {
    size_t n;
    const expected *e = model_tensors(L, &n);
    parity_tensor_data t[2 * N_LINEAR];
    shipment sh[N_LINEAR];
    char names[N_LINEAR][160];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!e[i].linear) continue;
        shipment *s = &sh[k / 2];
        *s = quantize(L, e[i].name, rule);
        int bf16_scales = 0;
        if (tweak) tweak(e[i].name, s, &bf16_scales);
        char *scale_name = names[k / 2];
        snprintf(scale_name, sizeof names[0], "%s_scale_inv", e[i].name);
        t[k] = (parity_tensor_data){e[i].name, PARITY_DTYPE_F8_E4M3, 2, {s->rows, s->cols}, s->codes};
        t[k + 1] = (parity_tensor_data){scale_name, bf16_scales ? PARITY_DTYPE_BF16 : PARITY_DTYPE_F32,
                                        2, {s->grid_rows, s->grid_cols},
                                        bf16_scales ? (const void *)s->scales_bf16 : (const void *)s->scales};
        k += 2;
    }
    CHECK_INT(k, 2 * N_LINEAR);
    CHECK_OK(parity_model_update(S, t, k));
    for (size_t i = 0; i < k / 2; i++) shipment_free(&sh[i]);
}

/* ---- manifests and reports --------------------------------------------------------------- */

static parity_policy policy(const char *name) {
    parity_policy p;
    CHECK_OK(parity_policy_from_name(name, &p));
    return p;
}

/* The learner's manifest under its policy, with the version set to `version` (the sampler's:
 * the version check is tested on its own). */
static void write_manifest(const parity_model *L, const char *pol_name, uint64_t version,
                           const char *path) {
    parity_policy p = policy(pol_name);
    CHECK_OK(parity_model_write_manifest_for(L, &p, path));
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 20);
    size_t len = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    const char *rest = strstr(text, ", ");
    f = fopen(path, "wb");
    if (f && rest) {
        fprintf(f, "{\"version\": %" PRIu64 "%s", version, rest);
        fclose(f);
    }
    CHECK(len > 0 && rest);
    free(text);
}

/* Replaces the first `from` after `anchor` in the file by `to`. */
static void patch(const char *path, const char *anchor, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    char *text = calloc(1, 1 << 20);
    size_t len = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    char *a = strstr(text, anchor), *p = a ? strstr(a, from) : NULL;
    CHECK(len && p);
    if (!p) {
        free(text);
        return;
    }
    f = fopen(path, "wb");
    fwrite(text, 1, (size_t)(p - text), f);
    fputs(to, f);
    fputs(p + strlen(from), f);
    fclose(f);
    free(text);
}

/* Verifies S under `pol_name` (NULL: no policy) and checks the report: exactly `lines` lines,
 * each holding `needle` (and `needle2` when given); 0 lines: PARITY_OK. */
static void expect_report(const parity_model *S, const char *pol_name, const char *manifest,
                          unsigned lines, const char *needle, const char *needle2,
                          const char *what) {
    char report[1 << 15];
    parity_policy p;
    if (pol_name) p = policy(pol_name);
    const int rc = parity_model_verify_for(S, pol_name ? &p : NULL, manifest, report, sizeof report);
    CHECK_STATUS(rc, lines ? PARITY_ERR_VERIFY : PARITY_OK);
    unsigned count = 0, matching = 0;
    for (const char *line = report; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)n, line);
        count++;
        matching += (!needle || strstr(buf, needle)) && (!needle2 || strstr(buf, needle2));
        line += n + (end != NULL);
    }
    CHECK_INT(count, lines);
    CHECK_INT(matching, lines);
    if (count != lines || matching != lines)
        fprintf(stderr, "  %s: %u lines (%u matching '%s'), expected %u:\n%s", what, count, matching,
                needle ? needle : "", lines, report);
    else if (lines)
        printf("  %-22s %.*s\n", what, (int)(strchr(report, '\n') - report), report);
}

/* ---- tweaks: one failure each ------------------------------------------------------------- */

static void flip_one_code(const char *name, shipment *s, int *bf16) {
    (void)bf16;
    if (!strcmp(name, GATE0)) s->codes[5] ^= 1;
}
static void nudge_one_scale(const char *name, shipment *s, int *bf16) {
    (void)bf16;
    if (!strcmp(name, GATE0)) s->scales[1] = nextafterf(s->scales[1], INFINITY);
}
static void bf16_scales_one(const char *name, shipment *s, int *bf16) {
    (void)s;
    if (!strcmp(name, GATE0)) *bf16 = 1;
}

/* ---- the scores --------------------------------------------------------------------------- */

static void scores(const parity_model *m, const char *pol, float *lp) {
    parity_scorer *s = new_scorer(m, (fixture){.policy = pol, .n_threads = 2, .max_tokens = 64});
    uint32_t len = SEQ_LEN;
    memset(lp, 0xff, (SEQ_LEN - 1) * sizeof *lp);
    if (s) score_raw(s, tokens, &len, 1, lp);
    parity_scorer_free(s);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/parity-sync-fp8-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    char manifest[128];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    for (int i = 0; i < SEQ_LEN; i++) tokens[i] = (i * 53 + 7) % 256;
    int deepseek = -1, te_pow2 = -1;
    CHECK_OK(parity_fp8_quantizer_from_name(0, "deepseek", &deepseek));
    CHECK_OK(parity_fp8_quantizer_from_name(0, "te-pow2", &te_pow2));

    parity_model *L = learner_model();
    parity_model *S = NULL, *Q = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:7", &S)); /* receives the masters */
    CHECK_OK(parity_model_open("synthetic:tiny:7", &Q)); /* receives codes and scales */
    if (!L || !S || !Q) return check_report("sync_fp8");
    push_masters(S, L);
    push_masters(Q, L);
    ship_all(Q, L, deepseek, NULL);
    const char *ds = "vllm+fp8-block:deepseek";

    /* the manifest's entry of one weight is the learner's codes and scales, checksummed */
    write_manifest(L, ds, 1, manifest);
    {
        shipment s = quantize(L, GATE0, deepseek);
        uint64_t c = 0, sc = 0;
        /* (the checksums of the manifest version the library writes) */
        const parity_tensor_data sums[2] = {
            {NULL, PARITY_DTYPE_F8_E4M3, 1, {(uint64_t)s.rows * s.cols, 1}, s.codes},
            {NULL, PARITY_DTYPE_F8_E4M3, 1, {(uint64_t)s.grid_rows * s.grid_cols * 4, 1}, s.scales}};
        uint64_t both[2];
        CHECK_OK(parity_tensor_checksums(NULL, PARITY_MANIFEST_VERSION, sums, 2, both));
        c = both[0];
        sc = both[1];
        char entry[512];
        snprintf(entry, sizeof entry, "\"" GATE0 "\": {\"shape\": [%u, %u], \"dtype\": \"F8_E4M3\", "
                 "\"format\": \"fp8-block\", \"block\": [128, 128], \"quantizer\": \"deepseek\", "
                 "\"fnv1a64\": \"%016" PRIx64 "\", \"scales\": {\"shape\": [%u, %u], \"dtype\": "
                 "\"F32\", \"fnv1a64\": \"%016" PRIx64 "\"}}", s.rows, s.cols, c, s.grid_rows,
                 s.grid_cols, sc);
        FILE *f = fopen(manifest, "rb");
        char *text = calloc(1, 1 << 20);
        if (f) {
            CHECK(fread(text, 1, (1 << 20) - 1, f) > 0);
            fclose(f);
        }
        CHECK(strstr(text, entry) != NULL);
        CHECK(strstr(text, "\"quantization\": {\"format\": \"fp8-block\", \"quantizer\": \"deepseek\"}"));
        free(text);
        shipment_free(&s);
    }

    /* in sync: the sampler that quantizes the masters itself, and the one that received the
     * codes; under the learner's policy and (no policy) the manifest's own */
    printf("in sync:\n");
    expect_report(S, ds, manifest, 0, NULL, NULL, "masters, deepseek");
    expect_report(S, NULL, manifest, 0, NULL, NULL, "masters, no policy");
    write_manifest(L, ds, parity_model_version(Q), manifest);
    expect_report(Q, ds, manifest, 0, NULL, NULL, "codes, deepseek");
    expect_report(Q, NULL, manifest, 0, NULL, NULL, "codes, no policy");
    /* shipped codes are read as they are by every fp8-block rule (the rule quantizes the
     * activations only) */
    expect_report(Q, "vllm+fp8-block:te", manifest, 0, NULL, NULL, "codes, te");
    /* and score as the learner, bitwise */
    {
        float a[SEQ_LEN - 1], b[SEQ_LEN - 1], c[SEQ_LEN - 1];
        scores(L, ds, a);
        scores(S, ds, b);
        scores(Q, ds, c);
        CHECK_BITS_F32(a, b, SEQ_LEN - 1, "sampler quantizing the masters vs learner");
        CHECK_BITS_F32(a, c, SEQ_LEN - 1, "sampler on shipped codes vs learner");
    }

    printf("each check, provoked:\n");
    /* codes: one code of one weight changed in transit */
    parity_model *R = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:7", &R));
    if (R) push_masters(R, L);
    ship_all(R, L, deepseek, flip_one_code);
    write_manifest(L, ds, parity_model_version(R), manifest);
    expect_report(R, ds, manifest, 1, "codes differ", GATE0, "codes");
    /* scales: one scale one ulp off */
    ship_all(R, L, deepseek, nudge_one_scale);
    write_manifest(L, ds, parity_model_version(R), manifest);
    expect_report(R, ds, manifest, 1, "scales differ", GATE0, "scales");
    /* scale format: one weight's scales shipped as BF16 (a cast the codes were not made with) */
    ship_all(R, L, deepseek, bf16_scales_one);
    write_manifest(L, ds, parity_model_version(R), manifest);
    expect_report(R, ds, manifest, 1, "scale format differs", GATE0, "scale dtype");
    /* scale format: the learner's te-pow2 makes powers of two; the sampler holds continuous
     * (deepseek) scales it was shipped */
    ship_all(R, L, deepseek, NULL);
    write_manifest(L, "vllm+fp8-block:te-pow2", parity_model_version(R), manifest);
    expect_report(R, "vllm+fp8-block:te-pow2", manifest, N_LINEAR, "scale format: the learner's "
                  "quantizer 'te-pow2' makes powers of two", NULL, "scale powers of two");
    /* geometry: a learner that padded one weight's scale grid */
    write_manifest(L, ds, parity_model_version(S), manifest);
    expect_report(S, ds, manifest, 0, NULL, NULL, "geometry baseline");
    patch(manifest, "\"" GATE0 "\"", "\"scales\": {\"shape\": [2, 1]", "\"scales\": {\"shape\": [2, 2]");
    expect_report(S, ds, manifest, 1, "block geometry differs", GATE0, "geometry (grid)");
    /* geometry: MXFP8 codes for a sampler that runs fp8-block */
    write_manifest(L, "hf-eager+mxfp8:te", parity_model_version(S), manifest);
    expect_report(S, ds, manifest, N_LINEAR, "block geometry differs", "mxfp8", "geometry (format)");
    expect_report(S, "hf-eager+mxfp8:te", manifest, 0, NULL, NULL, "mxfp8 in sync");
    /* quantizer identity: the sampler quantizes the learner's masters with power-of-two scales
     * (engines re-quantizing FP8 weights to UE8M0) where the learner used deepseek's */
    write_manifest(L, ds, parity_model_version(S), manifest);
    expect_report(S, "vllm+fp8-block:te-pow2", manifest, N_LINEAR, "quantizer identity",
                  "only the quantizer differs", "quantizer identity");
    /* ... and where the values differ too, the report says so */
    {
        const weight *w = model_find_tensor(S, GATE0)->dst;
        const size_t count = (size_t)w->rows * w->cols;
        float *x = malloc(count * sizeof *x);
        memcpy(x, w->master, count * sizeof *x);
        x[0] = 2 * x[0] + 0.01f;
        parity_tensor_data t = {GATE0, PARITY_DTYPE_F32, 2, {w->rows, w->cols}, x};
        CHECK_OK(parity_model_update(S, &t, 1));
        write_manifest(L, ds, parity_model_version(S), manifest);
        expect_report(S, "vllm+fp8-block:te-pow2", manifest, N_LINEAR, "quantizer identity", NULL,
                      "identity, values");
        char report[1 << 15];
        parity_policy p = policy("vllm+fp8-block:te-pow2");
        CHECK_STATUS(parity_model_verify_for(S, &p, manifest, report, sizeof report), PARITY_ERR_VERIFY);
        const char *line = strstr(report, GATE0 ": quantizer identity");
        const char *end = line ? strchr(line, '\n') : NULL;
        const char *too = strstr(report, "the values differ too");
        CHECK(line && end && too && too > line && too < end && !strstr(end, "the values differ too"));
        /* (and under the learner's rule: the values' codes differ) */
        expect_report(S, ds, manifest, 1, "codes differ", "the values the sampler quantized", "values");
        push_masters(S, L);
        free(x);
    }
    /* kept in bf16: the learner ships a layer quantized that the sampler keeps in bf16 (as a
     * checkpoint's modules_to_not_convert marks it at loading) */
    write_manifest(L, ds, parity_model_version(S), manifest);
    ((weight *)model_find_tensor(S, Q0)->dst)->keep_bf16 = 1;
    expect_report(S, ds, manifest, 1, "kept in bf16: the learner ships it quantized", Q0, "kept (sampler)");
    ((weight *)model_find_tensor(S, Q0)->dst)->keep_bf16 = 0;
    /* ... and a learner that keeps it in bf16 while the sampler's policy quantizes it */
    ((weight *)model_find_tensor(L, Q0)->dst)->keep_bf16 = 1;
    write_manifest(L, ds, parity_model_version(S), manifest);
    ((weight *)model_find_tensor(L, Q0)->dst)->keep_bf16 = 0;
    expect_report(S, ds, manifest, 1, "kept in bf16: the learner keeps it in bf16", Q0, "kept (learner)");
    /* ... and a sampler without an fp8 policy */
    write_manifest(L, ds, parity_model_version(S), manifest);
    expect_report(S, "vllm", manifest, N_LINEAR, "kept in bf16", "its policy has no fp8 gemm", "bf16 policy");
    /* version: a stale sync */
    write_manifest(L, ds, parity_model_version(S) + 1, manifest);
    expect_report(S, ds, manifest, 1, "version", NULL, "version");

    /* the probe: the learner's log-probs under deepseek against a sampler under te-pow2 */
    {
        float lp[SEQ_LEN - 1];
        scores(L, ds, lp);
        parity_scorer *same = new_scorer(S, (fixture){.policy = ds, .n_threads = 1, .max_tokens = 64});
        parity_scorer *pow2 = new_scorer(S, (fixture){.policy = "vllm+fp8-block:te-pow2", .n_threads = 1,
                                                       .max_tokens = 64});
        if (same && pow2) {
            CHECK_OK(parity_scorer_probe(same, tokens, SEQ_LEN, lp));
            CHECK_STATUS(parity_scorer_probe(pow2, tokens, SEQ_LEN, lp), PARITY_ERR_VERIFY);
            printf("  %-22s %s\n", "probe", parity_last_error());
        }
        parity_scorer_free(same);
        parity_scorer_free(pow2);
    }

    /* a weight that leaves its shipped codes for values: the fp8-block copies an existing
     * scorer needs are made, and it scores as the learner again */
    {
        parity_scorer *s = new_scorer(Q, (fixture){.policy = ds, .n_threads = 1, .max_tokens = 64});
        push_masters(Q, L);
        const weight *g = model_find_tensor(Q, GATE0)->dst;
        CHECK(!g->shipped && g->quant[deepseek] != NULL);
        float a[SEQ_LEN - 1], b[SEQ_LEN - 1];
        scores(L, ds, a);
        uint32_t len = SEQ_LEN;
        if (s) score_raw(s, tokens, &len, 1, b);
        CHECK_BITS_F32(a, b, SEQ_LEN - 1, "values after shipped codes");
        parity_scorer_free(s);
    }

    /* refused updates change nothing */
    {
        const uint64_t v = parity_model_version(Q);
        shipment s = quantize(L, GATE0, deepseek);
        parity_tensor_data lone = {"model.layers.0.mlp.gate_proj.weight_scale_inv", PARITY_DTYPE_F32,
                                   2, {s.grid_rows, s.grid_cols}, s.scales};
        CHECK_STATUS(parity_model_update(Q, &lone, 1), PARITY_ERR_TENSOR_UNEXPECTED);
        parity_tensor_data norm[2] = {
            {"model.norm.weight", PARITY_DTYPE_F8_E4M3, 1, {64, 0}, s.codes},
            {"model.norm.weight_scale_inv", PARITY_DTYPE_F32, 2, {1, 1}, s.scales}};
        CHECK_STATUS(parity_model_update(Q, norm, 2), PARITY_ERR_TENSOR_DTYPE);
        CHECK_INT(parity_model_version(Q), v);
        CHECK(model_find_tensor(Q, GATE0)->dst->shipped == NULL);
        shipment_free(&s);
    }

    parity_model_free(R);
    parity_model_free(Q);
    parity_model_free(S);
    parity_model_free(L);
    remove(manifest);
    rmdir(dir);
    return check_report("sync_fp8");
}
