"""Loading libparity and declaring its C API for ctypes.

Everything in this module mirrors include/parity.h: the structs field by field, every exported
function with its C prototype in a comment above its declaration. At import it checks that the
library it loaded has the ABI this file mirrors (parity_abi_version() and parity_struct_size()
for every mirrored struct) and refuses to go on otherwise, saying what to rebuild.

The library is looked for in these places, each tried in turn until one loads and matches
this binding (its ABI, struct sizes and enumerations); if none does, the ImportError names every
place tried and why it failed:
  1. the file named by the environment variable PARITY_LIBRARY;
  2. the repository's build trees: <repo>/build*/lib/libparity.so* (python/../build/lib/...),
     a directory named exactly "build" first, then the others most recently built first;
  3. installed locations: lib, lib64 and lib/<multiarch> under this Python's prefix, /usr/local
     and /usr (where `meson install` puts it);
  4. the dynamic linker's own search (LD_LIBRARY_PATH, the ld.so cache) for libparity.so.0,
     and ctypes.util.find_library("parity").
When a place before the one used failed (e.g. PARITY_LIBRARY names a file that is not the
library), a warning says so.

ctypes.CDLL releases the GIL for the duration of every foreign call, so long calls (scoring,
prefill, decode steps) let other Python threads run.
"""
import ctypes
import ctypes.util
import glob
import os
import sys
import sysconfig
import warnings
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_double, c_float, c_int, c_int32,
                    c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

#: The ABI this binding mirrors (PARITY_ABI_VERSION in include/parity.h).
ABI_VERSION = 3

#: PARITY_MAX_STOP: stop tokens per sequence.
MAX_STOP = 16

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ParityError(Exception):
    """A call into libparity failed, or was refused before it was made.

    Attributes:
        code: the parity_status value (a negative int).
        status: its stable name, e.g. "PARITY_ERR_TOKEN_RANGE".
        message: what was wrong (the library's parity_last_error(), or the binding's own words
            for a check it makes before calling the library).
    """

    def __init__(self, code, message, status=None):
        self.code = int(code)
        self.status = status or status_name(self.code)
        self.message = message
        super().__init__("%s: %s" % (self.status, message) if message else self.status)

    def __reduce__(self):
        return (type(self), (self.code, self.message, self.status))


# parity_status values the binding raises itself (stable, from parity.h); checked against
# parity_status_name() at import.
ERR_INVALID_ARGUMENT = -1
ERR_VERIFY = -60
ERR_TOKEN_RANGE = -40
ERR_EMPTY_INPUT = -41
ERR_TOO_LONG = -42
ERR_POLICY = -43
ERR_CACHE_FULL = -50

STATUSES = {
    "PARITY_OK": 0, "PARITY_ERR_INVALID_ARGUMENT": ERR_INVALID_ARGUMENT,
    "PARITY_ERR_TOKEN_RANGE": ERR_TOKEN_RANGE, "PARITY_ERR_EMPTY_INPUT": ERR_EMPTY_INPUT,
    "PARITY_ERR_TOO_LONG": ERR_TOO_LONG,
    "PARITY_ERR_POLICY": ERR_POLICY, "PARITY_ERR_CACHE_FULL": ERR_CACHE_FULL,
    "PARITY_ERR_VERIFY": ERR_VERIFY,
}

#: parity_masters values by the names Model.update takes (include/parity.h): what an update
#: does with F16/F32 data's exact values.
MASTERS = {"keep": 0, "where-read": 1}

#: parity_dtype values by name (checked at import through parity_tensor_checksum).
DTYPES = {"BF16": 0, "F16": 1, "F32": 2, "F8_E4M3": 3}
#: The manifest format version the library writes (PARITY_MANIFEST_VERSION; it reads 1 and 2).
MANIFEST_VERSION = 2

#: The names the binding uses as defaults; each must be one the library knows.
DEFAULT_NAMES = {"backends": "bf16", "modes": "raw", "cpu_paths": "portable"}


def status_name(code):
    """The stable name of a parity_status code ("PARITY_ERR_ST_OFFSETS")."""
    return lib.parity_status_name(int(code)).decode()


def fail(code, message):
    """Raises ParityError(code, message): a check the binding makes on the library's behalf."""
    raise ParityError(code, message)


def _errcheck(handle):
    """The errcheck of every function of `handle` returning a parity_status: raises ParityError
    on failure.

    ctypes runs the foreign call and this check on the same OS thread, so the thread-local
    parity_last_error() read here belongs to this very call."""
    last_error, name = handle.parity_last_error, handle.parity_status_name

    def check(result, func, args):
        if result:
            raise ParityError(result, last_error().decode("utf-8", "replace"),
                              name(result).decode())
        return result
    return check


# ---- structs (field for field as in parity.h) ------------------------------------------------

POLICY_FIELDS = ("compute", "norm_input", "norm_weight", "qk_norm", "rope_table", "rope_apply",
                 "swiglu", "attention", "logits", "temperature", "gemm", "quantizer", "exit_dist",
                 "moe_router", "moe_weights", "moe_combine")


class parity_policy(Structure):
    _fields_ = [(name, c_uint8) for name in POLICY_FIELDS]


class parity_config(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("arch", c_uint32),
        ("vocab_size", c_uint32),
        ("hidden_size", c_uint32),
        ("intermediate_size", c_uint32),
        ("num_hidden_layers", c_uint32),
        ("num_attention_heads", c_uint32),
        ("num_key_value_heads", c_uint32),
        ("head_dim", c_uint32),
        ("max_position_embeddings", c_uint32),
        ("tie_word_embeddings", c_uint32),
        ("attention_bias", c_uint32),
        ("qk_norm", c_uint32),
        ("rms_norm_eps", c_float),
        ("rope_theta", c_double),
        ("rope_type", c_uint32),
        ("rope_factor", c_float),
        ("rope_low_freq_factor", c_float),
        ("rope_high_freq_factor", c_float),
        ("rope_original_max_position_embeddings", c_uint32),
        ("rope_beta_fast", c_float),
        ("rope_beta_slow", c_float),
        ("rope_attention_factor", c_float),
        ("rope_mscale", c_float),
        ("rope_mscale_all_dim", c_float),
        ("rope_truncate", c_uint32),
        ("total_ut_steps", c_uint32),
        ("early_exit_gate", c_uint32),
        ("early_exit_threshold", c_float),
        ("num_experts", c_uint32),
        ("num_experts_per_tok", c_uint32),
        ("moe_intermediate_size", c_uint32),
        ("shared_expert_intermediate_size", c_uint32),
        ("norm_topk_prob", c_uint32),
        ("decoder_sparse_step", c_uint32),
        ("mlp_only_layers", c_uint64 * 16),
    ]


class parity_scorer_params(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("n_threads", c_uint32),
        ("backend", c_uint32),
        ("max_tokens", c_uint32),
        ("chunk_rows", c_uint32),
        ("policy", parity_policy),
        ("max_memory", c_uint64),
    ]


