/*
 * libparity — BF16 forward passes of Qwen-family models with every rounding point explicit,
 * and a sampler and a learner that return bitwise-identical log-probabilities.
 *
 * The public API, in three tiers. This header holds the core, in reading order: version,
 * status, policy, model, scorer, sampler, weight updates (then the policy's switches and
 * presets in detail). At its end it includes parity_quant.h (element formats, quantizers,
 * export check) and parity_ops.h (CPU paths, region kernels, forward pieces), so that
 * including parity.h gives the whole API. A function or type that is not declared in these
 * three headers is not published. Conventions, for every object:
 *
 *   - Handles are opaque. `parity_X_free(NULL)` is a harmless no-op.
 *   - Every fallible call returns a parity_status (0 = PARITY_OK, errors are negative and
 *     stable once published). On failure, parity_last_error() returns a message for the
 *     calling thread saying what was wrong, and nothing the caller owns has been changed
 *     (output buffers excepted: their contents are unspecified after a failed call).
 *   - The library never prints, never exits and never aborts on bad input; it speaks only
 *     through the logging hook the host installs (parity_set_log_callback).
 *   - Threading: a parity_model may be shared by any number of threads. Its weights change
 *     only through parity_model_update (and parity_model_set_quantized, parity_quant.h), which
 *     runs only while no other call uses the model (it fails with PARITY_ERR_BUSY otherwise,
 *     and calls that find an update running fail the same way): no call ever sees
 *     half-updated weights. Its config never changes. A
 *     parity_scorer is used by one thread at a time (it owns scratch memory and a thread
 *     pool); create one per thread that scores. The region kernels are pure functions of
 *     their arguments and may be called from any thread.
 *     A scorer or sampler must not be used by two threads at once; the library detects it
 *     where cheap (parity_score, parity_sampler_add/fork/step/release) and returns
 *     PARITY_ERR_BUSY to the call that finds the object in use, changing nothing.
 *   - Params structs start with their size (`size`), filled by the *_default_params()
 *     function, so that the ABI can grow: always initialise them with that function.
 *
 * Numerics: see DESIGN.md and README.md. In short, fp32->bf16 is round-to-nearest-even with
 * quiet NaN (PyTorch's rule); bf16->fp32 is exact; every reduction runs in one fixed,
 * documented order per output element, independent of batch size, batch position, chunking,
 * thread count and SIMD path.
 */
#ifndef PARITY_H
#define PARITY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PARITY_STATIC_DEFINE)
#define PARITY_API
#elif defined(PARITY_BUILDING_LIBRARY)
#define PARITY_API __attribute__((visibility("default")))
#else
#define PARITY_API
#endif

/* ---------------------------------------------------------------------------------------- */
/* Version                                                                                  */
/* ---------------------------------------------------------------------------------------- */

#define PARITY_VERSION_MAJOR 0
#define PARITY_VERSION_MINOR 1
#define PARITY_VERSION_PATCH 0
#define PARITY_VERSION_STRING "0.1.0"
#define PARITY_VERSION_NUMBER \
    (PARITY_VERSION_MAJOR * 10000 + PARITY_VERSION_MINOR * 100 + PARITY_VERSION_PATCH)

/* Runtime version, so a host can check that it links what it compiled against:
 *   assert(parity_version_number() == PARITY_VERSION_NUMBER); */
PARITY_API const char *parity_version(void);
PARITY_API int parity_version_number(void);

/* The ABI: bumped whenever a public struct or a function's signature changes, so that a
 * binding (python/parity) can check that it mirrors this library. */
#define PARITY_ABI_VERSION 3
PARITY_API int parity_abi_version(void);
/* sizeof a public struct by its name ("parity_policy", "parity_config",
 * "parity_scorer_params", "parity_score_options", "parity_sampling",
 * "parity_sampler_params", "parity_tensor_data", "parity_seq_info", "parity_profile",
 * "parity_weight_info", "parity_weight_bytes", "parity_quant_operand"); 0 for other names. */
PARITY_API size_t parity_struct_size(const char *name);

/* ---------------------------------------------------------------------------------------- */
/* Status codes and errors                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Every status, X(NAME, VALUE), in one list: the parity_status enum below and the names
 * parity_status_name gives are both made from it (a host may expand it too). */
#define PARITY_STATUS_LIST(X)                                                                      \
    X(PARITY_OK, 0)                                                                                \
                                                                                                   \
    /* generic */                                                                                  \
    X(PARITY_ERR_INVALID_ARGUMENT, -1) /* NULL pointer, zero count, bad option value */            \
    X(PARITY_ERR_OUT_OF_MEMORY, -2)    /* an allocation failed; nothing was changed */             \
    X(PARITY_ERR_IO, -3)               /* a file could not be opened, read, mapped or written */   \
    X(PARITY_ERR_UNSUPPORTED, -4)      /* valid input this build does not handle */                \
    X(PARITY_ERR_MEMORY_LIMIT, -5)     /* the request needs more memory than max_memory allows */  \
    X(PARITY_ERR_BUSY, -6)             /* an object (or the model, during a weight update) is      \
                                          in use by another call */                                \
                                                                                                   \
    /* JSON files (config.json, model.safetensors.index.json) */                                   \
    X(PARITY_ERR_JSON_SYNTAX, -10)     /* not valid JSON (RFC 8259), or nested too deep */         \
    X(PARITY_ERR_CONFIG, -11)          /* config.json: missing, wrong type or out-of-range         \
                                          field */                                                 \
    X(PARITY_ERR_INDEX, -12)           /* index.json: bad weight_map, missing shard, tensor in     \
                                          a shard the map does not name */                         \
                                                                                                   \
    /* safetensors: one status per rule of the format */                                           \
    X(PARITY_ERR_ST_HEADER_LENGTH, -20) /* file < 8 bytes, header length 0, > 100 MB or past       \
                                           EOF */                                                  \
    X(PARITY_ERR_ST_HEADER_UTF8, -21)  /* header is not valid UTF-8 */                             \
    X(PARITY_ERR_ST_HEADER_JSON, -22)  /* header is not a JSON object of tensor entries            \
                                          {"dtype","shape","data_offsets"} (+ "__metadata__") */   \
    X(PARITY_ERR_ST_DTYPE, -23)        /* unknown dtype string */                                  \
    X(PARITY_ERR_ST_OFFSETS, -24)      /* data_offsets not contiguous from 0: gap, overlap, or     \
                                          end < begin */                                           \
    X(PARITY_ERR_ST_OVERFLOW, -25)     /* shape product or byte size overflows 64 bits */          \
    X(PARITY_ERR_ST_SIZE, -26)         /* shape x dtype size differs from the byte range */        \
    X(PARITY_ERR_ST_TRUNCATED, -27)    /* the file ends before the last tensor's data */           \
    X(PARITY_ERR_ST_TRAILING, -28)     /* bytes after the last tensor's data */                    \
    X(PARITY_ERR_ST_DUPLICATE, -29)    /* a tensor name appears twice (in a file or across         \
                                          shards) */                                               \
                                                                                                   \
    /* model tensors against the config */                                                         \
    X(PARITY_ERR_TENSOR_MISSING, -30)  /* a tensor the config requires is absent */                \
    X(PARITY_ERR_TENSOR_SHAPE, -31)    /* a tensor's shape does not match the config */            \
    X(PARITY_ERR_TENSOR_DTYPE, -32)    /* a weight stored in a dtype other than BF16/F16/F32       \
                                          (F8_E4M3 where a block-FP8 checkpoint quantizes it),     \
                                          or a scale in one other than F32/BF16 */                 \
    X(PARITY_ERR_TENSOR_NONFINITE, -33) /* a weight holds NaN or Inf */                            \
    X(PARITY_ERR_TENSOR_UNEXPECTED, -34) /* a tensor the architecture does not use */              \
    /* block-FP8 weights (a checkpoint's or an update's F8_E4M3 codes and their scales) */         \
    X(PARITY_ERR_SCALE_MISSING, -35)   /* an F8_E4M3 weight without its weight_scale_inv */        \
    X(PARITY_ERR_SCALE_GRID, -36)      /* a weight_scale_inv whose shape is not the weight's       \
                                          128 x 128 block grid [ceil(rows/128), ceil(cols/128)] */ \
    X(PARITY_ERR_SCALE_VALUE, -37)     /* a scale that is NaN, infinite, zero or negative (or      \
                                          not a power of two under "scale_fmt": "ue8m0") */        \
                                                                                                   \
    /* inputs to scoring */                                                                        \
    X(PARITY_ERR_TOKEN_RANGE, -40)     /* a token id < 0 or >= vocab_size */                       \
    X(PARITY_ERR_EMPTY_INPUT, -41)     /* a sequence of length 0, or no sequences */               \
    X(PARITY_ERR_TOO_LONG, -42)        /* a sequence longer than the context or the capacity */    \
    X(PARITY_ERR_POLICY, -43)          /* unknown preset name or invalid policy switch value */    \
                                                                                                   \
    /* the sampler */                                                                              \
    X(PARITY_ERR_CACHE_FULL, -50)      /* no free KV cache blocks or sequence slots for the        \
                                          call */                                                  \
    X(PARITY_ERR_UNKNOWN_SEQUENCE, -51) /* a sequence id that is not live in this sampler */       \
    X(PARITY_ERR_SEQUENCE_FINISHED, -52) /* a step asked of a sequence that has finished */        \
    X(PARITY_ERR_STALE, -53)           /* a sequence's KV cache predates a weight update */        \
                                                                                                   \
    /* sync checks */                                                                              \
    X(PARITY_ERR_VERIFY, -60)          /* the model differs from a manifest or a probe */          \
    X(PARITY_ERR_NO_MASTERS, -61)      /* a reader of fp32 masters asked for a weight whose        \
                                          masters an update did not keep                           \
                                          (PARITY_MASTERS_WHERE_READ) */

#define PARITY_STATUS_ENUMERATOR(name, value) name = value,
typedef enum parity_status { PARITY_STATUS_LIST(PARITY_STATUS_ENUMERATOR) } parity_status;
#undef PARITY_STATUS_ENUMERATOR

/* Stable name of a status ("PARITY_ERR_ST_OFFSETS"); "PARITY_UNKNOWN_STATUS" for others. */
PARITY_API const char *parity_status_name(int status);

/* The message of the last failed call on this thread ("" if none). Valid until the next
 * call into the library from this thread. */
PARITY_API const char *parity_last_error(void);

/* Logging: the library reports nothing unless a callback is installed (process-wide). The
 * callback may be called from any thread that calls into the library. */
