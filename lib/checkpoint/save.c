/* Saving a model as a checkpoint directory: config.json (with the layout's quantization_config),
 * model.safetensors (written to a temporary file, then renamed) and, for ModelOpt's NVFP4,
 * hf_quant_config.json. The tensor list is planned first: every slot's values, and each
 * quantized linear weight's tensors as its layout (layout.h) plans and writes them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "layouts.h"
#include "model/model.h"

static int write_config(const parity_config *c, const char *path, const char *torch_dtype,
                        const char *quantization_config) {
    FILE *fp = fopen(path, "w");
    if (!fp) return set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    const char *type = parity_arch_name((int)c->arch);
    const char *archname = c->arch == PARITY_ARCH_QWEN2   ? "Qwen2ForCausalLM"
                           : c->arch == PARITY_ARCH_QWEN3 ? "Qwen3ForCausalLM"
                           : c->arch == PARITY_ARCH_OURO  ? "OuroForCausalLM"
                           : c->arch == PARITY_ARCH_QWEN3_MOE ? "Qwen3MoeForCausalLM"
                           : c->arch == PARITY_ARCH_QWEN2_MOE ? "Qwen2MoeForCausalLM"
                                                          : "LlamaForCausalLM";
    fprintf(fp,
            "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n"
            "  \"vocab_size\": %u,\n  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
            "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
            "  \"num_key_value_heads\": %u,\n  \"head_dim\": %u,\n  \"hidden_act\": \"silu\",\n"
            "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %.9g,\n"
            "  \"rope_theta\": %.17g,\n  \"tie_word_embeddings\": %s,\n"
            "  \"attention_bias\": %s,\n  \"torch_dtype\": \"%s\",\n",
            archname, type, c->vocab_size, c->hidden_size, c->intermediate_size,
            c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
            c->max_position_embeddings, (double)c->rms_norm_eps, c->rope_theta,
            c->tie_word_embeddings ? "true" : "false", c->attention_bias ? "true" : "false",
            torch_dtype);
    if (c->arch == PARITY_ARCH_OURO)
        fprintf(fp,
                "  \"total_ut_steps\": %u,\n  \"early_exit_threshold\": %.9g,\n"
                "  \"use_early_exit_gate\": %s,\n",
                c->total_ut_steps, (double)c->early_exit_threshold,
                c->early_exit_gate ? "true" : "false");
    if (c->arch == PARITY_ARCH_QWEN3_MOE || c->arch == PARITY_ARCH_QWEN2_MOE) {
        fprintf(fp,
                "  \"num_experts\": %u,\n  \"num_experts_per_tok\": %u,\n"
                "  \"moe_intermediate_size\": %u,\n  \"norm_topk_prob\": %s,\n"
                "  \"decoder_sparse_step\": %u,\n  \"mlp_only_layers\": [",
                c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size,
                c->norm_topk_prob ? "true" : "false", c->decoder_sparse_step);
        for (uint32_t l = 0, first = 1; l < c->num_hidden_layers; l++)
            if ((c->mlp_only_layers[l / 64] >> (l % 64)) & 1u) {
                fprintf(fp, "%s%u", first ? "" : ", ", l);
                first = 0;
            }
        fprintf(fp, "],\n");
        if (c->arch == PARITY_ARCH_QWEN2_MOE)
            fprintf(fp, "  \"shared_expert_intermediate_size\": %u,\n  \"qkv_bias\": true,\n",
                    c->shared_expert_intermediate_size);
    }
    if (quantization_config) fprintf(fp, "  \"quantization_config\": %s,\n", quantization_config);
    switch (c->rope_type) {
    case PARITY_ROPE_LINEAR:
        fprintf(fp, "  \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": %.9g}\n",
                (double)c->rope_factor);
        break;
    case PARITY_ROPE_LLAMA3:
        fprintf(fp,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.9g, "
                "\"low_freq_factor\": %.9g, \"high_freq_factor\": %.9g, "
                "\"original_max_position_embeddings\": %u}\n",
                (double)c->rope_factor, (double)c->rope_low_freq_factor,
                (double)c->rope_high_freq_factor, c->rope_original_max_position_embeddings);
        break;
    case PARITY_ROPE_YARN:
        fprintf(fp,
                "  \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": %.9g, "
                "\"original_max_position_embeddings\": %u, \"beta_fast\": %.9g, "
                "\"beta_slow\": %.9g, \"truncate\": %s",
                (double)c->rope_factor, c->rope_original_max_position_embeddings,
                (double)c->rope_beta_fast, (double)c->rope_beta_slow,
                c->rope_truncate ? "true" : "false");
        if (c->rope_attention_factor > 0)
            fprintf(fp, ", \"attention_factor\": %.9g", (double)c->rope_attention_factor);
        if (c->rope_mscale > 0) fprintf(fp, ", \"mscale\": %.9g", (double)c->rope_mscale);
        if (c->rope_mscale_all_dim > 0)
            fprintf(fp, ", \"mscale_all_dim\": %.9g", (double)c->rope_mscale_all_dim);
        fprintf(fp, "}\n");
        break;
    default:
        fprintf(fp, "  \"rope_scaling\": null\n");
    }
    fprintf(fp, "}\n");
    if (fclose(fp) != 0) return set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return PARITY_OK;
}

/* Whether a layout saves the values in `dtype`. */
static int saves_as(const checkpoint_layout *layout, const char *dtype) {
    return !strcmp(layout->values_dtype, dtype);
}

