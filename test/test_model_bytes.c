/* parity_model_bytes against the bytes worked out here from the config alone: what a model
 * holds (its bf16 values, fp32 norms and biases, the copies built for the policies served,
 * a checkpoint's shipped codes), what serving one policy keeps of it, and what one step under
 * each kind of policy reads (bf16 or fp32 values, each quantized format's codes and scales as
 * parity_quant_scale_count grids them; a mixture of experts' step, its active experts); its
 * argument errors leave the output untouched. */
#include <stdio.h>
#include <string.h>

#include "fixtures.h"

/* The shape of a one-pass model's tensors, from its config. */
typedef struct shape {
    uint64_t linear;   /* the decoder layers' linear weights' elements */
    uint64_t vectors;  /* norm weights and biases */
    uint64_t matrices; /* every matrix: linear, embedding, an untied head */
    uint64_t head;     /* the lm_head's elements */
} shape;

/* The rows x cols of layer linear j (q, k, v, o, gate, up, down). */
static void linear_dims(const parity_config *c, int j, uint64_t *rows, uint64_t *cols) {
    const uint64_t h = c->hidden_size, q = (uint64_t)c->num_attention_heads * c->head_dim,
                   kv = (uint64_t)c->num_key_value_heads * c->head_dim, f = c->intermediate_size;
    const uint64_t r[7] = {q, kv, kv, h, f, f, h}, k[7] = {h, h, h, q, h, h, f};
    *rows = r[j], *cols = k[j];
}

static shape shape_of(const parity_config *c) {
    shape s = {0};
    const uint64_t h = c->hidden_size, q = (uint64_t)c->num_attention_heads * c->head_dim,
                   kv = (uint64_t)c->num_key_value_heads * c->head_dim;
    for (int j = 0; j < 7; j++) {
        uint64_t rows, cols;
        linear_dims(c, j, &rows, &cols);
        s.linear += rows * cols;
    }
    s.linear *= c->num_hidden_layers;
    s.vectors = c->num_hidden_layers * (2 * h + (c->qk_norm ? 2ull * c->head_dim : 0) +
                                        (c->attention_bias ? q + 2 * kv : 0)) + h;
    s.head = (uint64_t)c->vocab_size * h;
    s.matrices = s.linear + s.head * (c->tie_word_embeddings ? 1 : 2);
    return s;
}

/* The bytes of a rows x cols weight's codes under gemm format `gemm` as the library holds
 * them (parity_weight_bytes): E2M1 (NVFP4, MXFP4) two a byte, a row's odd last code in a byte
 * of its own; ternary four a byte, a row in groups of 64 codes in 16 bytes (its last group
 * padded); the others one a byte. */
static uint64_t held_code_bytes(uint32_t gemm, uint64_t rows, uint64_t cols) {
    if (gemm == PARITY_GEMM_NVFP4 || gemm == PARITY_GEMM_MXFP4) return rows * ((cols + 1) / 2);
    if (gemm == PARITY_GEMM_TERNARY) return rows * ((cols + 63) / 64 * 16);
    return rows * cols;
}

/* The bytes a block scale of gemm format `gemm` takes as the library holds it: NVFP4's E4M3
 * and MXFP4's E8M0 a byte, as their checkpoints ship them; the others' fp32. */
static uint64_t held_scale_bytes(uint32_t gemm) {
    return gemm == PARITY_GEMM_NVFP4 || gemm == PARITY_GEMM_MXFP4 ? 1 : 4;
}

/* The codes and the scales as the library holds them of every layer linear under a quantizer
 * of gemm format `gemm`. */
static uint64_t quantized_linear_bytes(const parity_config *c, uint32_t gemm, int quantizer) {
    uint64_t bytes = 0;
    for (int j = 0; j < 7; j++) {
        uint64_t rows, cols;
        linear_dims(c, j, &rows, &cols);
        bytes += held_code_bytes(gemm, rows, cols) +
                 held_scale_bytes(gemm) * parity_quant_scale_count(quantizer, rows, cols);
    }
    return bytes * c->num_hidden_layers;
}

static parity_weight_bytes query(const parity_model *m, const char *preset, uint32_t backend) {
    return weight_bytes_of(m, preset, backend);
}

/* A sampler of the preset made and freed: the model builds the copies the policy reads. */
static void serve(const parity_model *m, const char *preset) {
    parity_sampler_params sp;
    parity_sampler_default_params(&sp);
    CHECK_OK(parity_policy_from_name(preset, &sp.policy));
    sp.max_seqs = 1;
    sp.max_len = 8;
    parity_sampler *s = NULL;
    CHECK_OK(parity_sampler_create(m, &sp, &s));
    parity_sampler_free(s);
}