typedef enum parity_log_level {
    PARITY_LOG_ERROR = 0,
    PARITY_LOG_WARN = 1,
    PARITY_LOG_INFO = 2,
    PARITY_LOG_DEBUG = 3,
} parity_log_level;
typedef void (*parity_log_fn)(parity_log_level level, const char *message, void *user);
PARITY_API void parity_set_log_callback(parity_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------- */
/* Precision policy: one switch per rounding point                                          */
/* ---------------------------------------------------------------------------------------- */

/* Values of the switches. "ROUND" means: the fp32 value is rounded to bf16 at that point
 * (to fp16 under PARITY_COMPUTE_FP16: read every "bf16" below as "fp16" then). The longer
 * stories of compute, exit_dist and the presets follow the weight updates ("The policy in
 * detail"); the quantized gemm formats' arithmetic is in parity_quant.h. */
enum {
    /* norm_input: what the RMSNorm after a residual add reads */
    PARITY_NORM_INPUT_ROUNDED = 0,  /* the bf16-rounded residual sum (HF transformers) */
    PARITY_NORM_INPUT_FP32 = 1,     /* the unrounded fp32 sum (vLLM compiled, SGLang) */
    /* norm_weight, qk_norm: how the normalised value meets the weight */
    PARITY_NORM_ROUND_TWICE = 0,    /* bf16(w * bf16(x * r)): HF, vLLM */
    PARITY_NORM_ROUND_ONCE = 1,     /* bf16(w * x * r) in fp32 */
    /* rope_table: precision of cos/sin */
    PARITY_ROPE_TABLE_BF16 = 0,
    PARITY_ROPE_TABLE_FP32 = 1,
    /* rope_apply */
    PARITY_ROPE_PER_OP = 0,         /* bf16(bf16(x*c) +- bf16(x'*s)): 3 roundings (HF) */
    PARITY_ROPE_FUSED = 1,          /* bf16(x*c +- x'*s) in fp32: 1 rounding */
    /* swiglu */
    PARITY_SWIGLU_PER_OP = 0,       /* bf16(bf16(silu(g)) * u): 2 roundings (HF, vLLM CUDA) */
    PARITY_SWIGLU_FUSED = 1,        /* bf16(silu(g) * u) in fp32: 1 rounding */
    /* attention */
    PARITY_ATTN_EAGER = 0,          /* HF eager: bf16 scores, bf16 scaled, fp32 softmax -> bf16 P,
                                       bf16(P.V) */
    PARITY_ATTN_FLASH = 1,          /* flash: fp32 scores, P = exp(s-m) fp32, l over fp32 P,
                                       O = sum bf16(P) V in fp32, bf16(O / l) */
    PARITY_ATTN_FP32 = 2,           /* fp32 softmax attention, no rounding */
    /* logits */
    PARITY_LOGITS_BF16 = 0,         /* lm_head output rounded to bf16 */
    PARITY_LOGITS_FP32 = 1,         /* fp32 lm_head output (an "fp32 head") */
    /* temperature */
    PARITY_TEMPERATURE_BF16 = 0,    /* logits / T rounded to bf16 (verl's div_ on bf16 logits) */
    PARITY_TEMPERATURE_FP32 = 1,    /* logits / T in fp32 */
    /* compute: the master switch of the fp32 reference */
    PARITY_COMPUTE_BF16 = 0,        /* bf16 weights and activations, rounding where switched */
    PARITY_COMPUTE_FP32 = 1,        /* fp32 everywhere: no rounding at any point, fp32 weights */
    PARITY_COMPUTE_FP16 = 2,        /* fp16 weights and activations, rounding where bf16 would
                                       (the "+fp16" modifier) */
    /* gemm: the format of the decoder layers' linear layers (q, k, v, o, gate, up, down; the
     * embedding, the norms and lm_head stay bf16) */
    PARITY_GEMM_BF16 = 0,           /* bf16 weights (the native GEMM of the compute switch) */
    PARITY_GEMM_FP8_BLOCK = 1,      /* E4M3 weights in 128 x 128 blocks with fp32 scales,
                                       activations in 1 x 128 groups; "+fp8-block:RULE" */
    PARITY_GEMM_MXFP8 = 2,          /* E4M3 in 1 x 32 blocks along K with E8M0 scales, weights
                                       and activations; "+mxfp8:RULE" */
    PARITY_GEMM_NVFP4 = 3,          /* "+nvfp4:RULE" */
    PARITY_GEMM_MXFP4 = 4,          /* "+mxfp4:RULE" */
    PARITY_GEMM_TERNARY = 5,        /* "+ternary:RULE" */
    /* exit_dist: a looped model's exit distribution from its gate */
    PARITY_EXIT_DIST_MODEL = 0,     /* in the model's dtype, as HF computes it */
    PARITY_EXIT_DIST_FP32 = 1,      /* every step in fp32, the gate's output unrounded */
    /* moe_router: how a mixture-of-experts router turns its logits (the gate GEMM's output,
     * rounded as every GEMM output is) into k experts and their weights; "The policy in
     * detail" below says each step */
    PARITY_MOE_ROUTER_HF = 0,       /* fp32 softmax dividing by the sum, top-k of the
                                       probabilities, renormalised by dividing (transformers) */
    PARITY_MOE_ROUTER_VLLM = 1,     /* softmax as exp times 1/sum, top-k, renormalised by
                                       dividing by a sum > 0 (vLLM topk_softmax) */
    PARITY_MOE_ROUTER_SGLANG = 2,   /* softmax as exp times 1/sum, top-k, renormalised by
                                       multiplying by 1/sum (SGLang topk_softmax) */
    PARITY_MOE_ROUTER_TOPK_SOFTMAX = 3, /* top-k of the logits, then an fp32 softmax over the
                                       k chosen (mistral-inference's MoeLayer); only for models
                                       with norm_topk_prob */
    /* moe_weights: the routing weights the combine multiplies by */
    PARITY_MOE_WEIGHTS_ROUNDED = 0, /* rounded to bf16 (fp16) once routed (transformers v4's
                                       routing_weights.to(hidden_states.dtype)) */
    PARITY_MOE_WEIGHTS_FP32 = 1,    /* kept fp32 (vLLM, SGLang) */
    /* moe_combine: how the k experts' outputs are weighted and summed */
    PARITY_MOE_COMBINE_HF = 0,      /* round(round(y) * w) per expert, a bf16 running sum in
                                       ascending expert index (transformers' eager loop) */
    PARITY_MOE_COMBINE_VLLM = 1,    /* round(y * w) per expert (fp32 y), then for k <= 4 a bf16
                                       running sum in slot order, else an fp32 sum rounded once
                                       (vLLM fused_moe and moe_sum) */
    PARITY_MOE_COMBINE_SGLANG = 2,  /* round(y * w) per expert, then for k <= 2 a bf16 add, else
                                       an fp32 sum in slot order rounded once (SGLang) */
    PARITY_MOE_COMBINE_FP32 = 3,    /* the region in fp32: sum of y * w in slot order (and the
                                       gated shared expert), one rounding at the output */
};

typedef struct parity_policy {
    uint8_t compute;      /* PARITY_COMPUTE_* */
    uint8_t norm_input;   /* PARITY_NORM_INPUT_* (residual RMSNorms) */
    uint8_t norm_weight;  /* PARITY_NORM_ROUND_* (input, post-attention and final RMSNorm) */
    uint8_t qk_norm;      /* PARITY_NORM_ROUND_* (Qwen3 q_norm / k_norm, before RoPE) */
    uint8_t rope_table;   /* PARITY_ROPE_TABLE_* */
    uint8_t rope_apply;   /* PARITY_ROPE_PER_OP / PARITY_ROPE_FUSED */
    uint8_t swiglu;       /* PARITY_SWIGLU_* */
    uint8_t attention;    /* PARITY_ATTN_* */
    uint8_t logits;       /* PARITY_LOGITS_* */
    uint8_t temperature;  /* PARITY_TEMPERATURE_* */
    uint8_t gemm;         /* PARITY_GEMM_*: the decoder layers' linear layers, bf16 or quantized */
    uint8_t quantizer;    /* parity_quantizer (parity_quant.h) of the gemm's format (0 under
                             PARITY_GEMM_BF16) */
    uint8_t exit_dist;    /* PARITY_EXIT_DIST_* (looped models: the exit gate's distribution) */
    uint8_t moe_router;   /* PARITY_MOE_ROUTER_* (mixture-of-experts models) */
    uint8_t moe_weights;  /* PARITY_MOE_WEIGHTS_* */
    uint8_t moe_combine;  /* PARITY_MOE_COMBINE_* */
} parity_policy;

/* The policy of a preset name ("fp32", "hf-eager", "hf-sdpa", "vllm", "sglang", "aligned"),
 * followed by any modifiers ("+aligned", "+fp32-head", "+fp16", "+fp8-block:RULE",
 * "+mxfp8:RULE", "+nvfp4:RULE", "+mxfp4:RULE", "+ternary:RULE"), e.g. "vllm+fp32-head". Each
 * preset follows a framework, cited in "The policy in detail" below the weight updates. */
PARITY_API int parity_policy_from_name(const char *name, parity_policy *out);
/* The preset names, NULL-terminated ("fp32", "hf-eager", ...). */
PARITY_API const char *const *parity_policy_preset_names(void);
/* Checks that every switch holds a defined value. */
PARITY_API int parity_policy_validate(const parity_policy *policy);

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                   */
/* ---------------------------------------------------------------------------------------- */

typedef struct parity_model parity_model;
/* What config.json says: defined with the architectures, below parity_model_config. */
typedef struct parity_config parity_config;

/* Loads a Hugging Face checkpoint directory: config.json plus model.safetensors, or shards
 * listed in model.safetensors.index.json. BF16 tensors are mapped, not copied; F16/F32 are
 * cast to bf16 with round-to-nearest-even (F32 masters are kept, mapped, for the fp32
 * policy; F16 ones are widened into owned fp32 copies, 4 bytes a parameter). Every tensor
 * is validated (format, shape against the config, finite values).
 *
 * A mixture of experts (qwen3_moe, qwen2_moe) reads each sparse layer's routed experts as the
 * hub checkpoints ship them, model.layers.L.mlp.experts.N.{gate,up,down}_proj.weight, or as
 * newer transformers (v5) writes them, fused: model.layers.L.mlp.experts.gate_up_proj
 * [num_experts, 2 x moe_intermediate_size, hidden_size] (each expert's gate_proj rows, then
 * its up_proj rows) and model.layers.L.mlp.experts.down_proj [num_experts, hidden_size,
 * moe_intermediate_size], each expert's weights then views into them (BF16 mapped, F16/F32
 * cast as above); a save writes the per-expert names. Refused with the tensor named: a layer
 * holding both forms (PARITY_ERR_TENSOR_UNEXPECTED), a fused tensor of another shape
 * (_TENSOR_SHAPE) or dtype (_TENSOR_DTYPE) or without its partner (_TENSOR_MISSING), fused
 * experts in a quantized checkpoint (PARITY_ERR_UNSUPPORTED).
 *
 * Lifetimes and memory:
 *   - The checkpoint files stay mapped while the model lives: they must not be truncated or
 *     rewritten in place meanwhile (reading a truncated mapping kills the process with
 *     SIGBUS, which no library can catch). Replace a file by renaming a new one over it.
 *   - The model must outlive every scorer and sampler made from it; free them first.
 *   - Weights in fp32: norm weights and biases are always held widened (small). The matrices
 *     are widened, once per model, when the first scorer or sampler with the openblas
 *     backend or the fp32 policy is created: an fp32 copy of every weight matrix, 4 bytes a
 *     parameter more (the fp32 policy reads an F32 or F16 checkpoint's masters instead, but
 *     the copy is made all the same, for the openblas backend). The copy lives with the
 *     model and is not counted by a scorer's or sampler's max_memory.
 *   - Weight buffers the library allocates (casts of F16/F32 tensors, fp32 copies, synthetic
 *     weights) of 2 MB or more are 2 MB aligned and advised MADV_HUGEPAGE, so that
 *     transparent huge pages back them where the OS enables them; mapped BF16 tensors stay in
 *     the page cache as they are.
 *   - A quantized checkpoint (block-FP8, NVFP4, MXFP4, BitNet: parity_model_save_as below)
 *     is held compressed. After the load its quantized linear weights are their codes and
 *     scales alone: E4M3 codes one a byte, E2M1 two a byte as the files pack them (block-FP8's
 *     and NVFP4's used in place from the mapped file, MXFP4's too where its rows carry no
 *     block padding, else copied a row at a time), ternary four a byte (repacked from
 *     BitNet's four rows a byte into four codes of a row a byte, in groups of 64), block-FP8's
 *     block scales as fp32 values and NVFP4's and MXFP4's as the bytes the files ship (E4M3,
 *     E8M0; used in place from the mapped file), so every such checkpoint is held at about its
 *     file's bytes; the
 *     embedding, norms and lm_head are as for any checkpoint (BF16 mapped). Scorers and samplers of the checkpoint's own format (e.g. "+fp8-block:RULE"
 *     on a block-FP8 checkpoint) with bf16 compute read the codes as they are and add
 *     nothing. The dequantized values of those weights (their fp32 master and its bf16
 *     cast, 6 bytes a parameter, bitwise the values described under parity_model_save_as)
 *     are made once, when the first reader that needs them asks, and then stay with the
 *     model: a scorer or sampler with a bf16 GEMM, fp32 or fp16 compute, the openblas
 *     backend or a quantizer of another format; parity_model_save_as in another layout;
 *     a manifest's BF16 entry or codes of another quantizer for such a weight
 *     (parity_model_write_manifest and _verify, and their _for calls under another
 *     policy). A block-FP8 weight update keeps a weight that holds no values so.
 *     parity_model_bytes reports what is held. */
PARITY_API int parity_model_load(const char *dir, parity_model **out);

/* A model with deterministic weights drawn from `seed`: normal(0, 0.02) matrices and
 * embeddings, norm weights 1 + normal(0, 0.02), biases normal(0, 0.02), rounded to bf16. */
PARITY_API int parity_model_synthetic(const parity_config *config, uint64_t seed,
                                      parity_model **out);

/* "DIR" or "synthetic:NAME[:SEED]" (seed default 0), as the command-line tools take it. */
PARITY_API int parity_model_open(const char *spec, parity_model **out);

/* Writes the model as a Hugging Face checkpoint directory (config.json + model.safetensors,
 * bf16 weights). The directory must exist. parity_model_save_as(model, dir, "bf16"). */
PARITY_API int parity_model_save(const parity_model *model, const char *dir);
/* Writes the model in a layout (NULL: "bf16"), each one parity_model_load reads back:
 *   "bf16"  BF16 weights (a block-FP8 weight's dequantized values, rounded to bf16);
 *   "fp16"  F16 weights, torch_dtype float16: each value (the fp32 master where the model has
 *           one, else the bf16 value) rounded once to nearest even; a value beyond fp16's range
 *           fails with PARITY_ERR_TENSOR_NONFINITE before anything is written;
 *   "fp32"  F32 weights, torch_dtype float32: the masters, else the bf16 values widened;
 *   "fp8-block:RULE"  the block-FP8 layout of DeepSeek-V3 / Qwen3-FP8: config.json gains
 *           quantization_config {quant_method fp8, fmt e4m3, activation_scheme dynamic,
 *           weight_block_size [128, 128], modules_to_not_convert ["lm_head", and the layers the
 *           model keeps in bf16]} (and "scale_fmt": "ue8m0" when every scale is a power of two
 *           under te-pow2 or a ue8m0 checkpoint); each decoder linear weight is written as
 *           "<name>" F8_E4M3 codes with "<name>_scale_inv", the fp32 block scales
 *           [ceil(rows/128), ceil(cols/128)] — the shipped codes and scales as they are where the
 *           model holds them (a block-FP8 checkpoint saves back byte for byte, BF16 scales
 *           staying BF16), else quantized with the block rule RULE ("deepseek", "sglang", "te",
 *           "deepgemm", "te-pow2") from the model's values (the fp32 masters where it has them,
 *           never through a bf16 cast); the embedding, norms and lm_head stay BF16;
 *   "fp8-block"  the same where every quantized weight holds shipped codes (else
 *           PARITY_ERR_INVALID_ARGUMENT, naming the weight);
 *   "bitnet:RULE"  transformers' BitNet layout (integrations/bitnet.py): config.json gains
 *           quantization_config {quant_method bitnet, linear_class bitlinear,
 *           modules_to_not_convert ["lm_head", and the kept layers]}; each decoder linear
 *           weight is "<name>" U8 [ceil(rows/4), cols], four ternary codes a byte stored + 1
 *           as pack_weights interleaves them (row i * ceil(rows/4) + r in bits 2i of packed
 *           row r), with "<name>_scale" [1], s_w = 1 / mean|W| (BitLinear divides by it): the
 *           shipped codes and scale as they are where the model holds them (the scale in its
 *           dtype), else quantized with the ternary rule RULE ("bitnet", "hf-bitlinear",
 *           "onebitllms") from the model's values, the scale F32 (BF16 under hf-bitlinear);
 *   "bitnet"  the same where every quantized weight holds shipped ternary codes;
 *   "nvfp4:RULE"  ModelOpt's NVFP4 layout: config.json gains quantization_config {quant_method
 *           modelopt, quant_algo NVFP4, kv_cache_quant_algo null, group_size 16,
 *           exclude_modules ["lm_head", and the kept layers]}, and hf_quant_config.json the same
 *           under "quantization" (with producer libparity); each decoder linear weight is
 *           "<name>" U8 [rows, ceil(cols/2)] (two E2M1 codes a byte, the low nibble the even
 *           column), "<name>_scale" F8_E4M3 [rows, ceil(cols/16)] and "<name>_scale_2" F32 []:
 *           the shipped codes as they are where the model holds them, else quantized with the
 *           NVFP4 rule RULE ("modelopt", "te", "torchao"); "<module>.input_scale" F32 [] only
 *           where the loaded checkpoint had one (libparity scales activations per token and
 *           calibrates none). An all-zero weight's weight_scale_2 is written as 1 (its codes
 *           are 0 whatever it is);
 *   "mxfp4:RULE"  the *_blocks / *_scales layout of gpt-oss on each linear weight:
 *           quantization_config {quant_method mxfp4, modules_to_not_convert [...]};
 *           "<name>_blocks" U8 [rows, ceil(cols/32), 16] and "<name>_scales" U8 [rows,
 *           ceil(cols/32)] (E8M0): shipped, else quantized with the MXFP4 rule RULE ("ocp",
 *           "rceil", "microxcaling");
 *   "nvfp4", "mxfp4"  the same where every quantized weight holds shipped codes of the format.
 * Saving a layout other than nvfp4 removes an hf_quant_config.json left in the directory.
 * NVFP4 and MXFP4 checkpoints load as they are (config.json's quantization_config, or for
 * ModelOpt hf_quant_config.json alone): every policy of the format reads the shipped codes,
 * every other reader their values, RN_fp32(e2m1 * sf * s2) (NVFP4) or e2m1 * 2^(e - 127)
 * (MXFP4). Refused with the tensor named: codes not U8 (_TENSOR_DTYPE) or of another shape,
 * the wrong count of nibbles (_TENSOR_SHAPE), a nonzero padding code past the last column
 * (_TENSOR_SHAPE), a missing weight_scale / weight_scale_2 / *_scales (_SCALE_MISSING),
 * scales of another grid or a weight_scale_2 of more than one value (_SCALE_GRID), a NaN or
 * negative E4M3 block scale, an E8M0 0xFF, a weight_scale_2 or input_scale that is not finite
 * and positive (_SCALE_VALUE), a value beyond bf16's range (_TENSOR_NONFINITE), a "<name>"
 * beside "<name>_blocks" (_TENSOR_UNEXPECTED); another quant_algo, group_size or a quantized
 * KV cache is PARITY_ERR_UNSUPPORTED. A block scale of zero is accepted (ModelOpt writes one
 * for a block far below the tensor's amax).
 * A checkpoint in the BitNet layout loads as it is: its codes are shipped (every ternary
 * policy reads them; the rule then quantizes the activations only), the dequantized values
 * code / weight_scale (linear_class "bitlinear", the default) or code * weight_scale
 * ("autobitlinear", offline) are what every other reader sees. Refused with their own
 * statuses and the tensor named: packed codes of another shape (PARITY_ERR_TENSOR_SHAPE) or
 * dtype (_TENSOR_DTYPE), a 2-bit field of 3 (_TENSOR_NONFINITE: no ternary code), a missing
 * weight_scale (_SCALE_MISSING), one of another shape than [1] (_SCALE_GRID), one that is
 * NaN, infinite, zero or negative (_SCALE_VALUE); another linear_class, or the online
 * quantization_mode, is PARITY_ERR_UNSUPPORTED.
 * The directory must exist; model.safetensors is written under a temporary name and renamed.
 * PARITY_ERR_INVALID_ARGUMENT (PARITY_ERR_POLICY for an unknown RULE) for another layout. */
PARITY_API int parity_model_save_as(const parity_model *model, const char *dir, const char *layout);

PARITY_API void parity_model_free(parity_model *model);
/* The model's config: valid until the model is freed (weight updates do not change it). */
PARITY_API const parity_config *parity_model_config(const parity_model *model);

/* What a model's weights take in memory, and what one forward step under a policy reads of
 * them (parity_model_bytes). The quantized codes and scales are counted as the model holds
 * them (E4M3 codes one a byte, E2M1 two a byte, ternary four a byte, a row's codes in groups
 * of 64 in 16 bytes; NVFP4's and MXFP4's block scales a byte each, the others' as fp32
 * values), so the figures follow the library's layout rather
 * than a format's nominal bits. A model loaded from a quantized
 * checkpoint holds its linear weights' shipped codes and scales alone until a reader asks
 * for their values (parity_model_load): `held` counts the values from then on, 6 bytes a
 * parameter (the fp32 master and its bf16 cast), and `held_for_policy` counts them for the
 * policies that read them (not for a bf16-compute policy of the checkpoint's format). */
typedef struct parity_weight_bytes {
    uint32_t size;            /* sizeof(parity_weight_bytes): set it before the call */
    uint64_t held;            /* every weight buffer the model holds now, mapped from its
                                 checkpoint or owned: the values as loaded (bf16, fp32
                                 masters), the codes and scales a checkpoint shipped, and
                                 the copies built so far (the shipped codes' values, fp32
                                 and fp16 values, each quantizer's codes and scales); a
                                 tied head once */
    uint64_t held_for_policy; /* of held, what serving `policy` on `backend` alone keeps:
                                 the values as loaded, the shipped codes and scales, the fp32
                                 norms and biases, and the copies this policy and backend
                                 read that are built (a scorer or sampler of it builds them;
                                 the shipped codes' values unless it reads the codes alone);
                                 the copies built for other policies are left out */
    uint64_t step_linear;     /* the decoder layers' linear weights, each read once: their
                                 codes and scales under a quantized gemm (whether built yet
                                 or not), else their values (bf16, or fp32 where the policy
                                 or backend multiplies fp32 weights). A mixture of experts:
                                 what a step of one sequence reads, the attention, each
                                 sparse layer's router, num_experts_per_tok of its experts
                                 (of one token: a batch's tokens may pick more) and the
                                 shared expert with its one-row gate (router and gate
                                 values, never quantized) */
    uint64_t step_head;       /* the lm_head, as the policy reads it (a tied head too) */
    uint64_t step_vectors;    /* the norm weights and biases (held in fp32), each once */
    uint64_t embedding_row;   /* one token's embedding row: a step reads one per sequence */
    uint64_t kv_position;     /* one position's keys and values over every layer (and loop)
                                 in the policy's cells: a decode step of a sequence at
                                 context c reads c of them */
} parity_weight_bytes;

/* Fills *out (out->size set by the caller) for `policy` on `backend`. A looped model runs
 * its layers several times a step: the step_ fields count each weight once all the same.
 * PARITY_ERR_INVALID_ARGUMENT for a NULL argument or a wrong out->size, a policy's status
 * (parity_policy_validate) for an invalid one, PARITY_ERR_INVALID_ARGUMENT for an unknown
 * backend; *out is left untouched then. Safe to call while other threads use the model;
 * PARITY_ERR_BUSY during a weight update. */
PARITY_API int parity_model_bytes(const parity_model *model, const parity_policy *policy,
                                  uint32_t backend, parity_weight_bytes *out);

/* ---- The config: architectures and hyper-parameters ------------------------------------- */

typedef enum parity_rope_type {
    PARITY_ROPE_DEFAULT = 0,
    PARITY_ROPE_LINEAR = 1,
    PARITY_ROPE_LLAMA3 = 2,
    PARITY_ROPE_YARN = 3,
} parity_rope_type;

typedef enum parity_arch {
    PARITY_ARCH_QWEN2 = 0,   /* Qwen2 / Qwen2.5: q/k/v bias, no q/k-norm */
    PARITY_ARCH_QWEN3 = 1,   /* Qwen3: q_norm/k_norm before RoPE, no bias */
    PARITY_ARCH_LLAMA = 2,   /* Llama 3.x: no bias, no q/k-norm */
    PARITY_ARCH_OURO = 3,    /* Ouro (ByteDance): a looped Qwen2-style stack without biases,
                                run total_ut_steps times, four RMSNorms a layer (the attention
                                and MLP outputs normed before each residual add), the final
                                norm after every loop, an exit gate on each loop's output */
    PARITY_ARCH_QWEN3_MOE = 4, /* Qwen3-MoE (Qwen3-30B-A3B): Qwen3's attention, and in each sparse
                                layer a router and num_experts SwiGLU experts of which each
                                token runs num_experts_per_tok */
    PARITY_ARCH_QWEN2_MOE = 5, /* Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention
                                (q/k/v bias), routed experts as Qwen3-MoE's plus a shared expert
                                every token runs, weighted by a sigmoid gate */
} parity_arch;

/* An architecture's name, its config.json model_type ("qwen2", "qwen3", "llama", "ouro",
 * "qwen3_moe", "qwen2_moe");
 * NULL for a value that is not an architecture. */
PARITY_API const char *parity_arch_name(int arch);
/* The architecture of a model_type; PARITY_ERR_INVALID_ARGUMENT for another name. */
PARITY_API int parity_arch_from_name(const char *name, parity_arch *out);

/* The blueprint of a model: what config.json says. */
struct parity_config {
    uint32_t size;                 /* sizeof(parity_config) */
    uint32_t arch;                 /* parity_arch */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size;
    uint32_t num_hidden_layers;
    uint32_t num_attention_heads;
    uint32_t num_key_value_heads;
    uint32_t head_dim;
    uint32_t max_position_embeddings;  /* the context length */
    uint32_t tie_word_embeddings;      /* lm_head shares embed_tokens */
    uint32_t attention_bias;           /* q/k/v projections have a bias (Qwen2) */
    uint32_t qk_norm;                  /* q_norm/k_norm present (Qwen3) */
    float rms_norm_eps;
    double rope_theta;
    uint32_t rope_type;                /* parity_rope_type */
    float rope_factor;                 /* linear, llama3, yarn */
    float rope_low_freq_factor;        /* llama3 */
    float rope_high_freq_factor;       /* llama3 */
    uint32_t rope_original_max_position_embeddings;  /* llama3, yarn */
    float rope_beta_fast;              /* yarn (default 32) */
    float rope_beta_slow;              /* yarn (default 1) */
    float rope_attention_factor;       /* yarn; 0 = derived from factor as transformers does */
    float rope_mscale;                 /* yarn; 0 = absent */
    float rope_mscale_all_dim;         /* yarn; 0 = absent */
    uint32_t rope_truncate;            /* yarn (default 1) */
    /* Looped models (PARITY_ARCH_OURO; 1, 0 and 0 for every other architecture): */
    uint32_t total_ut_steps;           /* loops T: the layer stack runs T times per token,
                                          K/V kept per (loop, layer) (T x num_hidden_layers
                                          planes); 0 is read as 1 */
    uint32_t early_exit_gate;          /* model.early_exit_gate (Linear(hidden, 1) with bias)
                                          is present; 0: a fixed-loop model (config.json
                                          "use_early_exit_gate": false), every token T loops */
    float early_exit_threshold;        /* config.json's early_exit_threshold (HF's default
                                          exit rule; 1 when absent): recorded, not applied */
    /* Mixture of experts (PARITY_ARCH_QWEN3_MOE, _QWEN2_MOE; all 0 for the other architectures).
     * Layer i is sparse (a router and experts instead of the dense MLP) when
     * (i + 1) % decoder_sparse_step == 0 and bit i of mlp_only_layers is clear, as
     * transformers' and vLLM's Qwen2-MoE / Qwen3-MoE decoder layers decide; a dense layer
     * keeps the MLP of intermediate_size. */
    uint32_t num_experts;              /* routed experts per sparse layer, 1..4096 */
    uint32_t num_experts_per_tok;      /* experts each token runs per sparse layer, 1..min(64, E) */
    uint32_t moe_intermediate_size;    /* each routed expert's intermediate width */
    uint32_t shared_expert_intermediate_size; /* Qwen2-MoE's shared expert (0 for Qwen3-MoE) */
    uint32_t norm_topk_prob;           /* the chosen experts' weights renormalised to sum to 1
                                          (config.json's norm_topk_prob; false when absent, as
                                          transformers' configs default) */
    uint32_t decoder_sparse_step;      /* see above; 1 when absent */
    uint64_t mlp_only_layers[16];      /* bit i % 64 of word i / 64: layer i keeps a dense MLP
                                          (config.json's mlp_only_layers list) */
};

/* Named built-in configs with real hyper-parameters: "tiny", "qwen3-0.6b",
 * "qwen2.5-0.5b", "llama3.2-1b", "ouro-1.4b", "ouro-2.6b" (ByteDance/Ouro-1.4B, -2.6B), and
 * the small looped shapes "ouro-tiny" (4 loops, exit gate) and "ouro-tiny-fixed" (3 loops,
 * no gate); mixture of experts: "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "qwen2-57b-a14b" and the
 * small "qwen3-moe-tiny" (8 experts, 2 a token, layer 1 dense) and "qwen2-moe-tiny" (8 experts,
 * 4 a token, a shared expert). */
PARITY_API int parity_config_builtin(const char *name, parity_config *out);
/* Names of the built-in configs, NULL-terminated. */
PARITY_API const char *const *parity_config_builtin_names(void);
/* Reads and validates a Hugging Face config.json. */
PARITY_API int parity_config_load(const char *path, parity_config *out);

/* ---------------------------------------------------------------------------------------- */
/* Scorer: the learner entry point                                                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct parity_scorer parity_scorer;

typedef enum parity_backend {
    /* The library's own GEMM on bf16 weights (fp32 weights under PARITY_COMPUTE_FP32): fp32
     * accumulation in one fixed order per output element, whatever M, tile or thread. */
    PARITY_BACKEND_BF16 = 0,
    /* OpenBLAS cblas_sgemm on the weights widened to fp32, one row per call (M = 1): on CPUs
     * where OpenBLAS's sgemm is not invariant across M (measured on Zen: see
     * bench/openblas-invariance), one-row calls are what keeps rows bitwise equal.
     * OpenBLAS's own thread count is left as the host set it. */
    PARITY_BACKEND_OPENBLAS = 1,
    /* AMX-BF16 tiles (tdpbf16ps) for the GEMMs of bf16 weights and bf16 activations, on CPUs
     * that have them (Intel Xeon 4th generation and later; the OS must grant the tile state:
     * arch_prctl(ARCH_REQ_XCOMP_PERM), asked once; creation fails with PARITY_ERR_UNSUPPORTED
     * where either is missing). K in tiles of 32 from k = 0, zero-padded, each output element
     * accumulated in fp32 by one tile op per K tile in the tile unit's own order, denormal
     * inputs read as zero. Every element depends only on its own row and column, so the
     * parity contract holds within the backend (batch, position, chunking, forks, threads),
     * on one CPU model. Its results differ from the bf16 backend's, as the openblas
     * backend's do: sampler and learner must both run it, and a learner on a CPU without
     * AMX cannot reproduce it. Only bf16 x bf16 products go to the tiles: a GEMM input row
     * holding a value that is not bf16 (the fp32 attention output of PARITY_ATTN_FP32), the
     * GEMMs of compute fp32 and fp16, and the fp8 gemm's blocks are the bf16 backend's, bit
     * for bit (the lm_head of an fp8 policy is the tiles'). */
    PARITY_BACKEND_AMX = 2,
} parity_backend;

