/* Every status code is provoked. The list of codes is read from include/parity.h at run time
 * (PARITY_STATUS_LIST, which makes the parity_status enum), so a code added without a way to
 * provoke it here fails this test. For each code a few lines call the public API (or an
 * internal reader) so that it returns exactly that status, with a message;
 * parity_status_name names it. */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixtures.h"
#include "base/alloc.h"
#include "checkpoint/safetensors.h"

static parity_model *tiny;         /* synthetic:tiny:1 (vocab 256, 2 layers, context 512) */
static parity_scorer *scorer;      /* on tiny, max_tokens 64 */
static char ckpt[256];             /* tiny saved: config.json + model.safetensors */
static parity_score_options options; /* the defaults */
static const parity_score_options *opts(void) { return &options; }

/* ---- files ------------------------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    if (buf && fread(buf, 1, *len, f) != *len) *len = 0;
    fclose(f);
    return buf;
}

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, len, f) == len);
    if (f) fclose(f);
}

/* Loads the checkpoint with one file changed: the first `from` replaced by `to` (same length),
 * or, with from == NULL, the first bf16 weight set to +Inf; the file is restored after. */
static int load_patched(const char *name, const char *from, const char *to) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", ckpt, name);
    size_t len = 0;
    char *orig = read_file(path, &len), *copy = malloc(len + 1);
    if (!orig || !copy) return -1000;
    memcpy(copy, orig, len);
    copy[len] = '\0';
    if (from) {
        char *at = memmem(copy, len, from, strlen(from));
        CHECK(at && strlen(from) == strlen(to));
        if (at) memcpy(at, to, strlen(to));
    } else {
        uint64_t header = 0;
        for (int k = 7; k >= 0; k--) header = header << 8 | (uint8_t)copy[k];
        memcpy(copy + 8 + header, "\x80\x7f", 2); /* bf16 0x7f80 = +Inf */
    }
    write_file(path, copy, len);
    parity_model *m = NULL;
    int rc = parity_model_load(ckpt, &m);
    CHECK(rc != PARITY_OK || m != NULL);
    parity_model_free(m);
    write_file(path, orig, len);
    free(orig);
    free(copy);
    return rc;
}

static int load_config(const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/test/data/configs/%s", source_root(), file);
    parity_config c;
    return parity_config_load(path, &c);
}

/* st_open on a file of test/data/bad-safetensors named *.ST_<rule>.safetensors. */
static int open_bad_safetensors(const char *rule) {
    char dir[512], want[64], path[1024];
    snprintf(dir, sizeof dir, "%s/test/data/bad-safetensors", source_root());
    snprintf(want, sizeof want, ".%s.safetensors", rule);
    DIR *d = opendir(dir);
    if (!d) return -1000;
    struct dirent *e;
    int rc = -1000;
    while (rc == -1000 && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, want)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            st_file *f = NULL;
            rc = st_open(path, &f);
            st_close(f);
        }
    closedir(d);
    return rc;
}

/* ---- provokers --------------------------------------------------------------------------- */

static int p_ok(void) {
    parity_policy p;
    return parity_policy_from_name("aligned", &p);
}
static int p_invalid_argument(void) {
    parity_model *m = NULL;
    return parity_model_load(NULL, &m);
}
static int p_out_of_memory(void) {
    parity_model *m = NULL;
    px_alloc_test_reset(1);
    int rc = parity_model_open("synthetic:tiny", &m);
    px_alloc_test_reset(0);
    return rc;
}
static int p_io(void) {
    parity_model *m = NULL;
    return parity_model_load("/nonexistent/parity-model", &m);
}
static int p_unsupported(void) { return load_config("bad-hidden-act-gelu.json"); }
static int p_memory_limit(void) {
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    p.max_memory = 1;
    parity_scorer *s = NULL;
    return parity_scorer_create(tiny, &p, &s);
}

/* BUSY: a thread scores a long sequence again and again while this one calls parity_score
 * on the same scorer (with no sequences: a call that gets in fails at once) until one call
 * finds the scorer in use. */
typedef struct busy_thread {
    atomic_int stop;
    int32_t tokens[64];
    float lp[63];
} busy_thread;

static void *score_repeatedly(void *arg) {
    busy_thread *b = arg;
    uint32_t len = 64;
    while (!atomic_load(&b->stop))
        parity_score(scorer, opts(), b->tokens, &len, 1, b->lp, NULL, NULL, NULL);
    return NULL;
}