/* config.json's torch_dtype for the values a layout saves. */
static const char *torch_dtype_of(const checkpoint_layout *layout) {
    return saves_as(layout, "F16") ? "float16" : saves_as(layout, "F32") ? "float32" : "bfloat16";
}

static int cmp_saved(const void *a, const void *b) {
    return strcmp(((const saved_tensor *)a)->name, ((const saved_tensor *)b)->name);
}

/* Writes one tensor's bytes: the layout writes codes and scales; values and scalars here. */
static int write_saved(FILE *fp, const saved_tensor *t, const checkpoint_layout *layout) {
    const weight *w = t->w;
    const size_t count = (size_t)w->rows * w->cols;
    if (t->kind == OUT_CODES || t->kind == OUT_SCALES) return layout->write(fp, t);
    if (t->kind == OUT_TENSOR_SCALE || t->kind == OUT_INPUT_SCALE) {
        float v = t->kind == OUT_INPUT_SCALE ? t->q->input_scale : t->q->tensor_scale;
        if (v == 0.0f) v = 1.0f; /* an all-zero weight's s2: its codes are 0 whatever s2 is */
        return fwrite(&v, 4, 1, fp) == 1;
    }
    const int f32 = saves_as(layout, "F32"), f16 = saves_as(layout, "F16");
    if (!f32 && !f16) return fwrite(w->bf16, 2, count, fp) == count;
    /* fp16 and fp32 from the master where there is one, else the bf16 values (exact) */
    for (size_t i = 0; i < count; i++) {
        const float v = w->master ? w->master[i] : bf16_to_f32(w->bf16[i]);
        if (f32 && fwrite(&v, 4, 1, fp) != 1) return 0;
        if (f16) {
            const uint16_t h = f16_from_f32(v);
            if (fwrite(&h, 2, 1, fp) != 1) return 0;
        }
    }
    return 1;
}

/* The tensor list of a layout, sorted by name, each quantized weight's companions right after
 * it ("X.weight" < "X.weight_scale_inv"): every slot's values, and for a quantized layout each
 * quantized weight's tensors as the layout plans them (shipped, or quantized with `rule` into
 * buffers the list owns). */
