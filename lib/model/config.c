/* A config's values, whatever made it: their validation (config_validate, which names the
 * field at fault) and the built-in configs parity_config_builtin names (the shapes of Qwen,
 * Llama, Ouro and Qwen mixture-of-experts models and the small ones of the tests).
 * config.json is read in lib/checkpoint/config_json.c. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "base/nametable.h"
#include "config.h"

#define CONFIG_MAX_LOOPS 64u

/* ---- validation ------------------------------------------------------------------------- */

static int finite_positive(float x) { return isfinite(x) && x > 0.0f; }

/* The mixture-of-experts fields: all zero for a dense architecture; for Qwen3-MoE and
 * Qwen2-MoE in range, with the shared expert Qwen2-MoE always has (transformers builds it
 * unconditionally) and Qwen3-MoE never, and no mlp_only_layers bit past the last layer. */
static int validate_moe(const parity_config *c) {
    int any_bit = 0;
    for (size_t i = 0; i < 16; i++) any_bit |= c->mlp_only_layers[i] != 0;
    if (!config_is_moe(c)) {
        if (c->num_experts || c->num_experts_per_tok || c->moe_intermediate_size ||
            c->shared_expert_intermediate_size || c->norm_topk_prob || c->decoder_sparse_step ||
            any_bit)
            return set_error(PARITY_ERR_CONFIG,
                             "config: num_experts, num_experts_per_tok, moe_intermediate_size, "
                             "shared_expert_intermediate_size, norm_topk_prob, "
                             "decoder_sparse_step and mlp_only_layers are for qwen3_moe and "
                             "qwen2_moe only (all 0 for %s)",
                             parity_arch_name((int)c->arch));
        return PARITY_OK;
    }
    if (c->num_experts < 1 || c->num_experts > CONFIG_MAX_EXPERTS)
        return set_error(PARITY_ERR_CONFIG, "config: num_experts is %u, must be in 1..%u",
                         c->num_experts, CONFIG_MAX_EXPERTS);
    if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts ||
        c->num_experts_per_tok > CONFIG_MAX_EXPERTS_PER_TOK)
        return set_error(PARITY_ERR_CONFIG,
                         "config: num_experts_per_tok is %u, must be in 1..min(num_experts = %u, "
                         "%u)",
                         c->num_experts_per_tok, c->num_experts, CONFIG_MAX_EXPERTS_PER_TOK);
    if (c->moe_intermediate_size < 1 || c->moe_intermediate_size > (1u << 20) - 1)
        return set_error(PARITY_ERR_CONFIG, "config: moe_intermediate_size is %u, must be in 1..%u",
                         c->moe_intermediate_size, (1u << 20) - 1);
    if (c->arch == PARITY_ARCH_QWEN2_MOE &&
        (c->shared_expert_intermediate_size < 1 ||
         c->shared_expert_intermediate_size > (1u << 20) - 1))
        return set_error(PARITY_ERR_CONFIG,
                         "config: shared_expert_intermediate_size is %u, must be in 1..%u for "
                         "qwen2_moe (its shared expert)",
                         c->shared_expert_intermediate_size, (1u << 20) - 1);
    if (c->arch == PARITY_ARCH_QWEN3_MOE && c->shared_expert_intermediate_size)
        return set_error(PARITY_ERR_CONFIG,
                         "config: shared_expert_intermediate_size is %u: qwen3_moe has no shared "
                         "expert (0)",
                         c->shared_expert_intermediate_size);
    if (c->norm_topk_prob > 1)
        return set_error(PARITY_ERR_CONFIG, "config: norm_topk_prob must be 0 or 1 (got %u)",
                         c->norm_topk_prob);
    if (c->decoder_sparse_step < 1)
        return set_error(PARITY_ERR_CONFIG, "config: decoder_sparse_step is 0, must be >= 1");
    for (uint32_t l = c->num_hidden_layers; l < 1024; l++)
        if ((c->mlp_only_layers[l / 64] >> (l % 64)) & 1u)
            return set_error(PARITY_ERR_CONFIG,
                             "config: mlp_only_layers names layer %u, past the last layer "
                             "(num_hidden_layers = %u)",
                             l, c->num_hidden_layers);
    return PARITY_OK;
}

