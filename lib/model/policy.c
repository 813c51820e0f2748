/* Precision policies: the presets (names are API) and their modifiers. The framework
 * behaviour each preset reproduces is documented in parity.h with the source lines it
 * follows (docs/framework-numerics.md quotes them). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "base/nametable.h"
#include "quant/rules.h"

/* The switches of a preset, in the order of the table in DESIGN.md §3. */
typedef struct preset {
    const char *name;
    parity_policy policy;
} preset;

#define POLICY(compute, ninput, nweight, qk, rtable, rapply, swiglu, attn, logits, temp, exit, \
               moe)                                                                              \
    { compute, ninput, nweight, qk, rtable, rapply, swiglu, attn, logits, temp,                   \
      PARITY_GEMM_BF16, 0, exit, moe }
/* The mixture-of-experts switches of a preset: router, weights, combine (parity.h, "The policy
 * in detail"). */
#define MOE_HF PARITY_MOE_ROUTER_HF, PARITY_MOE_WEIGHTS_ROUNDED, PARITY_MOE_COMBINE_HF
#define MOE_VLLM PARITY_MOE_ROUTER_VLLM, PARITY_MOE_WEIGHTS_FP32, PARITY_MOE_COMBINE_VLLM
#define MOE_SGLANG PARITY_MOE_ROUTER_SGLANG, PARITY_MOE_WEIGHTS_FP32, PARITY_MOE_COMBINE_SGLANG
#define MOE_FP32 PARITY_MOE_ROUTER_HF, PARITY_MOE_WEIGHTS_FP32, PARITY_MOE_COMBINE_FP32

static const preset presets[] = {
    /* fp32: the reference; no rounding anywhere (the other switches are ignored) */
    {"fp32", POLICY(PARITY_COMPUTE_FP32, PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_ONCE,
                    PARITY_NORM_ROUND_ONCE, PARITY_ROPE_TABLE_FP32, PARITY_ROPE_FUSED,
                    PARITY_SWIGLU_FUSED, PARITY_ATTN_FP32, PARITY_LOGITS_FP32,
                    PARITY_TEMPERATURE_FP32, PARITY_EXIT_DIST_FP32, MOE_FP32)},
    /* transformers eager, bf16 (framework-numerics.md §1, §3-§6) */
    {"hf-eager", POLICY(PARITY_COMPUTE_BF16, PARITY_NORM_INPUT_ROUNDED, PARITY_NORM_ROUND_TWICE,
                        PARITY_NORM_ROUND_TWICE, PARITY_ROPE_TABLE_BF16, PARITY_ROPE_PER_OP,
                        PARITY_SWIGLU_PER_OP, PARITY_ATTN_EAGER, PARITY_LOGITS_BF16,
                        PARITY_TEMPERATURE_BF16, PARITY_EXIT_DIST_MODEL, MOE_HF)},
    /* transformers with sdpa attention (flash recipe), otherwise eager's rounding points */
    {"hf-sdpa", POLICY(PARITY_COMPUTE_BF16, PARITY_NORM_INPUT_ROUNDED, PARITY_NORM_ROUND_TWICE,
                       PARITY_NORM_ROUND_TWICE, PARITY_ROPE_TABLE_BF16, PARITY_ROPE_PER_OP,
                       PARITY_SWIGLU_PER_OP, PARITY_ATTN_FLASH, PARITY_LOGITS_BF16,
                       PARITY_TEMPERATURE_BF16, PARITY_EXIT_DIST_MODEL, MOE_HF)},
    /* vLLM V1 default (Inductor, custom_ops none): forward_native RMSNorm reads the fp32 sum,
     * casts before x weight; bf16 cos_sin_cache, fused rotation; fused SiluAndMul; flash
     * attention; temperature in fp32 after logits.to(float32) */
    {"vllm", POLICY(PARITY_COMPUTE_BF16, PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_TWICE,
                    PARITY_NORM_ROUND_TWICE, PARITY_ROPE_TABLE_BF16, PARITY_ROPE_FUSED,
                    PARITY_SWIGLU_FUSED, PARITY_ATTN_FLASH, PARITY_LOGITS_BF16,
                    PARITY_TEMPERATURE_FP32, PARITY_EXIT_DIST_FP32, MOE_VLLM)},
    /* SGLang CUDA: FlashInfer fused add-RMSNorm (fp32 sum, one rounding), fp32 RoPE cache,
     * one rounding; SwiGLU fused (its source was not read); flash attention */
    {"sglang", POLICY(PARITY_COMPUTE_BF16, PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_ONCE,
                      PARITY_NORM_ROUND_ONCE, PARITY_ROPE_TABLE_FP32, PARITY_ROPE_FUSED,
                      PARITY_SWIGLU_FUSED, PARITY_ATTN_FLASH, PARITY_LOGITS_BF16,
                      PARITY_TEMPERATURE_FP32, PARITY_EXIT_DIST_FP32, MOE_SGLANG)},
    /* the remedy: hf-eager with the three regions in fp32, one rounding at each output */
    {"aligned", POLICY(PARITY_COMPUTE_BF16, PARITY_NORM_INPUT_FP32, PARITY_NORM_ROUND_ONCE,
                       PARITY_NORM_ROUND_ONCE, PARITY_ROPE_TABLE_FP32, PARITY_ROPE_FUSED,
                       PARITY_SWIGLU_FUSED, PARITY_ATTN_EAGER, PARITY_LOGITS_BF16,
                       PARITY_TEMPERATURE_BF16, PARITY_EXIT_DIST_FP32, MOE_FP32)},
};