static int plan_saved(const parity_model *m, const checkpoint_layout *layout, int rule,
                      saved_tensor **out, size_t *count) {
    size_t n;
    const expected *e = model_tensors(m, &n);
    saved_tensor *s = px_calloc((1 + LAYOUT_COMPANIONS) * n, sizeof *s, "tensor list");
    if (!s) return PARITY_ERR_OUT_OF_MEMORY;
    size_t k = 0;
    int rc = PARITY_OK;
    saved_tensor *tmp = px_calloc(n, sizeof *tmp, "tensor list");
    if (!tmp) rc = PARITY_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; !rc && i < n; i++) tmp[i] = (saved_tensor){.name = e[i].name, .w = e[i].dst,
                                                                   .is_vector = e[i].rows == 0};
    if (!rc) qsort(tmp, n, sizeof *tmp, cmp_saved);
    const int f32 = saves_as(layout, "F32"), f16 = saves_as(layout, "F16");
    for (size_t i = 0; !rc && i < n; i++) {
        const weight *w = tmp[i].w;
        const expected *slot = model_find_tensor(m, tmp[i].name);
        const uint64_t values = (uint64_t)w->rows * w->cols;
        saved_tensor *v = &s[k++];
        *v = tmp[i];
        v->kind = OUT_VALUES;
        const int quantize = layout_quantizes(layout) && slot->linear && !w->keep_bf16;
        /* fp16 and fp32 values and quantized codes are made from the masters */
        char reader[64];
        snprintf(reader, sizeof reader, "parity_model_save_as's layout %s", layout->name);
        if (f32 || f16 || quantize) rc = weight_master_check(w, v->name, reader);
        if (rc) continue;
        /* the values of shipped codes, unless the layout writes those codes as they are */
        if (!(quantize && w->shipped && w->shipped_gemm == layout->gemm))
            rc = model_weight_values((parity_model *)m, slot->dst);
        v->dtype = layout->values_dtype;
        v->shape[0] = '\0';
        v->bytes = values * (f32 ? 4 : 2);
        if (f16)
            for (uint64_t j = 0; j < values && !rc; j++) {
                const float x = w->master ? w->master[j] : bf16_to_f32(w->bf16[j]);
                if (isinf(round_fp16(x)))
                    rc = set_error(PARITY_ERR_TENSOR_NONFINITE, "layout fp16: '%s' element %llu "
                                   "(%g) is beyond fp16's range", v->name,
                                   (unsigned long long)j, (double)x);
            }
        if (!quantize || rc) continue;
        const int more = layout->plan(w, rule, v, &s[k]);
        if (more < 0) rc = more;
        else k += (size_t)more;
    }
    px_free(tmp);
    *out = s;
    *count = k;
    return rc;
}

static void saved_free(saved_tensor *s, size_t n) {
    for (size_t i = 0; s && i < n; i++) {
        px_free(s[i].made.codes);
        px_free(s[i].made.scales);
    }
    px_free(s);
}

/* The modules a quantized layout keeps in bf16, as a JSON array: lm_head, then the linear
 * layers the model keeps (named by the checkpoint it was loaded from). */
static int kept_modules_text(const parity_model *m, char *buf, size_t size) {
    int k = snprintf(buf, size, "[\"lm_head\"");
    size_t n;
    const expected *e = model_tensors(m, &n);
    for (size_t i = 0; i < n && k > 0 && (size_t)k < size; i++)
        if (e[i].linear && e[i].dst->keep_bf16)
            k += snprintf(buf + k, size - (size_t)k, ", \"%.*s\"", (int)(strlen(e[i].name) - 7),
                          e[i].name);
    if (k > 0 && (size_t)k < size) k += snprintf(buf + k, size - (size_t)k, "]");
    return k;
}

/* config.json's quantization_config for a quantized layout (hf_quant_config.json's
 * "quantization" object with `modelopt_file`), into buf. */
static void quant_config_text(const parity_model *m, const checkpoint_layout *layout,
                              const saved_tensor *s, size_t n, int rule, int modelopt_file,
                              char *buf, size_t size) {
    int k = layout->config_head(buf, size, s, n, rule, &m->ckpt, modelopt_file);
    if (k > 0 && (size_t)k < size) k += kept_modules_text(m, buf + k, size - (size_t)k);
    if (k > 0 && (size_t)k < size) snprintf(buf + k, size - (size_t)k, "}");
}

/* hf_quant_config.json beside a ModelOpt layout's config.json (vLLM finds ModelOpt
 * checkpoints by it); for another layout, one left from an earlier save is removed, so that
 * the directory does not contradict itself. */