class parity_score_options(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("mode", c_uint32),
        ("temperature", c_float),
        ("top_k", c_uint32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("top_n", c_uint32),
        ("depths", POINTER(c_uint32)),
        ("loop_kv", c_uint32),
        ("exit_rule", c_uint32),
        ("exit_threshold", c_float),
        ("min_depth", c_uint32),
        ("max_depth", c_uint32),
        ("prompt_len", c_uint32),
        ("readout", c_uint32),
        ("readout_loop", c_uint32),
        ("loop_logprobs", POINTER(c_float)),
        ("routes", POINTER(c_uint16)),
        ("routes_out", POINTER(c_uint16)),
    ]


class parity_sampling(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("temperature", c_float),
        ("top_k", c_uint32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("seed", c_uint64),
        ("max_new_tokens", c_uint32),
        ("n_stop", c_uint32),
        ("stop", c_int32 * MAX_STOP),
        ("logprob_mode", c_uint32),
        ("top_n", c_uint32),
        ("exit_rule", c_uint32),
        ("exit_threshold", c_float),
        ("min_depth", c_uint32),
        ("max_depth", c_uint32),
    ]


class parity_sampler_params(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("n_threads", c_uint32),
        ("backend", c_uint32),
        ("max_seqs", c_uint32),
        ("max_len", c_uint32),
        ("cache_tokens", c_uint32),
        ("prefill_chunk", c_uint32),
        ("max_batch", c_uint32),
        ("policy", parity_policy),
        ("split_k", c_uint32),
        ("split_kv", c_uint32),
        ("max_memory", c_uint64),
        ("loop_kv", c_uint32),
        ("prefault", c_uint32),
        ("record_routes", c_uint32),
    ]


class parity_seq_info(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("len", c_uint32),
        ("prompt_len", c_uint32),
        ("finished", c_uint32),
        ("stream", c_uint64),
        ("model_version", c_uint64),
    ]


PHASE_COUNT = 7  # PARITY_PHASE_COUNT


class parity_profile(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("enabled", c_uint32),
        ("calls", c_uint64),
        ("forwards", c_uint64),
        ("rows", c_uint64),
        ("call_seconds", c_double),
        ("phase_seconds", c_double * PHASE_COUNT),
        ("dispatch_seconds", c_double),
        ("loops", c_uint64),
    ]


class parity_tensor_data(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_uint32),
        ("ndim", c_uint32),
        ("shape", c_uint64 * 2),
        ("data", c_void_p),
    ]


class parity_weight_info(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("ndim", c_uint32),
        ("shape", c_uint64 * 2),
        ("has_master", c_uint32),
        ("quantized", c_uint32),
    ]


class parity_weight_bytes(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("held", c_uint64),
        ("held_for_policy", c_uint64),
        ("step_linear", c_uint64),
        ("step_head", c_uint64),
        ("step_vectors", c_uint64),
        ("embedding_row", c_uint64),
        ("kv_position", c_uint64),
    ]


class parity_quant_operand(Structure):
    _fields_ = [
        ("format", c_uint32),
        ("element", c_uint32),
        ("codes", c_void_p),
        ("codes_stride", c_size_t),
        ("scales", c_void_p),
        ("scales_stride", c_size_t),
        ("scale_rows", c_uint32),
        ("per_row_globals", c_uint32),
        ("globals", c_void_p),
    ]


MIRRORED_STRUCTS = {
    "parity_policy": parity_policy,
    "parity_config": parity_config,
    "parity_scorer_params": parity_scorer_params,
    "parity_score_options": parity_score_options,
    "parity_sampling": parity_sampling,
    "parity_sampler_params": parity_sampler_params,
    "parity_tensor_data": parity_tensor_data,
    "parity_weight_bytes": parity_weight_bytes,
    "parity_weight_info": parity_weight_info,
    "parity_seq_info": parity_seq_info,
    "parity_profile": parity_profile,
    "parity_quant_operand": parity_quant_operand,
}

# Opaque handles are plain void pointers.
model_p = c_void_p
scorer_p = c_void_p
sampler_p = c_void_p
pool_p = c_void_p

# typedef void (*parity_log_fn)(parity_log_level level, const char *message, void *user);
parity_log_fn = CFUNCTYPE(None, c_int, c_char_p, c_void_p)

_u16p = POINTER(c_uint16)
_i32p = POINTER(c_int32)
_u32p = POINTER(c_uint32)
_f32p = POINTER(c_float)

# (name, restype, argtypes, returns a parity_status), each under its C prototype.
_PROTOTYPES = [
    # const char *parity_version(void);
    ("parity_version", c_char_p, [], False),
    # int parity_version_number(void);
    ("parity_version_number", c_int, [], False),
    # int parity_abi_version(void);
    ("parity_abi_version", c_int, [], False),
    # size_t parity_struct_size(const char *name);
    ("parity_struct_size", c_size_t, [c_char_p], False),
    # const char *parity_status_name(int status);
    ("parity_status_name", c_char_p, [c_int], False),
    # const char *parity_last_error(void);
    ("parity_last_error", c_char_p, [], False),
    # void parity_set_log_callback(parity_log_fn fn, void *user);
    ("parity_set_log_callback", None, [parity_log_fn, c_void_p], False),
    # uint16_t parity_bf16_from_f32(float x);
    ("parity_bf16_from_f32", c_uint16, [c_float], False),
    # float parity_bf16_to_f32(uint16_t x);
    ("parity_bf16_to_f32", c_float, [c_uint16], False),
    # parity_cpu_path parity_get_cpu_path(void);
    ("parity_get_cpu_path", c_int, [], False),
    # const char *parity_cpu_path_name(parity_cpu_path path);
    ("parity_cpu_path_name", c_char_p, [c_int], False),
    # int parity_cpu_path_from_name(const char *name, parity_cpu_path *out);
    ("parity_cpu_path_from_name", c_int, [c_char_p, POINTER(c_int)], True),
    # int parity_set_cpu_path(parity_cpu_path path);
    ("parity_set_cpu_path", c_int, [c_int], True),
    # const char *parity_backend_name(int backend);
    ("parity_backend_name", c_char_p, [c_int], False),
    # int parity_backend_check(int backend);
    ("parity_backend_check", c_int, [c_int], True),
    # int parity_backend_from_name(const char *name, parity_backend *out);
    ("parity_backend_from_name", c_int, [c_char_p, POINTER(c_int)], True),
    # const char *parity_logprob_mode_name(int mode);
    ("parity_logprob_mode_name", c_char_p, [c_int], False),
    # int parity_logprob_mode_from_name(const char *name, parity_logprob_mode *out);
    ("parity_logprob_mode_from_name", c_int, [c_char_p, POINTER(c_int)], True),
    # const char *parity_arch_name(int arch);
    ("parity_arch_name", c_char_p, [c_int], False),
    # int parity_arch_from_name(const char *name, parity_arch *out);
    ("parity_arch_from_name", c_int, [c_char_p, POINTER(c_int)], True),
    # int parity_policy_from_name(const char *name, parity_policy *out);
    ("parity_policy_from_name", c_int, [c_char_p, POINTER(parity_policy)], True),
    # const char *const *parity_policy_preset_names(void);
    ("parity_policy_preset_names", POINTER(c_char_p), [], False),
    # int parity_policy_validate(const parity_policy *policy);
    ("parity_policy_validate", c_int, [POINTER(parity_policy)], True),
    # int parity_rmsnorm_residual(const parity_policy *policy, size_t rows, size_t dim,
    #                             const uint16_t *delta, size_t delta_stride,
    #                             const uint16_t *residual, size_t residual_stride,
    #                             const uint16_t *weight, float eps,
    #                             uint16_t *residual_out, size_t residual_out_stride,
    #                             uint16_t *out, size_t out_stride);
    ("parity_rmsnorm_residual", c_int,
     [POINTER(parity_policy), c_size_t, c_size_t, _u16p, c_size_t, _u16p, c_size_t, _u16p,
      c_float, _u16p, c_size_t, _u16p, c_size_t], True),
    # int parity_rmsnorm(const parity_policy *policy, int is_qk_norm, size_t rows, size_t dim,
    #                    const uint16_t *x, size_t x_stride, const uint16_t *weight, float eps,
    #                    uint16_t *out, size_t out_stride);
    ("parity_rmsnorm", c_int,
     [POINTER(parity_policy), c_int, c_size_t, c_size_t, _u16p, c_size_t, _u16p, c_float,
      _u16p, c_size_t], True),
    # int parity_swiglu(const parity_policy *policy, size_t rows, size_t dim,
    #                   const uint16_t *gate, size_t gate_stride, const uint16_t *up,
    #                   size_t up_stride, uint16_t *out, size_t out_stride);
    ("parity_swiglu", c_int,
     [POINTER(parity_policy), c_size_t, c_size_t, _u16p, c_size_t, _u16p, c_size_t, _u16p,
      c_size_t], True),
    # int parity_rope(const parity_policy *policy, size_t rows, size_t n_heads,
    #                 size_t head_dim, uint16_t *x, size_t row_stride,
    #                 const int32_t *positions, double theta);
    ("parity_rope", c_int,
     [POINTER(parity_policy), c_size_t, c_size_t, c_size_t, _u16p, c_size_t, _i32p, c_double],
     True),
    # int parity_config_builtin(const char *name, parity_config *out);
    ("parity_config_builtin", c_int, [c_char_p, POINTER(parity_config)], True),
    # const char *const *parity_config_builtin_names(void);
    ("parity_config_builtin_names", POINTER(c_char_p), [], False),
    # int parity_config_load(const char *path, parity_config *out);
    ("parity_config_load", c_int, [c_char_p, POINTER(parity_config)], True),
    # int parity_model_load(const char *dir, parity_model **out);
    ("parity_model_load", c_int, [c_char_p, POINTER(model_p)], True),
    # int parity_model_synthetic(const parity_config *config, uint64_t seed, parity_model **out);
    ("parity_model_synthetic", c_int, [POINTER(parity_config), c_uint64, POINTER(model_p)], True),
    # int parity_model_open(const char *spec, parity_model **out);
    ("parity_model_open", c_int, [c_char_p, POINTER(model_p)], True),
    # int parity_model_save(const parity_model *model, const char *dir);
    ("parity_model_save", c_int, [model_p, c_char_p], True),
    # int parity_model_save_as(const parity_model *model, const char *dir, const char *layout);
    ("parity_model_save_as", c_int, [model_p, c_char_p, c_char_p], True),
    # void parity_model_free(parity_model *model);
    ("parity_model_free", None, [model_p], False),
    # const parity_config *parity_model_config(const parity_model *model);
    ("parity_model_config", POINTER(parity_config), [model_p], False),
    # void parity_scorer_default_params(parity_scorer_params *params);
    ("parity_scorer_default_params", None, [POINTER(parity_scorer_params)], False),
    # int parity_scorer_create(const parity_model *model, const parity_scorer_params *params,
    #                          parity_scorer **out);
    ("parity_scorer_create", c_int, [model_p, POINTER(parity_scorer_params), POINTER(scorer_p)],
     True),
    # void parity_scorer_free(parity_scorer *scorer);
    ("parity_scorer_free", None, [scorer_p], False),
    # void parity_score_default_options(parity_score_options *options);
    ("parity_score_default_options", None, [POINTER(parity_score_options)], False),
    # int parity_score(parity_scorer *scorer, const parity_score_options *options,
    #                  const int32_t *tokens, const uint32_t *lengths, size_t n_seqs,
    #                  float *logprobs, float *entropy, int32_t *top_ids,
    #                  float *top_logprobs);
    ("parity_score", c_int,
     [scorer_p, POINTER(parity_score_options), _i32p, _u32p, c_size_t, _f32p, _f32p, _i32p,
      _f32p], True),
    # void parity_sampling_default(parity_sampling *sampling);
    ("parity_sampling_default", None, [POINTER(parity_sampling)], False),
    # void parity_sampler_default_params(parity_sampler_params *params);
    ("parity_sampler_default_params", None, [POINTER(parity_sampler_params)], False),
    # int parity_sampler_create(const parity_model *model, const parity_sampler_params *params,
    #                           parity_sampler **out);
    ("parity_sampler_create", c_int,
     [model_p, POINTER(parity_sampler_params), POINTER(sampler_p)], True),
    # void parity_sampler_free(parity_sampler *sampler);
    ("parity_sampler_free", None, [sampler_p], False),
    # int parity_sampler_add(parity_sampler *sampler, const int32_t *prompt, uint32_t len,
    #                        const parity_sampling *sampling, uint64_t stream, uint32_t *seq);
    ("parity_sampler_add", c_int,
     [sampler_p, _i32p, c_uint32, POINTER(parity_sampling), c_uint64, _u32p], True),
    # int parity_sampler_add_batch(parity_sampler *sampler, size_t n,
    #                              const int32_t *const *prompts, const uint32_t *lens,
    #                              const parity_sampling *sampling, const uint64_t *streams,
    #                              uint32_t *seqs);
    ("parity_sampler_add_batch", c_int,
     [sampler_p, c_size_t, POINTER(_i32p), _u32p, POINTER(parity_sampling), POINTER(c_uint64),
      _u32p], True),
    # int parity_sampler_fork(parity_sampler *sampler, uint32_t parent,
    #                         const parity_sampling *sampling, uint64_t stream, uint32_t *child);
    ("parity_sampler_fork", c_int,
     [sampler_p, c_uint32, POINTER(parity_sampling), c_uint64, _u32p], True),
    # int parity_sampler_release(parity_sampler *sampler, uint32_t seq);
    ("parity_sampler_release", c_int, [sampler_p, c_uint32], True),
    # int parity_sampler_step(parity_sampler *sampler, const uint32_t *seqs, size_t n,
    #                         int32_t *tokens, float *logprobs, uint32_t *finished,
    #                         uint32_t max_top_n, int32_t *top_ids, float *top_logprobs);
    ("parity_sampler_step", c_int,
     [sampler_p, _u32p, c_size_t, _i32p, _f32p, _u32p, c_uint32, _i32p, _f32p], True),
    # int parity_sampler_seq_info(const parity_sampler *sampler, uint32_t seq,
    #                             parity_seq_info *info);
    ("parity_sampler_seq_info", c_int, [sampler_p, c_uint32, POINTER(parity_seq_info)], True),
    # int parity_sampler_tokens(const parity_sampler *sampler, uint32_t seq,
    #                           const int32_t **tokens, uint32_t *len, uint32_t *prompt_len);
    ("parity_sampler_tokens", c_int, [sampler_p, c_uint32, POINTER(_i32p), _u32p, _u32p], True),
    # int parity_sampler_depths(const parity_sampler *sampler, uint32_t seq,
    #                           const uint32_t **depths, uint32_t *n);
    ("parity_sampler_depths", c_int, [sampler_p, c_uint32, POINTER(_u32p), _u32p], True),
    # int parity_sampler_routes(const parity_sampler *sampler, uint32_t seq,
    #                           const uint16_t **routes, uint32_t *n, uint32_t *stride);
    ("parity_sampler_routes", c_int,
     [sampler_p, c_uint32, POINTER(POINTER(c_uint16)), _u32p, _u32p], True),
    # const char *parity_phase_name(uint32_t phase);
    ("parity_phase_name", c_char_p, [c_uint32], False),
    # int parity_sampler_set_profiling(parity_sampler *sampler, int on);
    ("parity_sampler_set_profiling", c_int, [sampler_p, c_int], True),
    # int parity_sampler_profile(const parity_sampler *sampler, parity_profile *profile);
    ("parity_sampler_profile", c_int, [sampler_p, POINTER(parity_profile)], True),
    # int parity_scorer_set_profiling(parity_scorer *scorer, int on);
    ("parity_scorer_set_profiling", c_int, [scorer_p, c_int], True),
    # int parity_scorer_profile(const parity_scorer *scorer, parity_profile *profile);
    ("parity_scorer_profile", c_int, [scorer_p, POINTER(parity_profile)], True),
    # int parity_model_update(parity_model *model, const parity_tensor_data *tensors, size_t n);
    ("parity_model_update", c_int, [model_p, POINTER(parity_tensor_data), c_size_t], True),
    # int parity_model_update_on(parity_pool *pool, parity_model *model,
    #                            const parity_tensor_data *tensors, size_t n);
    ("parity_model_update_on", c_int, [pool_p, model_p, POINTER(parity_tensor_data), c_size_t],
     True),
    # int parity_model_update_with(parity_pool *pool, parity_model *model,
    #                              const parity_tensor_data *tensors, size_t n,
    #                              uint32_t masters);
    ("parity_model_update_with", c_int,
     [pool_p, model_p, POINTER(parity_tensor_data), c_size_t, c_uint32], True),
    # uint64_t parity_model_version(const parity_model *model);
    ("parity_model_version", c_uint64, [model_p], False),
    # int parity_model_write_manifest(const parity_model *model, const char *path);
    ("parity_model_write_manifest", c_int, [model_p, c_char_p], True),
    # int parity_model_verify(const parity_model *model, const char *manifest_path,
    #                         char *report, size_t report_size);
    ("parity_model_verify", c_int, [model_p, c_char_p, c_char_p, c_size_t], False),
    # int parity_model_write_manifest_for(const parity_model *model, const parity_policy *policy,
    #                                     const char *path);
    ("parity_model_write_manifest_for", c_int, [model_p, POINTER(parity_policy), c_char_p], True),
    # int parity_model_verify_for(const parity_model *model, const parity_policy *policy,
    #                             const char *manifest_path, char *report, size_t report_size);
    ("parity_model_verify_for", c_int,
     [model_p, POINTER(parity_policy), c_char_p, c_char_p, c_size_t], False),
    # int parity_model_write_manifest_on(parity_pool *pool, const parity_model *model,
    #                                    const parity_policy *policy, uint32_t manifest_version,
    #                                    const char *path);
    ("parity_model_write_manifest_on", c_int,
     [pool_p, model_p, POINTER(parity_policy), c_uint32, c_char_p], True),
    # int parity_model_verify_on(parity_pool *pool, const parity_model *model,
    #                            const parity_policy *policy, const char *manifest_path,
    #                            char *report, size_t report_size);
    ("parity_model_verify_on", c_int,
     [pool_p, model_p, POINTER(parity_policy), c_char_p, c_char_p, c_size_t], False),
    # int parity_tensor_checksums(parity_pool *pool, uint32_t manifest_version,
    #                             const parity_tensor_data *tensors, size_t n,
    #                             uint64_t *checksums);
    ("parity_tensor_checksums", c_int,
     [pool_p, c_uint32, POINTER(parity_tensor_data), c_size_t, POINTER(c_uint64)], True),
    # int parity_bytes_checksum(const void *data, uint64_t n_bytes, uint64_t *fnv1a64);
    ("parity_bytes_checksum", c_int, [c_void_p, c_uint64, POINTER(c_uint64)], True),
    # uint16_t parity_fp16_from_f32(float x);
    ("parity_fp16_from_f32", c_uint16, [c_float], False),
    # float parity_fp16_to_f32(uint16_t x);
    ("parity_fp16_to_f32", c_float, [c_uint16], False),
    # int parity_fp8_from_f32(int format, int saturate, size_t n, const float *x, uint8_t *out);
    ("parity_fp8_from_f32", c_int, [c_int, c_int, c_size_t, c_void_p, c_void_p], True),
    # int parity_fp8_to_f32(int format, size_t n, const uint8_t *codes, float *out);
    ("parity_fp8_to_f32", c_int, [c_int, c_size_t, c_void_p, c_void_p], True),
    # int parity_fp4_from_f32(int rounding, size_t n, const float *x, uint8_t *codes);
    ("parity_fp4_from_f32", c_int, [c_int, c_size_t, c_void_p, c_void_p], True),
    # int parity_fp4_to_f32(size_t n, const uint8_t *codes, float *out);
    ("parity_fp4_to_f32", c_int, [c_size_t, c_void_p, c_void_p], True),
    # int parity_fp4_pack(size_t n, const uint8_t *codes, uint8_t *packed);
    ("parity_fp4_pack", c_int, [c_size_t, c_void_p, c_void_p], True),
    # int parity_fp4_unpack(size_t n, const uint8_t *packed, uint8_t *codes);
    ("parity_fp4_unpack", c_int, [c_size_t, c_void_p, c_void_p], True),
    # int parity_fp8_quantizer_from_name(int mx, const char *name, int *out);
    ("parity_fp8_quantizer_from_name", c_int, [c_int, c_char_p, POINTER(c_int)], True),
    # const char *parity_fp8_quantizer_name(int quantizer);
    ("parity_fp8_quantizer_name", c_char_p, [c_int], False),
    # int parity_fp8_quantize_blocks(int quantizer, size_t rows, size_t cols, const float *x,
    #                                size_t x_stride, uint32_t block_rows, uint32_t block_cols,
    #                                uint8_t *codes, size_t codes_stride, float *scales);
    ("parity_fp8_quantize_blocks", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                           c_uint32, c_uint32, c_void_p, c_size_t, c_void_p],
     True),
    # int parity_mxfp8_quantize(int quantizer, size_t rows, size_t cols, const float *x,
    #                           size_t x_stride, uint8_t *codes, size_t codes_stride,
    #                           uint8_t *scales);
    ("parity_mxfp8_quantize", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
                                      c_size_t, c_void_p], True),
    # int parity_mxfp8_quantize_as(int quantizer, int element, size_t rows, size_t cols,
    #                              const float *x, size_t x_stride, uint8_t *codes,
    #                              size_t codes_stride, uint8_t *scales);
    ("parity_mxfp8_quantize_as", c_int, [c_int, c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                         c_void_p, c_size_t, c_void_p], True),
    # int parity_quantizer_from_name(uint32_t gemm, const char *name, int *out);
    ("parity_quantizer_from_name", c_int, [c_uint32, c_char_p, POINTER(c_int)], True),
    # const char *parity_quantizer_name(int quantizer);
    ("parity_quantizer_name", c_char_p, [c_int], False),
    # int parity_nvfp4_quantize(int quantizer, int per_row, size_t rows, size_t cols,
    #                           const float *x, size_t x_stride, uint8_t *codes,
    #                           size_t codes_stride, uint8_t *block_scales, float *tensor_scales);
    ("parity_nvfp4_quantize", c_int, [c_int, c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                      c_void_p, c_size_t, c_void_p, c_void_p], True),
    # int parity_nvfp4_quantize_2d(int quantizer, size_t rows, size_t cols, const float *x,
    #                              size_t ldx, uint8_t *codes, size_t ldc, uint8_t *sf,
    #                              float *s2);
    ("parity_nvfp4_quantize_2d", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                         c_void_p, c_size_t, c_void_p, c_void_p], True),
    # int parity_nvfp4_quantize_sr(int quantizer, int per_row, size_t rows, size_t cols,
    #                              const float *x, size_t ldx, uint64_t seed, uint64_t stream,
    #                              uint8_t *codes, size_t ldc, uint8_t *sf, float *s2);
    ("parity_nvfp4_quantize_sr", c_int, [c_int, c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                         c_uint64, c_uint64, c_void_p, c_size_t, c_void_p,
                                         c_void_p], True),
    # int parity_rht16(size_t rows, size_t cols, const float *x, size_t ldx, uint64_t sign_seed,
    #                  float *out, size_t ldo);
    ("parity_rht16", c_int, [c_size_t, c_size_t, c_void_p, c_size_t, c_uint64, c_void_p,
                             c_size_t], True),
    # int parity_mxfp4_quantize(int quantizer, size_t rows, size_t cols, const float *x,
    #                           size_t x_stride, uint8_t *codes, size_t codes_stride,
    #                           uint8_t *scales);
    ("parity_mxfp4_quantize", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
                                      c_size_t, c_void_p], True),
    # int parity_ternary_quantize(int quantizer, int per_row, size_t rows, size_t cols,
    #                             const float *x, size_t x_stride, int8_t *codes,
    #                             size_t codes_stride, float *scales);
    ("parity_ternary_quantize", c_int, [c_int, c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                        c_void_p, c_size_t, c_void_p], True),
    # uint64_t parity_quant_scale_count(int quantizer, size_t rows, size_t cols);
    ("parity_quant_scale_count", c_uint64, [c_int, c_size_t, c_size_t], False),
    # int parity_quantize_weight(int quantizer, size_t rows, size_t cols, const float *x,
    #                            size_t x_stride, uint8_t *codes, float *scales);
    ("parity_quantize_weight", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
                                       c_void_p], True),
    # int parity_quantize_bf16_export(int quantizer, size_t rows, size_t cols, const float *x,
    #                                 size_t x_stride, uint8_t *codes, float *scales);
    ("parity_quantize_bf16_export", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t,
                                            c_void_p, c_void_p], True),
    # int parity_quant_adjust_bf16(int quantizer, size_t rows, size_t cols, const float *x,
    #                              size_t x_stride, uint16_t *out, uint64_t *n_adjusted);
    ("parity_quant_adjust_bf16", c_int, [c_int, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
                                         POINTER(c_uint64)], True),
    # int parity_tensor_checksum(uint32_t dtype, const void *data, uint64_t n,
    #                            uint64_t *fnv1a64);
    ("parity_tensor_checksum", c_int, [c_uint32, c_void_p, c_uint64, POINTER(c_uint64)], True),
    # int parity_scorer_probe(parity_scorer *scorer, const int32_t *tokens, uint32_t len,
    #                         const float *expected);
    ("parity_scorer_probe", c_int, [scorer_p, _i32p, c_uint32, _f32p], True),
    # int parity_model_bytes(const parity_model *model, const parity_policy *policy,
    #                        uint32_t backend, parity_weight_bytes *out);
    ("parity_model_bytes", c_int, [model_p, POINTER(parity_policy), c_uint32,
                                   POINTER(parity_weight_bytes)], True),
    # int parity_scorer_bytes(const parity_model *model, const parity_scorer_params *params,
    #                         uint64_t *bytes);
    ("parity_scorer_bytes", c_int, [model_p, POINTER(parity_scorer_params), POINTER(c_uint64)],
     True),
    # int parity_sampler_bytes(const parity_model *model, const parity_sampler_params *params,
    #                          uint64_t *bytes);
    ("parity_sampler_bytes", c_int, [model_p, POINTER(parity_sampler_params), POINTER(c_uint64)],
     True),
    # int parity_sampler_cache_tokens(size_t n_groups, const uint32_t *prompt_lens,
    #                                 const uint32_t *completions, uint32_t max_new_tokens,
    #                                 uint64_t *cache_tokens);
    ("parity_sampler_cache_tokens", c_int,
     [c_size_t, POINTER(c_uint32), POINTER(c_uint32), c_uint32, POINTER(c_uint64)], True),
    # uint32_t parity_kv_block_tokens(void);
    ("parity_kv_block_tokens", c_uint32, [], False),
    # Forward pieces: buffers are passed as addresses (c_void_p), so that a torch tensor's
    # data_ptr() or a ctypes array goes in as it is.
    # int parity_pool_create(uint32_t n_threads, parity_pool **out);
    ("parity_pool_create", c_int, [c_uint32, POINTER(pool_p)], True),
    # void parity_pool_free(parity_pool *pool);
    ("parity_pool_free", None, [pool_p], False),
    # uint32_t parity_pool_threads(const parity_pool *pool);
    ("parity_pool_threads", c_uint32, [pool_p], False),
    # int parity_embedding(size_t rows, const int32_t *tokens, size_t vocab, size_t dim,
    #                      uint32_t dtype, const void *table, size_t table_stride,
    #                      float *out, size_t out_stride);
    ("parity_embedding", c_int,
     [c_size_t, c_void_p, c_size_t, c_size_t, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t],
     True),
    # int parity_linear(parity_pool *pool, const parity_policy *policy, uint32_t backend,
    #                   size_t m, size_t k, size_t n, const float *x, size_t x_stride,
    #                   uint32_t w_dtype, const void *w, size_t w_stride, const float *bias,
    #                   float *y, size_t y_stride);
    ("parity_linear", c_int,
     [pool_p, POINTER(parity_policy), c_uint32, c_size_t, c_size_t, c_size_t, c_void_p, c_size_t,
      c_uint32, c_void_p, c_size_t, c_void_p, c_void_p, c_size_t], True),
    # int parity_quant_gemm(parity_pool *pool, size_t m, size_t n, size_t k,
    #                       const parity_quant_operand *a, const parity_quant_operand *b,
    #                       float *y, size_t y_stride);
    ("parity_quant_gemm", c_int, [pool_p, c_size_t, c_size_t, c_size_t,
                                  POINTER(parity_quant_operand), POINTER(parity_quant_operand),
                                  c_void_p, c_size_t], True),
    # int parity_attention(parity_pool *pool, const parity_policy *policy, size_t n_seqs,
    #                      const uint32_t *lengths, size_t n_heads, size_t n_kv_heads,
    #                      size_t head_dim, const float *q, size_t q_stride,
    #                      const float *k, size_t k_stride, const float *v,
    #                      size_t v_stride, float *out, size_t out_stride);
    ("parity_attention", c_int,
     [pool_p, POINTER(parity_policy), c_size_t, c_void_p, c_size_t, c_size_t, c_size_t, c_void_p,
      c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t], True),
    # int parity_round_f32(uint32_t dtype, size_t n, const float *x, float *out);
    ("parity_round_f32", c_int, [c_uint32, c_size_t, c_void_p, c_void_p], True),
    # int parity_bf16_from_f32_array(parity_pool *pool, size_t n, const float *x,
    #                                uint16_t *out);
    ("parity_bf16_from_f32_array", c_int, [pool_p, c_size_t, c_void_p, c_void_p], True),
    # int parity_rmsnorm_residual_f32(parity_pool *pool, const parity_policy *policy,
    #                                 size_t rows, size_t dim, const float *delta,
    #                                 size_t delta_stride, const float *residual,
    #                                 size_t residual_stride, const float *weight, float eps,
    #                                 float *residual_out, size_t residual_out_stride,
    #                                 float *out, size_t out_stride);
    ("parity_rmsnorm_residual_f32", c_int,
     [pool_p, POINTER(parity_policy), c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
      c_size_t, c_void_p, c_float, c_void_p, c_size_t, c_void_p, c_size_t], True),
    # int parity_rmsnorm_f32(parity_pool *pool, const parity_policy *policy, int is_qk_norm,
    #                        size_t rows, size_t dim, const float *x, size_t x_stride,
    #                        const float *weight, float eps, float *out, size_t out_stride);
    ("parity_rmsnorm_f32", c_int,
     [pool_p, POINTER(parity_policy), c_int, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
      c_float, c_void_p, c_size_t], True),
    # int parity_swiglu_f32(parity_pool *pool, const parity_policy *policy, size_t rows,
    #                       size_t dim, const float *gate, size_t gate_stride, const float *up,
    #                       size_t up_stride, float *out, size_t out_stride);
    ("parity_swiglu_f32", c_int,
     [pool_p, POINTER(parity_policy), c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
      c_size_t, c_void_p, c_size_t], True),
    # int parity_rope_f32(parity_pool *pool, const parity_policy *policy, size_t rows,
    #                     size_t n_heads, size_t head_dim, const float *x, size_t x_stride,
    #                     float *out, size_t out_stride, const int32_t *positions,
    #                     double theta);
    ("parity_rope_f32", c_int,
     [pool_p, POINTER(parity_policy), c_size_t, c_size_t, c_size_t, c_void_p, c_size_t,
      c_void_p, c_size_t, c_void_p, c_double], True),
    # int parity_matmul(parity_pool *pool, size_t m, size_t n, size_t k, const float *a,
    #                   size_t a_row_stride, size_t a_col_stride, uint32_t b_dtype,
    #                   const void *b, size_t b_row_stride, size_t b_col_stride, float *c,
    #                   size_t c_stride);
    ("parity_matmul", c_int,
     [pool_p, c_size_t, c_size_t, c_size_t, c_void_p, c_size_t, c_size_t, c_uint32, c_void_p,
      c_size_t, c_size_t, c_void_p, c_size_t], True),
    # int parity_attention_backward(parity_pool *pool, size_t n_seqs, const uint32_t *lengths,
    #                               size_t n_heads, size_t n_kv_heads, size_t head_dim,
    #                               const float *q, size_t q_stride, const float *k,
    #                               size_t k_stride, const float *v, size_t v_stride,
    #                               const float *d_out, size_t d_out_stride, float *d_q,
    #                               size_t d_q_stride, float *d_k, size_t d_k_stride,
    #                               float *d_v, size_t d_v_stride);
    ("parity_attention_backward", c_int,
     [pool_p, c_size_t, c_void_p, c_size_t, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p,
      c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t,
      c_void_p, c_size_t], True),
    # int parity_rmsnorm_backward(parity_pool *pool, size_t rows, size_t dim, const float *x,
    #                             size_t x_stride, const float *weight, float eps,
    #                             const float *d_out, size_t d_out_stride, const float *d_add,
    #                             size_t d_add_stride, float *d_x, size_t d_x_stride,
    #                             float *d_weight);
    ("parity_rmsnorm_backward", c_int,
     [pool_p, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p, c_float, c_void_p, c_size_t,
      c_void_p, c_size_t, c_void_p, c_size_t, c_void_p], True),
    # int parity_rmsnorm_residual_backward(parity_pool *pool, size_t rows, size_t dim,
    #                                      const float *residual, size_t residual_stride,
    #                                      const float *delta, size_t delta_stride,
    #                                      const float *weight, float eps, const float *d_out,
    #                                      size_t d_out_stride, const float *d_add,
    #                                      size_t d_add_stride, float *d_x, size_t d_x_stride,
    #                                      float *d_weight);
    ("parity_rmsnorm_residual_backward", c_int,
     [pool_p, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_float,
      c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p], True),
    # int parity_swiglu_backward(parity_pool *pool, size_t rows, size_t dim, const float *gate,
    #                            size_t gate_stride, const float *up, size_t up_stride,
    #                            const float *d_out, size_t d_out_stride, float *d_gate,
    #                            size_t d_gate_stride, float *d_up, size_t d_up_stride);
    ("parity_swiglu_backward", c_int,
     [pool_p, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t,
      c_void_p, c_size_t, c_void_p, c_size_t], True),
    # int parity_rope_backward(parity_pool *pool, size_t rows, size_t n_heads,
    #                          size_t head_dim, const float *d_out, size_t d_out_stride,
    #                          const float *cos, const float *sin, size_t table_stride,
    #                          float *d_x, size_t d_x_stride);
    ("parity_rope_backward", c_int,
     [pool_p, c_size_t, c_size_t, c_size_t, c_void_p, c_size_t, c_void_p, c_void_p, c_size_t,
      c_void_p, c_size_t], True),
    # int parity_head_logprobs(parity_pool *pool, const parity_policy *policy,
    #                          uint32_t backend, const parity_score_options *options,
    #                          size_t rows, size_t dim, size_t vocab, const float *residual,
    #                          size_t residual_stride, const float *delta,
    #                          size_t delta_stride, uint32_t w_dtype,
    #                          const void *norm_weight, float eps, const void *lm_head,
    #                          size_t lm_head_stride, const int32_t *targets,
    #                          float *logprobs, float *entropy, float *logits,
    #                          size_t logits_stride);
    ("parity_head_logprobs", c_int,
     [pool_p, POINTER(parity_policy), c_uint32, POINTER(parity_score_options), c_size_t,
      c_size_t, c_size_t, c_void_p, c_size_t, c_void_p, c_size_t, c_uint32, c_void_p, c_float,
      c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t], True),
    # int parity_logprobs_from_logits(parity_pool *pool, const parity_policy *policy,
    #                                 const parity_score_options *options, size_t rows,
    #                                 size_t vocab, const float *logits,
    #                                 size_t logits_stride, const int32_t *targets,
    #                                 float *logprobs, float *entropy);
    ("parity_logprobs_from_logits", c_int,
     [pool_p, POINTER(parity_policy), POINTER(parity_score_options), c_size_t, c_size_t,
      c_void_p, c_size_t, c_void_p, c_void_p, c_void_p], True),
    # const char *parity_model_tensor_name(const parity_model *model, size_t index);
    ("parity_model_tensor_name", c_char_p, [model_p, c_size_t], False),
    # int parity_model_weight_info(const parity_model *model, const char *name,
    #                              parity_weight_info *info);
    ("parity_model_weight_info", c_int, [model_p, c_char_p, POINTER(parity_weight_info)], True),
    # int parity_model_weight_values(const parity_model *model, const char *name,
    #                                float *values, uint64_t n_values);
    ("parity_model_weight_values", c_int, [model_p, c_char_p, c_void_p, c_uint64], True),
    # int parity_moe_route(const parity_policy *policy, size_t rows, uint32_t n_experts,
    #                      uint32_t k, int norm_topk_prob, const float *logits,
    #                      size_t logits_stride, const uint16_t *replay, uint16_t *ids,
    #                      float *weights);
    ("parity_moe_route", c_int,
     [POINTER(parity_policy), c_size_t, c_uint32, c_uint32, c_int, c_void_p, c_size_t, c_void_p,
      c_void_p, c_void_p], True),
    # int parity_moe_combine(const parity_policy *policy, size_t rows, size_t width,
    #                        uint32_t k, const uint16_t *ids, const float *weights,
    #                        const float *y, const float *y_shared,
    #                        const float *shared_gate, float *out);
    ("parity_moe_combine", c_int,
     [POINTER(parity_policy), c_size_t, c_size_t, c_uint32, c_void_p, c_void_p, c_void_p,
      c_void_p, c_void_p, c_void_p], True),
]

