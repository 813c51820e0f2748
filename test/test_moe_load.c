/* Mixture-of-experts checkpoints (qwen3_moe, qwen2_moe), on files this test writes into a
 * scratch directory:
 *   1. the blueprint of qwen3-moe-tiny (layers 0 and 2 sparse, 1 dense) and qwen2-moe-tiny
 *      (every layer sparse, a shared expert): tensor counts and which are linear;
 *   2. synthetic -> parity_model_save -> load: the config, and every tensor bitwise equal
 *      (parity_model_weight_values), the per-expert names in the file;
 *   3. the same weights in transformers v5's fused layout (mlp.experts.gate_up_proj [E, 2I, H],
 *      each expert's gate rows then its up rows; mlp.experts.down_proj [E, H, I]): BF16 in place
 *      and at an unaligned offset (copied), F32 with masters, each bitwise the per-expert
 *      checkpoint's values, and saved back byte for byte as the per-expert files; the bad files
 *      (both layouts in a layer, a shape or dtype not the layout's, one fused tensor without the
 *      other, a fused tensor in a dense layer, a NaN in one, fused experts in a quantized
 *      checkpoint, a layer with neither), each with its status, a message naming the tensor
 *      and *out left alone;
 *   4. parity_model_save_as in each quantized layout (fp8-block, nvfp4, mxfp4, bitnet) and back:
 *      the routed and shared experts hold shipped codes of the format and no values, the router
 *      and shared_expert_gate stay bf16, and parity_model_bytes' held is within 1.15 x the
 *      checkpoint's files, as test_held_compressed keeps for the dense models. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_files.h"
#include "fixtures.h"
#include "model/config.h"
#include "model/model.h"

static char root[PATH_LEN]; /* scratch directory */

/* A new directory root/name. */
static void new_dir(const char *name, char *dir) {
    join(dir, root, name);
    CHECK(mkdir(dir, 0700) == 0);
}

