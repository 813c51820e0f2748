"""Where an engine's rounding departs from a policy: the bisect of an intermediates dump.

A dump (docs/DESIGN.md, "Intermediates dump and bisect") is one safetensors file holding an
engine's intermediates for one sequence of T tokens: the residual stream, every norm, the
projections, q/k-norm, RoPE, attention, SwiGLU, the router, the logits and the log-probs, each
[T, width] in the 16-bit dtype the engine held them. For each preset, every rounding point is
recomputed by libparity's public ops from the dump's OWN inputs to that point (teacher forcing:
a departure at one point does not propagate to the next) and compared bit for bit:

    report = parity.bisect.bisect("models/qwen3", "dump.safetensors")
    for p in report["presets"]:
        print(p["preset"], p["first_departure"], p["after_fraction"])

    python3 -m parity.bisect --model DIR --dump FILE [--policy P]... [--between A B] [--json]

prints a table per preset (or the report as JSON, byte for byte what the C program
parity-bisect prints). `--between A B` attributes the k3 KL and bias between two policies'
log-probs of the dump's tokens to the switches where they differ (attribute()).

Standard library and the binding only (numpy is not needed). Bad input raises DumpError (a
ValueError) naming the tensor, shape, dtype or metadata field, or ParityError from the library
(an unknown preset, a token out of range).
"""
import argparse
import ctypes
import json
import math
import struct
import sys
from array import array

from . import _lib, _safetensors
from ._lib import ParityError, lib
from .model import Model
from .policy import POLICY_FIELDS, policies, policy_struct
from .regions import to_bf16

__all__ = ["bisect", "attribute", "to_json", "table", "DumpError", "FORMAT_VERSION", "main"]

#: The dump format this bisect reads (`parity_dump` in the file's __metadata__).
FORMAT_VERSION = "1"

#: The kinds of rounding points (every kind but "gemm", which measures the summation-order
#: floor and never counts as a departure).
ROUNDING_KINDS = ("norm", "residual", "qk_norm", "rope", "attention", "swiglu", "moe_route",
                  "logits")

_BF16, _F16, _F32 = 0, 1, 2   # parity_dtype
_COMPUTE_FP32, _COMPUTE_FP16 = 1, 2


class DumpError(ValueError):
    """A dump that does not fit the model or the format: the message names the file and the
    tensor, shape, dtype or metadata field."""


# ---- the dump ------------------------------------------------------------------------------------

def _shape_text(shape):
    return "[%s]" % ", ".join(str(d) for d in shape)


def _sparse(cfg, layer):
    return cfg["num_experts"] > 0 and (layer + 1) % max(cfg["decoder_sparse_step"], 1) == 0 \
        and layer not in cfg["mlp_only_layers"]


def expected_tensors(cfg, T, half):
    """[(name, dtype, shape, optional)] of a dump of T tokens for a model of config cfg (the
    Model.config dict), in forward order; half: "BF16" or "F16", the 16-bit tensors' dtype."""
    H, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("tokens", "I32", (T,), False), ("logprobs", "F32", (T - 1,), False),
           ("embed", half, (T, H), False)]
    for i in range(cfg["num_hidden_layers"]):
        L = "layers.%d." % i
        names = ([] if i == 0 else [("input", H)]) + [
            ("attn_norm", H), ("q_proj", q), ("k_proj", kv), ("v_proj", kv)]
        if cfg["qk_norm"]:
            names += [("q_norm", q), ("k_norm", kv)]
        names += [("q_rope", q), ("k_rope", kv), ("attn", q), ("o_proj", H),
                  ("attn_residual", H), ("mlp_norm", H)]
        out += [(L + n, half, (T, w), False) for n, w in names]
        if _sparse(cfg, i):
            k = cfg["num_experts_per_tok"]
            out += [(L + "router_logits", half, (T, cfg["num_experts"]), False),
                    (L + "router_ids", "I32", (T, k), True),
                    (L + "router_weights", "F32", (T, k), True)]
        else:
            inter = cfg["intermediate_size"]
            out += [(L + "gate_proj", half, (T, inter), False),
                    (L + "up_proj", half, (T, inter), False),
                    (L + "swiglu", half, (T, inter), False)]
        out.append((L + "mlp", half, (T, H), False))
    out += [("final_residual", half, (T, H), False), ("final_norm", half, (T, H), False),
            ("logits", half, (T, cfg["vocab_size"]), False)]
    return out