int config_validate(const parity_config *c) {
    if (!c) return set_error(PARITY_ERR_INVALID_ARGUMENT, "config is NULL");
    if (c->size != sizeof(parity_config))
        return set_error(PARITY_ERR_CONFIG,
                         "config: size is %u, expected sizeof(parity_config) = %zu", c->size,
                         sizeof(parity_config));
    if (c->arch > PARITY_ARCH_QWEN2_MOE)
        return set_error(PARITY_ERR_CONFIG, "config: arch %u is not a parity_arch", c->arch);
    if (c->arch != PARITY_ARCH_OURO && (c->total_ut_steps > 1 || c->early_exit_gate))
        return set_error(PARITY_ERR_CONFIG,
                         "config: total_ut_steps %u and early_exit_gate %u: only arch ouro loops "
                         "(1 and 0 for %s)",
                         c->total_ut_steps, c->early_exit_gate, parity_arch_name((int)c->arch));
    if (c->arch == PARITY_ARCH_OURO) {
        if (c->total_ut_steps < 1 || c->total_ut_steps > CONFIG_MAX_LOOPS)
            return set_error(PARITY_ERR_CONFIG, "config: total_ut_steps is %u, must be in 1..%u",
                             c->total_ut_steps, CONFIG_MAX_LOOPS);
        if (c->early_exit_gate > 1)
            return set_error(PARITY_ERR_CONFIG, "config: early_exit_gate must be 0 or 1 (got %u)",
                             c->early_exit_gate);
        if (!(c->early_exit_threshold >= 0.0f && c->early_exit_threshold <= 1.0f))
            return set_error(PARITY_ERR_CONFIG, "config: early_exit_threshold (%g) must be in 0..1",
                             (double)c->early_exit_threshold);
        if (c->attention_bias || c->qk_norm)
            return set_error(PARITY_ERR_CONFIG,
                             "config: an ouro model has no q/k/v bias and no q/k-norm "
                             "(attention_bias %u, qk_norm %u)",
                             c->attention_bias, c->qk_norm);
    }

    TRY(validate_moe(c));

    struct {
        const char *name;
        uint32_t value, max; /* 1 <= value <= max */
    } sizes[] = {
        {"vocab_size", c->vocab_size, (1u << 24) - 1},
        {"hidden_size", c->hidden_size, (1u << 20) - 1},
        {"intermediate_size", c->intermediate_size, (1u << 20) - 1},
        {"num_hidden_layers", c->num_hidden_layers, 1023},
        {"num_attention_heads", c->num_attention_heads, 4096},
        {"num_key_value_heads", c->num_key_value_heads, 4096},
        {"head_dim", c->head_dim, 4096},
        {"max_position_embeddings", c->max_position_embeddings, 1u << 24},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < 1 || sizes[i].value > sizes[i].max)
            return set_error(PARITY_ERR_CONFIG, "config: %s is %u, must be in 1..%u", sizes[i].name,
                             sizes[i].value, sizes[i].max);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return set_error(
            PARITY_ERR_CONFIG,
            "config: num_attention_heads (%u) is not a multiple of num_key_value_heads (%u)",
            c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2 != 0)
        return set_error(PARITY_ERR_CONFIG, "config: head_dim (%u) must be even", c->head_dim);
    if ((uint64_t)c->num_attention_heads * c->head_dim >= (1u << 20))
        return set_error(PARITY_ERR_CONFIG,
                         "config: num_attention_heads x head_dim (%u x %u) is too large",
                         c->num_attention_heads, c->head_dim);
    if (c->tie_word_embeddings > 1 || c->attention_bias > 1 || c->qk_norm > 1)
        return set_error(PARITY_ERR_CONFIG,
                         "config: tie_word_embeddings, attention_bias and qk_norm "
                         "must be 0 or 1 (got %u, %u, %u)",
                         c->tie_word_embeddings, c->attention_bias, c->qk_norm);
    if (!finite_positive(c->rms_norm_eps))
        return set_error(PARITY_ERR_CONFIG, "config: rms_norm_eps (%g) must be finite and > 0",
                         (double)c->rms_norm_eps);
    if (!isfinite(c->rope_theta) || !(c->rope_theta > 0.0) || !isfinite((float)c->rope_theta))
        return set_error(PARITY_ERR_CONFIG, "config: rope_theta (%g) must be finite and > 0",
                         c->rope_theta);

    switch (c->rope_type) {
    case PARITY_ROPE_DEFAULT:
        break;
    case PARITY_ROPE_LINEAR:
        if (!finite_positive(c->rope_factor))
            return set_error(PARITY_ERR_CONFIG,
                             "config: linear rope factor (%g) must be finite and > 0",
                             (double)c->rope_factor);
        break;
    case PARITY_ROPE_LLAMA3:
        if (!finite_positive(c->rope_factor) || !finite_positive(c->rope_low_freq_factor) ||
            !finite_positive(c->rope_high_freq_factor))
            return set_error(PARITY_ERR_CONFIG,
                             "config: llama3 rope factor, low_freq_factor and "
                             "high_freq_factor (%g, %g, %g) must be finite and > 0",
                             (double)c->rope_factor, (double)c->rope_low_freq_factor,
                             (double)c->rope_high_freq_factor);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return set_error(PARITY_ERR_CONFIG,
                             "config: llama3 rope high_freq_factor (%g) must be "
                             "greater than low_freq_factor (%g)",
                             (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
        if (c->rope_original_max_position_embeddings < 1)
            return set_error(PARITY_ERR_CONFIG,
                             "config: llama3 rope original_max_position_embeddings "
                             "must be >= 1");
        break;
    case PARITY_ROPE_YARN:
        if (!finite_positive(c->rope_factor))
            return set_error(PARITY_ERR_CONFIG,
                             "config: yarn rope factor (%g) must be finite and > 0",
                             (double)c->rope_factor);
        if (!finite_positive(c->rope_beta_fast) || !finite_positive(c->rope_beta_slow))
            return set_error(PARITY_ERR_CONFIG,
                             "config: yarn rope beta_fast and beta_slow (%g, %g) "
                             "must be finite and > 0",
                             (double)c->rope_beta_fast, (double)c->rope_beta_slow);
        if (!isfinite(c->rope_attention_factor) || c->rope_attention_factor < 0.0f ||
            !isfinite(c->rope_mscale) || !isfinite(c->rope_mscale_all_dim))
            return set_error(PARITY_ERR_CONFIG,
                             "config: yarn rope attention_factor (%g) must be "
                             "finite and >= 0 (0 = derived), mscale and mscale_all_dim finite",
                             (double)c->rope_attention_factor);
        if (c->rope_original_max_position_embeddings < 1)
            return set_error(PARITY_ERR_CONFIG,
                             "config: yarn rope original_max_position_embeddings "
                             "must be >= 1");
        if (!(c->rope_theta > 1.0))
            return set_error(PARITY_ERR_CONFIG, "config: yarn rope needs rope_theta > 1 (got %g)",
                             c->rope_theta);
        if (c->rope_truncate > 1)
            return set_error(PARITY_ERR_CONFIG,
                             "config: yarn rope truncate must be 0 or 1 (got %u)",
                             c->rope_truncate);
        break;
    default:
        return set_error(PARITY_ERR_CONFIG, "config: rope_type %u is not a parity_rope_type",
                         c->rope_type);
    }
    return PARITY_OK;
}

/* ---- built-in configs --------------------------------------------------------------------- */

#define ROPE_NEUTRAL .rope_factor = 1.0f, .rope_beta_fast = 32.0f, .rope_beta_slow = 1.0f, \
                     .rope_truncate = 1
#define DEFAULT_ROPE .rope_type = PARITY_ROPE_DEFAULT, ROPE_NEUTRAL

/* The shape of a built-in config: architecture, vocabulary, widths, layers, heads, positions,
 * norm epsilon and RoPE theta. */
#define SHAPE(arch_, vocab, hidden, intermediate, layers, heads, kv_heads, hd, positions, eps,   \
              theta)                                                                            \
    .size = sizeof(parity_config), .arch = arch_, .vocab_size = vocab, .hidden_size = hidden,    \
    .intermediate_size = intermediate, .num_hidden_layers = layers,                              \
    .num_attention_heads = heads, .num_key_value_heads = kv_heads, .head_dim = hd,               \
    .max_position_embeddings = positions, .rms_norm_eps = eps, .rope_theta = theta
/* Qwen and Llama: tied head, q/k/v biases, q/k norms; one pass through the layers. */
#define ONE_PASS(tied, bias, qk) .tie_word_embeddings = tied, .attention_bias = bias,            \
                                 .qk_norm = qk, .total_ut_steps = 1
/* Mixture of experts: experts, experts a token, their width, the shared expert's width, the
 * renormalisation of the chosen weights; every layer sparse unless mlp_only_layers says. */
#define MOE(experts, per_tok, width, shared, norm_topk)                                          \
    .num_experts = experts, .num_experts_per_tok = per_tok, .moe_intermediate_size = width,      \
    .shared_expert_intermediate_size = shared, .norm_topk_prob = norm_topk,                      \
    .decoder_sparse_step = 1
/* Ouro: the layers run `loops` times, with or without the early-exit gate. */
#define LOOPED(loops, gate) .total_ut_steps = loops, .early_exit_gate = gate,                     \
                            .early_exit_threshold = 1.0f

static const struct builtin {
    const char *name;
    parity_config config;
} builtins[] = {
    /* A small Qwen3 shape for fast tests. */
    {"tiny", {SHAPE(PARITY_ARCH_QWEN3, 256, 64, 160, 2, 4, 2, 16, 512, 1e-6f, 10000.0),
              ONE_PASS(0, 0, 1), DEFAULT_ROPE}},
    /* Qwen/Qwen3-0.6B config.json */
    {"qwen3-0.6b", {SHAPE(PARITY_ARCH_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1e-6f,
                          1000000.0), ONE_PASS(1, 0, 1), DEFAULT_ROPE}},
    /* Qwen/Qwen2.5-0.5B config.json */
    {"qwen2.5-0.5b", {SHAPE(PARITY_ARCH_QWEN2, 151936, 896, 4864, 24, 14, 2, 64, 32768, 1e-6f,
                            1000000.0), ONE_PASS(1, 1, 0), DEFAULT_ROPE}},
    /* meta-llama/Llama-3.2-1B config.json */
    {"llama3.2-1b", {SHAPE(PARITY_ARCH_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 1e-5f,
                           500000.0), ONE_PASS(1, 0, 0), .rope_type = PARITY_ROPE_LLAMA3,
                     .rope_factor = 32.0f, .rope_low_freq_factor = 1.0f,
                     .rope_high_freq_factor = 4.0f, .rope_original_max_position_embeddings = 8192,
                     .rope_beta_fast = 32.0f, .rope_beta_slow = 1.0f, .rope_truncate = 1}},
    /* ByteDance/Ouro-1.4B config.json (revision 574fa66c, as vllm-rlt pins it): 24 layers run
     * 4 times, MHA, untied head */
#define OURO(layers)                                                                             \
    {SHAPE(PARITY_ARCH_OURO, 49152, 2048, 5632, layers, 16, 16, 128, 65536, 1e-6f, 1000000.0),    \
     DEFAULT_ROPE, LOOPED(4, 1)}
    {"ouro-1.4b", OURO(24)},
    /* ByteDance/Ouro-2.6B: the 1.4B's layers duplicated, 48 */
    {"ouro-2.6b", OURO(48)},
#undef OURO
    /* Small looped shapes for tests: 2 layers run 4 times with the exit gate, GQA (the Ouro
     * models are MHA; GQA reaches more of the attention code), and a fixed-loop one (3 loops,
     * no gate) */
    {"ouro-tiny", {SHAPE(PARITY_ARCH_OURO, 256, 64, 160, 2, 4, 2, 16, 512, 1e-6f, 10000.0),
                   DEFAULT_ROPE, LOOPED(4, 1)}},
    {"ouro-tiny-fixed", {SHAPE(PARITY_ARCH_OURO, 256, 64, 160, 2, 4, 2, 16, 512, 1e-6f, 10000.0),
                         DEFAULT_ROPE, LOOPED(3, 0)}},
    /* Mixture of experts (model_type qwen3_moe, qwen2_moe). Small shapes for tests, the same as
     * test/data/moe's checkpoints made with transformers: Qwen3-MoE with 8 experts of which 2
     * run, layer 1 dense (mlp_only_layers); Qwen2-MoE with top-4 of 8 and the shared expert. */
    {"qwen3-moe-tiny", {SHAPE(PARITY_ARCH_QWEN3_MOE, 256, 64, 96, 3, 4, 2, 16, 512, 1e-6f, 10000.0),
                        ONE_PASS(0, 0, 1), DEFAULT_ROPE,
                        MOE(8, 2, 32, 0, 1), .mlp_only_layers = {1u << 1}}},
    {"qwen2-moe-tiny", {SHAPE(PARITY_ARCH_QWEN2_MOE, 256, 64, 96, 3, 4, 2, 16, 512, 1e-6f, 10000.0),
                        ONE_PASS(0, 1, 0), DEFAULT_ROPE, MOE(8, 4, 32, 48, 0)}},
    /* Qwen/Qwen3-30B-A3B config.json: 48 sparse layers of 128 experts, 8 a token */
    {"qwen3-30b-a3b", {SHAPE(PARITY_ARCH_QWEN3_MOE, 151936, 2048, 6144, 48, 32, 4, 128, 40960,
                             1e-6f, 1000000.0), ONE_PASS(0, 0, 1), DEFAULT_ROPE,
                       MOE(128, 8, 768, 0, 1)}},
    /* Qwen/Qwen1.5-MoE-A2.7B config.json: 60 experts, 4 a token, a shared expert */
    {"qwen1.5-moe-a2.7b", {SHAPE(PARITY_ARCH_QWEN2_MOE, 151936, 2048, 5632, 24, 16, 16, 128, 8192,
                                 1e-6f, 1000000.0), ONE_PASS(0, 1, 0), DEFAULT_ROPE,
                           MOE(60, 4, 1408, 5632, 0)}},
    /* Qwen/Qwen2-57B-A14B config.json: 64 experts, 8 a token, a shared expert */
    {"qwen2-57b-a14b", {SHAPE(PARITY_ARCH_QWEN2_MOE, 151936, 3584, 18944, 28, 28, 4, 128, 131072,
                              1e-6f, 1000000.0), ONE_PASS(0, 1, 0), DEFAULT_ROPE,
                        MOE(64, 8, 2560, 20480, 0)}},
};

/* parity_config_builtin_names: the names, NULL-terminated, derived from builtins[] once. */
NAME_NAMES_ONCE(builtins, parity_config_builtin_names)

int parity_config_builtin(const char *name, parity_config *out) {
    clear_error();
    if (!name || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "name or output is NULL");
    const struct builtin *b = NAME_FIND(builtins, name, strlen(name));
    if (b) {
        *out = b->config;
        return PARITY_OK;
    }
    char names[128];
    NAME_LIST(builtins, names);
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "no built-in config named '%s' (%s)", name,
                     names);
}