static uint64_t file_bytes(const char *dir, const char *name) {
    char path[PATH_LEN];
    struct stat st;
    join(path, dir, name);
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- 1. the blueprint ---------------------------------------------------------------------- */

/* The tensors of m's table: how many, how many linear, and whether `name` is one. */
static size_t count_tensors(const parity_model *m, size_t *linear) {
    size_t n;
    const expected *e = model_tensors(m, &n);
    *linear = 0;
    for (size_t i = 0; i < n; i++) *linear += (size_t)e[i].linear;
    return n;
}

static void test_blueprint(const parity_model *q3, const parity_model *q2) {
    size_t linear;
    /* qwen3-moe-tiny, untied: embed, norm, lm_head; a layer's attention q/k/v/o, q/k norms and
     * two norms (8); sparse: router + 8 experts x 3 = 25, dense: 3 */
    CHECK_INT(count_tensors(q3, &linear), 3 + 2 * (8 + 25) + (8 + 3));
    CHECK_INT(linear, 2 * (4 + 24) + (4 + 3));
    CHECK(model_find_tensor(q3, "model.layers.1.mlp.gate_proj.weight") != NULL);
    CHECK(model_find_tensor(q3, "model.layers.0.mlp.gate_proj.weight") == NULL);
    CHECK(model_find_tensor(q3, "model.layers.1.mlp.gate.weight") == NULL);
    const expected *router = model_find_tensor(q3, "model.layers.2.mlp.gate.weight");
    CHECK(router && !router->linear && router->rows == 8 && router->cols == 64);
    const expected *down = model_find_tensor(q3, "model.layers.2.mlp.experts.7.down_proj.weight");
    CHECK(down && down->linear && down->rows == 64 && down->cols == 32);
    /* qwen2-moe-tiny: attention with q/k/v biases and two norms (9); sparse: router, 24 expert
     * weights, the shared expert's 3 and its gate */
    CHECK_INT(count_tensors(q2, &linear), 3 + 3 * (9 + 29));
    CHECK_INT(linear, 3 * (4 + 24 + 3));
    const expected *gate = model_find_tensor(q2, "model.layers.0.mlp.shared_expert_gate.weight");
    CHECK(gate && !gate->linear && gate->rows == 1 && gate->cols == 64);
    const expected *shared = model_find_tensor(q2, "model.layers.1.mlp.shared_expert.up_proj.weight");
    CHECK(shared && shared->linear && shared->rows == 48 && shared->cols == 64);
}

/* ---- 2. per-expert checkpoints -------------------------------------------------------------- */

/* Every tensor of a and b (the same architecture) holds bitwise the same values, with masters
 * in both or in neither. */
static void check_same_weights(const parity_model *a, const parity_model *b, const char *what) {
    CHECK(a && b);
    if (!a || !b) return;
    size_t n, differ = 0;
    const expected *e = model_tensors(a, &n);
    for (size_t i = 0; i < n; i++) {
        parity_weight_info ia = {.size = sizeof ia}, ib = {.size = sizeof ib};
        CHECK_OK(parity_model_weight_info(a, e[i].name, &ia));
        CHECK_OK(parity_model_weight_info(b, e[i].name, &ib));
        const uint64_t count = ia.shape[0] * ia.shape[1];
        CHECK(ia.shape[0] == ib.shape[0] && ia.shape[1] == ib.shape[1]);
        CHECK_INT(ia.has_master, ib.has_master);
        float *va = malloc(count * 4), *vb = malloc(count * 4);
        if (!va || !vb) exit(2);
        CHECK_OK(parity_model_weight_values(a, e[i].name, va, count));
        CHECK_OK(parity_model_weight_values(b, e[i].name, vb, count));
        if (memcmp(va, vb, count * 4)) {
            if (differ++ < 5) fprintf(stderr, "  %s: '%s' differs\n", what, e[i].name);
        }
        free(va), free(vb);
    }
    CHECK_INT(differ, 0);
}

/* m saved as bf16 into root/name (dir), loaded back: the same config and weights, and the file
 * names every expert's weights one by one. Returns the loaded model. */
static parity_model *save_and_load(const parity_model *m, const char *name, char *dir) {
    new_dir(name, dir);
    CHECK_OK(parity_model_save(m, dir));
    parity_model *back = load(dir);
    if (!back) return NULL;
    CHECK(!memcmp(parity_model_config(m), parity_model_config(back), sizeof(parity_config)));
    check_same_weights(m, back, name);
    ckpt c;
    ckpt_read_in(&c, dir);
    size_t n;
    model_tensors(m, &n);
    CHECK_INT(c.n, n); /* the file holds the table, each tensor once */
    int per_expert = 0, fused = 0;
    for (size_t i = 0; i < c.n; i++) {
        per_expert += strstr(c.t[i].name, ".mlp.experts.0.down_proj.weight") != NULL;
        fused += strstr(c.t[i].name, "gate_up_proj") != NULL;
    }
    CHECK_INT(per_expert, (int)config_sparse_layers(parity_model_config(m)));
    CHECK_INT(fused, 0);
    ckpt_free(&c);
    return back;
}

/* ---- 3. the fused layout ------------------------------------------------------------------- */

/* c (a per-expert checkpoint of config cfg) with sparse layer l's expert weights moved into
 * the fused tensors, dtype and element size as c's. */
static void fuse_layer(ckpt *c, const parity_config *cfg, uint32_t l) {
    const uint64_t E = cfg->num_experts, I = cfg->moe_intermediate_size, H = cfg->hidden_size;
    char name[128];
    snprintf(name, sizeof name, "model.layers.%u.mlp.experts.0.gate_proj.weight", l);
    const size_t elem = ckpt_get(c, name)->bytes / (I * H);
    char dtype[8];
    snprintf(dtype, sizeof dtype, "%s", ckpt_get(c, name)->dtype);
    const size_t matrix = I * H * elem;
    uint8_t *gate_up = malloc(E * 2 * matrix), *down = malloc(E * matrix);
    if (!gate_up || !down) exit(2);
    for (uint32_t x = 0; x < E; x++) {
        static const char *const parts[3] = {"gate_proj", "up_proj", "down_proj"};
        for (int p = 0; p < 3; p++) {
            snprintf(name, sizeof name, "model.layers.%u.mlp.experts.%u.%s.weight", l, x, parts[p]);
            const tensor *t = ckpt_get(c, name);
            CHECK_INT(t->bytes, matrix);
            memcpy(p < 2 ? gate_up + (2 * x + (uint32_t)p) * matrix : down + x * matrix, t->data,
                   matrix);
            ckpt_remove(c, name);
        }
    }
    snprintf(name, sizeof name, "model.layers.%u.mlp.experts.gate_up_proj", l);
    ckpt_add(c, name, dtype, 3, (const uint64_t[]){E, 2 * I, H}, gate_up, E * 2 * matrix);
    snprintf(name, sizeof name, "model.layers.%u.mlp.experts.down_proj", l);
    ckpt_add(c, name, dtype, 3, (const uint64_t[]){E, H, I}, down, E * matrix);
    free(gate_up), free(down);
}

/* Every sparse layer of c fused. */
static void fuse_all(ckpt *c, const parity_config *cfg) {
    for (uint32_t l = 0; l < cfg->num_hidden_layers; l++)
        if (config_layer_is_sparse(cfg, l)) fuse_layer(c, cfg, l);
}

/* root/name holding config.json of config_dir and c as model.safetensors (data moved off
 * alignment by extra_pad bytes). */
static void write_checkpoint(const char *name, const char *config_dir, const ckpt *c,
                             size_t extra_pad, char *dir) {
    char path[PATH_LEN];
    new_dir(name, dir);
    free(copy_file_in(config_dir, dir, "config.json"));
    join(path, dir, "model.safetensors");
    write_st(path, c->t, c->n, extra_pad);
}

/* Whether dir_a/file and dir_b/file hold the same bytes. */
static int same_file_in(const char *dir_a, const char *dir_b, const char *file) {
    size_t la, lb;
    char pa[PATH_LEN], pb[PATH_LEN];
    join(pa, dir_a, file);
    join(pb, dir_b, file);
    char *a = read_all(pa, &la), *b = read_all(pb, &lb);
    const int same = a && b && la == lb && !memcmp(a, b, la);
    free(a), free(b);
    return same;
}

/* Every expert weight of a fused-loaded BF16 model lies in its mapped fused tensor: gate_proj
 * of expert x at gate_up_proj[x] rows 0..I-1, up_proj at rows I..2I-1, down_proj at
 * down_proj[x] (used in place, as a per-expert BF16 tensor is). */
static void check_views(const parity_model *m) {
    const parity_config *c = parity_model_config(m);
    const uint64_t E = c->num_experts, I = c->moe_intermediate_size, H = c->hidden_size;
    size_t wrong = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        if (!config_layer_is_sparse(c, l)) continue;
        char name[128];
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.0.gate_proj.weight", l);
        const uint16_t *gate_up = model_find_tensor(m, name)->dst->bf16;
        snprintf(name, sizeof name, "model.layers.%u.mlp.experts.0.down_proj.weight", l);
        const uint16_t *down = model_find_tensor(m, name)->dst->bf16;
        for (uint32_t x = 0; x < E; x++) {
            const layer_weights *lw = &m->layers[l];
            wrong += lw->expert_gate[x].bf16 != gate_up + x * 2 * I * H;
            wrong += lw->expert_up[x].bf16 != gate_up + (x * 2 + 1) * I * H;
            wrong += lw->expert_down[x].bf16 != down + x * H * I;
            wrong += model_owns(m, lw->expert_gate[x].bf16);
        }
    }
    CHECK_INT(wrong, 0);
}

