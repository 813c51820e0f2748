/* Writes the crafted seeds of the fuzz targets: `make_seeds SOURCE_ROOT OUT_DIR` fills
 * OUT_DIR/<target>/ with inputs built from the micro checkpoint (fuzz_common.h) and the test
 * data, as they were made for test/fuzz/corpus/ (which then grew by fuzzing and was pruned
 * with -merge=1). */
#include "fuzz_common.h"

static char out_root[512];

static void seed(const char *target, const char *name, const void *data, size_t len) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", out_root, target);
    mkdir(dir, 0755);
    fuzz_write(dir, name, data, len);
}

static char *slurp(const char *dir, const char *name, size_t *len) {
    char path[1024];
    fuzz_path(path, sizeof path, dir, name);
    FILE *f = fopen(path, "rb");
    FUZZ_REQUIRE(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len + 1);
    FUZZ_REQUIRE(buf && fread(buf, 1, *len, f) == *len, "cannot read %s", path);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

/* Copies every file of src_dir into the target's seeds. */
static void seed_dir(const char *target, const char *src_dir) {
    DIR *d = opendir(src_dir);
    FUZZ_REQUIRE(d != NULL, "cannot open %s", src_dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        size_t len;
        char *buf = slurp(src_dir, e->d_name, &len);
        seed(target, e->d_name, buf, len);
        free(buf);
    }
    closedir(d);
}

/* An index mapping every tensor of the micro checkpoint: to model.safetensors, or to the
 * shards as fuzz_write_checkpoint splits them; `skip` >= 0 leaves that tensor out. */
static size_t make_index(const st_file *f, int sharded, long skip, const char *shard_override,
                         char *out, size_t cap) {
    size_t len = (size_t)snprintf(out, cap, "{\"metadata\": {\"total_size\": %zu}, "
                                            "\"weight_map\": {", f->size);
    for (size_t i = 0, n = 0; i < f->n_tensors; i++) {
        if ((long)i == skip) continue;
        const char *shard = shard_override ? shard_override
                            : !sharded     ? fuzz_files[2]
                            : i < f->n_tensors / 2 ? fuzz_files[3]
                                                   : fuzz_files[4];
        len += (size_t)snprintf(out + len, cap - len, "%s\"%s\": \"%s\"", n++ ? ", " : "",
                                f->tensors[i].name, shard);
    }
    len += (size_t)snprintf(out + len, cap - len, "}}\n");
    return len;
}

/* A fuzz_load input: the parts joined by the marker. */
static void seed_load(const char *name, const char *const *parts, const size_t *lens) {
    size_t total = 0;
    for (size_t i = 0; i < FUZZ_N_FILES; i++) total += lens[i] + FUZZ_MARKER_LEN;
    char *buf = malloc(total), *p = buf;
    for (size_t i = 0; i < FUZZ_N_FILES; i++) {
        if (i) memcpy(p, FUZZ_MARKER, FUZZ_MARKER_LEN), p += FUZZ_MARKER_LEN;
        for (size_t k = 0; k + FUZZ_MARKER_LEN <= lens[i]; k++)
            FUZZ_REQUIRE(memcmp(parts[i] + k, FUZZ_MARKER, FUZZ_MARKER_LEN), "marker in a part");
        if (lens[i]) memcpy(p, parts[i], lens[i]), p += lens[i];
    }
    seed("load", name, buf, (size_t)(p - buf));
    free(buf);
}

static void seed_score(const char *name, const uint8_t *head, size_t n_head, size_t n_tokens) {
    uint8_t buf[2048];
    memcpy(buf, head, n_head);
    for (size_t i = 0; i < n_tokens; i++) buf[n_head + i] = (uint8_t)(i * 37 + 11);
    seed("score", name, buf, n_head + n_tokens);
}

/* A synthetic model of config c saved in `layout` (parity_model_save_as) as a fuzz_load seed
 * `name`, and its config.json and model.safetensors as json and safetensors seeds. */
static void seed_saved(const parity_config *c, const char *layout, const char *name) {
    char dir[1024], file[96];
    snprintf(dir, sizeof dir, "%s/parity-seeds-saved-XXXXXX",
             getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    FUZZ_REQUIRE(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
    parity_model *m = NULL;
    FUZZ_REQUIRE(parity_model_synthetic(c, 7, &m) == PARITY_OK, "%s", parity_last_error());
    FUZZ_REQUIRE(parity_model_save_as(m, dir, layout) == PARITY_OK, "%s", parity_last_error());
    parity_model_free(m);
    size_t config_len, st_len;
    char *config = slurp(dir, fuzz_files[0], &config_len), *st = slurp(dir, fuzz_files[2], &st_len);
    const char *parts[FUZZ_N_FILES] = {config, NULL, st, NULL, NULL};
    size_t lens[FUZZ_N_FILES] = {config_len, 0, st_len, 0, 0};
    fuzz_remove(dir, fuzz_files[0]);
    fuzz_remove(dir, fuzz_files[2]);
    fuzz_remove(dir, "hf_quant_config.json");
    rmdir(dir);
    seed_load(name, parts, lens);
    snprintf(file, sizeof file, "%s-config.json", name);
    seed("json", file, config, config_len);
    snprintf(file, sizeof file, "%s.safetensors", name);
    seed("safetensors", file, st, st_len);
    free(config);
    free(st);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOURCE_ROOT OUT_DIR\n", argv[0]);
        return 2;
    }
    const char *root = argv[1];
    snprintf(out_root, sizeof out_root, "%s", argv[2]);
    mkdir(out_root, 0755);
    const char *dir = fuzz_make_dir("seeds");
    fuzz_write_checkpoint(dir);
    size_t config_len, st_len, s1_len, s2_len;
    char *config = slurp(dir, fuzz_files[0], &config_len);
    char *st = slurp(dir, fuzz_files[2], &st_len);
    char *s1 = slurp(dir, fuzz_files[3], &s1_len), *s2 = slurp(dir, fuzz_files[4], &s2_len);
    st_file *f = NULL;
    FUZZ_REQUIRE(st_parse((const uint8_t *)st, st_len, "micro", &f) == PARITY_OK, "micro");

    /* safetensors: the rule-by-rule corpus and the micro checkpoint's files */
    char path[1024];
    snprintf(path, sizeof path, "%s/test/data/bad-safetensors", root);
    seed_dir("safetensors", path);
    seed("safetensors", "micro.safetensors", st, st_len);
    seed("safetensors", "micro-shard-1.safetensors", s1, s1_len);

    /* json: real and crafted configs, and indexes */
    snprintf(path, sizeof path, "%s/test/data/configs", root);
    seed_dir("json", path);
    size_t len, trained_len;
    snprintf(path, sizeof path, "%s/models/qwen3-bytes-pystdlib-4.9m", root);
    char *trained = slurp(path, "config.json", &trained_len);
    seed("json", "qwen3-bytes-pystdlib-4.9m.json", trained, trained_len);
    seed("json", "micro-config.json", config, config_len);

    /* index: to the single file, to the shards, one tensor short, a path outside */
    char index[8192];
    len = make_index(f, 0, -1, NULL, index, sizeof index);
    seed("index", "single.json", index, len);
    seed("json", "index-single.json", index, len);
    len = make_index(f, 1, -1, NULL, index, sizeof index);
    seed("index", "sharded.json", index, len);
    size_t sharded_len = len;
    char sharded[8192];
    memcpy(sharded, index, len);
    len = make_index(f, 1, 3, NULL, index, sizeof index);
    seed("index", "sharded-missing-one.json", index, len);
    len = make_index(f, 0, -1, "../model.safetensors", index, sizeof index);
    seed("index", "outside.json", index, len);

    /* load: single file, sharded, the trained model's config over micro weights, weights
     * without a config */
    const char *parts[FUZZ_N_FILES] = {config, NULL, st, NULL, NULL};
    size_t lens[FUZZ_N_FILES] = {config_len, 0, st_len, 0, 0};
    seed_load("single", parts, lens);
    const char *parts_sharded[FUZZ_N_FILES] = {config, sharded, NULL, s1, s2};
    size_t lens_sharded[FUZZ_N_FILES] = {config_len, sharded_len, 0, s1_len, s2_len};
    seed_load("sharded", parts_sharded, lens_sharded);
    parts[0] = trained, lens[0] = trained_len;
    seed_load("trained-config", parts, lens);
    parts[0] = NULL, lens[0] = 0;
    seed_load("no-config", parts, lens);
    /* quantized checkpoints as the library writes them: block-FP8 (F8_E4M3 codes and
     * weight_scale_inv), BitNet (packed ternary codes, weight_scale), ModelOpt NVFP4 (packed
     * E2M1, F8_E4M3 weight_scale, weight_scale_2) and MXFP4 (*_blocks, *_scales) */
    static const struct {
        const char *layout, *name;
    } quantized[] = {{"fp8-block:deepseek", "fp8-block"},
                     {"bitnet:bitnet", "bitnet"},
                     {"nvfp4:modelopt", "nvfp4"},
                     {"mxfp4:ocp", "mxfp4"}};
    for (size_t k = 0; k < sizeof quantized / sizeof quantized[0]; k++) {
        parity_config c = fuzz_micro_config();
        seed_saved(&c, quantized[k].layout, quantized[k].name);
    }
    /* mixture of experts, as parity_model_save writes them: a micro Qwen3-MoE (2 of 4 experts,
     * norm_topk_prob), the same in NVFP4, and a micro Qwen2-MoE (a shared expert, q/k/v bias) */
    for (int qwen2 = 0; qwen2 <= 1; qwen2++) {
        parity_config c = fuzz_micro_config();
        c.arch = qwen2 ? PARITY_ARCH_QWEN2_MOE : PARITY_ARCH_QWEN3_MOE;
        c.qk_norm = !qwen2;
        c.attention_bias = qwen2;
        c.num_experts = 4;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 4;
        c.shared_expert_intermediate_size = qwen2 ? 8 : 0;
        c.norm_topk_prob = !qwen2;
        c.decoder_sparse_step = 1;
        seed_saved(&c, "bf16", qwen2 ? "qwen2-moe" : "qwen3-moe");
        if (!qwen2) seed_saved(&c, "nvfp4:modelopt", "qwen3-moe-nvfp4");
    }

    /* score: valid calls on each scorer, and a few invalid ones (see fuzz_score.c) */
    static const struct {
        const char *name;
        uint8_t head[32];
        size_t n_head, n_tokens;
    } scores[] = {
        {"raw-aligned", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 5, 0, 17, 0}, 15, 22},
        {"processed-entropy-top", {1, 1, 1, 0, 0, 0, 0, 3, 0, 3, 1, 9, 0}, 13, 9},
        {"truncated-topk-topp-minp", {2, 2, 1, 1, 1, 40, 0, 2, 0, 3, 1, 12, 0}, 13, 12},
        {"greedy-one-by-one", {3, 2, 2, 0, 0, 0, 0, 0, 0, 8, 3, 4, 0, 1, 0, 30, 0}, 17, 35},
        {"fp32-two-groups", {2, 0, 0, 0, 0, 0, 0, 0, 0, 8, 2, 40, 0, 40, 0}, 15, 80},
        {"too-long", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 100, 0}, 13, 100},
        {"token-range", {0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 1, 3, 0, 1, 0, 0, 1, 2, 0}, 19, 0},
        {"empty", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0}, 13, 0},
        {"bad-temperature", {0, 1, 5, 0, 0, 0, 0, 0, 0, 0, 1, 4, 0}, 13, 4},
    };
    for (size_t i = 0; i < sizeof scores / sizeof scores[0]; i++)
        seed_score(scores[i].name, scores[i].head, scores[i].n_head, scores[i].n_tokens);

    st_close(f);
    free(config), free(st), free(s1), free(s2), free(trained);
    return 0;
}