_IN_TREE = os.path.isfile(os.path.join(_REPO_ROOT, "include", "parity.h"))
_BUILD_HINT = ("build it with `meson setup build && ninja -C build` in %s (or install it: "
               "`meson install -C build`), or point the environment variable PARITY_LIBRARY at "
               "a libparity.so" % (_REPO_ROOT if _IN_TREE else "the libparity source tree"))
_SONAME = "libparity.so.0"


def _installed_dirs():
    """The library directories `meson install` uses under the usual prefixes."""
    multiarch = sysconfig.get_config_var("MULTIARCH")
    subdirs = ["lib", "lib64"] + ([os.path.join("lib", multiarch)] if multiarch else [])
    dirs = []
    for prefix in (sys.prefix, sys.base_prefix, "/usr/local", "/usr"):
        for sub in subdirs:
            d = os.path.join(prefix, sub)
            if d not in dirs:
                dirs.append(d)
    return dirs


def candidates():
    """Where the shared library may be, in the order they are tried: a list of (where, path),
    `where` saying which rule found the path. A path that is not absolute is a name for the
    dynamic linker's search; None, a rule that found nothing to try."""
    found = []
    env = os.environ.get("PARITY_LIBRARY")
    if env:
        found.append(("PARITY_LIBRARY", env))
    if _IN_TREE:
        builds = [d for d in glob.glob(os.path.join(_REPO_ROOT, "build*")) if os.path.isdir(d)]
        # "build" first (the README's build directory), then the others newest first
        builds.sort(key=lambda d: (os.path.basename(d) != "build", -os.path.getmtime(d)))
        libs = []
        for d in builds:
            libs += sorted(glob.glob(os.path.join(d, "lib", "libparity.so*")), key=len)[:1]
        found += [("build tree", p) for p in libs] or \
            [("build tree", os.path.join(_REPO_ROOT, "build*", "lib", "libparity.so"))]
    else:
        found.append(("build tree", None))  # an installed binding: no source tree around it
    for d in _installed_dirs():
        found.append(("installed", os.path.join(d, "libparity.so")))
    found.append(("dynamic linker search", _SONAME))
    system = ctypes.util.find_library("parity")
    found.append(("ctypes.util.find_library", system))
    return found


