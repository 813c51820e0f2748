/* Weights held compressed: a model loaded from a block-FP8, NVFP4, MXFP4 or BitNet checkpoint
 * (each saved here from the trained checkpoint) holds its linear weights' codes and scales
 * alone, also after scoring under its own format, and parity_model_bytes counts exactly that
 * (within 1.15 x the checkpoint's file bytes for block-FP8, whose codes are a byte each as in
 * the file, and for BitNet, whose codes are four a byte as in the file); the dequantized values appear, once, when a reader asks (a bf16, fp32 or fp16
 * scorer, one of another quantized format, one weight's model_weight_values, a save in another
 * layout, a manifest of bf16 entries), and everything read from them is bitwise what a model
 * that made them first reads: log-probs under bf16, fp32, fp16, another format and the
 * checkpoint's, the values, the saved files, the manifests and their verification, and a
 * block-FP8 update taken in with or without values. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "model/model.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

static const char TEXT[] = "Weights held compressed: codes and scales, the values on demand.";
#define SEQ_LEN (sizeof TEXT - 1)

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static uint64_t file_bytes(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The bytes of a checkpoint directory's files (config.json, model.safetensors and, for NVFP4,
 * hf_quant_config.json). */
static uint64_t checkpoint_bytes(const char *dir) {
    static const char *const names[] = {"config.json", "model.safetensors",
                                        "hf_quant_config.json"};
    uint64_t total = 0;
    for (size_t i = 0; i < 3; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        total += file_bytes(path);
    }
    return total;
}

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        const int ca = fgetc(fa), cb = fgetc(fb);
        same = ca == cb;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static parity_model *load(const char *dir) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_load(dir, &m));
    return m;
}

static uint64_t held(const parity_model *m, const char *preset) {
    return weight_bytes_of(m, preset, PARITY_BACKEND_BF16).held;
}

/* The log-probs of TEXT under `preset` (SEQ_LEN - 1 values into lp). */
static void score(const parity_model *m, const char *preset, float *lp) {
    int32_t tokens[SEQ_LEN];
    for (size_t i = 0; i < SEQ_LEN; i++) tokens[i] = (unsigned char)TEXT[i];
    const uint32_t len = SEQ_LEN;
    parity_scorer *s = new_scorer(m, (fixture){.policy = preset, .n_threads = 2});
    if (!s) return;
    score_raw(s, tokens, &len, 1, lp);
    parity_scorer_free(s);
}

/* The number of m's decoder linear weights that hold shipped codes of `gemm`, and of those,
 * how many hold any copy of their values (bf16, master, fp32, fp16). */
static void count_linear(const parity_model *m, int gemm, size_t *shipped, size_t *valued) {
    size_t n;
    const expected *t = model_tensors(m, &n);
    *shipped = *valued = 0;
    for (size_t i = 0; i < n; i++) {
        const weight *w = t[i].dst;
        if (!t[i].linear || !w->shipped || w->shipped_gemm != gemm) continue;
        (*shipped)++;
        *valued += w->bf16 || w->master || w->wide || w->fp16;
    }
}

/* The linear weights of m whose shipped codes of format `gemm` have their block scales used in
 * place from the mapped checkpoint (not buffers of the model's own). */
static size_t mapped_scales(const parity_model *m, int gemm) {
    size_t n, mapped = 0;
    const expected *t = model_tensors(m, &n);
    for (size_t i = 0; i < n; i++) {
        const weight *w = t[i].dst;
        if (t[i].linear && w->shipped && w->shipped_gemm == gemm)
            mapped += !model_owns(m, w->shipped->scales);
    }
    return mapped;
}

/* What m holds with its linear weights as codes and scales alone (the codes packed as the
 * format holds them, quant_weight_code_bytes: a byte each for E4M3, two a byte for E2M1, four a
 * byte in groups of 64 for ternary; the scales as parity_quant_scale_count grids them under
 * `quantizer`, a byte each for NVFP4 and MXFP4, else fp32), the other tensors' bf16 values
 * as loaded, the vectors also widened; and the elements of the linear weights. */