/* parity_policy_preset_names: the names, NULL-terminated, derived from presets[] once. */
NAME_NAMES_ONCE(presets, parity_policy_preset_names)

/* The modifiers: "PRESET+NAME" (or "PRESET+NAME:ARG") applies `apply` to the preset's
 * switches; an apply that cannot compose with what it finds, or whose argument it does not
 * take, sets the error and returns its status. `arg` is the text after ':' ("" if none),
 * `arg_len` its length. */
static int no_arg(const char *mod, const char *arg, size_t arg_len, const char *name) {
    (void)arg;
    if (arg_len)
        return set_error(PARITY_ERR_POLICY, "policy '%s': +%s takes no ':' argument", name, mod);
    return PARITY_OK;
}

static int apply_aligned(parity_policy *p, const char *arg, size_t arg_len, const char *name) {
    TRY(no_arg("aligned", arg, arg_len, name));
    /* the three regions as in "aligned" */
    p->norm_input = PARITY_NORM_INPUT_FP32;
    p->norm_weight = PARITY_NORM_ROUND_ONCE;
    p->qk_norm = PARITY_NORM_ROUND_ONCE;
    p->rope_table = PARITY_ROPE_TABLE_FP32;
    p->rope_apply = PARITY_ROPE_FUSED;
    p->swiglu = PARITY_SWIGLU_FUSED;
    /* and the experts' combine: fp32 weights, the weighted sum in fp32, one rounding */
    p->moe_weights = PARITY_MOE_WEIGHTS_FP32;
    p->moe_combine = PARITY_MOE_COMBINE_FP32;
    return PARITY_OK;
}

static int apply_fp32_head(parity_policy *p, const char *arg, size_t arg_len, const char *name) {
    TRY(no_arg("fp32-head", arg, arg_len, name));
    /* fp32 logits; a temperature then divides fp32 logits, without rounding */
    p->logits = PARITY_LOGITS_FP32;
    p->temperature = PARITY_TEMPERATURE_FP32;
    return PARITY_OK;
}