/* A backend's name ("bf16", "openblas", "amx"); NULL for a value that is not a backend. */
PARITY_API const char *parity_backend_name(int backend);
/* The backend of a name; PARITY_ERR_INVALID_ARGUMENT for another name. */
PARITY_API int parity_backend_from_name(const char *name, parity_backend *out);
/* PARITY_OK when this build, CPU and OS run the backend (bf16 always; openblas unless the
 * library was built without OpenBLAS, meson -Dopenblas=disabled; amx where the CPU has
 * AMX-BF16 and the OS grants the tile state), else PARITY_ERR_UNSUPPORTED with
 * the reason in parity_last_error(); PARITY_ERR_INVALID_ARGUMENT for a value that is not a
 * backend. */
PARITY_API int parity_backend_check(int backend);

typedef struct parity_scorer_params {
    uint32_t size;              /* sizeof(parity_scorer_params) */
    uint32_t n_threads;         /* threads of the scorer's pool, including the caller; 0 = 1 */
    uint32_t backend;           /* parity_backend */
    uint32_t max_tokens;        /* capacity: the longest sequence, and the most tokens of one
                                   group of sequences scored together; 0 = min(context, 8192) */
    uint32_t chunk_rows;        /* rows per forward chunk (bounds scratch memory); 0 = 256 */
    parity_policy policy;
    uint64_t max_memory;        /* ceiling on the bytes the scorer allocates (KV cache,
                                   scratch, tables: parity_scorer_bytes); creation fails up
                                   front with PARITY_ERR_MEMORY_LIMIT beyond it. 0 = none */
} parity_scorer_params;