static int p_busy(void) {
    static busy_thread b;
    for (int i = 0; i < 64; i++) b.tokens[i] = i * 3;
    atomic_store(&b.stop, 0);
    pthread_t th;
    if (pthread_create(&th, NULL, score_repeatedly, &b)) return -1000;
    int rc = PARITY_OK;
    const time_t deadline = time(NULL) + 30;
    uint32_t len = 1;
    float lp;
    while (rc != PARITY_ERR_BUSY && time(NULL) < deadline)
        rc = parity_score(scorer, opts(), b.tokens, &len, 0, &lp, NULL, NULL, NULL);
    atomic_store(&b.stop, 1);
    pthread_join(th, NULL);
    return rc;
}

static int p_json_syntax(void) { return load_config("bad-json-trailing-comma.json"); }
static int p_config(void) { return load_config("bad-missing-hidden-size.json"); }
static int p_index(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", ckpt);
    write_file(path, "{\"metadata\": {}}", 16);
    parity_model *m = NULL;
    int rc = parity_model_load(ckpt, &m);
    unlink(path);
    return rc;
}
static int p_st_header_length(void) { return open_bad_safetensors("ST_HEADER_LENGTH"); }
static int p_st_header_utf8(void) { return open_bad_safetensors("ST_HEADER_UTF8"); }
static int p_st_header_json(void) { return open_bad_safetensors("ST_HEADER_JSON"); }
static int p_st_dtype(void) { return open_bad_safetensors("ST_DTYPE"); }
static int p_st_offsets(void) { return open_bad_safetensors("ST_OFFSETS"); }
static int p_st_overflow(void) { return open_bad_safetensors("ST_OVERFLOW"); }
static int p_st_size(void) { return open_bad_safetensors("ST_SIZE"); }
static int p_st_truncated(void) { return open_bad_safetensors("ST_TRUNCATED"); }
static int p_st_trailing(void) { return open_bad_safetensors("ST_TRAILING"); }
static int p_st_duplicate(void) { return open_bad_safetensors("ST_DUPLICATE"); }
static int p_tensor_missing(void) {
    return load_patched("config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
}
static int p_tensor_shape(void) {
    return load_patched("config.json", "\"intermediate_size\": 160", "\"intermediate_size\": 128");
}
static int p_tensor_dtype(void) {
    /* the same header length: JSON allows the space */
    return load_patched("model.safetensors", "\"dtype\":\"BF16\"", "\"dtype\":\"U16\" ");
}
static int p_tensor_nonfinite(void) { return load_patched("model.safetensors", NULL, NULL); }
static int p_tensor_unexpected(void) {
    return load_patched("config.json", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1");
}
/* Block-FP8 codes of tiny's layer-0 gate_proj (160 x 64: a [2, 1] grid of 128 x 128 blocks)
 * shipped by an update, with scales of value `scale` in a grid of `grid_rows` rows (without
 * its scales when with_scales is 0). */
static int update_fp8(int with_scales, uint64_t grid_rows, float scale) {
    static uint8_t codes[160 * 64];
    float scales[4] = {scale, scale, scale, scale};
    parity_tensor_data t[2] = {
        {"model.layers.0.mlp.gate_proj.weight", PARITY_DTYPE_F8_E4M3, 2, {160, 64}, codes},
        {"model.layers.0.mlp.gate_proj.weight_scale_inv", PARITY_DTYPE_F32, 2, {grid_rows, 1}, scales},
    };
    return parity_model_update(tiny, t, with_scales ? 2 : 1);
}
static int p_scale_missing(void) { return update_fp8(0, 2, 1.0f); }
static int p_scale_grid(void) { return update_fp8(1, 1, 1.0f); }
static int p_scale_value(void) { return update_fp8(1, 2, -1.0f); }
static int p_token_range(void) {
    int32_t t[2] = {1, 999};
    uint32_t len = 2;
    float lp;
    return parity_score(scorer, opts(), t, &len, 1, &lp, NULL, NULL, NULL);
}
static int p_empty_input(void) {
    int32_t t = 1;
    uint32_t len = 1;
    float lp;
    return parity_score(scorer, opts(), &t, &len, 0, &lp, NULL, NULL, NULL);
}
static int p_too_long(void) {
    static int32_t t[100];
    uint32_t len = 100;
    static float lp[99];
    return parity_score(scorer, opts(), t, &len, 1, lp, NULL, NULL, NULL);
}
static int p_policy(void) {
    parity_policy p;
    return parity_policy_from_name("no-such-preset", &p);
}

/* A sampler on `m` with one sequence slot, and a greedy sequence of one new token in it. */
static parity_sampler *sampler_with_one(parity_model *m, uint32_t *seq) {
    parity_sampler *s = new_sampler(m, (fixture){.max_seqs = 1, .max_len = 32});
    parity_sampling sp;
    parity_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_new_tokens = 1;
    int32_t prompt[3] = {5, 6, 7};
    if (s) CHECK_OK(parity_sampler_add(s, prompt, 3, &sp, 0, seq));
    return s;
}
static int p_cache_full(void) {
    uint32_t a, b;
    parity_sampler *s = sampler_with_one(tiny, &a);
    if (!s) return -1000;
    parity_sampling sp;
    parity_sampling_default(&sp);
    int rc = parity_sampler_fork(s, a, &sp, 1, &b);
    parity_sampler_free(s);
    return rc;
}
static int p_unknown_sequence(void) {
    uint32_t a;
    parity_sampler *s = sampler_with_one(tiny, &a);
    if (!s) return -1000;
    int rc = parity_sampler_release(s, a + 1);
    parity_sampler_free(s);
    return rc;
}
static int step(parity_sampler *s, uint32_t seq) {
    int32_t tok;
    float lp;
    uint32_t fin;
    return parity_sampler_step(s, &seq, 1, &tok, &lp, &fin, 0, NULL, NULL);
}
static int p_sequence_finished(void) {
    uint32_t a;
    parity_sampler *s = sampler_with_one(tiny, &a);
    if (!s) return -1000;
    CHECK_OK(step(s, a));
    int rc = step(s, a);
    parity_sampler_free(s);
    return rc;
}
static int p_stale(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:2", &m));
    uint32_t a;
    parity_sampler *s = m ? sampler_with_one(m, &a) : NULL;
    if (!s) return -1000;
    uint16_t ones[64];
    for (int i = 0; i < 64; i++) ones[i] = 0x3f80;
    parity_tensor_data t = {"model.norm.weight", PARITY_DTYPE_BF16, 1, {64, 0}, ones};
    CHECK_OK(parity_model_update(m, &t, 1));
    int rc = step(s, a);
    parity_sampler_free(s);
    parity_model_free(m);
    return rc;
}
static int p_no_masters(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny:2", &m));
    if (!m) return -1000;
    float ones[64], back[64];
    for (int i = 0; i < 64; i++) ones[i] = 1.0f + 0x1p-12f;
    parity_tensor_data t = {"model.norm.weight", PARITY_DTYPE_F32, 1, {64, 0}, ones};
    CHECK_OK(parity_model_update_with(NULL, m, &t, 1, PARITY_MASTERS_WHERE_READ));
    int rc = parity_model_weight_values(m, "model.norm.weight", back, 64);
    parity_model_free(m);
    return rc;
}
static int p_verify(void) {
    int32_t t[4] = {1, 2, 3, 4};
    const float wrong[3] = {0, 0, 0};
    return parity_scorer_probe(scorer, t, 4, wrong);
}

static const struct {
    const char *name;
    int (*provoke)(void);
} provokers[] = {
    {"PARITY_OK", p_ok},
    {"PARITY_ERR_INVALID_ARGUMENT", p_invalid_argument},
    {"PARITY_ERR_OUT_OF_MEMORY", p_out_of_memory},
    {"PARITY_ERR_IO", p_io},
    {"PARITY_ERR_UNSUPPORTED", p_unsupported},
    {"PARITY_ERR_MEMORY_LIMIT", p_memory_limit},
    {"PARITY_ERR_BUSY", p_busy},
    {"PARITY_ERR_JSON_SYNTAX", p_json_syntax},
    {"PARITY_ERR_CONFIG", p_config},
    {"PARITY_ERR_INDEX", p_index},
    {"PARITY_ERR_ST_HEADER_LENGTH", p_st_header_length},
    {"PARITY_ERR_ST_HEADER_UTF8", p_st_header_utf8},
    {"PARITY_ERR_ST_HEADER_JSON", p_st_header_json},
    {"PARITY_ERR_ST_DTYPE", p_st_dtype},
    {"PARITY_ERR_ST_OFFSETS", p_st_offsets},
    {"PARITY_ERR_ST_OVERFLOW", p_st_overflow},
    {"PARITY_ERR_ST_SIZE", p_st_size},
    {"PARITY_ERR_ST_TRUNCATED", p_st_truncated},
    {"PARITY_ERR_ST_TRAILING", p_st_trailing},
    {"PARITY_ERR_ST_DUPLICATE", p_st_duplicate},
    {"PARITY_ERR_TENSOR_MISSING", p_tensor_missing},
    {"PARITY_ERR_TENSOR_SHAPE", p_tensor_shape},
    {"PARITY_ERR_TENSOR_DTYPE", p_tensor_dtype},
    {"PARITY_ERR_TENSOR_NONFINITE", p_tensor_nonfinite},
    {"PARITY_ERR_TENSOR_UNEXPECTED", p_tensor_unexpected},
    {"PARITY_ERR_SCALE_MISSING", p_scale_missing},
    {"PARITY_ERR_SCALE_GRID", p_scale_grid},
    {"PARITY_ERR_SCALE_VALUE", p_scale_value},
    {"PARITY_ERR_TOKEN_RANGE", p_token_range},
    {"PARITY_ERR_EMPTY_INPUT", p_empty_input},
    {"PARITY_ERR_TOO_LONG", p_too_long},
    {"PARITY_ERR_POLICY", p_policy},
    {"PARITY_ERR_CACHE_FULL", p_cache_full},
    {"PARITY_ERR_UNKNOWN_SEQUENCE", p_unknown_sequence},
    {"PARITY_ERR_SEQUENCE_FINISHED", p_sequence_finished},
    {"PARITY_ERR_STALE", p_stale},
    {"PARITY_ERR_VERIFY", p_verify},
    {"PARITY_ERR_NO_MASTERS", p_no_masters},
};
#define N_PROVOKERS (sizeof provokers / sizeof provokers[0])

/* Reads the status list of include/parity.h (PARITY_STATUS_LIST, from which the
 * parity_status enum is made): names and values; returns the count. */
static size_t read_status_enum(char names[][64], int *values, size_t cap) {
    char path[512];
    snprintf(path, sizeof path, "%s/include/parity.h", source_root());
    size_t len = 0, n = 0;
    char *text = read_file(path, &len);
    CHECK(text != NULL);
    if (!text) return 0;
    text[len] = '\0';
    char *begin = strstr(text, "#define PARITY_STATUS_LIST(X)");
    /* the list ends at its first line that does not continue with a backslash */
    char *end = begin;
    while (end && (end = strchr(end, '\n')) && end[-1] == '\\') end++;
    CHECK(begin && end);
    for (char *line = begin; line && line < end && n < cap; line = strchr(line, '\n')) {
        line++;
        if (sscanf(line, " X(PARITY_%57[A-Z0-9_], %d)", names[n] + 7, &values[n]) == 2) {
            memcpy(names[n], "PARITY_", 7);
            n++;
        }
    }
    free(text);
    return n;
}

int main(void) {
    parity_score_default_options(&options);
    CHECK_OK(parity_model_open("synthetic:tiny:1", &tiny));
    if (tiny) scorer = new_scorer(tiny, (fixture){.max_tokens = 64});
    snprintf(ckpt, sizeof ckpt, "/tmp/parity-status-XXXXXX");
    CHECK(mkdtemp(ckpt) != NULL);
    if (tiny) CHECK_OK(parity_model_save(tiny, ckpt));
    if (!scorer) return check_report("test_status");

    static char names[128][64];
    static int values[128];
    size_t n = read_status_enum(names, values, 128);
    CHECK(n >= 30);
    /* the text read holds every entry the compiler sees in the list */
#define COUNT_STATUS(name, value) +1
    CHECK_INT(n, 0 PARITY_STATUS_LIST(COUNT_STATUS));
#undef COUNT_STATUS
    for (size_t i = 0; i < n; i++) {
        CHECK(strcmp(parity_status_name(values[i]), names[i]) == 0);
        size_t k = 0;
        while (k < N_PROVOKERS && strcmp(provokers[k].name, names[i])) k++;
        if (k == N_PROVOKERS) {
            check_count++, check_failures++;
            fprintf(stderr, "%s (%d) is in parity.h but nothing here provokes it\n", names[i],
                    values[i]);
            continue;
        }
        int rc = provokers[k].provoke();
        CHECK_INT(rc, values[i]);
        if (rc != values[i])
            fprintf(stderr, "  %s: got %s: %s\n", names[i], parity_status_name(rc),
                    parity_last_error());
        if (values[i] != PARITY_OK) CHECK(parity_last_error()[0] != '\0');
        printf("%-29s %4d  %s\n", names[i], values[i], parity_last_error());
    }
    /* and nothing here names a code the header no longer has */
    for (size_t k = 0; k < N_PROVOKERS; k++) {
        int found = 0;
        for (size_t i = 0; i < n && !found; i++) found = !strcmp(provokers[k].name, names[i]);
        CHECK(found);
    }
    CHECK(strcmp(parity_status_name(12345), "PARITY_UNKNOWN_STATUS") == 0);

    char path[512];
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", ckpt, i ? "model.safetensors" : "config.json");
        unlink(path);
    }
    rmdir(ckpt);
    parity_scorer_free(scorer);
    parity_model_free(tiny);
    return check_report("test_status");
}