def _open(path):
    """The library at `path` with every prototype declared and its ABI, struct sizes and
    enumerations checked; raises OSError or ImportError saying why not."""
    if os.sep in path and not os.path.exists(path):
        raise OSError("no such file")
    if os.path.isdir(path):
        raise OSError("a directory, not the library file")
    handle = ctypes.CDLL(path)
    for name, restype, argtypes, status in _PROTOTYPES:
        if not hasattr(handle, name):
            raise ImportError("it lacks %s(): it is older or newer than this binding (ABI %d); "
                              "rebuild it from this source tree" % (name, ABI_VERSION))
    check = _errcheck(handle)
    for name, restype, argtypes, status in _PROTOTYPES:
        fn = getattr(handle, name)
        fn.restype = restype
        fn.argtypes = argtypes
        if status:
            fn.errcheck = check
    _check_abi(handle, path)
    tables = check_mirrors(handle, path)
    return handle, tables


def load(places):
    """Tries each (where, path) of `places` in turn; returns (handle, path, name tables) of
    the first that loads and matches this binding. Raises ImportError naming every place tried
    and why it failed when none does (a place that resolves to one tried before is named as the
    same place, not opened again); warns about the places that failed before the one used."""
    failures, tried = [], {}  # tried: the real path of each place tried -> the place's path
    # worth a warning when another place is used: the one the user named, or a library that
    # is there but does not load or match (an absent file at a usual place is not news)
    notable = []
    for where, path in places:
        if not path:
            failures.append("%s: %s" % (where, "not in a source tree (no include/parity.h "
                                         "next to python/)" if where == "build tree"
                                         else "nothing found"))
            continue
        key = os.path.realpath(path) if os.sep in path else path
        if key in tried:  # e.g. a venv's lib64, a symbolic link to its lib: named, not reopened
            failures.append("%s: %s: the same place as %s (tried above)"
                            % (where, path, tried[key]))
            continue
        tried[key] = path
        try:
            handle, tables = _open(path)
        except (OSError, ImportError) as e:
            why = str(e)
            for prefix in ("parity: ", path + ": "):
                if why.startswith(prefix):
                    why = why[len(prefix):]
            failures.append("%s: %s: %s" % (where, path, why))
            if where == "PARITY_LIBRARY" or why != "no such file":
                notable.append(failures[-1])
            continue
        if notable:
            warnings.warn("parity: using %s (%s); tried before it: %s"
                          % (path, where, "; ".join(notable)), RuntimeWarning, stacklevel=3)
        return handle, path, tables
    raise ImportError("parity: no usable libparity; tried, in order:\n  %s\n%s"
                      % ("\n  ".join(failures), _BUILD_HINT))