static int apply_fp16(parity_policy *p, const char *arg, size_t arg_len, const char *name) {
    TRY(no_arg("fp16", arg, arg_len, name));
    /* every rounding point of the preset rounds to fp16 instead of bf16 */
    if (p->compute == PARITY_COMPUTE_FP32)
        return set_error(PARITY_ERR_POLICY, "policy '%s': +fp16 moves a preset's bf16 rounding "
                         "points to fp16, and the fp32 reference has none", name);
    p->compute = PARITY_COMPUTE_FP16;
    return PARITY_OK;
}

/* +fp8-block:RULE, +mxfp8:RULE, +nvfp4:RULE, +mxfp4:RULE, +ternary:RULE: the decoder layers'
 * GEMMs in a quantized format with a named quantizer */
static int apply_quantized(parity_policy *p, uint32_t gemm, const char *arg, size_t arg_len,
                           const char *name) {
    const char *mod = quant_format_name(gemm);
    if (p->compute != PARITY_COMPUTE_BF16)
        return set_error(PARITY_ERR_POLICY, "policy '%s': +%s applies to bf16 presets (not fp32 "
                         "or +fp16)", name, mod);
    if (p->gemm != PARITY_GEMM_BF16)
        return set_error(PARITY_ERR_POLICY, "policy '%s': +%s after +%s: one quantized format a "
                         "policy", name, mod, quant_format_name(p->gemm));
    char rule[32];
    if (arg_len >= sizeof rule) arg_len = sizeof rule - 1; /* no rule name is that long */
    memcpy(rule, arg, arg_len);
    rule[arg_len] = 0;
    int q;
    if (!arg_len || parity_quantizer_from_name(gemm, rule, &q)) {
        char why[160] = "";
        if (arg_len) snprintf(why, sizeof why, ": %s", parity_last_error());
        return set_error(PARITY_ERR_POLICY, "policy '%s': +%s needs its quantizer, +%s:RULE%s",
                         name, mod, mod, why);
    }
    p->gemm = (uint8_t)gemm;
    p->quantizer = (uint8_t)q;
    return PARITY_OK;
}

#define QUANTIZED_MODIFIER(fn, gemm)                                                         \
    static int fn(parity_policy *p, const char *arg, size_t arg_len, const char *name) {    \
        return apply_quantized(p, gemm, arg, arg_len, name);                                 \
    }
QUANTIZED_MODIFIER(apply_fp8_block, PARITY_GEMM_FP8_BLOCK)
QUANTIZED_MODIFIER(apply_mxfp8, PARITY_GEMM_MXFP8)
QUANTIZED_MODIFIER(apply_nvfp4, PARITY_GEMM_NVFP4)
QUANTIZED_MODIFIER(apply_mxfp4, PARITY_GEMM_MXFP4)
QUANTIZED_MODIFIER(apply_ternary, PARITY_GEMM_TERNARY)

static const struct modifier {
    const char *name;
    int (*apply)(parity_policy *p, const char *arg, size_t arg_len, const char *name);
} modifiers[] = {
    {"aligned", apply_aligned},
    {"fp32-head", apply_fp32_head},
    {"fp16", apply_fp16},
    {"fp8-block", apply_fp8_block},
    {"mxfp8", apply_mxfp8},
    {"nvfp4", apply_nvfp4},
    {"mxfp4", apply_mxfp4},
    {"ternary", apply_ternary},
};