def check_model(cfg):
    """DumpError if the bisect cannot recompute this model's points."""
    if cfg["arch"] == "ouro":
        raise DumpError("the model is a looped model (ouro): the bisect recomputes a plain "
                        "decoder stack only")
    if cfg["rope_type"] != "default":
        raise DumpError("the model's rope scaling (%s) is not supported: the bisect recomputes "
                        "default RoPE only" % cfg["rope_type"])


class Dump:
    """A dump read and checked against a model's config: .tensors {name: (dtype, shape,
    memoryview)}, .metadata, .half ("bf16" or "f16"), .T, .tokens (array('i'))."""

    def __init__(self, path, cfg):
        self.path = path
        with open(path, "rb") as f:
            data = f.read()
        meta = _safetensors.metadata(data, path)
        self.tensors = _safetensors.parse(data, path)
        version = meta.get("parity_dump")
        if version is None:
            raise DumpError("%s: __metadata__ has no parity_dump (not an intermediates dump)"
                            % path)
        if version != FORMAT_VERSION:
            raise DumpError("%s: __metadata__ parity_dump is %s: this bisect reads format %s"
                            % (path, json.dumps(version), FORMAT_VERSION))
        for field in ("engine", "model_type", "dtype"):
            if field not in meta:
                raise DumpError("%s: __metadata__ has no %s" % (path, field))
        if meta["dtype"] not in ("bf16", "f16"):
            raise DumpError('%s: __metadata__ dtype is %s: "bf16" or "f16"'
                            % (path, json.dumps(meta["dtype"])))
        if meta["model_type"] != cfg["arch"]:
            raise DumpError("%s: __metadata__ model_type is %s, the model is %s"
                            % (path, json.dumps(meta["model_type"]), cfg["arch"]))
        check_model(cfg)
        self.metadata, self.half = meta, meta["dtype"]
        tokens = self.tensors.get("tokens")
        if tokens is None:
            raise DumpError("%s: no tensor tokens in the dump" % path)
        if tokens[0] != "I32" or len(tokens[1]) != 1:
            raise DumpError("%s: tensor tokens is %s %s: I32 [T] needed"
                            % (path, tokens[0], _shape_text(tokens[1])))
        self.T = T = tokens[1][0]
        if T < 2:
            raise DumpError("%s: tensor tokens holds %d ids: a dump needs at least 2" % (path, T))
        want = expected_tensors(cfg, T, "BF16" if self.half == "bf16" else "F16")
        for name, dtype, shape, optional in want:
            got = self.tensors.get(name)
            if got is None:
                if optional:
                    continue
                raise DumpError("%s: no tensor %s in the dump (the model needs %s %s)"
                                % (path, name, dtype, _shape_text(shape)))
            if got[0] != dtype:
                raise DumpError("%s: tensor %s has dtype %s, the model needs %s"
                                % (path, name, got[0], dtype))
            if tuple(got[1]) != shape:
                raise DumpError("%s: tensor %s has shape %s, the model needs %s"
                                % (path, name, _shape_text(got[1]), _shape_text(shape)))
        known = {w[0] for w in want}
        for name in self.tensors:
            if name not in known:
                raise DumpError("%s: tensor %s is not one this model has (%s, %d layers)"
                                % (path, name, cfg["arch"], cfg["num_hidden_layers"]))
        self.tokens = array("i")
        self.tokens.frombytes(bytes(tokens[2]))
        for t, tok in enumerate(self.tokens):
            if not 0 <= tok < cfg["vocab_size"]:
                raise DumpError("%s: tokens[%d] = %d is outside the model's vocabulary [0, %d)"
                                % (path, t, tok, cfg["vocab_size"]))

    def raw(self, name):
        return bytes(self.tensors[name][2])

    def has(self, name):
        return name in self.tensors

    def summary(self):
        out = {k: self.metadata[k] for k in sorted(self.metadata)}
        out["tokens"] = self.T
        return out


