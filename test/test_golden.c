/*
 * Golden bits: the library's own outputs, pinned bit for bit.
 *
 * For the trained model in models/ and for synthetic:tiny, under every preset (and nine
 * modified presets: fp32-head, aligned, two fp16, the fp8 and the 4-bit and ternary formats)
 * and every backend, and for the mixture-of-experts synthetic:qwen3-moe-tiny and
 * synthetic:qwen2-moe-tiny on the bf16 backend, this program computes
 *   - the scorer's log-probs of a fixed batch in the three log-prob modes, with entropy and
 *     the top-4 alternatives (ids and log-probs);
 *   - the sampler's tokens, log-probs and top-4 alternatives for fixed prompts, seeds and
 *     sampling settings (greedy, plain temperature, top-k, top-p + min-p), each in its own
 *     log-prob mode;
 * and compares them bitwise with test/data/golden/, once per CPU path this machine has (in
 * quick mode, PARITY_TEST_QUICK, on the path the library picked alone): every case on the
 * path the library picked, and on the others synthetic:tiny's every case and the trained
 * model's one policy per GEMM and rounding kind (secondary_path_case).
 *
 *   test_golden                 compare (the meson test)
 *   test_golden --write DIR     write the files and DIR/MANIFEST.json (scripts/golden.sh)
 *
 * A file holds sections one after another, each an array of little-endian int32 or float32
 * values; MANIFEST.json names, per file, the model, policy and backend that made it and its
 * sections in order (name, type, count). The comparison also checks that list, so a change
 * of this program is caught as well as a change of the library.
 *
 * The bf16 backend's bits are the same on every machine. The openblas backend's depend on
 * the kernels OpenBLAS picked for this CPU (openblas_get_corename()): the manifest records
 * the core they were made on, and on another core those files are skipped with a message.
 * The amx backend's (four policies) depend on the CPU's tile unit: the manifest records the
 * CPU (vendor, family, model) they were made on, and another CPU, or one without AMX, skips
 * them with a message; a regeneration on a CPU without AMX leaves them out.
 *
 * Regenerating the files is a change of the library's output: the commit that does it says
 * why, for a reason docs/DESIGN.md names.
 */
#if defined(PARITY_HAVE_OPENBLAS)
#include <cblas.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>

#include "check.h"
#include "checkpoint/json.h"

#define MAX_SECTIONS 64
#define TOP_N 4

typedef struct section {
    char name[96];
    int is_int;         /* int32 values, else float32 */
    size_t count;
    void *data;         /* count values of 4 bytes */
} section;

typedef struct output {
    section s[MAX_SECTIONS];
    size_t n;
} output;