int parity_policy_validate(const parity_policy *p) {
    clear_error();
    if (!p) return set_error(PARITY_ERR_INVALID_ARGUMENT, "policy is NULL");
    struct {
        const char *name;
        uint8_t value, max;
    } sw[] = {
        {"compute", p->compute, PARITY_COMPUTE_FP16},
        {"norm_input", p->norm_input, PARITY_NORM_INPUT_FP32},
        {"norm_weight", p->norm_weight, PARITY_NORM_ROUND_ONCE},
        {"qk_norm", p->qk_norm, PARITY_NORM_ROUND_ONCE},
        {"rope_table", p->rope_table, PARITY_ROPE_TABLE_FP32},
        {"rope_apply", p->rope_apply, PARITY_ROPE_FUSED},
        {"swiglu", p->swiglu, PARITY_SWIGLU_FUSED},
        {"attention", p->attention, PARITY_ATTN_FP32},
        {"logits", p->logits, PARITY_LOGITS_FP32},
        {"temperature", p->temperature, PARITY_TEMPERATURE_FP32},
        {"gemm", p->gemm, PARITY_GEMM_TERNARY},
        {"quantizer", p->quantizer, PARITY_QUANT_NVFP4_TE_2D},
        {"exit_dist", p->exit_dist, PARITY_EXIT_DIST_FP32},
        {"moe_router", p->moe_router, PARITY_MOE_ROUTER_TOPK_SOFTMAX},
        {"moe_weights", p->moe_weights, PARITY_MOE_WEIGHTS_FP32},
        {"moe_combine", p->moe_combine, PARITY_MOE_COMBINE_FP32},
    };
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++)
        if (sw[i].value > sw[i].max)
            return set_error(PARITY_ERR_POLICY, "policy switch %s = %u is not defined (0..%u)",
                             sw[i].name, sw[i].value, sw[i].max);
    /* the quantizer belongs to the gemm format; quantized formats run on bf16 policies */
    const int q = p->quantizer;
    if (p->gemm == PARITY_GEMM_BF16 && q != 0)
        return set_error(PARITY_ERR_POLICY, "policy quantizer = %d needs a quantized gemm (gemm = "
                         "%u is bf16): 0 there", q, p->gemm);
    if (p->gemm != PARITY_GEMM_BF16 && quant_format_of(q) != p->gemm)
        return set_error(PARITY_ERR_POLICY, "policy quantizer = %d (%s) is not a rule of the "
                         "gemm format %u (%s)", q, parity_quantizer_name(q), p->gemm,
                         quant_format_name(p->gemm));
    if (p->gemm != PARITY_GEMM_BF16 && p->compute != PARITY_COMPUTE_BF16)
        return set_error(PARITY_ERR_POLICY, "policy gemm = %u (%s) needs compute bf16, not %u",
                         p->gemm, quant_format_name(p->gemm), p->compute);
    return PARITY_OK;
}

/* "PRESET" or "PRESET+MODIFIER+..." with modifiers "aligned", "fp32-head", "fp16",
 * "fp8-block:RULE", "mxfp8:RULE", "nvfp4:RULE", "mxfp4:RULE" and "ternary:RULE". */
int parity_policy_from_name(const char *name, parity_policy *out) {
    clear_error();
    if (!name || !out) return set_error(PARITY_ERR_INVALID_ARGUMENT, "policy name or output is NULL");
    const char *plus = strchr(name, '+');
    size_t base_len = plus ? (size_t)(plus - name) : strlen(name);
    const preset *base = NAME_FIND(presets, name, base_len);
    char presets_list[128], modifiers_list[128];
    NAME_LIST(modifiers, modifiers_list);
    if (!base) {
        NAME_LIST(presets, presets_list);
        return set_error(PARITY_ERR_POLICY,
                         "unknown policy '%s': presets are %s, each optionally followed by "
                         "+MODIFIER (%s)",
                         name, presets_list, modifiers_list);
    }
    parity_policy p = base->policy;
    while (plus) {
        const char *mod = plus + 1;
        plus = strchr(mod, '+');
        size_t len = plus ? (size_t)(plus - mod) : strlen(mod);
        const char *colon = memchr(mod, ':', len);
        const size_t name_len = colon ? (size_t)(colon - mod) : len;
        const struct modifier *m = NAME_FIND(modifiers, mod, name_len);
        if (!m)
            return set_error(PARITY_ERR_POLICY,
                             "unknown policy modifier '%.*s' in '%s' (modifiers: %s)", (int)len,
                             mod, name, modifiers_list);
        TRY(colon ? m->apply(&p, colon + 1, len - name_len - 1, name) : m->apply(&p, "", 0, name));
    }
    *out = p;
    return PARITY_OK;
}