/* A copy of the fused checkpoint `fused` with one change, written as root/name (config.json
 * of config_dir), whose load must fail with `status` naming needle (and needle2). */
typedef void (*ckpt_change)(ckpt *c);
static void check_bad(const char *name, const ckpt *fused, const char *config_dir,
                      ckpt_change change, int status, const char *needle, const char *needle2) {
    ckpt c;
    char dir[PATH_LEN];
    ckpt_copy(&c, fused);
    change(&c);
    write_checkpoint(name, config_dir, &c, 0, dir);
    check_load_fails(dir, status, needle, needle2);
    ckpt_free(&c);
}

/* The bad files' changes, on a fused qwen3-moe-tiny checkpoint (sparse layers 0 and 2, E 8,
 * I 32, H 64). */
static void add_per_expert(ckpt *c) { /* layer 0's expert 3 also per expert */
    const tensor *t = ckpt_get(c, "model.layers.0.mlp.experts.gate_up_proj");
    ckpt_add(c, "model.layers.0.mlp.experts.3.up_proj.weight", t->dtype, 2,
             (const uint64_t[]){32, 64}, t->data, 32 * 64 * 2);
}
static void halve_gate_up(ckpt *c) { /* [8, 32, 64]: the up rows missing */
    tensor *t = ckpt_get(c, "model.layers.2.mlp.experts.gate_up_proj");
    t->shape[1] = 32;
    t->bytes /= 2;
}
static void transpose_down(ckpt *c) { /* [8, 32, 64]: a transposed [E, I, H] layout (GptOss'
                                          kind; here 2I = H, so a transposed gate_up_proj would
                                          have its shape) */
    tensor *t = ckpt_get(c, "model.layers.0.mlp.experts.down_proj");
    t->shape[1] = 32;
    t->shape[2] = 64;
}
static void flatten_down(ckpt *c) { /* [8 * 64, 32] */
    tensor *t = ckpt_get(c, "model.layers.0.mlp.experts.down_proj");
    t->ndim = 2;
    t->shape[0] = 8 * 64;
    t->shape[1] = 32;
}
static void int_down(ckpt *c) { /* I16 bits where bf16 values belong */
    snprintf(ckpt_get(c, "model.layers.2.mlp.experts.down_proj")->dtype, 8, "I16");
}
static void drop_down(ckpt *c) { ckpt_remove(c, "model.layers.2.mlp.experts.down_proj"); }
static void drop_gate_up(ckpt *c) { ckpt_remove(c, "model.layers.0.mlp.experts.gate_up_proj"); }
static void drop_both(ckpt *c) {
    ckpt_remove(c, "model.layers.2.mlp.experts.gate_up_proj");
    ckpt_remove(c, "model.layers.2.mlp.experts.down_proj");
}
static void fuse_dense_layer(ckpt *c) { /* layer 1 is dense (mlp_only_layers) */
    const tensor *t = ckpt_get(c, "model.layers.0.mlp.experts.down_proj");
    ckpt_add(c, "model.layers.1.mlp.experts.down_proj", t->dtype, t->ndim, t->shape, t->data,
             t->bytes);
}
static void nan_in_up(ckpt *c) { /* expert 5's up_proj, its row 1, column 2 */
    tensor *t = ckpt_get(c, "model.layers.2.mlp.experts.gate_up_proj");
    const uint16_t nan = 0x7fc0;
    memcpy(t->data + 2 * ((5 * 64 + 32 + 1) * 64 + 2), &nan, 2);
}