def _check_abi(handle, path):
    abi = handle.parity_abi_version()
    if abi != ABI_VERSION:
        raise ImportError(
            "parity: %s has ABI version %d, this binding (python/parity) mirrors ABI %d. Rebuild "
            "the library from the same source tree as the binding (ninja -C build), or use the "
            "python/parity that ships with that library." % (path, abi, ABI_VERSION))
    wrong = []
    for name, struct in MIRRORED_STRUCTS.items():
        theirs = handle.parity_struct_size(name.encode())
        if theirs != ctypes.sizeof(struct):
            wrong.append("%s is %d bytes in the library, %d in python/parity/_lib.py"
                         % (name, theirs, ctypes.sizeof(struct)))
    if wrong:
        raise ImportError(
            "parity: %s does not match this binding (%s). Both claim ABI %d, so one of them was "
            "edited without the other: rebuild the library from the same tree (ninja -C build) "
            "and, if include/parity.h changed its structs, update their mirrors in "
            "python/parity/_lib.py (and bump PARITY_ABI_VERSION)."
            % (path, "; ".join(wrong), ABI_VERSION))


# The enumerations the library names: (table, name function, from-name function). Values are
# looked for in 0 .. _ENUM_SCAN - 1.
_ENUMS = (("backends", "parity_backend_name", "parity_backend_from_name"),
          ("modes", "parity_logprob_mode_name", "parity_logprob_mode_from_name"),
          ("archs", "parity_arch_name", "parity_arch_from_name"),
          ("cpu_paths", "parity_cpu_path_name", "parity_cpu_path_from_name"))