PARITY_API void parity_scorer_default_params(parity_scorer_params *params);
PARITY_API int parity_scorer_create(const parity_model *model, const parity_scorer_params *params,
                                    parity_scorer **out);
PARITY_API void parity_scorer_free(parity_scorer *scorer);
/* The bytes parity_scorer_create(model, params) would allocate (the scorer's KV cache,
 * scratch, tables, thread pool and the object itself; what max_memory is compared with),
 * without creating it. The model's own memory is not included: the fp32 copy of the
 * weights that the openblas backend and the fp32 policy read is the model's (see
 * parity_model_load). Fails as parity_scorer_create would on bad params. */
PARITY_API int parity_scorer_bytes(const parity_model *model, const parity_scorer_params *params,
                                   uint64_t *bytes);

typedef enum parity_logprob_mode {
    PARITY_LOGPROB_RAW = 0,        /* log_softmax of the logits */
    PARITY_LOGPROB_PROCESSED = 1,  /* log_softmax of logits / temperature (temperature 0, i.e.
                                      greedy, counts as 1) */
    PARITY_LOGPROB_PROCESSED_TRUNCATED = 2,
                                   /* as PROCESSED, renormalised over the support the sampler
                                      draws from after top-k, top-p and min-p (the support of
                                      greedy is the arg max alone); -inf outside it. With no
                                      truncation switched on it equals PROCESSED. */
} parity_logprob_mode;

/* A mode's name ("raw", "processed", "processed-truncated": vLLM's --logprobs-mode words
 * without the "-logprobs"); NULL for a value that is not a mode. */
PARITY_API const char *parity_logprob_mode_name(int mode);
/* The mode of a name; PARITY_ERR_INVALID_ARGUMENT for another name. */
PARITY_API int parity_logprob_mode_from_name(const char *name, parity_logprob_mode *out);