static void add_section(output *o, const char *name, int is_int, const void *data, size_t count) {
    if (o->n == MAX_SECTIONS) {
        fprintf(stderr, "test_golden: more than %d sections in one file\n", MAX_SECTIONS);
        exit(2);
    }
    section *s = &o->s[o->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->is_int = is_int;
    s->count = count;
    s->data = malloc(count ? count * 4 : 1);
    if (!s->data) {
        fprintf(stderr, "test_golden: out of memory\n");
        exit(2);
    }
    memcpy(s->data, data, count * 4);
}

/* add_section with a printf-formatted name. */
static void add_named(output *o, int is_int, const void *data, size_t count, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void add_named(output *o, int is_int, const void *data, size_t count, const char *fmt, ...) {
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    add_section(o, name, is_int, data, count);
}

static void free_output(output *o) {
    for (size_t i = 0; i < o->n; i++) free(o->s[i].data);
    o->n = 0;
}

/* ---- what is computed ------------------------------------------------------------------ */

#define N_SEQS 4
static const char *const text_seqs[N_SEQS] = {
    "def f(x):\n    return x + 1\n",
    "import os",
    "for i in range(10):\n    print(i * i)\n# done",
    "x",
};

typedef struct batch {
    int32_t tokens[512];
    uint32_t lengths[N_SEQS];
    size_t n_tokens, n_out;
} batch;

/* Bytes as tokens (the trained model's vocabulary), reduced modulo the vocabulary. */
static void make_batch(batch *b, uint32_t vocab) {
    b->n_tokens = b->n_out = 0;
    for (int i = 0; i < N_SEQS; i++) {
        size_t len = strlen(text_seqs[i]);
        b->lengths[i] = (uint32_t)len;
        for (size_t t = 0; t < len; t++)
            b->tokens[b->n_tokens++] = (int32_t)((unsigned char)text_seqs[i][t] % vocab);
        b->n_out += len - 1;
    }
}

/* The scorer's modes: options as a caller sets them. */
typedef struct score_mode {
    const char *name;
    parity_score_options options;
} score_mode;

#define SCORE_OPTIONS(mode, t, k, p, minp) \
    {sizeof(parity_score_options), mode, t, k, p, minp, TOP_N, NULL, PARITY_LOOP_KV_LAST_EXITED, \
     PARITY_EXIT_FULL, 0.0f, 0, 0, 0, PARITY_READOUT_EXIT, 0, NULL, NULL, NULL}
static const score_mode score_modes[] = {
    {"raw", SCORE_OPTIONS(PARITY_LOGPROB_RAW, 1.0f, 0, 1.0f, 0.0f)},
    {"processed", SCORE_OPTIONS(PARITY_LOGPROB_PROCESSED, 0.7f, 0, 1.0f, 0.0f)},
    {"processed-truncated", SCORE_OPTIONS(PARITY_LOGPROB_PROCESSED_TRUNCATED, 0.8f, 20, 0.9f, 0.02f)},
};

/* The sampler's settings: parity_sampling as a caller sets it (no stop tokens). */
typedef struct sample_setting {
    const char *name;
    parity_sampling sampling;
} sample_setting;

#define MAX_NEW 20
#define SAMPLING(t, k, p, minp, mode, seed_) \
    {.size = sizeof(parity_sampling), .temperature = t, .top_k = k, .top_p = p, .min_p = minp, \
     .seed = seed_, .max_new_tokens = MAX_NEW, .logprob_mode = mode, .top_n = TOP_N}
static const sample_setting sample_settings[] = {
    {"greedy", SAMPLING(0.0f, 0, 1.0f, 0.0f, PARITY_LOGPROB_RAW, 1)},
    {"t1", SAMPLING(1.0f, 0, 1.0f, 0.0f, PARITY_LOGPROB_PROCESSED, 7)},
    {"t0.7-topk8", SAMPLING(0.7f, 8, 1.0f, 0.0f, PARITY_LOGPROB_PROCESSED_TRUNCATED, 42)},
    {"t1.2-topp0.9-minp0.05", SAMPLING(1.2f, 0, 0.9f, 0.05f, PARITY_LOGPROB_PROCESSED_TRUNCATED, 2026)},
};
#define N_SETTINGS (sizeof sample_settings / sizeof sample_settings[0])
static const char *const prompts[] = {"def ", "class Foo:\n    "};
#define N_PROMPTS (sizeof prompts / sizeof prompts[0])

static const char *const backend_names[] = {"bf16", "openblas", "amx"};

static int score_outputs(const parity_model *m, const parity_policy *pol, uint32_t backend,
                         output *o) {
    const parity_config *cfg = parity_model_config(m);
    batch b;
    make_batch(&b, cfg->vocab_size);
    add_section(o, "score.tokens", 1, b.tokens, b.n_tokens);
    add_section(o, "score.lengths", 1, b.lengths, N_SEQS);

    parity_scorer_params p;
    parity_scorer_default_params(&p);
    p.policy = *pol;
    p.backend = backend;
    parity_scorer *s = NULL;
    int st = parity_scorer_create(m, &p, &s);
    if (st != PARITY_OK) return st;
    float lp[512], ent[512], top_lp[512 * TOP_N];
    int32_t top_ids[512 * TOP_N];
    for (size_t i = 0; i < sizeof score_modes / sizeof score_modes[0]; i++) {
        const score_mode *sm = &score_modes[i];
        const parity_score_options opt = sm->options;
        st = parity_score(s, &opt, b.tokens, b.lengths, N_SEQS, lp, ent, top_ids, top_lp);
        if (st != PARITY_OK) break;
        add_named(o, 0, lp, b.n_out, "score.%s.logprobs", sm->name);
        add_named(o, 0, ent, b.n_out, "score.%s.entropy", sm->name);
        add_named(o, 1, top_ids, b.n_out * TOP_N, "score.%s.top_ids", sm->name);
        add_named(o, 0, top_lp, b.n_out * TOP_N, "score.%s.top_logprobs", sm->name);
    }
    parity_scorer_free(s);
    return st;
}

/* Every (prompt, setting) pair is one sequence; all of them step together, two threads. */
static int sample_outputs(const parity_model *m, const parity_policy *pol, uint32_t backend,
                          output *o) {
    const parity_config *cfg = parity_model_config(m);
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.policy = *pol;
    p.backend = backend;
    p.n_threads = 2;
    p.max_seqs = 16;
    p.max_len = 64;
    parity_sampler *smp = NULL;
    int st = parity_sampler_create(m, &p, &smp);
    if (st != PARITY_OK) return st;

    enum { N = N_PROMPTS * N_SETTINGS };
    uint32_t seq[N], n_out[N] = {0};
    int32_t tokens[N][MAX_NEW], top_ids[N][MAX_NEW][TOP_N];
    float logprobs[N][MAX_NEW], top_lp[N][MAX_NEW][TOP_N];
    memset(tokens, 0, sizeof tokens);
    memset(logprobs, 0, sizeof logprobs);
    memset(top_ids, 0, sizeof top_ids);
    memset(top_lp, 0, sizeof top_lp);
    for (size_t i = 0; i < N && st == PARITY_OK; i++) {
        const char *text = prompts[i / N_SETTINGS];
        const sample_setting *ss = &sample_settings[i % N_SETTINGS];
        int32_t prompt[64];
        uint32_t len = (uint32_t)strlen(text);
        for (uint32_t t = 0; t < len; t++)
            prompt[t] = (int32_t)((unsigned char)text[t] % cfg->vocab_size);
        st = parity_sampler_add(smp, prompt, len, &ss->sampling, i, &seq[i]);
    }
    for (uint32_t step = 0; step < MAX_NEW && st == PARITY_OK; step++) {
        uint32_t live[N], idx[N];
        size_t n = 0;
        for (size_t i = 0; i < N; i++)
            if (n_out[i] == step) {
                live[n] = seq[i];
                idx[n++] = (uint32_t)i;
            }
        if (n == 0) break;
        int32_t tok[N], tid[N * TOP_N];
        float lp[N], tlp[N * TOP_N];
        uint32_t fin[N];
        st = parity_sampler_step(smp, live, n, tok, lp, fin, TOP_N, tid, tlp);
        for (size_t j = 0; j < n && st == PARITY_OK; j++) {
            uint32_t i = idx[j];
            tokens[i][step] = tok[j];
            logprobs[i][step] = lp[j];
            memcpy(top_ids[i][step], tid + j * TOP_N, sizeof top_ids[i][step]);
            memcpy(top_lp[i][step], tlp + j * TOP_N, sizeof top_lp[i][step]);
            if (fin[j] == PARITY_RUNNING) n_out[i]++;
            else n_out[i] = step + 1 + MAX_NEW; /* finished: leaves the batch */
        }
    }
    parity_sampler_free(smp);
    if (st != PARITY_OK) return st;
    for (size_t i = 0; i < N; i++) {
        if (n_out[i] > MAX_NEW) n_out[i] -= MAX_NEW;
        const size_t p = i / N_SETTINGS;
        const char *setting = sample_settings[i % N_SETTINGS].name;
        add_named(o, 1, tokens[i], n_out[i], "sample.p%zu.%s.tokens", p, setting);
        add_named(o, 0, logprobs[i], n_out[i], "sample.p%zu.%s.logprobs", p, setting);
        add_named(o, 1, top_ids[i], n_out[i] * TOP_N, "sample.p%zu.%s.top_ids", p, setting);
        add_named(o, 0, top_lp[i], n_out[i] * TOP_N, "sample.p%zu.%s.top_logprobs", p, setting);
    }
    return PARITY_OK;
}

/* ---- the cases ------------------------------------------------------------------------- */

typedef struct model_entry {
    const char *label;   /* directory name under test/data/golden */
    const char *spec;    /* for parity_model_open; NULL: the trained model in models/ */
    int bf16_only;       /* the bf16 backend's files alone (the other backends' bits are
                            pinned by the dense models' files) */
} model_entry;

/* The mixture-of-experts models join with the bf16 backend alone: its bits are the same on
 * every machine, so their files were made where the others were not (a CPU without AMX, on
 * another OpenBLAS core) without remaking those. */
static const model_entry models[] = {
    {"qwen3-bytes-pystdlib-4.9m", NULL, 0},
    {"synthetic-tiny", "synthetic:tiny", 0},
    {"synthetic-qwen3-moe-tiny", "synthetic:qwen3-moe-tiny", 1},
    {"synthetic-qwen2-moe-tiny", "synthetic:qwen2-moe-tiny", 1},
};

static const char *const extra_policies[] = {"vllm+fp32-head", "hf-eager+aligned",
                                             "hf-eager+fp16", "vllm+fp16",
                                             "vllm+fp8-block:deepseek", "hf-eager+mxfp8:te",
                                             "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp",
                                             "hf-eager+ternary:bitnet"};

/* The amx backend's files: these policies, on a CPU with AMX-BF16. Its tile order is the
 * CPU's, so the manifest records the CPU (amx_cpu_id) and another CPU skips them. */
static const char *const amx_policies[] = {"hf-eager", "vllm", "aligned", "vllm+fp32-head"};
static int amx_cases; /* set by the writer and the checker before for_each_case */
/* The checker's: whether the openblas backend's files are compared (same OpenBLAS core), and
 * whether this CPU path runs every case. */
static int openblas_cases = 1, every_case = 1;

/* On a CPU path other than the one the library picked (the portable path of an AVX2 machine,
 * say), the trained model runs one policy per GEMM and rounding kind (the bf16 GEMM with and
 * without the fp32 head, the fp32 regions, fp32, fp16, the fp8 and the 4-bit and ternary
 * GEMMs), and synthetic:tiny every case: the other presets differ from these by where they
 * round and how they attend, which tiny's files pin on that path, while its kernels' cost on
 * the trained model is the bf16 GEMM's, the same kernel again. */
static int secondary_path_case(const model_entry *me, const char *policy) {
    static const char *const skipped[] = {"sglang", "hf-sdpa", "vllm", "hf-eager+aligned",
                                          "vllm+fp16"};
    if (me->spec) return 1;
    for (size_t i = 0; i < sizeof skipped / sizeof *skipped; i++)
        if (!strcmp(skipped[i], policy)) return 0;
    return 1;
}

static int is_amx_policy(const char *name) {
    for (size_t i = 0; i < sizeof amx_policies / sizeof *amx_policies; i++)
        if (!strcmp(amx_policies[i], name)) return 1;
    return 0;
}

/* "GenuineIntel family 6 model 207" (cpuid leaves 0 and 1), or "none" without AMX. */
static const char *amx_cpu_id(void) {
    static char id[96];
    if (parity_backend_check(PARITY_BACKEND_AMX) != PARITY_OK) return "none";
#if defined(__x86_64__)
    unsigned a = 0, b, c, d, vendor[3] = {0};
    if (!__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]) || !__get_cpuid(1, &a, &b, &c, &d))
        return "unknown";
    const unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
    const unsigned model = ((a >> 4) & 0xf) | ((a >> 12) & 0xf0);
    char v[13];
    memcpy(v, vendor, 12);
    v[12] = 0;
    snprintf(id, sizeof id, "%s family %u model %u", v, family, model);
#endif
    return id;
}