_ENUM_SCAN = 64


def _name_table(handle, name_fn, from_fn):
    """{name: value} of one enumeration, each name read back through its from-name function
    (a name that does not give back its value, like "unknown" for a CPU path that is not one,
    is not a value of the enumeration)."""
    table = {}
    out = c_int()
    raw = handle[from_fn]  # without the errcheck: a refusal here is an answer, not an error
    raw.restype, raw.argtypes = c_int, [c_char_p, POINTER(c_int)]
    for value in range(_ENUM_SCAN):
        name = getattr(handle, name_fn)(value)
        if name is None:
            continue
        if raw(name, ctypes.byref(out)) == 0 and out.value == value:
            table[name.decode()] = value
    return table


def check_mirrors(handle, path, statuses=None, dtypes=None, defaults=None):
    """Checks what the binding mirrors of the library's enumerations against its name functions
    and returns the library's name tables {"backends": {name: value}, "modes", "archs",
    "cpu_paths"}. Checked: every status the binding raises (STATUSES) against
    parity_status_name, the dtype values (DTYPES) through parity_tensor_checksum (the same
    value as BF16, F16 and F32 must hash alike, a value past F32 be refused), and that each
    name the binding uses as a default (DEFAULT_NAMES) is one the library knows. The
    arguments replace those mirrors (for tests). Raises ImportError naming every difference."""
    statuses = STATUSES if statuses is None else statuses
    dtypes = DTYPES if dtypes is None else dtypes
    defaults = DEFAULT_NAMES if defaults is None else defaults
    wrong = []
    for name, code in statuses.items():
        theirs = handle.parity_status_name(code).decode()
        if theirs != name:
            wrong.append("status %d is %s in the library, %s in the binding" % (code, theirs, name))
    tables = {t: _name_table(handle, name_fn, from_fn) for t, name_fn, from_fn in _ENUMS}
    for table, name in defaults.items():
        if name not in tables[table]:
            wrong.append("the binding's default %s %r is not one of the library's (%s)"
                         % (table.rstrip("s").replace("_", " "), name,
                            ", ".join(tables[table]) or "none"))
    raw = handle["parity_tensor_checksum"]
    raw.restype, raw.argtypes = c_int, [c_uint32, c_void_p, c_uint64, POINTER(c_uint64)]
    one = {"BF16": b"\x80\x3f", "F16": b"\x00\x3c", "F32": b"\x00\x00\x80\x3f"}  # 1.0
    hashes = {}
    for name, value in dtypes.items():
        if name not in one:
            continue
        h = c_uint64()
        if raw(value, one[name], 1, ctypes.byref(h)) != 0:
            hashes[name] = None
        else:
            hashes[name] = h.value
    # F8_E4M3 codes: the checksum of their bytes as they are (FNV-1a 64 of the byte 0x38)
    codes = c_uint64()
    fp8_ok = "F8_E4M3" in dtypes and raw(dtypes["F8_E4M3"], b"\x38", 1, ctypes.byref(codes)) == 0 \
        and codes.value == ((0xcbf29ce484222325 ^ 0x38) * 0x100000001b3) % 2 ** 64
    if len(set(hashes.values())) != 1 or None in hashes.values() or not fp8_ok or \
            raw(max(dtypes.values()) + 1, one["F32"], 1, ctypes.byref(c_uint64())) == 0:
        wrong.append("the dtypes %s do not read 1.0 alike in parity_tensor_checksum"
                     % ", ".join("%s=%d" % kv for kv in dtypes.items()))
    if wrong:
        raise ImportError(
            "parity: %s does not match the enumerations python/parity/_lib.py mirrors: %s. "
            "Rebuild the library from the same tree as the binding (ninja -C build) or update "
            "the mirrors." % (path, "; ".join(wrong)))
    return tables