typedef struct parity_score_options {
    uint32_t size;              /* sizeof(parity_score_options) */
    uint32_t mode;              /* parity_logprob_mode */
    float temperature;          /* >= 0; PROCESSED modes divide the logits by it (0 = greedy) */
    uint32_t top_k;             /* PROCESSED_TRUNCATED: as the sampler's (0 = off) */
    float top_p;                /* PROCESSED_TRUNCATED: in (0, 1] (1 = off) */
    float min_p;                /* PROCESSED_TRUNCATED: in [0, 1) (0 = off) */
    uint32_t top_n;             /* alternatives to report per position (0 = none) */
    /* Looped models (see parity_loop_kv): the depth schedule to replay. depths[j], indexed
     * like tokens, is the loops position j runs, 1..total_ut_steps: what
     * parity_sampler_depths returns for a sampled sequence (prompt positions at full depth,
     * then each generated token's input at the depth its step exited; the last position's
     * value is not used). NULL: every position runs every loop (the dense learner). */
    const uint32_t *depths;
    uint32_t loop_kv;           /* parity_loop_kv the schedule was sampled with */
    /* Or, with depths NULL, the depths re-derived by an exit rule, as parity_sampling's
     * (PARITY_EXIT_FULL, 0, is the dense learner): every position past prompt_len - 1 runs
     * until the rule fires on the gate's exit distribution under this scorer's policy (the
     * prompt's positions run every loop, as the sampler's do). A learner that re-thresholds
     * instead of replaying; with the sampler's policy it computes the sampler's depths. */
    uint32_t exit_rule;
    float exit_threshold;
    uint32_t min_depth, max_depth;
    uint32_t prompt_len;        /* under an exit rule: positions 0 .. prompt_len - 1 run every
                                   loop (the sampler's prompt, its last token included), the
                                   same for every sequence of the call */
    /* Looped models, the dense learner (depths NULL, exit_rule PARITY_EXIT_FULL): the loop
     * output that logprobs, entropy and the top-n read (parity_loop_readout), and optionally
     * every loop's log-prob besides. */
    uint32_t readout;           /* parity_loop_readout (0 = PARITY_READOUT_EXIT) */
    uint32_t readout_loop;      /* PARITY_READOUT_LOOP: the loop read, 1..total_ut_steps */
    float *loop_logprobs;       /* NULL, or total_ut_steps values per scored position (loop 1
                                   first), indexed like logprobs times total_ut_steps: the
                                   log-prob of the token in each loop's distribution (as the
                                   mode defines it), for learners that weight per-loop
                                   log-probs; entry total_ut_steps - 1 equals logprobs' under
                                   PARITY_READOUT_EXIT */
    /* Mixture-of-experts models (routing replay): NULL, or the experts each position runs in
     * each sparse layer, indexed like tokens times S = sparse layers x num_experts_per_tok
     * (routes[j * S + l * k + slot], l counting the sparse layers in layer order): what
     * parity_sampler_routes returns for a sampled sequence. Position j's k experts (distinct,
     * < num_experts) replace the router's top-k; their weights are still computed from this
     * scorer's router logits under its policy (as the frameworks' routing replay does), so
     * replay under the sampler's policy returns the sampler's log-probs bit for bit. The last
     * position of each sequence is not read (its logits are not scored). NULL: every position
     * routes itself (recomputation, the default). */
    const uint16_t *routes;
    /* NULL, or an output indexed as `routes`: the experts each position ran (replayed or
     * routed), the last position of each sequence included */
    uint16_t *routes_out;
} parity_score_options;

/* What a looped model's scorer reads out of a position's loops. */
typedef enum parity_loop_readout {
    PARITY_READOUT_EXIT = 0,     /* the output of the position's exit loop: its replayed or
                                    re-derived depth, or the last loop (the dense learner) */
    PARITY_READOUT_LOOP = 1,     /* dense: the output of loop readout_loop (HF's exit_at_step,
                                    which counts from 0) */
    PARITY_READOUT_EXPECTED_LOGITS = 2,
                                 /* dense: HF's expected logits (the labels and
                                    use_weighted_exit path), sum over loops t of
                                    p_t * logits_t, p the exit distribution (policy exit_dist),
                                    each product and partial sum rounded where the logits are
                                    (policy logits); needs an exit gate */
} parity_loop_readout;

PARITY_API void parity_score_default_options(parity_score_options *options);

/*
 * Scores n_seqs token sequences, concatenated in `tokens` with lengths `lengths[i]` >= 1.
 * For sequence i, writes log p(x_t | x_<t) for t = 1 .. len_i - 1 to `logprobs`,
 * sequences one after another (sum of (len_i - 1) values). Optional outputs (NULL to skip),
 * indexed like `logprobs`: `entropy` (nats, of the distribution the mode defines) and the
 * top_n most likely tokens per position (`top_ids`, `top_logprobs`, top_n per position,
 * best first, ties to the lower id; id -1 and log-prob -inf past the support of a truncated
 * distribution).
 *
 * The parity contract: each value is a pure function of the model, policy, backend, mode and
 * that sequence's tokens 0..t — not of n_threads, of which sequences share the call or of
 * their order, of chunk_rows, or of the CPU path.
 */
PARITY_API int parity_score(parity_scorer *scorer, const parity_score_options *options,
                            const int32_t *tokens, const uint32_t *lengths, size_t n_seqs,
                            float *logprobs, float *entropy, int32_t *top_ids,
                            float *top_logprobs);

/* A profile of the scorer's parity_score calls (see parity_profile, below the sampler). */
typedef struct parity_profile parity_profile;
PARITY_API int parity_scorer_set_profiling(parity_scorer *scorer, int on);
PARITY_API int parity_scorer_profile(const parity_scorer *scorer, parity_profile *profile);

/* ---------------------------------------------------------------------------------------- */
/* Sampler: KV-cached batched generation                                                    */
/* ---------------------------------------------------------------------------------------- */
/*
 * A sampler owns a KV cache shared by many sequences, in blocks of 16 positions. A sequence
 * is added from a prompt (prefilled in chunks), forked (the child shares the parent's cache
 * blocks, copied on write), stepped (one decode step advances any set of live sequences
 * together, in batches: members may join and leave between steps) and released.
 *
 * The parity contract: the log-prob a step reports for a token equals bitwise what
 * parity_score() returns for the same tokens with the same model, policy, backend, mode and
 * sampling parameters; and the tokens drawn depend only on (model, policy, backend, prompt,
 * sampling parameters, seed, stream), never on the batch, its order, the prefill chunking,
 * forking, the thread count or the CPU path.
 */

typedef struct parity_sampler parity_sampler;

#define PARITY_MAX_STOP 16

/* How a sequence draws its tokens. */
typedef struct parity_sampling {
    uint32_t size;               /* sizeof(parity_sampling) */
    float temperature;           /* 0 = greedy (arg max, ties to the lower id) */
    uint32_t top_k;              /* keep the k most likely tokens; 0 = off */
    float top_p;                 /* keep the smallest most-likely set of mass >= top_p; 1 = off */
    float min_p;                 /* keep tokens with p >= min_p * p_max; 0 = off */
    uint64_t seed;               /* with the stream id and the position, keys the randomness */
    uint32_t max_new_tokens;     /* finish after this many tokens; 0 = only stop or capacity */
    uint32_t n_stop;             /* stop tokens: finish after drawing one of them */
    int32_t stop[PARITY_MAX_STOP];
    uint32_t logprob_mode;       /* parity_logprob_mode of the reported log-probs */
    uint32_t top_n;              /* alternatives reported per step (0 = none) */
    /* Looped models (arch ouro): how many loops each decode step runs (the prompt runs them
     * all). The loops a step ran are the sequence's depth at that position
     * (parity_sampler_depths), which the scorer replays. */
    uint32_t exit_rule;          /* parity_exit_rule (0 = PARITY_EXIT_FULL) */
    float exit_threshold;        /* PARITY_EXIT_THRESHOLD: exit after the first loop whose exit
                                    CDF (policy->exit_dist) is >= this, in [0, 1] */
    uint32_t min_depth;          /* PARITY_EXIT_THRESHOLD: loops run at least (0 = 1) */
    uint32_t max_depth;          /* PARITY_EXIT_THRESHOLD: loops run at most; PARITY_EXIT_FIXED:
                                    the loops every step runs (0 = total_ut_steps) */
} parity_sampling;

/* How a looped model's decode step chooses its depth. */
typedef enum parity_exit_rule {
    PARITY_EXIT_FULL = 0,        /* every loop (vLLM upstream: the gate is never read) */
    PARITY_EXIT_THRESHOLD = 1,   /* the exit gate's CDF against exit_threshold, within
                                    [min_depth, max_depth] (HF's exit_threshold path, vllm-rlt's
                                    "ouro" mode); needs the gate */
    PARITY_EXIT_FIXED = 2,       /* max_depth loops */
} parity_exit_rule;

/* What a looped model's token leaves in the KV planes of the loops after its exit depth. */
typedef enum parity_loop_kv {
    PARITY_LOOP_KV_LAST_EXITED = 0,  /* the exit loop's K/V copied into every deeper plane
                                        (vllm-rlt's LAST_EXITED); the deeper loops are not
                                        run: early exit saves their compute */
    PARITY_LOOP_KV_FULL = 1,         /* every loop run and its K/V kept, as dense engines do;
                                        the logits read the exit loop's output */
} parity_loop_kv;

PARITY_API void parity_sampling_default(parity_sampling *sampling);

typedef struct parity_sampler_params {
    uint32_t size;               /* sizeof(parity_sampler_params) */
    uint32_t n_threads;          /* threads of the sampler's pool, including the caller; 0 = 1 */
    uint32_t backend;            /* parity_backend */
    uint32_t max_seqs;           /* live sequences at once; 0 = 64 */
    uint32_t max_len;            /* positions of one sequence (prompt + generated);
                                    0 = min(context, 4096) */
    uint32_t cache_tokens;       /* KV positions shared by all sequences; 0 = room for max_seqs
                                    sequences of max_len that share nothing */
    uint32_t prefill_chunk;      /* rows per prefill forward; 0 = 256 */
    uint32_t max_batch;          /* rows per decode forward; 0 = 64 */
    parity_policy policy;
    /* EXPERIMENT ONLY: kernel-order experiments, for the mismatch benchmarks (engines sum in
     * other orders than a learner does). Both switch the sampler's decode steps to that order
     * and so break the parity contract on purpose; leave them 0 (off, the default). */
    uint32_t split_k;            /* GEMMs sum K in this many chunks (each a multiple of 32
                                    elements, in the backend's order), then add the partial
                                    sums in chunk order, as split-K GEMMs do */
    uint32_t split_kv;           /* flash attention over segments of this many positions, each
                                    with its own max and sum, merged in order (split-KV /
                                    flash-decoding); eager and fp32 attention ignore it */
    uint64_t max_memory;         /* ceiling on the bytes the sampler allocates (KV cache,
                                    scratch, tables: parity_sampler_bytes); creation fails up
                                    front with PARITY_ERR_MEMORY_LIMIT beyond it. 0 = none */
    uint32_t loop_kv;            /* parity_loop_kv (looped models) */
    uint32_t prefault;           /* 1: every page of the KV cache and of the sampler's
                                    other buffers is written at creation, so that no step
                                    takes a first-touch page fault when its sequences reach
                                    new cache blocks (as a server wants; the memory is
                                    committed at once: size cache_tokens first). 0 (the
                                    default): pages are touched as the sequences grow */
    uint32_t record_routes;      /* mixture-of-experts models: 1 keeps, for every sequence,
                                    the experts each of its positions ran in each sparse layer
                                    (parity_sampler_routes), for a learner to replay; 2 bytes
                                    per position, sparse layer and expert a token
                                    (max_seqs x max_len of them, counted in the sampler's
                                    bytes). 0 (the default): not kept */
} parity_sampler_params;

PARITY_API void parity_sampler_default_params(parity_sampler_params *params);
PARITY_API int parity_sampler_create(const parity_model *model,
                                     const parity_sampler_params *params, parity_sampler **out);