typedef void (*case_fn)(const model_entry *me, const parity_model *m, const char *policy,
                        uint32_t backend, const output *o, void *ctx);

static int open_model(const model_entry *me, parity_model **m) {
    if (me->spec) return parity_model_open(me->spec, m);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/%s", source_root(), me->label);
    return parity_model_load(dir, m);
}

static void for_each_case(case_fn fn, void *ctx) {
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        parity_model *m = NULL;
        CHECK_OK(open_model(&models[mi], &m));
        if (!m) continue;
        const char *const *presets = parity_policy_preset_names();
        size_t n_presets = 0;
        while (presets[n_presets]) n_presets++;
        for (size_t pi = 0; pi < n_presets + sizeof extra_policies / sizeof *extra_policies; pi++) {
            const char *name = pi < n_presets ? presets[pi] : extra_policies[pi - n_presets];
            parity_policy pol;
            CHECK_OK(parity_policy_from_name(name, &pol));
            for (uint32_t backend = 0; backend < 3; backend++) {
                if (backend == PARITY_BACKEND_AMX && (!amx_cases || !is_amx_policy(name))) continue;
                if (backend == PARITY_BACKEND_OPENBLAS && !openblas_cases) continue;
                if (backend != PARITY_BACKEND_BF16 && models[mi].bf16_only) continue;
                if (!every_case && !secondary_path_case(&models[mi], name)) continue;
                /* the 4-bit and ternary GEMMs are one C implementation on every backend: their
                 * files are the bf16 backend's (the backends' lm_head is covered by the other
                 * policies' files, which need no regeneration per OpenBLAS core for them) */
                if (backend != PARITY_BACKEND_BF16 && pol.gemm >= PARITY_GEMM_NVFP4) continue;
                output o = {0};
                CHECK_OK(score_outputs(m, &pol, backend, &o));
                CHECK_OK(sample_outputs(m, &pol, backend, &o));
                fn(&models[mi], m, name, backend, &o, ctx);
                free_output(&o);
            }
        }
        parity_model_free(m);
    }
}