# ---- 16-bit values ------------------------------------------------------------------------------

def _numpy():
    """numpy if it is installed (the conversions and counts run faster on it), else None."""
    if _NUMPY[0] is False:
        try:
            import numpy
        except ImportError:
            numpy = None
        _NUMPY[0] = numpy
    return _NUMPY[0]


_NUMPY = [False]   # not looked for yet; tests set it to None to run the standard-library path


def _widen(raw, half):
    """array('f') of the 16-bit values (bytes, little-endian) of the dtype `half`, exact."""
    n = len(raw) // 2
    out = array("f")
    if half == "f16":
        np = _numpy()
        if np is not None:
            out.frombytes(np.frombuffer(raw, dtype="<f2").astype(np.float32).tobytes())
            return out
        return array("f", struct.unpack("<%de" % n, raw))
    wide = bytearray(4 * n)
    wide[2::4] = raw[0::2]
    wide[3::4] = raw[1::2]
    out.frombytes(bytes(wide))
    return out


def _round(values, half, finite=False):
    """array('H') of fp32 values rounded to the dtype `half` (nearest even, as the library:
    every NaN to 0x7fc0 in bf16, 0x7e00 in fp16; overflow to infinity). finite: the values
    are known finite (a model's weights), so bf16 values already are taken as they are."""
    out = array("H")
    np = _numpy()
    if np is not None:
        x = np.frombuffer(values, dtype=np.float32)
        nan = np.isnan(x)
        if half == "f16":
            with np.errstate(over="ignore"):
                h = x.astype(np.float16).view(np.uint16)
            h = np.where(nan, np.uint16(0x7E00), h)
        else:
            u = x.view(np.uint32).astype(np.uint64)
            h = np.where(nan, 0x7FC0, (u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        out.frombytes(h.astype("<u2").tobytes())
        return out
    if half == "f16":
        return array("H", map(lib.parity_fp16_from_f32, values))
    raw = values.tobytes()
    if finite and raw[0::4].count(0) + raw[1::4].count(0) == len(raw) // 2:  # bf16 already
        narrow = bytearray(len(raw) // 2)
        narrow[0::2] = raw[2::4]
        narrow[1::2] = raw[3::4]
        out.frombytes(bytes(narrow))
        return out
    return to_bf16(values)


def _differing(got, want):
    """How many elements of two equal-length arrays differ (bitwise for the arrays given)."""
    if got == want:
        return 0
    np = _numpy()
    if np is not None and got.itemsize == want.itemsize:
        return int(np.count_nonzero(np.frombuffer(got, dtype="u%d" % got.itemsize)
                                    != np.frombuffer(want, dtype="u%d" % want.itemsize)))
    return sum(1 for a, b in zip(got, want) if a != b)


def _u16(raw):
    out = array("H")
    out.frombytes(raw)
    return out


def _bits32(values):
    out = array("I")
    out.frombytes(values.tobytes() if isinstance(values, array) else bytes(values))
    return out


def _ptr(a, ctype=None):
    """The address of an array's first element: a void pointer, or a POINTER(ctype)."""
    if ctype is not None:
        return ctypes.cast(a.buffer_info()[0], ctypes.POINTER(ctype))
    return ctypes.c_void_p(a.buffer_info()[0]) if len(a) else None


def _h(a):
    return _ptr(a, ctypes.c_uint16)


# ---- the points ----------------------------------------------------------------------------------

class _Weights:
    """The model's weights by checkpoint name, as a policy's ops read them: fp32 values (the
    masters where the model has them, else its bf16 values widened), rounded once to bf16 or
    fp16 for a 16-bit reader."""

    def __init__(self, model, cfg):
        self.model, self.cfg = model, cfg
        self.values, self.rounded = {}, {}

    def f32(self, name, n):
        a = self.values.get(name)
        if a is None:
            a = array("f", bytes(4 * n))
            handle = self.model._acquire()
            try:
                lib.parity_model_weight_values(handle, name.encode(), _ptr(a), n)
            finally:
                self.model._release()
            self.values[name] = a
        return a

    def half(self, name, n, half):
        key = (name, half)
        a = self.rounded.get(key)
        if a is None:
            a = self.rounded[key] = _round(self.f32(name, n), half, finite=True)
        return a


class _Run:
    """One preset's recomputation of a dump's points."""

    def __init__(self, dump, weights, cfg, name, pool):
        self.dump, self.w, self.cfg, self.name, self.pool = dump, weights, cfg, name, pool
        self.pol = policy_struct(name)
        if self.pol.compute == _COMPUTE_FP32 and dump.half == "f16":
            raise DumpError("%s: policy %s computes in fp32: it keeps no fp16 values to compare "
                            "with an F16 dump" % (dump.path, name))
        if self.pol.compute == _COMPUTE_FP16 and dump.half == "bf16":
            raise DumpError("%s: policy %s rounds to fp16; the dump holds BF16 values"
                            % (dump.path, name))
        # the 16-bit dtype of the kernels' buffers (bf16 under compute "fp32": its stores)
        self.half = dump.half
        # lm_head and the router are never quantized: a bf16 gemm for them
        self.plain = _lib.parity_policy.from_buffer_copy(self.pol)
        self.plain.gemm = self.plain.quantizer = 0
        self.eps = cfg["rms_norm_eps"]
        self.points = []

    def add(self, name, kind, got, want):
        differing = _differing(got, want)
        self.points.append({"name": name, "kind": kind, "elements": len(want),
                            "differing": differing, "fraction": differing / len(want)})

    def u16(self, name):
        return _u16(self.dump.raw(name))

    def wide(self, name):
        return _widen(self.dump.raw(name), self.dump.half)

    def norm_weight(self, name):
        return self.w.half(name, self.cfg["hidden_size"], self.half)

    # the points, each from the dump's own inputs

    def norm(self, x, weight, out_name):
        T, H = self.dump.T, self.cfg["hidden_size"]
        xb, out = self.u16(x), array("H", bytes(2 * T * H))
        lib.parity_rmsnorm(ctypes.byref(self.pol), 0, T, H, _h(xb), H,
                           _h(self.norm_weight(weight)), self.eps, _h(out), H)
        self.add(out_name, "norm", out, self.u16(out_name))

    def residual_norm(self, delta, residual, weight, residual_name, norm_name):
        T, H = self.dump.T, self.cfg["hidden_size"]
        d, r = self.u16(delta), self.u16(residual)
        res, out = array("H", bytes(2 * T * H)), array("H", bytes(2 * T * H))
        lib.parity_rmsnorm_residual(ctypes.byref(self.pol), T, H, _h(d), H, _h(r), H,
                                    _h(self.norm_weight(weight)), self.eps, _h(res), H,
                                    _h(out), H)
        self.add(residual_name, "residual", res, self.u16(residual_name))
        self.add(norm_name, "norm", out, self.u16(norm_name))

    def linear(self, x, weight, n, out_name, bias=None, plain=False):
        """parity_linear of the dump's x by `weight` [n, k], rounded to the dump's dtype."""
        T = self.dump.T
        xs = self.wide(x)
        k = len(xs) // T
        pol = self.plain if plain else self.pol
        if pol.compute == _COMPUTE_FP32 or pol.gemm:
            wd, wt = _F32, self.w.f32(weight, n * k)
        else:
            wd, wt = (_F16, self.w.half(weight, n * k, "f16")) if pol.compute == _COMPUTE_FP16 \
                else (_BF16, self.w.half(weight, n * k, "bf16"))
        b = None
        if bias is not None:
            b = self.w.f32(bias, n)
            if pol.compute != _COMPUTE_FP32:
                b = _widen(self.w.half(bias, n, self.half).tobytes(), self.half)
        y = array("f", bytes(4 * T * n))
        lib.parity_linear(self.pool, ctypes.byref(pol), 0, T, k, n, _ptr(xs), k, wd, _ptr(wt), k,
                          _ptr(b) if b is not None else None, _ptr(y), n)
        self.add(out_name, "gemm", _round(y, self.half), self.u16(out_name))

    def qk_norm(self, x, weight, heads, out_name):
        T, hd = self.dump.T, self.cfg["head_dim"]
        xb, out = self.u16(x), array("H", bytes(2 * T * heads * hd))
        lib.parity_rmsnorm(ctypes.byref(self.pol), 1, T * heads, hd, _h(xb), hd,
                           _h(self.w.half(weight, hd, self.half)), self.eps, _h(out), hd)
        self.add(out_name, "qk_norm", out, self.u16(out_name))

    def rope(self, x, heads, out_name):
        T, hd = self.dump.T, self.cfg["head_dim"]
        xb = self.u16(x)
        positions = array("i", range(T))
        lib.parity_rope(ctypes.byref(self.pol), T, heads, hd, _h(xb), heads * hd,
                        _ptr(positions, ctypes.c_int32), self.cfg["rope_theta"])
        self.add(out_name, "rope", xb, self.u16(out_name))

    def attention(self, prefix):
        T, hd = self.dump.T, self.cfg["head_dim"]
        nq, nkv = self.cfg["num_attention_heads"], self.cfg["num_key_value_heads"]
        q, k, v = (self.wide(prefix + n) for n in ("q_rope", "k_rope", "v_proj"))
        out = array("f", bytes(4 * T * nq * hd))
        lengths = (ctypes.c_uint32 * 1)(T)
        lib.parity_attention(self.pool, ctypes.byref(self.pol), 1, lengths, nq, nkv, hd,
                             _ptr(q), nq * hd, _ptr(k), nkv * hd, _ptr(v), nkv * hd, _ptr(out),
                             nq * hd)
        self.add(prefix + "attn", "attention", _round(out, self.half), self.u16(prefix + "attn"))

    def swiglu(self, prefix):
        T, inter = self.dump.T, self.cfg["intermediate_size"]
        g, u = self.u16(prefix + "gate_proj"), self.u16(prefix + "up_proj")
        out = array("H", bytes(2 * T * inter))
        lib.parity_swiglu(ctypes.byref(self.pol), T, inter, _h(g), inter, _h(u), inter,
                          _h(out), inter)
        self.add(prefix + "swiglu", "swiglu", out, self.u16(prefix + "swiglu"))

    def route(self, prefix):
        T, E, k = self.dump.T, self.cfg["num_experts"], self.cfg["num_experts_per_tok"]
        logits = self.wide(prefix + "router_logits")
        ids, weights = array("H", bytes(2 * T * k)), array("f", bytes(4 * T * k))
        lib.parity_moe_route(ctypes.byref(self.pol), T, E, k, 1 if self.cfg["norm_topk_prob"]
                             else 0, _ptr(logits), E, None, _ptr(ids), _ptr(weights))
        if self.dump.has(prefix + "router_ids"):
            want = array("i")
            want.frombytes(self.dump.raw(prefix + "router_ids"))
            self.add(prefix + "router_ids", "moe_route", array("i", ids), want)
        if self.dump.has(prefix + "router_weights"):
            self.add(prefix + "router_weights", "moe_route", _bits32(weights),
                     _bits32(self.dump.raw(prefix + "router_weights")))

    def logprobs(self):
        T, V = self.dump.T, self.cfg["vocab_size"]
        logits = self.wide("logits")
        targets = array("i", self.dump.tokens[1:])
        lp = array("f", bytes(4 * (T - 1)))
        options = _lib.parity_score_options()
        lib.parity_score_default_options(ctypes.byref(options))
        lib.parity_logprobs_from_logits(self.pool, ctypes.byref(self.pol), ctypes.byref(options),
                                        T - 1, V, _ptr(logits), V, _ptr(targets), _ptr(lp), None)
        self.add("logprobs", "logits", _bits32(lp), _bits32(self.dump.raw("logprobs")))

    def run(self):
        cfg = self.cfg
        hd = cfg["head_dim"]
        nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        H = cfg["hidden_size"]
        for i in range(cfg["num_hidden_layers"]):
            L, W = "layers.%d." % i, "model.layers.%d." % i
            if i == 0:
                self.norm("embed", W + "input_layernorm.weight", L + "attn_norm")
            else:
                P = "layers.%d." % (i - 1)
                self.residual_norm(P + "mlp", P + "attn_residual", W + "input_layernorm.weight",
                                   L + "input", L + "attn_norm")
            bias = cfg["attention_bias"]
            for proj, n in (("q_proj", nq * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
                self.linear(L + "attn_norm", W + "self_attn.%s.weight" % proj, n, L + proj,
                            bias=W + "self_attn.%s.bias" % proj if bias else None)
            q, k = L + "q_proj", L + "k_proj"
            if cfg["qk_norm"]:
                self.qk_norm(q, W + "self_attn.q_norm.weight", nq, L + "q_norm")
                self.qk_norm(k, W + "self_attn.k_norm.weight", nkv, L + "k_norm")
                q, k = L + "q_norm", L + "k_norm"
            self.rope(q, nq, L + "q_rope")
            self.rope(k, nkv, L + "k_rope")
            self.attention(L)
            self.linear(L + "attn", W + "self_attn.o_proj.weight", H, L + "o_proj")
            self.residual_norm(L + "o_proj", "embed" if i == 0 else L + "input",
                               W + "post_attention_layernorm.weight", L + "attn_residual",
                               L + "mlp_norm")
            if _sparse(cfg, i):
                self.linear(L + "mlp_norm", W + "mlp.gate.weight", cfg["num_experts"],
                            L + "router_logits", plain=True)
                self.route(L)
            else:
                inter = cfg["intermediate_size"]
                self.linear(L + "mlp_norm", W + "mlp.gate_proj.weight", inter, L + "gate_proj")
                self.linear(L + "mlp_norm", W + "mlp.up_proj.weight", inter, L + "up_proj")
                self.swiglu(L)
                self.linear(L + "swiglu", W + "mlp.down_proj.weight", H, L + "mlp")
        last = "layers.%d." % (cfg["num_hidden_layers"] - 1)
        self.residual_norm(last + "mlp", last + "attn_residual", "model.norm.weight",
                           "final_residual", "final_norm")
        head = "model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"
        self.linear("final_norm", head, cfg["vocab_size"], "logits", plain=True)
        self.logprobs()
        return self.report()

    def report(self):
        points = self.points
        first = next((i for i, p in enumerate(points)
                      if p["kind"] != "gemm" and p["differing"]), None)
        after = [p for p in points[first:] if p["kind"] != "gemm"] if first is not None else []
        after_elements = sum(p["elements"] for p in after)
        kinds = {}
        for p in points:
            k = kinds.setdefault(p["kind"], {"elements": 0, "differing": 0})
            k["elements"] += p["elements"]
            k["differing"] += p["differing"]
        gemm = kinds.get("gemm", {"elements": 0, "differing": 0})
        return {"preset": self.name, "points": points,
                "first_departure": dict(points[first]) if first is not None else None,
                "after_fraction": sum(p["differing"] for p in after) / after_elements
                if after_elements else 0.0,
                "kinds": kinds,
                "gemm_floor": (gemm["elements"] - gemm["differing"]) / gemm["elements"]
                if gemm["elements"] else 1.0}


# ---- the entry points -------------------------------------------------------------------------

class _Opened:
    """The model of a bisect call: the caller's parity.Model, or one opened from a path (and
    closed on exit)."""

    def __init__(self, model, threads):
        self.own = not isinstance(model, Model)
        self.model = Model(model, threads=threads or 1) if self.own else model

    def __enter__(self):
        return self.model

    def __exit__(self, *exc):
        if self.own:
            self.model.close()


def _threads(threads):
    return 1 if threads is None else _lib.as_int(threads, "threads", 1, 256)


def preset_name(name, dump):
    """The policy a preset runs as on a dump: a bf16 one as NAME+fp16 on an F16 dump."""
    if dump.half == "f16" and policy_struct(name).compute == 0:
        return name + "+fp16"
    return name


def bisect(model, dump, presets=None, threads=None):
    """The bisect report of the dump at path `dump` for the model (a checkpoint directory,
    "synthetic:NAME[:SEED]", or a parity.Model) under each of `presets` (policy names; None:
    every preset, parity.policies(), run as PRESET+fp16 on an F16 dump, where fp32 is
    skipped). Returns {"dump": {the metadata..., "tokens": T}, "presets": [{"preset", "points":
    [{"name", "kind", "elements", "differing", "fraction"}...] in forward order,
    "first_departure": None or the first rounding point (non-gemm) that differs,
    "after_fraction": differing / elements over the rounding points from it on (0.0 if none),
    "kinds": {kind: {"elements", "differing"}}, "gemm_floor": the fraction of gemm elements
    equal}]}. Raises DumpError (a ValueError) or ParityError naming what is wrong."""
    threads = _threads(threads)
    with _Opened(model, threads) as m:
        cfg = m.config
        d = Dump(dump, cfg)
        if presets is None:
            names = [preset_name(p, d) for p in policies() if not (d.half == "f16" and p == "fp32")]
        else:
            if isinstance(presets, str):
                raise TypeError("presets must be a list of policy names, not a str")
            names = [preset_name(p, d) for p in presets]
        weights = _Weights(m, cfg)
        pool = _lib.pool_p()
        lib.parity_pool_create(threads, ctypes.byref(pool))
        try:
            reports = [_Run(d, weights, cfg, name, pool).run() for name in names]
        finally:
            lib.parity_pool_free(pool)
        return {"dump": d.summary(), "presets": reports}


def _metrics(base, other):
    """{"k3", "bias"} of log-probs `other` against `base` (bench/mismatch.h's definitions:
    d = other - base, bias = mean d, k3 = mean(exp(d) - d - 1) over the positions where both
    are finite; None where there is none)."""
    s_r = s_k3 = 0.0
    n = 0
    for a, b in zip(base, other):
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        d = b - a
        s_r += d
        s_k3 += math.exp(d) - d - 1
        n += 1
    if not n:
        return {"k3": None, "bias": None}
    return {"k3": s_k3 / n, "bias": s_r / n}


def _minus(a, b):
    return {k: (a[k] - b[k] if a[k] is not None and b[k] is not None else None) for k in a}


def attribute(model, dump, a, b, threads=None):
    """Switch attribution between policies a and b (names) on the dump's tokens: parity_score's
    raw log-probs under a, under b, and under each policy on the way: the switches where a and
    b differ flipped from a toward b one at a time in the policy's field order. Returns
    {"dump": {...}, "between": {"a", "b", "positions": T - 1, "total": {"k3", "bias"} of b
    against a, "switches": [{"switch", "a", "b" (the values), "cumulative": {"k3", "bias"} of
    the policy with this and the earlier switches flipped against a, "increment": its
    cumulative minus the previous one (the increments add up to the total), "alone": this
    switch flipped alone against a}]}}."""
    threads = _threads(threads)
    with _Opened(model, threads) as m:
        d = Dump(dump, m.config)
        pa, pb = policy_struct(a), policy_struct(b)
        tokens = list(d.tokens)

        def score(pol):
            return array("f", m.score(tokens, policy=_as_policy(pol), threads=threads))

        base = score(pa)
        switches, previous = [], {"k3": 0.0, "bias": 0.0}
        cumulative = _lib.parity_policy.from_buffer_copy(pa)
        for field in POLICY_FIELDS:
            if getattr(pa, field) == getattr(pb, field):
                continue
            setattr(cumulative, field, getattr(pb, field))
            alone = _lib.parity_policy.from_buffer_copy(pa)
            setattr(alone, field, getattr(pb, field))
            cum = _metrics(base, score(cumulative))
            switches.append({"switch": field, "a": getattr(pa, field), "b": getattr(pb, field),
                             "cumulative": cum, "increment": _minus(cum, previous),
                             "alone": _metrics(base, score(alone))})
            previous = cum
        total = switches[-1]["cumulative"] if switches else {"k3": 0.0, "bias": 0.0}
        return {"dump": d.summary(),
                "between": {"a": a, "b": b, "positions": d.T - 1, "total": dict(total),
                            "switches": switches}}


def _as_policy(c):
    from .policy import Policy
    return Policy(**{f: getattr(c, f) for f in POLICY_FIELDS})


# ---- output ------------------------------------------------------------------------------------

def _json(value):
    """JSON text of a report value, as the C program parity-bisect writes it: ", " and ": "
    separators, floats as "%.9g" (null where not finite), strings ASCII-escaped."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "%.9g" % value if math.isfinite(value) else "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s: %s" % (json.dumps(k), _json(v)) for k, v in value.items())
    return "[%s]" % ", ".join(_json(v) for v in value)


def to_json(report):
    """The report (bisect()'s or attribute()'s) as the JSON line parity-bisect --json prints."""
    return _json(report) + "\n"


def _percent(x):
    return "%.1f%%" % (100.0 * x)


def table(report):
    """The report as the readable text parity-bisect prints without --json."""
    d = report["dump"]
    lines = ["dump: %s, %s, %s, %d tokens" % (d.get("engine", ""), d.get("model_type", ""),
                                             d.get("dtype", ""), d["tokens"])]
    if "between" in report:
        b = report["between"]
        lines.append("%s -> %s over %d positions: k3 %s, bias %s"
                     % (b["a"], b["b"], b["positions"], _g(b["total"]["k3"]),
                        _g(b["total"]["bias"])))
        lines.append("  %-14s %9s %14s %14s %14s %14s" % ("switch", "a -> b", "k3 increment",
                                                        "bias increment", "k3 alone",
                                                        "bias alone"))
        for s in b["switches"]:
            lines.append("  %-14s %9s %14s %14s %14s %14s"
                         % (s["switch"], "%d -> %d" % (s["a"], s["b"]),
                            _g(s["increment"]["k3"]), _g(s["increment"]["bias"]),
                            _g(s["alone"]["k3"]), _g(s["alone"]["bias"])))
        return "\n".join(lines) + "\n"
    for p in report["presets"]:
        f = p["first_departure"]
        floor = "gemm floor %s equal" % _percent(p["gemm_floor"])
        if f is None:
            lines.append("%s: every rounding point bitwise (%s)" % (p["preset"], floor))
        else:
            lines.append("%s: departs at %s (%s, %s of elements); %s of rounding-point elements "
                         "differ from there on (%s)"
                         % (p["preset"], f["name"], f["kind"], _percent(f["fraction"]),
                            _percent(p["after_fraction"]), floor))
        for kind, k in p["kinds"].items():
            lines.append("  %-10s %12d elements %12d differ (%s)"
                         % (kind, k["elements"], k["differing"],
                            _percent(k["differing"] / k["elements"] if k["elements"] else 0.0)))
    return "\n".join(lines) + "\n"


def _g(x):
    return "%.6g" % x if x is not None and math.isfinite(x) else "-"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m parity.bisect",
                                 description="Where an engine's intermediates depart from each "
                                             "preset's rounding points.")
    ap.add_argument("--model", required=True, help="checkpoint directory or synthetic:NAME")
    ap.add_argument("--dump", required=True, help="the intermediates dump (.safetensors)")
    ap.add_argument("--policy", action="append", help="a preset to run (repeatable; default: "
                    "every preset)")
    ap.add_argument("--between", nargs=2, metavar=("A", "B"),
                    help="attribute the k3 KL and bias between policies A and B to switches")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    try:
        if args.between:
            report = attribute(args.model, args.dump, args.between[0], args.between[1],
                               threads=args.threads)
        else:
            report = bisect(args.model, args.dump, presets=args.policy, threads=args.threads)
    except (ParityError, ValueError, OSError) as e:
        sys.stderr.write("error: %s\n" % e)
        return 2
    sys.stdout.write(to_json(report) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