PARITY_API void parity_sampler_free(parity_sampler *sampler);
/* The bytes parity_sampler_create(model, params) would allocate, as parity_scorer_bytes. */
PARITY_API int parity_sampler_bytes(const parity_model *model, const parity_sampler_params *params,
                                    uint64_t *bytes);

/* Positions per KV cache block (16): a sequence's cache grows, and a fork's copy-on-write
 * happens, a block at a time. */
PARITY_API uint32_t parity_kv_block_tokens(void);

/* The cache_tokens a sampler needs so that n_groups groups of sequences can all run to
 * max_new_tokens at once, however they are stepped: group g adds a prompt of prompt_lens[g]
 * tokens once and forks it so that completions[g] sequences (the added one included;
 * completions NULL = 1 each) each generate up to max_new_tokens tokens. The forks share the
 * prompt's full blocks, and each gets its own copy of a partly filled one when it writes
 * there (the step's check counts one more block for a group whose sequences still share
 * such a block, and that is included). Sequences that stop early only leave room. */
PARITY_API int parity_sampler_cache_tokens(size_t n_groups, const uint32_t *prompt_lens,
                                           const uint32_t *completions, uint32_t max_new_tokens,
                                           uint64_t *cache_tokens);

/* Adds a sequence: prefills prompt[0 .. len-1) into the cache (the last prompt token is fed by
 * the first step). `stream` identifies the sequence's randomness (e.g. the completion's index
 * within its group): draws are keyed by (sampling->seed, stream, position). */
PARITY_API int parity_sampler_add(parity_sampler *sampler, const int32_t *prompt, uint32_t len,
                                  const parity_sampling *sampling, uint64_t stream,
                                  uint32_t *seq);

/* Adds n sequences at once: the same sequences, ids and bits as n parity_sampler_add calls in
 * order (prompt i of lens[i] tokens, with sampling[i] and streams[i], becomes seqs[i]), but the
 * prompts are prefilled together, up to prefill_chunk rows per forward, so that many short
 * prompts cost a few forwards instead of one each. All or nothing: every prompt is checked,
 * and the slots and cache blocks of all of them must be free, before anything changes; the
 * error names the first prompt that fails (PARITY_ERR_EMPTY_INPUT for n = 0). */
PARITY_API int parity_sampler_add_batch(parity_sampler *sampler, size_t n,
                                        const int32_t *const *prompts, const uint32_t *lens,
                                        const parity_sampling *sampling, const uint64_t *streams,
                                        uint32_t *seqs);

/* Forks a live sequence: the child has the parent's tokens and shares its cache blocks (the
 * n completions of a GRPO group prefill their prompt once). The child gets its own stream
 * and sampling parameters. */
PARITY_API int parity_sampler_fork(parity_sampler *sampler, uint32_t parent,
                                   const parity_sampling *sampling, uint64_t stream,
                                   uint32_t *child);

/* Releases a sequence and its cache blocks (blocks shared with other sequences stay). */
PARITY_API int parity_sampler_release(parity_sampler *sampler, uint32_t seq);

/* Why a sequence finished. */
typedef enum parity_finish {
    PARITY_RUNNING = 0,
    PARITY_FINISHED_STOP = 1,        /* drew a stop token (included in its tokens) */
    PARITY_FINISHED_LENGTH = 2,      /* max_new_tokens reached */
    PARITY_FINISHED_CAPACITY = 3,    /* max_len reached */
} parity_finish;

/* One decode step for n live, unfinished sequences: draws one token each. Outputs, indexed
 * like seqs: the token, its log-prob under the sequence's logprob_mode, its finish state,
 * and (if the sequence asked for top_n and the arrays are given) top_n alternatives at
 * top_ids/top_logprobs + i * max_top_n. Fails with PARITY_ERR_CACHE_FULL, before changing
 * anything, if the cache cannot hold the new positions. */
PARITY_API int parity_sampler_step(parity_sampler *sampler, const uint32_t *seqs, size_t n,
                                   int32_t *tokens, float *logprobs, uint32_t *finished,
                                   uint32_t max_top_n, int32_t *top_ids, float *top_logprobs);

/* A sequence's state. */
typedef struct parity_seq_info {
    uint32_t size;               /* sizeof(parity_seq_info): set it before the call */
    uint32_t len;                /* tokens so far, prompt included */
    uint32_t prompt_len;         /* where its completion starts (a fork's: at the fork) */
    uint32_t finished;           /* parity_finish */
    uint64_t stream;
    uint64_t model_version;      /* the weights its KV cache and results were computed under */
} parity_seq_info;

PARITY_API int parity_sampler_seq_info(const parity_sampler *sampler, uint32_t seq,
                                       parity_seq_info *info);

/* The tokens of a sequence so far (prompt then generated): valid until the next call that
 * changes the sampler. */
PARITY_API int parity_sampler_tokens(const parity_sampler *sampler, uint32_t seq,
                                     const int32_t **tokens, uint32_t *len, uint32_t *prompt_len);

/* A looped model's depth schedule of a sequence: depths[j] = the loops position j ran, for
 * j < *n = len - 1 (the positions in the cache; prompt positions ran every loop), valid until
 * the next call that changes the sampler. Pass it, with the sampler's loop_kv, as
 * parity_score_options.depths (any value for the last position) to replay it. A model that
 * does not loop gives 1 for every position. */
PARITY_API int parity_sampler_depths(const parity_sampler *sampler, uint32_t seq,
                                     const uint32_t **depths, uint32_t *n);

/* A mixture-of-experts model's routing record of a sequence (the sampler made with
 * record_routes): routes[j * S + l * k + slot] = the expert in slot `slot` (descending weight,
 * ties to the lower index) of position j in sparse layer l, for j < *n = len - 1 (the
 * positions the sampler has run), S = sparse layers x num_experts_per_tok (*stride), valid
 * until the next call that changes the sampler. Pass it as parity_score_options.routes (any
 * values for the last position) to replay it. PARITY_ERR_INVALID_ARGUMENT for a sampler
 * without record_routes or a model without experts. */
PARITY_API int parity_sampler_routes(const parity_sampler *sampler, uint32_t seq,
                                     const uint16_t **routes, uint32_t *n, uint32_t *stride);

/* ---- Where the time goes ---------------------------------------------------------------- */

/* The parts of a forward and a step that a profile times (wall clock of the calling thread,
 * each part's parallel loops included from their dispatch to their last worker's end). */
typedef enum parity_phase {
    PARITY_PHASE_EMBED = 0,      /* the token embedding gather */
    PARITY_PHASE_GEMM = 1,       /* the decoder layers' projections (q, k, v, o, gate, up,
                                    down) with their bias and the rounding of their outputs
                                    (bf16 or fp16), which the GEMMs' tasks do */
    PARITY_PHASE_ROUNDING = 2,   /* kept for the ABI: no time is counted here since those
                                    roundings moved into the GEMMs (reads 0) */
    PARITY_PHASE_REGIONS = 3,    /* the RMSNorms (residual adds included), q/k-norms, RoPE,
                                    SwiGLU */
    PARITY_PHASE_ATTENTION = 4,  /* K/V into the cache, and attention */
    PARITY_PHASE_HEAD = 5,       /* the final norm, the lm_head GEMM and the logits' rounding */
    PARITY_PHASE_SAMPLING = 6,   /* log-softmax, temperature, top-k / top-p / min-p, the
                                    draw, log-probs and top-n (sampler); the log-probs of the
                                    scored tokens (scorer) */
    PARITY_PHASE_COUNT = 7
} parity_phase;

/* The name of a phase ("embed", "gemm", "rounding", "regions", "attention", "head",
 * "sampling"), or NULL. */
PARITY_API const char *parity_phase_name(uint32_t phase);

/* What an object's calls spent since profiling was switched on. */
typedef struct parity_profile {
    uint32_t size;               /* sizeof(parity_profile): set it before the call */
    uint32_t enabled;            /* profiling is on */
    uint64_t calls;              /* calls of parity_sampler_add, _add_batch and _step, or of
                                    parity_score (a refused one included: its time counts) */
    uint64_t forwards;           /* forwards run by them (a call runs one or more) */
    uint64_t rows;               /* rows (tokens) those forwards ran */
    double call_seconds;         /* wall time inside the calls */
    double phase_seconds[PARITY_PHASE_COUNT];
    /* The thread pool's share, across all phases: per parallel loop, its wall time less its
     * slowest worker's time in the loop's own work (the wake-up, the hand-out and the join),
     * summed; and the number of loops. */
    double dispatch_seconds;
    uint64_t loops;
} parity_profile;

/* Switches an object's profiling on (nonzero) or off, and zeroes its counters either way.
 * Off is the default: no clock is read then. On costs a few clock readings per layer. The
 * profile changes no result. */
PARITY_API int parity_sampler_set_profiling(parity_sampler *sampler, int on);
PARITY_API int parity_sampler_profile(const parity_sampler *sampler, parity_profile *profile);

/* ---------------------------------------------------------------------------------------- */
/* Weight updates and sync checks (an RL step pushes new weights to the sampler)            */
/* ---------------------------------------------------------------------------------------- */

typedef enum parity_dtype {
    PARITY_DTYPE_BF16 = 0,
    PARITY_DTYPE_F16 = 1,
    PARITY_DTYPE_F32 = 2,        /* fp32 masters: cast to bf16 with the learner's RNE */
    PARITY_DTYPE_F8_E4M3 = 3,    /* block-FP8 codes of a decoder linear weight ("...weight"),
                                    shipped with its "...weight_scale_inv" (F32 or BF16) in
                                    the same update, as a block-FP8 checkpoint holds them */
} parity_dtype;

/* A tensor's new values, by its checkpoint name. Data is row-major, little-endian. */
typedef struct parity_tensor_data {
    const char *name;            /* e.g. "model.layers.0.mlp.up_proj.weight" */
    uint32_t dtype;              /* parity_dtype */
    uint32_t ndim;               /* 1 or 2, as in the checkpoint */
    uint64_t shape[2];
    const void *data;
} parity_tensor_data;

/*
 * Replaces the values of n tensors in place. All or nothing: every tensor is checked first
 * (a known name, its shape, its dtype, finite values after the cast). F32 data is cast to
 * bf16 with round-to-nearest-even — the cast a learner makes — and kept as the fp32 master
 * for the fp32 policy. Each successful call bumps the model's version. Memory: the new values
 * are written into the buffers the model already holds where it owns them (a cast or copy
 * made at loading, a synthetic model's, or an earlier update's), after every tensor passed
 * its checks and while no call runs; a tensor still read from a mapped checkpoint gets a new
 * bf16 buffer (2 bytes a value; the mapping is never written), and F16/F32 data for a tensor
 * without a master of the model's own a new master (4 bytes a value), which later F16/F32
 * updates write in place (BF16 data drops it). Every new buffer is allocated before anything
 * changes: out of memory, like any other failure, leaves the model as it was.
 *
 * No other call may use the model while it runs: the call is refused with PARITY_ERR_BUSY if
 * a scorer or sampler of this model is inside a call (and such calls are refused while an
 * update runs). Scorers and samplers created before the update stay valid; a sampler
 * refuses to step a sequence whose KV cache was computed under an older version
 * (PARITY_ERR_STALE): release it and add it again.
 */
PARITY_API int parity_model_update(parity_model *model, const parity_tensor_data *tensors,
                                   size_t n);
/* A thread pool (parity_ops.h: parity_pool_create). */
typedef struct parity_pool parity_pool;
/* parity_model_update with the values' checks and casts run on `pool`'s threads, a tensor a
 * task (NULL: the calling thread alone; PARITY_ERR_BUSY if another call is using the pool):
 * the same weights, and the same status and message for bad input, on any number of
 * threads. */