static void test_synthetic(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny", &m));
    if (!m) return;
    const parity_config *c = parity_model_config(m);
    const shape s = shape_of(c);
    const uint64_t kv = 2ull * c->num_hidden_layers * c->num_key_value_heads * c->head_dim;

    /* bf16: the values, the fp32 vectors; a step reads bf16 matrices */
    const parity_weight_bytes bf16 = query(m, "vllm", PARITY_BACKEND_BF16);
    const uint64_t loaded = 2 * (s.matrices + s.vectors) + 4 * s.vectors;
    CHECK_INT(bf16.held, loaded);
    CHECK_INT(bf16.held_for_policy, loaded);
    CHECK_INT(bf16.step_linear, 2 * s.linear);
    CHECK_INT(bf16.step_head, 2 * s.head);
    CHECK_INT(bf16.step_vectors, 4 * s.vectors);
    CHECK_INT(bf16.embedding_row, 2 * c->hidden_size);
    CHECK_INT(bf16.kv_position, 2 * kv);

    /* each quantized format: a step reads its codes and scales, built or not; serving it
     * builds exactly those, which the bf16 policy leaves out */
    static const char *const quantized[] = {"vllm+fp8-block:deepseek", "vllm+mxfp8:ocp",
                                            "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp",
                                            "vllm+ternary:bitnet"};
    uint64_t held = loaded;
    for (size_t i = 0; i < sizeof quantized / sizeof *quantized; i++) {
        parity_policy p;
        CHECK_OK(parity_policy_from_name(quantized[i], &p));
        const uint64_t codes = quantized_linear_bytes(c, p.gemm, p.quantizer);
        const parity_weight_bytes before = query(m, quantized[i], PARITY_BACKEND_BF16);
        CHECK_INT(before.step_linear, codes);
        CHECK_INT(before.step_head, 2 * s.head);
        CHECK_INT(before.held, held);
        CHECK_INT(before.held_for_policy, loaded);
        serve(m, quantized[i]);
        held += codes;
        const parity_weight_bytes after = query(m, quantized[i], PARITY_BACKEND_BF16);
        printf("model bytes: %-24s step reads %8llu of linear weights (bf16: %llu), "
               "held %llu\n", quantized[i], (unsigned long long)after.step_linear,
               (unsigned long long)bf16.step_linear, (unsigned long long)after.held);
        CHECK_INT(after.held, held);
        CHECK_INT(after.held_for_policy, loaded + codes);
        CHECK_INT(query(m, "vllm", PARITY_BACKEND_BF16).held_for_policy, loaded);
    }

    /* fp32: fp32 matrices, cells and embedding rows; serving it widens every matrix */
    const parity_weight_bytes fp32 = query(m, "fp32", PARITY_BACKEND_BF16);
    CHECK_INT(fp32.step_linear, 4 * s.linear);
    CHECK_INT(fp32.step_head, 4 * s.head);
    CHECK_INT(fp32.embedding_row, 4 * c->hidden_size);
    CHECK_INT(fp32.kv_position, 4 * kv);
    serve(m, "fp32");
    CHECK_INT(query(m, "fp32", PARITY_BACKEND_BF16).held, held + 4 * s.matrices);
    CHECK_INT(query(m, "fp32", PARITY_BACKEND_BF16).held_for_policy, loaded + 4 * s.matrices);
    CHECK_INT(query(m, "vllm", PARITY_BACKEND_BF16).held_for_policy, loaded);
    /* the openblas backend multiplies the fp32 copies under a bf16 policy too */
    const parity_weight_bytes blas = query(m, "vllm", PARITY_BACKEND_OPENBLAS);
    CHECK_INT(blas.step_linear, 4 * s.linear);
    CHECK_INT(blas.held_for_policy, loaded + 4 * s.matrices);
    CHECK_INT(blas.embedding_row, 2 * c->hidden_size);
    parity_model_free(m);
}

/* A BitNet checkpoint served under ternary reads its shipped codes: nothing is built, and the
 * linear weights' values are not held until a bf16 policy asks for them. */