static uint64_t compressed_bytes(const parity_model *m, int quantizer, uint64_t *linear) {
    size_t n;
    const expected *t = model_tensors(m, &n);
    uint64_t total = 0;
    *linear = 0;
    for (size_t i = 0; i < n; i++) {
        const weight *w = t[i].dst;
        const uint64_t count = (uint64_t)w->rows * w->cols;
        if (!w->rows) continue;
        if (t[i].linear) {
            *linear += count;
            /* NVFP4's and MXFP4's block scales are held as their checkpoints' bytes (E4M3,
             * E8M0), the others' as fp32 */
            const uint32_t gemm = quant_rule_of(quantizer)->format->gemm;
            const uint64_t scale_bytes =
                gemm == PARITY_GEMM_NVFP4 || gemm == PARITY_GEMM_MXFP4 ? 1 : 4;
            total += quant_weight_code_bytes(quant_rule_of(quantizer)->format, w->rows, w->cols) +
                     scale_bytes * parity_quant_scale_count(quantizer, w->rows, w->cols);
        } else {
            total += 2 * count + (w->rows == 1 ? 4 * count : 0);
        }
    }
    return total;
}

/* Every linear weight of a and b holds the same values, bitwise (both made). */
static void check_same_values(const parity_model *a, const parity_model *b, const char *what) {
    size_t n;
    const expected *t = model_tensors(a, &n);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t[i].linear) continue;
        const weight *wa = t[i].dst, *wb = model_find_tensor(b, t[i].name)->dst;
        const size_t count = (size_t)wa->rows * wa->cols;
        CHECK(wa->bf16 && wb->bf16 && wa->master && wb->master);
        if (!wa->bf16 || !wb->bf16 || !wa->master || !wb->master) return;
        differ += memcmp(wa->bf16, wb->bf16, 2 * count) != 0;
        differ += memcmp(wa->master, wb->master, 4 * count) != 0;
    }
    CHECK_INT(differ, 0);
    if (differ) fprintf(stderr, "  %s: %zu value copies differ\n", what, differ);
}

typedef struct format_case {
    const char *layout, *preset;
    int gemm;
} format_case;

/* A file `name` of dir saved from m in `layout`. */
static void save_into(const parity_model *m, const char *root, const char *name,
                      const char *layout, char *dir, size_t size) {
    snprintf(dir, size, "%s/%s", root, name);
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_OK(parity_model_save_as(m, dir, layout));
}

/* A block-FP8 update of layer 0's gate_proj with layer 1's shipped codes and scales (same
 * shape), as a learner ships them. */
static void update_gate(parity_model *m) {
    const weight *src = model_find_tensor(m, "model.layers.1.mlp.gate_proj.weight")->dst;
    const uint64_t gr = (src->rows + 127) / 128, gc = (src->cols + 127) / 128;
    const parity_tensor_data t[2] = {
        {"model.layers.0.mlp.gate_proj.weight", PARITY_DTYPE_F8_E4M3, 2, {src->rows, src->cols},
         src->shipped->codes},
        {"model.layers.0.mlp.gate_proj.weight_scale_inv", PARITY_DTYPE_F32, 2, {gr, gc},
         src->shipped->scales}};
    CHECK_OK(parity_model_update(m, t, 2));
}