/* The per-expert checkpoint per_expert_dir (per_expert loaded from it) in the fused layout
 * loads bitwise the same, BF16 (in place; copied when unaligned) and F32; `tag` names the
 * directories. */
static void test_fused(const parity_model *orig, const char *tag, const char *per_expert_dir,
                       const parity_model *per_expert) {
    ckpt base, fused;
    ckpt_read_in(&base, per_expert_dir);
    ckpt_copy(&fused, &base);
    fuse_all(&fused, parity_model_config(orig));
    char dir[PATH_LEN], again[PATH_LEN], name[128];

    /* BF16, aligned: views into the mapping, bitwise the per-expert weights; saved back as the
     * per-expert files, byte for byte */
    snprintf(name, sizeof name, "%s-fused", tag);
    write_checkpoint(name, per_expert_dir, &fused, 0, dir);
    parity_model *m = load(dir);
    check_same_weights(per_expert, m, "fused BF16");
    if (m) {
        check_views(m);
        snprintf(name, sizeof name, "%s-fused-saved", tag);
        new_dir(name, again);
        CHECK_OK(parity_model_save(m, again));
        CHECK(same_file_in(per_expert_dir, again, "model.safetensors"));
        CHECK(same_file_in(per_expert_dir, again, "config.json"));
        parity_model_free(m);
    }
    /* BF16 at an odd offset: copied, the same values */
    snprintf(name, sizeof name, "%s-fused-unaligned", tag);
    write_checkpoint(name, per_expert_dir, &fused, 1, dir);
    m = load(dir);
    check_same_weights(per_expert, m, "fused BF16, unaligned");
    parity_model_free(m);
    /* F32 with bits below bf16's: masters, as the per-expert F32 file's */
    ckpt f32_fused, f32_base;
    ckpt_copy(&f32_fused, &fused);
    ckpt_copy(&f32_base, &base);
    ckpt_bf16_to_f32(&f32_fused, 0x1234);
    ckpt_bf16_to_f32(&f32_base, 0x1234);
    snprintf(name, sizeof name, "%s-fused-f32", tag);
    write_checkpoint(name, per_expert_dir, &f32_fused, 0, dir);
    snprintf(name, sizeof name, "%s-f32", tag);
    write_checkpoint(name, per_expert_dir, &f32_base, 0, again);
    parity_model *a = load(dir), *b = load(again);
    check_same_weights(b, a, "fused F32");
    if (a) {
        parity_weight_info info = {.size = sizeof info};
        CHECK_OK(parity_model_weight_info(a, "model.layers.2.mlp.experts.6.up_proj.weight", &info));
        CHECK_INT(info.has_master, 1);
    }
    parity_model_free(a), parity_model_free(b);
    ckpt_free(&f32_fused), ckpt_free(&f32_base);
    ckpt_free(&base), ckpt_free(&fused);
}