static void test_shipped(void) {
    char dir[1024];
    parity_model *m = NULL;
    CHECK_OK(parity_model_load(source_path(dir, sizeof dir, "models/qwen3-bytes-ternary-4.9m"),
                               &m));
    if (!m) return;
    const parity_config *c = parity_model_config(m);
    const shape s = shape_of(c);
    /* the codes four a byte (each row's in groups of 64 codes, 16 bytes a group), and one fp32
     * tensor scale each */
    uint64_t codes = 4ull * 7 * c->num_hidden_layers;
    for (int j = 0; j < 7; j++) {
        uint64_t rows, cols;
        linear_dims(c, j, &rows, &cols);
        codes += c->num_hidden_layers * rows * ((cols + 63) / 64 * 16);
    }
    CHECK_INT(quantized_linear_bytes(c, PARITY_GEMM_TERNARY, PARITY_QUANT_TERNARY_BITNET),
              codes);
    /* the loader keeps the codes alone: bf16 values of the other matrices and the vectors,
     * the vectors widened, the codes */
    const uint64_t loaded = 2 * (s.matrices - s.linear + s.vectors) + 4 * s.vectors + codes;
    const parity_weight_bytes before = query(m, "vllm+ternary:bitnet", PARITY_BACKEND_BF16);
    CHECK_INT(before.held, loaded);
    CHECK_INT(before.held_for_policy, loaded);
    CHECK_INT(before.step_linear, codes);
    serve(m, "vllm+ternary:bitnet");
    CHECK_INT(query(m, "vllm+ternary:bitnet", PARITY_BACKEND_BF16).held, loaded);
    CHECK_INT(query(m, "vllm", PARITY_BACKEND_BF16).held_for_policy, loaded);
    /* a bf16 policy asks for the values: bf16 and fp32 masters of the linear weights */
    serve(m, "vllm");
    CHECK_INT(query(m, "vllm", PARITY_BACKEND_BF16).held, loaded + 6 * s.linear);
    CHECK_INT(query(m, "vllm", PARITY_BACKEND_BF16).held_for_policy, loaded + 6 * s.linear);
    CHECK_INT(query(m, "vllm+ternary:bitnet", PARITY_BACKEND_BF16).held_for_policy, loaded);
    parity_model_free(m);
}

/* Whether layer l of a mixture of experts is sparse: every decoder_sparse_step-th layer
 * (counted from 1) that mlp_only_layers does not name. */
static int layer_sparse(const parity_config *c, uint32_t l) {
    return c->decoder_sparse_step && (l + 1) % c->decoder_sparse_step == 0 &&
           !((c->mlp_only_layers[l / 64] >> (l % 64)) & 1u);
}

/* The bytes of a rows x cols linear weight under gemm format `gemm` of `quantizer` (bf16:
 * its values). */
static uint64_t linear_bytes(uint32_t gemm, int quantizer, uint64_t rows, uint64_t cols) {
    if (gemm == PARITY_GEMM_BF16) return 2 * rows * cols;
    return held_code_bytes(gemm, rows, cols) +
           held_scale_bytes(gemm) * parity_quant_scale_count(quantizer, rows, cols);
}

/* What a decode step of one sequence reads of a mixture of experts' decoder layers under a
 * bf16-compute policy of gemm format `gemm`: the attention's four linear weights, a dense
 * layer's MLP; a sparse layer's router (bf16 values), num_experts_per_tok experts' three
 * weights, and the shared expert's three and its one-row gate (bf16 values). `experts` is
 * the count of experts a layer reads (num_experts: what the model holds). */
static uint64_t moe_linear_bytes(const parity_config *c, uint32_t gemm, int quantizer,
                                 uint64_t experts) {
    const uint64_t h = c->hidden_size, q = (uint64_t)c->num_attention_heads * c->head_dim,
                   kv = (uint64_t)c->num_key_value_heads * c->head_dim,
                   f = c->intermediate_size, fe = c->moe_intermediate_size,
                   fs = c->shared_expert_intermediate_size;
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
        bytes += linear_bytes(gemm, quantizer, q, h) + 2 * linear_bytes(gemm, quantizer, kv, h) +
                 linear_bytes(gemm, quantizer, h, q);
        if (!layer_sparse(c, l)) {
            bytes += 2 * linear_bytes(gemm, quantizer, f, h) + linear_bytes(gemm, quantizer, h, f);
            continue;
        }
        bytes += 2 * (uint64_t)c->num_experts * h;
        bytes += experts * (2 * linear_bytes(gemm, quantizer, fe, h) +
                            linear_bytes(gemm, quantizer, h, fe));
        if (fs)
            bytes += 2 * linear_bytes(gemm, quantizer, fs, h) +
                     linear_bytes(gemm, quantizer, h, fs) + 2 * h;
    }
    return bytes;
}