PARITY_API int parity_model_update_on(parity_pool *pool, parity_model *model,
                                      const parity_tensor_data *tensors, size_t n);
/* What an update does with F16/F32 data's exact values (parity_model_update_with). */
typedef enum parity_masters {
    /* Kept as the weight's fp32 master (4 bytes a value beside the bf16 cast) for every
     * reader: parity_model_update's and parity_model_update_on's behaviour. */
    PARITY_MASTERS_KEEP = 0,
    /* Kept only where the weight holds a master already (an F32/F16 checkpoint's, an earlier
     * update's: written in place) or where a copy the model has built reads it: the fp32
     * values of an fp32-compute scorer or sampler, the fp16 values of an fp16 one, the codes
     * of a quantized policy's quantizer (decoder linear weights); elsewhere the weight holds
     * the bf16 cast alone, which is all a bf16-compute, bf16-GEMM policy reads. A learner
     * keeping its own fp32 masters syncs a bf16 sampler so without writing 4 bytes a
     * parameter of new memory. Until an update brings such a weight bf16 values, F16/F32 data
     * with PARITY_MASTERS_KEEP, or codes, every reader of its fp32 masters is refused with
     * PARITY_ERR_NO_MASTERS, naming it, rather than read the bf16 cast in their place:
     * scorers and samplers of fp32-compute, fp16-compute or quantized-GEMM policies (made
     * after the update), parity_model_weight_values, parity_model_weight_codes (when it
     * quantizes), parity_model_save_as in the fp32, fp16 and quantized layouts,
     * parity_model_write_manifest_for under a quantized policy; parity_model_verify_for
     * reports such a weight's codes on a line of its own ("fp32 masters") and compares no
     * codes it would have to quantize from the bf16 cast. parity_weight_info.has_master is 0
     * for it. */
    PARITY_MASTERS_WHERE_READ = 1,
} parity_masters;
/* parity_model_update_on with `masters` (parity_masters) saying which fp32 masters F16/F32
 * data leaves in the model; PARITY_ERR_INVALID_ARGUMENT for another value. BF16 and F8_E4M3
 * updates are the same under both. */
PARITY_API int parity_model_update_with(parity_pool *pool, parity_model *model,
                                        const parity_tensor_data *tensors, size_t n,
                                        uint32_t masters);
/* The model's version: 0 when loaded, +1 per successful parity_model_update. */
PARITY_API uint64_t parity_model_version(const parity_model *model);

/*
 * Sync checks. A manifest lists, for each tensor, its name, shape, dtype ("BF16") and a
 * checksum of its bf16 bytes as the model holds them (the little-endian bf16 values), plus
 * the model's version and the manifest's own format version:
 *   {"version": N, "manifest_version": 2,
 *    "tensors": {"NAME": {"shape": [..], "dtype": "BF16", "fnv1a64": "16 hex digits"}, ...}}
 * The checksums ("fnv1a64" everywhere below) depend on manifest_version:
 *   1 (a manifest without "manifest_version"): FNV-1a 64 over the bytes, in one chain;
 *   2 (what the library writes): the bytes cut into chunks of 65536 bytes (the last one
 *     shorter; none for no bytes), the FNV-1a 64 of each chunk, and the checksum the FNV-1a 64
 *     over those chunk checksums' 8 little-endian bytes each, in order (no bytes: the FNV-1a
 *     offset basis, as in version 1). FNV-1a is one multiply per byte in one chain; chunks
 *     are independent, so the library hashes them four at a time on each of a pool's threads
 *     (parity_model_write_manifest_on, parity_model_verify_on, parity_tensor_checksums): the
 *     same value on any number of threads.
 * The library reads both versions and writes version 2 (or, asked to, version 1).
 * The learner writes one from the weights it sent (python/parity has a writer; so does
 * parity_model_write_manifest). parity_model_verify compares the model against it and
 * reports every difference — a tensor missing on either side, a shape, dtype or checksum
 * that differs (a wrong cast, a skipped tensor, a stale shard, a transposed view, truncation
 * instead of rounding), a version that differs — one per line in `report` (NUL-terminated,
 * truncated to report_size). Returns PARITY_OK when nothing differs, PARITY_ERR_VERIFY with
 * the count in the message otherwise.
 *
 * Quantized weights. A learner that quantizes (a policy with a quantized gemm) lists the
 * decoder linear weights its GEMMs read quantized as (fp8)
 *   "NAME": {"shape": [rows, cols], "dtype": "F8_E4M3", "format": "fp8-block" | "mxfp8",
 *            "block": [128, 128] | [1, 32], "quantizer": "deepseek" (null: shipped codes
 *            whose rule is unknown), "fnv1a64": FNV-1a 64 of the codes' bytes,
 *            "scales": {"shape": [grid rows, grid cols], "dtype": "F32" | "BF16" | "F8_E8M0",
 *                       "fnv1a64": FNV-1a 64 of the scales' fp32 values' bytes}}
 * or, for the 4-bit and ternary formats,
 *   "NAME": {"shape": [rows, cols], "dtype": "E2M1" | "TERNARY", "format": "nvfp4" | "mxfp4" |
 *            "ternary", "block": [1, 16] | [1, 32] | [rows, cols], "quantizer": RULE | null,
 *            "fnv1a64": of the codes one a byte, whatever their packing in memory (E2M1
 *            in the low nibble, ternary as int8),
 *            "scales": {"shape": [rows, ceil(cols / block)] | [1, 1], "dtype": "F8_E4M3" |
 *            "F8_E8M0" | "F32", "fnv1a64": of the block scales' fp32 values (ternary: of
 *            s_w)}, "tensor_scale": NVFP4's s2 as 8 hex digits of its fp32 bits}
 * with a top-level "quantization": {"format": .., "quantizer": ..}; its BF16 entries of linear
 * weights are then layers it keeps in bf16. parity_model_write_manifest_for writes this for a
 * policy (NULL: parity_model_write_manifest). parity_model_verify_for checks the codes that
 * the sampler's policy reads (NULL: the manifest's own format and quantizer, applied to the
 * model's values where it holds no shipped codes), one report line per failure, each naming
 * its check:
 *   "kept in bf16"            the learner ships a layer quantized that the sampler runs in
 *                             bf16 (modules_to_not_convert, a bf16 policy), or the reverse;
 *   "block geometry differs"  format, block or scale grid (padding) not the sampler's;
 *   "scale format"            the scales' storage dtype (BF16 scales where the learner's are
 *                             F32), scales not powers of two where the learner's rule makes
 *                             them (te-pow2, MXFP8), scales not finite and positive;
 *   "quantizer identity"      the sampler quantizes the values with another rule than the
 *                             learner's (e.g. power-of-two scales where the learner's are
 *                             continuous: the re-quantization to UE8M0 that engines make),
 *                             saying whether the learner's rule would give its codes;
 *   "codes differ", "scales differ", "tensor scale differs"  the same rule (or shipped codes)
 *                             but other bytes;
 *   "format differs"          the learner ships codes of another format than the sampler's
 *                             policy reads (fp8 against 4-bit or ternary);
 *   "fp32 masters"            the sampler holds only the bf16 cast of the weight's last fp32
 *                             values (an update with PARITY_MASTERS_WHERE_READ dropped its
 *                             master): no codes are made from the cast or compared;
 *   "version"                 a stale sync, or one applied twice.
 * The log-prob probe (parity_scorer_probe) checks the rest end to end.
 */
PARITY_API int parity_model_write_manifest(const parity_model *model, const char *path);
PARITY_API int parity_model_verify(const parity_model *model, const char *manifest_path,
                                   char *report, size_t report_size);
PARITY_API int parity_model_write_manifest_for(const parity_model *model,
                                               const parity_policy *policy, const char *path);
PARITY_API int parity_model_verify_for(const parity_model *model, const parity_policy *policy,
                                       const char *manifest_path, char *report,
                                       size_t report_size);
/* The manifest format version the library writes (it reads 1 and 2). */
#define PARITY_MANIFEST_VERSION 2
/* parity_model_write_manifest_for (writing a manifest of version `manifest_version`, 1 or 2:
 * PARITY_MANIFEST_VERSION unless an older reader needs 1) and parity_model_verify_for (of
 * either version, as the manifest says) with the checksums computed on `pool`'s threads
 * (NULL: the calling thread alone; PARITY_ERR_BUSY if another call is using the pool): the
 * same file and the same report on any number of threads. */
PARITY_API int parity_model_write_manifest_on(parity_pool *pool, const parity_model *model,
                                              const parity_policy *policy,
                                              uint32_t manifest_version, const char *path);
PARITY_API int parity_model_verify_on(parity_pool *pool, const parity_model *model,
                                      const parity_policy *policy, const char *manifest_path,
                                      char *report, size_t report_size);
/* The checksums a manifest of version `manifest_version` (1 or 2) holds for n tensors held
 * by the caller, into checksums[n], on `pool`'s threads (NULL: the calling thread alone): of
 * each tensor's values as bf16, as the model holds them after parity_model_update (BF16 data
 * as it is, F16 and F32 data rounded to bf16 with the same round-to-nearest-even, NaN ->
 * 0x7fc0), or of F8_E4M3 data's bytes as they are (fp8 codes; and any bytes, such as the
 * little-endian bytes of scales' fp32 values, as shape [n_bytes]). Each tensor is its dtype,
 * ndim (1 or 2), shape and data (read in place, need not be aligned); its name is not read.
 * A learner computes its manifest with it without copying or casting its weights; the
 * values do not depend on the pool's size. PARITY_ERR_INVALID_ARGUMENT for a NULL pointer
 * (data may be NULL for no values), an unknown dtype or version, ndim not 1 or 2. */
PARITY_API int parity_tensor_checksums(parity_pool *pool, uint32_t manifest_version,
                                       const parity_tensor_data *tensors, size_t n,
                                       uint64_t *checksums);
/* Version 1's checksums of one buffer (FNV-1a 64 in one chain, on the calling thread), for
 * manifests of that version: of n_bytes bytes (fp8 codes; scales' fp32 bytes), and of n
 * values of `dtype` as parity_tensor_checksums reads them. PARITY_ERR_INVALID_ARGUMENT for a
 * NULL pointer (data may be NULL when n is 0) or an unknown dtype. */
PARITY_API int parity_bytes_checksum(const void *data, uint64_t n_bytes, uint64_t *fnv1a64);
PARITY_API int parity_tensor_checksum(uint32_t dtype, const void *data, uint64_t n,
                                      uint64_t *fnv1a64);

/* The probe: scores `tokens` (raw log-probs) with a scorer and compares them bitwise with
 * `expected` (len - 1 values the learner computed for the same tokens and policy). Returns
 * PARITY_OK if all are equal, PARITY_ERR_VERIFY otherwise, with the number that differ, the
 * first position and the largest |difference| in the message. */
PARITY_API int parity_scorer_probe(parity_scorer *scorer, const int32_t *tokens, uint32_t len,
                                   const float *expected);

/* ---- Reading a tensor by name ----------------------------------------------------------- */
/* What the model holds for one tensor, by its checkpoint name ("model.norm.weight", ...):
 * the size query of parity_model_weight_values (and of parity_model_weight_codes, in
 * parity_quant.h). Like every call that reads weights, these two fail with PARITY_ERR_BUSY
 * while a weight update runs; they change nothing and may be called from any thread. */