/* The bad fused files of qwen3-moe-tiny (orig, saved per expert in per_expert_dir). */
static void test_fused_bad(const parity_model *orig, const char *per_expert_dir) {
    ckpt fused;
    ckpt_read_in(&fused, per_expert_dir);
    fuse_all(&fused, parity_model_config(orig));
    char dir[PATH_LEN];
    static const struct {
        const char *name;
        ckpt_change change;
        int status;
        const char *needle, *needle2;
    } cases[] = {
        {"both-layouts", add_per_expert, PARITY_ERR_TENSOR_UNEXPECTED,
         "model.layers.0.mlp.experts.3.up_proj.weight", "gate_up_proj"},
        {"half-gate-up", halve_gate_up, PARITY_ERR_TENSOR_SHAPE,
         "model.layers.2.mlp.experts.gate_up_proj", "[8, 32, 64]"},
        {"transposed-down", transpose_down, PARITY_ERR_TENSOR_SHAPE,
         "model.layers.0.mlp.experts.down_proj", "hidden_size=64, moe_intermediate_size=32"},
        {"flat-down", flatten_down, PARITY_ERR_TENSOR_SHAPE, "model.layers.0.mlp.experts.down_proj",
         "not 3"},
        {"int-down", int_down, PARITY_ERR_TENSOR_DTYPE, "model.layers.2.mlp.experts.down_proj",
         "I16"},
        {"gate-up-alone", drop_down, PARITY_ERR_TENSOR_MISSING,
         "'model.layers.2.mlp.experts.down_proj' is missing", "gate_up_proj"},
        {"down-alone", drop_gate_up, PARITY_ERR_TENSOR_MISSING,
         "'model.layers.0.mlp.experts.gate_up_proj' is missing", NULL},
        {"no-experts", drop_both, PARITY_ERR_TENSOR_MISSING,
         "model.layers.2.mlp.experts.0.gate_proj.weight", NULL},
        {"fused-dense-layer", fuse_dense_layer, PARITY_ERR_TENSOR_UNEXPECTED,
         "model.layers.1.mlp.experts.down_proj", NULL},
        {"nan-up", nan_in_up, PARITY_ERR_TENSOR_NONFINITE, "gate_up_proj' (expert 5's up_proj)",
         "element 66"},
    };
    printf("failures, as expected:\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_bad(cases[i].name, &fused, per_expert_dir, cases[i].change, cases[i].status,
                  cases[i].needle, cases[i].needle2);
    /* a quantized checkpoint's config.json over fused BF16 experts */
    char fp8_dir[PATH_LEN];
    new_dir("fp8-config", fp8_dir);
    CHECK_OK(parity_model_save_as(orig, fp8_dir, "fp8-block:deepseek"));
    write_checkpoint("fused-fp8", fp8_dir, &fused, 0, dir);
    check_load_fails(dir, PARITY_ERR_UNSUPPORTED, "model.layers.0.mlp.experts.gate_up_proj",
                     "quant_method fp8");
    ckpt_free(&fused);
}

/* ---- 4. quantized layouts -------------------------------------------------------------------- */