/* A mixture of experts' step reads the active experts alone (the model holds them all), and
 * the shared expert with its gate; the head and the norms as a dense model's. */
static void test_moe(void) {
    static const char *const models[] = {"synthetic:qwen3-moe-tiny", "synthetic:qwen2-moe-tiny"};
    static const char *const quantized[] = {"vllm+fp8-block:deepseek", "vllm+nvfp4:modelopt",
                                            "vllm+mxfp4:ocp"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        parity_model *m = NULL;
        CHECK_OK(parity_model_open(models[i], &m));
        if (!m) continue;
        const parity_config *c = parity_model_config(m);
        CHECK(c->num_experts_per_tok < c->num_experts);
        const uint64_t h = c->hidden_size, k = c->num_experts_per_tok;
        uint64_t vectors = h, sparse = 0;
        for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
            vectors += 2 * h + (c->qk_norm ? 2ull * c->head_dim : 0) +
                       (c->attention_bias ? (uint64_t)(c->num_attention_heads +
                                                       2 * c->num_key_value_heads) * c->head_dim
                                          : 0);
            sparse += (uint64_t)layer_sparse(c, l);
        }
        CHECK(sparse > 0);
        const parity_weight_bytes bf16 = query(m, "vllm", PARITY_BACKEND_BF16);
        const uint64_t step = moe_linear_bytes(c, PARITY_GEMM_BF16, 0, k);
        const uint64_t all = moe_linear_bytes(c, PARITY_GEMM_BF16, 0, c->num_experts);
        printf("model bytes: %-26s step reads %llu of linear weights, the model holds %llu\n",
               models[i], (unsigned long long)bf16.step_linear, (unsigned long long)all);
        CHECK_INT(bf16.step_linear, step);
        CHECK_INT(bf16.step_head, 2ull * c->vocab_size * h);
        CHECK_INT(bf16.step_vectors, 4 * vectors);
        /* held: every expert, the vectors (and the shared expert's one-row gate) widened too */
        const uint64_t gates = c->shared_expert_intermediate_size ? sparse * h : 0;
        const uint64_t head = (c->tie_word_embeddings ? 1u : 2u) * (uint64_t)c->vocab_size * h;
        CHECK_INT(bf16.held, all + 2 * head + 6 * vectors + 4 * gates);
        for (size_t j = 0; j < sizeof quantized / sizeof *quantized; j++) {
            parity_policy p;
            CHECK_OK(parity_policy_from_name(quantized[j], &p));
            CHECK_INT(query(m, quantized[j], PARITY_BACKEND_BF16).step_linear,
                      moe_linear_bytes(c, p.gemm, p.quantizer, k));
        }
        /* fp32 compute reads fp32 values: twice the bf16 bytes */
        CHECK_INT(query(m, "fp32", PARITY_BACKEND_BF16).step_linear, 2 * step);
        parity_model_free(m);
    }
}

static void test_arguments(void) {
    parity_model *m = NULL;
    CHECK_OK(parity_model_open("synthetic:tiny", &m));
    parity_policy p;
    CHECK_OK(parity_policy_from_name("vllm", &p));
    parity_weight_bytes b, untouched;
    memset(&untouched, 0xab, sizeof untouched);
    untouched.size = sizeof untouched;
    b = untouched;
    CHECK_STATUS(parity_model_bytes(NULL, &p, PARITY_BACKEND_BF16, &b),
                 PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_bytes(m, NULL, PARITY_BACKEND_BF16, &b), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_bytes(m, &p, PARITY_BACKEND_BF16, NULL), PARITY_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(parity_model_bytes(m, &p, 7, &b), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "unknown backend 7") != NULL);
    b.size = 8;
    CHECK_STATUS(parity_model_bytes(m, &p, PARITY_BACKEND_BF16, &b), PARITY_ERR_INVALID_ARGUMENT);
    CHECK(strstr(parity_last_error(), "out->size is 8") != NULL);
    b.size = sizeof b;
    parity_policy bad = p;
    bad.gemm = 99;
    CHECK(parity_model_bytes(m, &bad, PARITY_BACKEND_BF16, &b) != PARITY_OK);
    CHECK(strstr(parity_last_error(), "parity_model_bytes") != NULL);
    CHECK(memcmp(&b, &untouched, sizeof b) == 0);
    parity_model_free(m);
}

int main(void) {
    test_synthetic();
    test_shipped();
    test_moe();
    test_arguments();
    return check_report("model_bytes");
}