static int write_modelopt_file(const parity_model *m, const char *dir,
                               const checkpoint_layout *layout, const saved_tensor *s, size_t n,
                               int rule, char *qtext, size_t qsize) {
    const size_t plen = strlen(dir) + 32;
    char *path = px_malloc(plen, "path");
    if (!path) return PARITY_ERR_OUT_OF_MEMORY;
    snprintf(path, plen, "%s/hf_quant_config.json", dir);
    int rc = PARITY_OK;
    if (!layout->writes_modelopt_file) {
        if (remove(path) != 0 && errno != ENOENT)
            rc = set_error(PARITY_ERR_IO, "%s: cannot remove the stale file: %s", path, strerror(errno));
        px_free(path);
        return rc;
    }
    quant_config_text(m, layout, s, n, rule, 1, qtext, qsize);
    FILE *fp = fopen(path, "w");
    if (!fp) rc = set_error(PARITY_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (fp) {
        fprintf(fp, "{\n  \"producer\": {\"name\": \"libparity\", \"version\": \"%s\"},\n"
                "  \"quantization\": %s\n}\n", PARITY_VERSION_STRING, qtext);
        if (fclose(fp) != 0) rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    px_free(path);
    return rc;
}

int parity_model_save(const parity_model *m, const char *dir) {
    return parity_model_save_as(m, dir, "bf16");
}

int parity_model_save_as(const parity_model *m, const char *dir, const char *layout_name) {
    clear_error();
    if (!m || !dir) return set_error(PARITY_ERR_INVALID_ARGUMENT, "model or directory is NULL");
    const checkpoint_layout *layout;
    int rule;
    TRY(layout_parse(layout_name, &layout, &rule));
    TRY(model_enter(m));
    size_t plen = strlen(dir) + 64;
    char *path = px_malloc(plen, "path"), *tmp = px_malloc(plen, "path");
    size_t n = 0;
    saved_tensor *s = NULL;
    char *header = NULL, *qtext = NULL;
    FILE *fp = NULL;
    int rc = (path && tmp) ? plan_saved(m, layout, rule, &s, &n) : PARITY_ERR_OUT_OF_MEMORY;
    const size_t qsize = 512 + m->n_tensors * 100;
    const int quantized = layout_quantizes(layout);
    if (rc == PARITY_OK && !(qtext = px_malloc(qsize, "config text"))) rc = PARITY_ERR_OUT_OF_MEMORY;
    if (rc == PARITY_OK) rc = write_modelopt_file(m, dir, layout, s, n, rule, qtext, qsize);
    if (rc == PARITY_OK) {
        if (quantized) quant_config_text(m, layout, s, n, rule, 0, qtext, qsize);
        snprintf(path, plen, "%s/config.json", dir);
        rc = write_config(&m->config, path,
                          torch_dtype_of(layout),
                          quantized ? qtext : NULL);
    }
    if (rc == PARITY_OK) {
        size_t cap = 256 + n * 200, len = 0;
        header = px_malloc(cap, "safetensors header");
        if (!header) rc = PARITY_ERR_OUT_OF_MEMORY;
        uint64_t offset = 0;
        if (header) len += (size_t)snprintf(header, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
        for (size_t i = 0; i < n && header; i++) {
            const weight *w = s[i].w;
            char shape[64];
            if (s[i].shape[0])
                snprintf(shape, sizeof shape, "%s", s[i].shape);
            else if (s[i].kind == OUT_TENSOR_SCALE || s[i].kind == OUT_INPUT_SCALE)
                shape[0] = '\0'; /* a scalar, [] */
            else if (s[i].is_vector)
                snprintf(shape, sizeof shape, "%u", w->cols);
            else
                snprintf(shape, sizeof shape, "%u,%u", w->rows, w->cols);
            len += (size_t)snprintf(header + len, cap - len,
                                    ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],"
                                    "\"data_offsets\":[%llu,%llu]}",
                                    s[i].name, s[i].dtype, shape, (unsigned long long)offset,
                                    (unsigned long long)(offset + s[i].bytes));
            offset += s[i].bytes;
        }
        if (header) {
            header[len++] = '}';
            while (len % 8) header[len++] = ' '; /* data 8-byte aligned */
            snprintf(tmp, plen, "%s/model.safetensors.tmp", dir);
            snprintf(path, plen, "%s/model.safetensors", dir);
            fp = fopen(tmp, "wb");
            if (!fp) rc = set_error(PARITY_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        }
        if (fp) {
            uint64_t hlen = len;
            uint8_t le[8];
            for (int b = 0; b < 8; b++) le[b] = (uint8_t)(hlen >> (8 * b));
            int ok = fwrite(le, 1, 8, fp) == 8 && fwrite(header, 1, len, fp) == len;
            for (size_t i = 0; i < n && ok; i++) ok = write_saved(fp, &s[i], layout);
            if (fclose(fp) != 0) ok = 0;
            if (!ok || rename(tmp, path) != 0) {
                rc = set_error(PARITY_ERR_IO, "%s: write failed: %s", path, strerror(errno));
                remove(tmp);
            }
        }
    }
    model_leave(m);
    px_free(header);
    px_free(qtext);
    saved_free(s, n);
    px_free(tmp);
    px_free(path);
    return rc;
}