/* A policy name as a file name: ':' (of "+fp8-block:RULE") becomes '=', which every file
 * system takes. */
static const char *policy_file(const char *policy) {
    static _Thread_local char buf[128];
    snprintf(buf, sizeof buf, "%s", policy);
    for (char *c = buf; *c; c++)
        if (*c == ':') *c = '=';
    return buf;
}

static void file_name(char *buf, size_t size, const char *root, const model_entry *me,
                      const char *policy, uint32_t backend) {
    snprintf(buf, size, "%s/%s/%s/%s.bin", root, me->label, backend_names[backend],
             policy_file(policy));
}

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}
static uint32_t get_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- writing --------------------------------------------------------------------------- */

typedef struct writer {
    const char *root;
    FILE *manifest;
    int first;
} writer;

static void mkdir_p(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

static void write_case(const model_entry *me, const parity_model *m, const char *policy,
                       uint32_t backend, const output *o, void *ctx) {
    (void)m;
    writer *w = ctx;
    char path[4096], dir[4096];
    snprintf(dir, sizeof dir, "%s/%s/%s", w->root, me->label, backend_names[backend]);
    mkdir_p(dir);
    file_name(path, sizeof path, w->root, me, policy, backend);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "test_golden: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    for (size_t i = 0; i < o->n; i++)
        for (size_t j = 0; j < o->s[i].count; j++) {
            unsigned char b[4];
            put_le32(b, ((const uint32_t *)o->s[i].data)[j]);
            fwrite(b, 1, 4, f);
        }
    if (fclose(f) != 0) {
        fprintf(stderr, "test_golden: writing %s failed\n", path);
        exit(2);
    }
    fprintf(w->manifest, "%s\n    {\"file\": \"%s/%s/%s.bin\", \"model\": \"%s\", \"policy\": \"%s\", "
            "\"backend\": \"%s\",\n     \"sections\": [", w->first ? "" : ",", me->label,
            backend_names[backend], policy_file(policy), me->spec ? me->spec : me->label, policy,
            backend_names[backend]);
    w->first = 0;
    for (size_t i = 0; i < o->n; i++)
        fprintf(w->manifest, "%s\n       [\"%s\", \"%s\", %zu]", i ? "," : "", o->s[i].name,
                o->s[i].is_int ? "i32" : "f32", o->s[i].count);
    fprintf(w->manifest, "]}");
}

/* The OpenBLAS core this build's openblas backend runs on; NULL in a build without OpenBLAS
 * (meson -Dopenblas=disabled), which neither writes nor compares the openblas files. */
static const char *openblas_core(void) {
#if defined(PARITY_HAVE_OPENBLAS)
    return openblas_get_corename();
#else
    return NULL;
#endif
}

static int write_all(const char *root) {
    if (!openblas_core()) {
        fprintf(stderr, "test_golden: the golden files are written by a build with OpenBLAS (its "
                "backend's files are among them); this one was built with -Dopenblas=disabled\n");
        return 2;
    }
    mkdir_p(root);
    char path[4096];
    snprintf(path, sizeof path, "%s/MANIFEST.json", root);
    writer w = {root, fopen(path, "w"), 1};
    if (!w.manifest) {
        fprintf(stderr, "test_golden: %s: %s\n", path, strerror(errno));
        return 2;
    }
    fprintf(w.manifest,
            "{\"made_by\": \"test/test_golden --write (scripts/golden.sh)\",\n"
            " \"library_version\": \"%s\",\n"
            " \"cpu_path\": \"%s\",\n"
            " \"openblas_core\": \"%s\",\n"
            " \"amx_cpu\": \"%s\",\n"
            " \"format\": \"each file: its sections one after another, each `count` "
            "little-endian int32 (i32) or float32 (f32) values\",\n"
            " \"files\": [",
            parity_version(), parity_cpu_path_name(parity_get_cpu_path()),
            openblas_core(), amx_cpu_id());
    amx_cases = parity_backend_check(PARITY_BACKEND_AMX) == PARITY_OK;
    for_each_case(write_case, &w);
    fprintf(w.manifest, "\n]}\n");
    if (fclose(w.manifest) != 0) return 2;
    return check_failures ? 1 : 0;
}

/* ---- comparing ------------------------------------------------------------------------- */

typedef struct checker {
    const char *root;
    const json_value *files;
    const char *cpu_path;
    size_t compared;
} checker;

static const json_value *manifest_entry(const checker *c, const char *file) {
    for (size_t i = 0; i < c->files->count; i++) {
        const json_value *f = json_get(&c->files->items[i], "file");
        if (f && f->type == JSON_STRING && strcmp(f->str, file) == 0) return &c->files->items[i];
    }
    return NULL;
}

static void check_case(const model_entry *me, const parity_model *m, const char *policy,
                       uint32_t backend, const output *o, void *ctx) {
    (void)m;
    checker *c = ctx;
    char rel[512], path[4096], what[768];
    snprintf(rel, sizeof rel, "%s/%s/%s.bin", me->label, backend_names[backend], policy_file(policy));
    snprintf(path, sizeof path, "%s/%s", c->root, rel);
    const json_value *entry = manifest_entry(c, rel);
    const json_value *secs = entry ? json_get(entry, "sections") : NULL;
    check_count++;
    if (!secs || secs->type != JSON_ARRAY) {
        check_failures++;
        fprintf(stderr, "golden: %s is not in MANIFEST.json\n", rel);
        return;
    }
    /* The section list: names, types and counts as the manifest records them. */
    check_count++;
    int same_layout = secs->count == o->n;
    for (size_t i = 0; same_layout && i < o->n; i++) {
        const json_value *s = &secs->items[i];
        same_layout = s->type == JSON_ARRAY && s->count == 3 &&
                      s->items[0].type == JSON_STRING && strcmp(s->items[0].str, o->s[i].name) == 0 &&
                      s->items[1].type == JSON_STRING &&
                      strcmp(s->items[1].str, o->s[i].is_int ? "i32" : "f32") == 0 &&
                      s->items[2].is_int && (size_t)s->items[2].integer == o->s[i].count;
        if (!same_layout)
            fprintf(stderr, "golden: %s: section %zu is %s[%zu] now, not as in the manifest\n",
                    rel, i, o->s[i].name, o->s[i].count);
    }
    if (!same_layout) {
        check_failures++;
        return;
    }
    FILE *f = fopen(path, "rb");
    size_t total = 0;
    for (size_t i = 0; i < o->n; i++) total += o->s[i].count * 4;
    unsigned char *bytes = malloc(total + 1);
    size_t got = f && bytes ? fread(bytes, 1, total + 1, f) : 0;
    if (f) fclose(f);
    check_count++;
    if (got != total) {
        check_failures++;
        fprintf(stderr, "golden: %s: %zu bytes, expected %zu\n", path, got, total);
        free(bytes);
        return;
    }
    size_t at = 0;
    for (size_t i = 0; i < o->n; i++) {
        const section *s = &o->s[i];
        snprintf(what, sizeof what, "%s [%s] %s", rel, c->cpu_path, s->name);
        if (s->is_int) {
            size_t bad = 0;
            check_count++;
            for (size_t j = 0; j < s->count; j++) {
                int32_t want = (int32_t)get_le32(bytes + at + 4 * j);
                int32_t have = ((const int32_t *)s->data)[j];
                if (want != have && bad++ < 5)
                    fprintf(stderr, "golden: %s: [%zu] %d, golden %d\n", what, j, have, want);
            }
            if (bad) {
                check_failures++;
                fprintf(stderr, "golden: %s: %zu of %zu values differ\n", what, bad, s->count);
            }
        } else {
            float *want = malloc(s->count ? s->count * 4 : 1);
            for (size_t j = 0; j < s->count; j++) {
                uint32_t u = get_le32(bytes + at + 4 * j);
                memcpy(&want[j], &u, 4);
            }
            check_bits_f32_(want, s->data, s->count, what, __FILE__, __LINE__);
            free(want);
        }
        at += s->count * 4;
    }
    free(bytes);
    c->compared++;
}

static int check_all(void) {
    char root[4096], path[4200];
    snprintf(root, sizeof root, "%s/test/data/golden", source_root());
    snprintf(path, sizeof path, "%s/MANIFEST.json", root);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "golden: %s: %s\n", path, strerror(errno));
        return 1;
    }
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    json_doc *doc = NULL;
    char err[256];
    if (json_parse(text, len, &doc, err, sizeof err) != 0) {
        fprintf(stderr, "golden: %s: %s\n", path, err);
        return 1;
    }
    const json_value *root_v = json_doc_root(doc);
    const json_value *files = json_get(root_v, "files");
    const json_value *core = json_get(root_v, "openblas_core");
    if (!files || files->type != JSON_ARRAY || !core || core->type != JSON_STRING) {
        fprintf(stderr, "golden: %s: no \"files\" array or \"openblas_core\"\n", path);
        json_free(doc);
        return 1;
    }
    checker c = {root, files, NULL, 0};
    openblas_cases = openblas_core() && strcmp(core->str, openblas_core()) == 0;
    const json_value *amx = json_get(root_v, "amx_cpu");
    const char *amx_made = amx && amx->type == JSON_STRING ? amx->str : "none";
    const char *amx_here = amx_cpu_id();
    amx_cases = strcmp(amx_made, "none") != 0 && strcmp(amx_made, amx_here) == 0;
    if (!amx_cases)
        printf("golden: amx files skipped: they were made on %s, this machine is %s (the tile "
               "unit's order is the CPU's)\n",
               strcmp(amx_made, "none") ? amx_made : "a CPU without AMX (none)",
               strcmp(amx_here, "none") ? amx_here : "without AMX");
    if (!openblas_cases)
        printf("golden: openblas files skipped: they were made on OpenBLAS core %s, this machine's "
               "is %s (its sgemm kernels, and so their bits, differ by core)\n",
               core->str, openblas_core() ? openblas_core() : "none: built without OpenBLAS");

    /* Quick mode (the sanitizer tiers): the path the library picked, alone. */
    parity_cpu_path saved = parity_get_cpu_path();
    for (int path_i = PARITY_CPU_PORTABLE; path_i <= PARITY_CPU_AVX512BF16; path_i++) {
        if (quick() && path_i != (int)saved) continue;
        if (parity_set_cpu_path((parity_cpu_path)path_i) != PARITY_OK) {
            printf("golden: cpu path %s: not on this machine\n",
                   parity_cpu_path_name((parity_cpu_path)path_i));
            continue;
        }
        c.cpu_path = parity_cpu_path_name((parity_cpu_path)path_i);
        every_case = path_i == (int)saved;
        size_t before = c.compared;
        for_each_case(check_case, &c);
        printf("golden: cpu path %s: %zu files compared bitwise%s\n", c.cpu_path,
               c.compared - before,
               every_case ? "" : " (the trained model: one policy per GEMM and rounding kind)");
    }
    parity_set_cpu_path(saved);
    every_case = 1;
    json_free(doc);
    return check_report("golden");
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_all(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: test_golden [--write DIR]\n");
        return 2;
    }
    return check_all();
}