static void test_quantized(const parity_model *orig, const char *tag) {
    static const struct {
        const char *layout, *preset;
        int gemm;
    } cases[] = {
        {"fp8-block:deepseek", "vllm+fp8-block:deepseek", PARITY_GEMM_FP8_BLOCK},
        {"nvfp4:modelopt", "vllm+nvfp4:modelopt", PARITY_GEMM_NVFP4},
        {"mxfp4:ocp", "vllm+mxfp4:ocp", PARITY_GEMM_MXFP4},
        {"bitnet:bitnet", "vllm+ternary:bitnet", PARITY_GEMM_TERNARY},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char name[96], dir[PATH_LEN];
        snprintf(name, sizeof name, "%s-%.*s", tag, (int)strcspn(cases[k].layout, ":"),
                 cases[k].layout);
        new_dir(name, dir);
        CHECK_OK(parity_model_save_as(orig, dir, cases[k].layout));
        parity_model *m = load(dir);
        if (!m) continue;
        size_t n, codes = 0, values = 0, plain = 0, linear = 0;
        const expected *e = model_tensors(m, &n);
        for (size_t i = 0; i < n; i++) {
            const weight *w = e[i].dst;
            if (e[i].linear) {
                linear++;
                codes += w->shipped && w->shipped_gemm == cases[k].gemm && !w->bf16 && !w->master;
            } else {
                plain += !w->shipped && w->bf16 != NULL;
            }
            values += w->shipped == NULL;
        }
        CHECK_INT(codes, linear);
        CHECK_INT(plain, n - linear);
        CHECK_INT(values, n - linear);
        /* the router and the shared expert's gate stay bf16; the shared expert is codes */
        const char *kept[] = {"model.layers.0.mlp.gate.weight",
                              "model.layers.0.mlp.shared_expert_gate.weight"};
        for (int i = 0; i < 2; i++) {
            const expected *x = model_find_tensor(m, kept[i]);
            if (x) CHECK(!x->linear && !x->dst->shipped && x->dst->bf16);
        }
        const expected *up = model_find_tensor(m, "model.layers.0.mlp.shared_expert.up_proj.weight");
        if (up) CHECK(up->linear && up->dst->shipped);
        const uint64_t held = weight_bytes_of(m, cases[k].preset, PARITY_BACKEND_BF16).held;
        const uint64_t files = file_bytes(dir, "config.json") +
                               file_bytes(dir, "model.safetensors") +
                               file_bytes(dir, "hf_quant_config.json");
        printf("%-16s %-18s checkpoint %7llu bytes, held %7llu (%.3f x)\n", tag,
               cases[k].layout, (unsigned long long)files, (unsigned long long)held,
               (double)held / (double)files);
        CHECK(held <= files * 115 / 100);
        /* the file names each expert's weights one by one */
        ckpt c;
        ckpt_read_in(&c, dir);
        int gate_up = 0;
        for (size_t i = 0; i < c.n; i++) gate_up += strstr(c.t[i].name, "gate_up_proj") != NULL;
        CHECK_INT(gate_up, 0);
        ckpt_free(&c);
        parity_model_free(m);
    }
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/parity-moe-load-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    parity_model *q3 = NULL, *q2 = NULL;
    CHECK_OK(parity_model_open("synthetic:qwen3-moe-tiny:7", &q3));
    CHECK_OK(parity_model_open("synthetic:qwen2-moe-tiny:8", &q2));
    if (q3 && q2) {
        test_blueprint(q3, q2);
        char q3_dir[PATH_LEN], q2_dir[PATH_LEN];
        parity_model *q3_back = save_and_load(q3, "qwen3-moe-tiny", q3_dir);
        parity_model *q2_back = save_and_load(q2, "qwen2-moe-tiny", q2_dir);
        if (q3_back) test_fused(q3, "qwen3-moe-tiny", q3_dir, q3_back);
        if (q2_back) test_fused(q2, "qwen2-moe-tiny", q2_dir, q2_back);
        test_fused_bad(q3, q3_dir);
        parity_model_free(q3_back), parity_model_free(q2_back);
        test_quantized(q3, "qwen3-moe-tiny");
        test_quantized(q2, "qwen2-moe-tiny");
    }
    parity_model_free(q3), parity_model_free(q2);
    remove_tree(root);
    return check_report("moe_load");
}