lib = None
lib, LIBRARY_PATH, _TABLES = load(candidates())

#: {name: value} of the library's backends, log-prob modes, architectures and CPU paths.
BACKENDS = _TABLES["backends"]
MODES = _TABLES["modes"]
ARCHS = _TABLES["archs"]
CPU_PATHS = _TABLES["cpu_paths"]


class Closing:
    """The life cycle of an object owning a library handle in self._handle: close() in a
    ``with`` block's exit and at garbage collection (quietly at interpreter shutdown). The
    subclass defines close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_handle", None) is not None:
                self.close()
        except Exception:  # interpreter shutdown
            pass


def null_terminated(ptr):
    """The strings of a NULL-terminated const char *const * as a list of str."""
    out, i = [], 0
    while ptr[i] is not None:
        out.append(ptr[i].decode())
        i += 1
    return out


def as_int(value, what, lo, hi):
    """`value` as an int in [lo, hi]: TypeError for a non-integer, ParityError otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s must be an integer, not %s" % (what, type(value).__name__))
    value = value.__index__()
    if not lo <= value <= hi:
        fail(ERR_INVALID_ARGUMENT, "%s = %d is outside [%d, %d]" % (what, value, lo, hi))
    return value


def as_float(value, what):
    """`value` as a Python float: TypeError for a non-number."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError("%s must be a number, not %s" % (what, type(value).__name__))
    return float(value)


def as_choice(table, value, what):
    """table[value] for a name `value` of the {name: value} table: TypeError for a non-string,
    ParityError for a name the table lacks."""
    if not isinstance(value, str):
        raise TypeError("%s must be one of %s, not %s" % (what, ", ".join(table),
                                                          type(value).__name__))
    try:
        return table[value]
    except KeyError:
        raise ParityError(ERR_INVALID_ARGUMENT, "%s must be one of %s, not %r"
                          % (what, ", ".join(table), value)) from None