typedef struct parity_weight_info {
    uint32_t size;               /* sizeof(parity_weight_info): set it before the call */
    uint32_t ndim;               /* 1 or 2, as in the checkpoint */
    uint64_t shape[2];           /* [rows, cols]; ndim 1: shape[0] values, shape[1] = 1 */
    uint32_t has_master;         /* 1: the model holds fp32 master values for it (an F32 or F16
                                    checkpoint, an F32 update), which parity_model_weight_values
                                    returns; 0: its bf16 values, which it returns unless they
                                    are the cast of fp32 values an update did not keep
                                    (PARITY_MASTERS_WHERE_READ): PARITY_ERR_NO_MASTERS */
    uint32_t quantized;          /* 1: a decoder layer's linear weight that a policy with a
                                    quantized gemm runs quantized; 0: it stays bf16 under every
                                    policy (not such a weight, or one the checkpoint keeps
                                    unquantized: modules_to_not_convert, ignored_layers) */
} parity_weight_info;

/* The checkpoint name of the model's tensor `index`: 0, 1, ... up to the number of tensors it
 * holds (those parity_model_save writes, a tied lm_head not among them), in the model's
 * order; NULL past the last or for a NULL model. The string lives as long as the model. */
PARITY_API const char *parity_model_tensor_name(const parity_model *model, size_t index);
/* Fills *info for the tensor `name`. PARITY_ERR_INVALID_ARGUMENT for a NULL pointer or an
 * info->size other than sizeof(parity_weight_info); PARITY_ERR_TENSOR_UNEXPECTED for a name
 * the model has no tensor of (a tied lm_head is "model.embed_tokens.weight"). */
PARITY_API int parity_model_weight_info(const parity_model *model, const char *name,
                                        parity_weight_info *info);
/* The tensor's values in fp32, row-major, into values[n_values]: its fp32 masters where it
 * has them, else its bf16 values widened (exact). n_values must be shape[0] x shape[1]
 * (PARITY_ERR_INVALID_ARGUMENT, saying the count, otherwise); errors as above. */
PARITY_API int parity_model_weight_values(const parity_model *model, const char *name,
                                          float *values, uint64_t n_values);

/* ---------------------------------------------------------------------------------------- */
/* The policy in detail: the longer switches and the presets                                */
/* ---------------------------------------------------------------------------------------- */
/*
 * compute (the switch values are with parity_policy, above):
 *   PARITY_COMPUTE_FP32  fp32 everywhere: no rounding at any point, fp32 weights (F32
 *       checkpoints keep their master weights; bf16/f16 checkpoints are widened exactly). The
 *       other switches are ignored.
 *   PARITY_COMPUTE_FP16  fp16 weights and activations: every rounding point that rounds to
 *       bf16 under PARITY_COMPUTE_BF16 rounds to IEEE fp16 instead (nearest even, overflow to
 *       infinity, subnormals kept), the residual stream and the KV cache included; the other
 *       switches as under bf16. Weights are the checkpoint's values in fp16 (F16 as they are,
 *       BF16 and F32 rounded once to nearest even; a value beyond fp16's range is refused),
 *       multiplied by the fp32-weight GEMM (dot16 order: fp16 products are exact in fp32).
 *       The "+fp16" modifier.
 *
 * gemm: the quantized formats (PARITY_GEMM_FP8_BLOCK .. PARITY_GEMM_TERNARY) require compute
 * bf16; how they quantize and sum is in parity_quant.h, "Quantized GEMMs".
 *
 * exit_dist: a looped model's exit distribution from its gate (Ouro's
 * OuroForCausalLM.forward): per loop t, lambda = sigmoid(gate(h_t)), p_t = lambda * remaining
 * and remaining = remaining * (1 - lambda), the last loop p = remaining; the CDF is the
 * running sum of the p. The threshold rule exits at the first loop whose CDF >= the threshold.
 *   PARITY_EXIT_DIST_MODEL  in the model's dtype, as HF computes it: the gate's output,
 *       lambda, 1 - lambda, each product and each CDF value rounded to bf16 (fp16 under
 *       PARITY_COMPUTE_FP16; the CDF summed in fp32 and rounded per loop, as torch.cumsum
 *       does), and the threshold rounded too (a Python float compared with a bf16 tensor). A
 *       CDF that comes within 2^-9 of 1 rounds to 1: at threshold 1 this exits before the last
 *       loop. Under PARITY_COMPUTE_FP32 as FP32.
 *   PARITY_EXIT_DIST_FP32  every step in fp32, the gate's output unrounded.
 *
 * moe_router, moe_weights, moe_combine: a sparse layer of a mixture-of-experts model
 * (Qwen3-MoE, Qwen2-MoE). The router's logits are the gate GEMM's output (bf16 weights, never
 * quantized, rounded where every GEMM output is). From them, per token:
 *   - probabilities p_e, e < E: m = max logit, z_e = parity_expf(l_e - m), S = the sum of the
 *     z_e in ascending e (fp32); HF: p_e = z_e / S (torch softmax's division); VLLM, SGLANG:
 *     p_e = z_e * (1 / S) (topk_softmax's reciprocal_row_sum).
 *   - the k experts: the k largest p_e, ties to the lower expert index (vLLM's and SGLang's
 *     rule; torch.topk promises none), in slot order: descending p, then ascending index.
 *     TOPK_SOFTMAX: the k largest logits (same tie rule), then p over the k chosen alone
 *     (m and S over them, in slot order, z / S), which renormalises by construction.
 *   - with norm_topk_prob: s = the k chosen p summed in slot order (fp32); HF: w = p / s; VLLM:
 *     w = p / (s > 0 ? s : 1); SGLANG: w = p * (1 / s). Without: w = p.
 *   - moe_weights ROUNDED rounds each w to bf16 (fp16 under PARITY_COMPUTE_FP16).
 * Each chosen expert runs its SwiGLU MLP (gate and up GEMMs rounded, the swiglu switch, the
 * down GEMM's fp32 output y). moe_combine then gives the layer's output (round(): the policy's
 * rounding point; a "bf16 running sum" is a = 0, a = round(a + t) per term):
 *   HF      t_e = round(round(y_e) * w_e), a bf16 running sum in ascending expert index
 *           (modeling_qwen3_moe.py v4: `expert_layer(current_state) * routing_weights[...]`,
 *           `final_hidden_states.index_add_` per expert in `expert_hit` order).
 *   VLLM    t = round(y * w) (the fused_moe kernel's MUL_ROUTED_WEIGHT epilogue on the fp32
 *           accumulator), then k <= 4: a bf16 running sum in slot order (moe_sum_kernel's
 *           scalar_t accumulator), k > 4: the fp32 sum in slot order, rounded once
 *           (`at::sum_out`; its order on the GPU is torch's).
 *   SGLANG  t = round(y * w), then k = 1: t; k = 2: round(t_0 + t_1) (`torch.add`); k > 2: the
 *           fp32 sum in slot order, rounded once (_moe_sum_reduce_kernel).
 *   FP32    round(sum over slots of y * w in fp32 [+ the shared expert's term]): the region
 *           kept in fp32 until one rounding at its output, as "aligned" keeps the others.
 * Qwen2-MoE's shared expert (every token, its own SwiGLU MLP of output y_sh) and its gate
 * g = round(x . w_gate) (one output): under HF, VLLM and SGLANG (the three agree:
 * `F.sigmoid(self.shared_expert_gate(x)) * shared_expert_output`, then `+` after the routed
 * sum) out = round(routed + round(round(sigmoid(g)) * round(y_sh))); under FP32
 * out = round(routed_fp32 + sigmoid(g) * y_sh), sigmoid(g) = 1 / (1 + parity_expf(-g)).
 * A token's route and output depend on that token alone: no capacity, no dropping, nothing
 * computed across the batch; the experts' GEMMs run over the tokens that chose each expert,
 * and every GEMM gives a row the bits of that row alone.
 *
 * Presets (names are API). Each follows the framework behaviour cited; the line-by-line
 * sources are in notes/framework-numerics.md (copied from ../shared/notes).
 *
 *  "fp32"      Reference: no rounding anywhere, fp32 weights.
 *  "hf-eager"  transformers eager, torch_dtype=bfloat16 (modeling_qwen3.py / qwen2.py):
 *              `hidden_states = residual + hidden_states` rounds and Qwen3RMSNorm reads it;
 *              `hidden_states.to(input_dtype)` then `self.weight * hidden_states` (2 roundings);
 *              RoPE `cos.to(dtype)`, `(q * cos) + (rotate_half(q) * sin)` (3 roundings);
 *              `act_fn(gate_proj(x)) * up_proj(x)` (2 roundings); eager_attention_forward
 *              (bf16 matmul, `* scaling`, `+ causal_mask`, softmax(dtype=float32).to(bf16),
 *              bf16 matmul); bf16 lm_head; verl's `logits.div_(temperature)` on bf16 logits.
 *  "hf-sdpa"   as hf-eager with F.scaled_dot_product_attention's flash recipe (fp32 scores,
 *              bf16 P before P.V, one output rounding).
 *  "vllm"      vLLM default V1 (torch.compile/Inductor, custom_ops "none"): RMSNorm
 *              forward_native `x = x + residual` in fp32, `residual = x.to(orig_dtype)`, the
 *              norm reads the fp32 x, `x.to(orig_dtype)` then `x * self.weight` (2 roundings);
 *              RotaryEmbedding bf16 cos_sin_cache, rotation fused (1 rounding); SiluAndMul
 *              forward_native fused (1 rounding); FlashAttention; bf16 logits; sampler
 *              `logits.to(torch.float32)` then temperature in fp32.
 *  "sglang"    SGLang CUDA (FlashInfer FusedAddRMSNorm): fp32 sum read by the norm,
 *              `x * rms_rcp * weight` rounded once; RoPE cache kept fp32 ("cache needs to be
 *              in FP32"), one rounding; SwiGLU fused (not read from its source); flash
 *              attention; bf16 logits; temperature in fp32.
 *  "aligned"   the remedy: hf-eager with RoPE, SwiGLU and every RMSNorm (residual ones and
 *              q/k-norm) in fp32 from their bf16 inputs, rounded once at the region output;
 *              the norm reads the unrounded fp32 residual sum while the residual stream is
 *              still rounded after each add. Attention, GEMMs, logits as hf-eager.
 *  Mixture of experts (moe_router, moe_weights, moe_combine): "hf-eager", "hf-sdpa" HF,
 *  ROUNDED, HF (transformers v4's eager expert loop); "vllm" VLLM, FP32, VLLM; "sglang"
 *  SGLANG, FP32, SGLANG; "aligned" and "fp32" HF, FP32, FP32 ("+aligned" sets FP32 weights
 *  and the FP32 combine on any preset).
 *
 * Modifiers, appended to any preset: "+aligned" (the three regions as in "aligned"),
 * "+fp32-head" (fp32 logits, which a temperature then divides in fp32: vLLM's head_dtype
 * float32), "+fp16" (PARITY_COMPUTE_FP16: the preset's rounding points round to fp16, as the
 * framework does when run with torch_dtype=float16 / --dtype float16; not on "fp32"),
 * "+fp8-block:RULE" and "+mxfp8:RULE" (the gemm switch with the quantizer RULE: "deepseek",
 * "sglang", "te", "deepgemm", "te-pow2"; "ocp", "te"; on bf16 presets), "+nvfp4:RULE"
 * ("modelopt", "te", "torchao"), "+mxfp4:RULE" ("ocp", "rceil", "microxcaling") and
 * "+ternary:RULE" ("bitnet", "hf-bitlinear", "onebitllms"), likewise.
 * E.g. "vllm+fp32-head", "hf-eager+aligned", "hf-eager+fp16", "vllm+fp8-block:deepseek",
 * "hf-eager+mxfp8:te", "vllm+nvfp4:modelopt", "vllm+mxfp4:ocp", "hf-eager+ternary:bitnet".
 */

#ifdef __cplusplus
}
#endif

/* The other two tiers. Each includes this header first, which its guard makes a no-op here:
 * everything above is declared before they are read. */
#include "parity_quant.h"
#include "parity_ops.h"

#endif /* PARITY_H */