static void test_format(const char *root, const format_case *f) {
    char dir[1024], tag[64];
    snprintf(tag, sizeof tag, "%.*s", (int)strcspn(f->layout, ":"), f->layout);
    parity_model *orig = NULL;
    load_model(TRAINED_MODEL, &orig);
    if (!orig) return;
    save_into(orig, root, tag, f->layout, dir, sizeof dir);
    parity_model_free(orig);
    const uint64_t ckpt = checkpoint_bytes(dir);
    parity_policy pol;
    CHECK_OK(parity_policy_from_name(f->preset, &pol));

    /* A: loaded, served under its format: the codes alone, counted as such */
    parity_model *a = load(dir), *b = load(dir);
    if (!a || !b) return;
    size_t shipped, valued;
    count_linear(a, f->gemm, &shipped, &valued);
    CHECK_INT(shipped, 7u * parity_model_config(a)->num_hidden_layers);
    CHECK_INT(valued, 0);
    /* NVFP4's and MXFP4's scale bytes are the mapped file's, used in place */
    if (f->gemm == PARITY_GEMM_NVFP4 || f->gemm == PARITY_GEMM_MXFP4)
        CHECK_INT(mapped_scales(a, f->gemm), shipped);
    uint64_t linear;
    const uint64_t want = compressed_bytes(a, pol.quantizer, &linear);
    CHECK_INT(held(a, f->preset), want);
    float lp_fmt_a[SEQ_LEN], lp_bf16_a[SEQ_LEN], lp_fmt_b[SEQ_LEN], lp_bf16_b[SEQ_LEN];
    score(a, f->preset, lp_fmt_a);
    count_linear(a, f->gemm, &shipped, &valued);
    CHECK_INT(valued, 0);
    const uint64_t served = held(a, f->preset);
    CHECK_INT(served, want);
    printf("%-18s checkpoint %9llu bytes, held after scoring under %s %9llu (%.3f x)\n",
           f->layout, (unsigned long long)ckpt, f->preset, (unsigned long long)served,
           (double)served / (double)ckpt);
    /* block-FP8 codes are a byte each, as in the file; NVFP4 and MXFP4 codes two a byte and
     * their block scales a byte each (E4M3, E8M0), as in the file */
    if (f->gemm == PARITY_GEMM_FP8_BLOCK) CHECK(served <= ckpt * 115 / 100);
    /* ternary codes four a byte, as in the file (there four rows' codes a byte) */
    if (f->gemm == PARITY_GEMM_TERNARY) CHECK(served <= ckpt * 115 / 100);
    if (f->gemm == PARITY_GEMM_NVFP4 || f->gemm == PARITY_GEMM_MXFP4)
        CHECK(served <= ckpt * 115 / 100);

    /* then bf16: the values appear, bf16 and fp32 masters; B made them first */
    score(a, "vllm", lp_bf16_a);
    count_linear(a, f->gemm, &shipped, &valued);
    CHECK_INT(valued, shipped);
    CHECK_INT(held(a, f->preset), want + 6 * linear);
    score(b, "vllm", lp_bf16_b);
    score(b, f->preset, lp_fmt_b);
    CHECK_BITS_F32(lp_bf16_a, lp_bf16_b, SEQ_LEN - 1, "bf16 log-probs: after the format / first");
    CHECK_BITS_F32(lp_fmt_a, lp_fmt_b, SEQ_LEN - 1, "format log-probs: before / after the values");

    /* the other readers of values: fp32 and fp16 compute, a quantizer of another format;
     * each makes them on a compressed model, and scores as on B, which holds them */
    const char *const readers[] = {"fp32", "vllm+fp16",
                                   f->gemm == PARITY_GEMM_FP8_BLOCK ? "vllm+mxfp8:ocp"
                                                                    : "vllm+fp8-block:deepseek"};
    for (size_t r = 0; r < sizeof readers / sizeof *readers; r++) {
        parity_model *g = load(dir);
        if (!g) continue;
        float lp_g[SEQ_LEN], lp_b[SEQ_LEN];
        score(g, readers[r], lp_g);
        score(b, readers[r], lp_b);
        count_linear(g, f->gemm, &shipped, &valued);
        CHECK_INT(valued, shipped);
        char label[96];
        snprintf(label, sizeof label, "%s log-probs on a %s model", readers[r], f->layout);
        CHECK_BITS_F32(lp_g, lp_b, SEQ_LEN - 1, label);
        parity_model_free(g);
    }

    /* one weight's values on demand are the whole model's, bitwise */
    parity_model *c = load(dir);
    if (c) {
        size_t n;
        const expected *t = model_tensors(c, &n);
        for (size_t i = 0; i < n; i++)
            if (t[i].linear) CHECK_OK(model_weight_values(c, t[i].dst));
        check_same_values(a, c, f->layout);
        parity_model_free(c);
    }

    /* a save in the bf16 layout and a manifest of bf16 entries ask for the values: the same
     * files as from a model that holds them; a manifest of the format reads the codes alone */
    parity_model *d = load(dir);
    if (d) {
        char manifest_d[1100], manifest_b[1100], fmt_manifest[1100], saved_d[1100],
            saved_b[1100], path_d[1200], path_b[1200];
        snprintf(fmt_manifest, sizeof fmt_manifest, "%s/%s-format.json", root, tag);
        CHECK_OK(parity_model_write_manifest_for(d, &pol, fmt_manifest));
        count_linear(d, f->gemm, &shipped, &valued);
        CHECK_INT(valued, 0);
        snprintf(manifest_d, sizeof manifest_d, "%s/%s-d.json", root, tag);
        snprintf(manifest_b, sizeof manifest_b, "%s/%s-b.json", root, tag);
        CHECK_OK(parity_model_write_manifest(d, manifest_d));
        CHECK_OK(parity_model_write_manifest(b, manifest_b));
        CHECK(same_file(manifest_d, manifest_b));
        parity_model_free(d);
        /* verifying a compressed model: the format's entries against its codes alone, the
         * bf16 entries against the values it makes for them */
        d = load(dir);
        if (d) {
            CHECK_OK(parity_model_verify_for(d, &pol, fmt_manifest, NULL, 0));
            count_linear(d, f->gemm, &shipped, &valued);
            CHECK_INT(valued, 0);
            CHECK_OK(parity_model_verify(d, manifest_b, NULL, 0));
            count_linear(d, f->gemm, &shipped, &valued);
            CHECK_INT(valued, shipped);
            parity_model_free(d);
        }
        d = load(dir);
        if (d) {
            save_into(d, root, "bf16-d", "bf16", saved_d, sizeof saved_d);
            save_into(b, root, "bf16-b", "bf16", saved_b, sizeof saved_b);
            snprintf(path_d, sizeof path_d, "%s/model.safetensors", saved_d);
            snprintf(path_b, sizeof path_b, "%s/model.safetensors", saved_b);
            CHECK(same_file(path_d, path_b));
            CHECK(nftw(saved_d, remove_entry, 8, FTW_DEPTH | FTW_PHYS) == 0);
            CHECK(nftw(saved_b, remove_entry, 8, FTW_DEPTH | FTW_PHYS) == 0);
            parity_model_free(d);
        }
    }

    /* a block-FP8 update keeps a weight that holds no values compressed; the values made
     * after it are those of a model that held values when it came in */
    if (f->gemm == PARITY_GEMM_FP8_BLOCK) {
        parity_model *e = load(dir);
        if (e) {
            update_gate(e);
            update_gate(b);
            count_linear(e, f->gemm, &shipped, &valued);
            CHECK_INT(valued, 0);
            float lp_e[SEQ_LEN];
            score(e, "vllm", lp_e);
            score(b, "vllm", lp_bf16_b);
            CHECK_BITS_F32(lp_e, lp_bf16_b, SEQ_LEN - 1, "bf16 log-probs after an fp8 update");
            check_same_values(e, b, "after an fp8 update");
            parity_model_free(e);
        }
    }
    parity_model_free(a);
    parity_model_free(b);
}

int main(void) {
    char root[] = "/tmp/parity-held-compressed-XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    static const format_case cases[] = {
        {"fp8-block:deepseek", "vllm+fp8-block:deepseek", PARITY_GEMM_FP8_BLOCK},
        {"nvfp4:modelopt", "vllm+nvfp4:modelopt", PARITY_GEMM_NVFP4},
        {"mxfp4:ocp", "vllm+mxfp4:ocp", PARITY_GEMM_MXFP4},
        {"bitnet:bitnet", "vllm+ternary:bitnet", PARITY_GEMM_TERNARY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) test_format(root, &cases[i]);
    CHECK(nftw(root, remove_entry, 8, FTW_DEPTH | FTW_PHYS) == 0);
    return check_report("held_compressed");
}
