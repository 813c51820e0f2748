"""An intermediates dump (docs/DESIGN.md, "Intermediates dump and bisect") written by libparity
itself: a free-running forward composed from the binding's forward pieces and region kernels
under one policy (as test/test_ops.c composes it), every intermediate kept as the dump format
names it. Its log-probs equal parity_score's under that policy bit for bit (the tests check
it), so the bisect must find every rounding point of that policy bitwise in it.

    write_dump(model, tokens, "hf-eager", path)   # model: a parity.Model

Needs numpy. Used by test_bisect.py; not part of the package.
"""
import ctypes

import numpy as np

from parity import _safetensors
from parity._lib import lib, parity_policy, parity_score_options, pool_p
from parity.policy import policy_struct

_BF16, _F16, _F32 = 0, 1, 2


def _ptr(a, ctype=None):
    if ctype is not None:
        return ctypes.cast(a.ctypes.data, ctypes.POINTER(ctype))
    return ctypes.c_void_p(a.ctypes.data)


def _h(a):
    return _ptr(a, ctypes.c_uint16)


def round16(x, half):
    """uint16 bit patterns of fp32 values rounded to nearest even (NaN quiet, as the library)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if half == "f16":
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def widen(bits, half):
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    if half == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


class _Forward:
    def __init__(self, model, policy, half, pool):
        self.m, self.cfg = model, model.config
        self.pol, self.half, self.pool = policy_struct(policy), half, pool
        self.plain = parity_policy.from_buffer_copy(self.pol)
        self.plain.gemm = self.plain.quantizer = 0
        self.eps = self.cfg["rms_norm_eps"]
        self.cache = {}

    def values(self, name):
        if name not in self.cache:
            handle = self.m._acquire()
            try:
                n = self._count(name)
                a = np.zeros(n, dtype=np.float32)
                lib.parity_model_weight_values(handle, name.encode(), _ptr(a), n)
            finally:
                self.m._release()
            self.cache[name] = a
        return self.cache[name]

    def _count(self, name):
        c = self.cfg
        H, hd = c["hidden_size"], c["head_dim"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        leaf = name.split(".")[-2] + "." + name.split(".")[-1]
        moe_i, sh_i = c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            return H
        if leaf in ("q_norm.weight", "k_norm.weight"):
            return hd
        if name in ("lm_head.weight", "model.embed_tokens.weight"):
            return c["vocab_size"] * H
        sizes = {"q_proj.weight": q * H, "k_proj.weight": kv * H, "v_proj.weight": kv * H,
                 "o_proj.weight": H * q, "q_proj.bias": q, "k_proj.bias": kv, "v_proj.bias": kv,
                 "gate.weight": c["num_experts"] * H, "shared_expert_gate.weight": H}
        if leaf in sizes:
            return sizes[leaf]
        inter = c["intermediate_size"]
        if ".experts." in name:
            inter = moe_i
        elif ".shared_expert." in name:
            inter = sh_i
        return inter * H

    def w16(self, name):
        """The weight rounded to the 16-bit dtype, kept (a pointer the C calls read must not
        outlive its array)."""
        key = (name, "16")
        if key not in self.cache:
            self.cache[key] = round16(self.values(name), self.half)
        return self.cache[key]

    def linear(self, x, name, n, bias=None, plain=False):
        """The fp32, unrounded x W^T (+ bias) of parity_linear."""
        pol = self.plain if plain else self.pol
        T, k = x.shape
        if pol.gemm:
            wd, w = _F32, self.values(name)
        else:
            wd, w = (_F16 if self.half == "f16" else _BF16), self.w16(name)
        b = widen(self.w16(bias), self.half) if bias else None
        y = np.zeros((T, n), dtype=np.float32)
        x = np.ascontiguousarray(x, dtype=np.float32)
        lib.parity_linear(self.pool, ctypes.byref(pol), 0, T, k, n, _ptr(x), k, wd, _ptr(w), k,
                          _ptr(b) if b is not None else None, _ptr(y), n)
        return y

    def rmsnorm(self, x16, name, rows, dim, qk=0):
        out = np.zeros(rows * dim, dtype=np.uint16)
        x16 = np.ascontiguousarray(x16, dtype=np.uint16)
        lib.parity_rmsnorm(ctypes.byref(self.pol), qk, rows, dim, _h(x16), dim,
                           _h(self.w16(name)), self.eps, _h(out), dim)
        return out.reshape(x16.shape)

    def residual_norm(self, delta16, residual16, name):
        T, H = residual16.shape
        res, out = np.zeros((T, H), np.uint16), np.zeros((T, H), np.uint16)
        d, r = np.ascontiguousarray(delta16), np.ascontiguousarray(residual16)
        lib.parity_rmsnorm_residual(ctypes.byref(self.pol), T, H, _h(d), H, _h(r), H,
                                    _h(self.w16(name)), self.eps, _h(res), H, _h(out), H)
        return res, out

    def swiglu(self, g16, u16):
        T, inter = g16.shape
        out = np.zeros((T, inter), np.uint16)
        g, u = np.ascontiguousarray(g16), np.ascontiguousarray(u16)
        lib.parity_swiglu(ctypes.byref(self.pol), T, inter, _h(g), inter, _h(u), inter,
                          _h(out), inter)
        return out

    def mlp16(self, x16, prefix, n_out):
        """gate, up (rounded), swiglu, and the down projection's fp32 output."""
        x = widen(x16, self.half)
        inter = self._count(prefix + "gate_proj.weight") // x.shape[1]
        g = round16(self.linear(x, prefix + "gate_proj.weight", inter), self.half)
        u = round16(self.linear(x, prefix + "up_proj.weight", inter), self.half)
        s = self.swiglu(g, u)
        return g, u, s, self.linear(widen(s, self.half), prefix + "down_proj.weight", n_out)


def write_dump(model, tokens, policy, path, engine="libparity test/python/dump_writer.py"):
    """Writes the dump of `tokens` (a list of ids) under `policy` for the parity.Model `model`
    to `path`; returns {name: the 16-bit (uint16), I32 or F32 array} written. The dtype is F16
    under compute "fp16", else BF16."""
    pol = policy_struct(policy)
    half = "f16" if pol.compute == 2 else "bf16"
    pool = pool_p()
    lib.parity_pool_create(1, ctypes.byref(pool))
    try:
        out = _write(model, tokens, policy, half, pool)
    finally:
        lib.parity_pool_free(pool)
    dt = "F16" if half == "f16" else "BF16"
    tensors = []
    for name, a in out.items():
        dtype = {np.int32: "I32", np.float32: "F32", np.uint16: dt}[a.dtype.type]
        tensors.append((name, dtype, a.shape, np.ascontiguousarray(a).tobytes()))
    _safetensors.write(path, tensors, {"parity_dump": "1", "engine": engine,
                                       "model_type": model.config["arch"], "dtype": half})
    return out


def _write(model, tokens, policy, half, pool):
    f = _Forward(model, policy, half, pool)
    c = f.cfg
    T, H, hd = len(tokens), c["hidden_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    toks = np.array(tokens, dtype=np.int32)
    out = {"tokens": toks}
    emb = np.zeros((T, H), np.float32)
    table = f.values("model.embed_tokens.weight")
    lib.parity_embedding(T, _ptr(toks), c["vocab_size"], H, _F32, _ptr(table), H, _ptr(emb), H)
    out["embed"] = h = round16(emb, half).reshape(T, H)
    positions = np.arange(T, dtype=np.int32)
    for i in range(c["num_hidden_layers"]):
        L, W = "layers.%d." % i, "model.layers.%d." % i
        if i == 0:
            xn = f.rmsnorm(h, W + "input_layernorm.weight", T, H)
        else:
            P = "layers.%d." % (i - 1)
            h, xn = f.residual_norm(out[P + "mlp"], out[P + "attn_residual"],
                                    W + "input_layernorm.weight")
            out[L + "input"] = h
        out[L + "attn_norm"] = xn
        x = widen(xn, half)
        proj = {}
        for name, n in (("q_proj", nq * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            bias = W + "self_attn.%s.bias" % name if c["attention_bias"] else None
            proj[name] = out[L + name] = round16(
                f.linear(x, W + "self_attn.%s.weight" % name, n, bias), half)
        q, k = proj["q_proj"], proj["k_proj"]
        if c["qk_norm"]:
            q = out[L + "q_norm"] = f.rmsnorm(q, W + "self_attn.q_norm.weight", T * nq, hd, 1)
            k = out[L + "k_norm"] = f.rmsnorm(k, W + "self_attn.k_norm.weight", T * nkv, hd, 1)
        q, k = q.copy(), k.copy()
        pos = _ptr(positions, ctypes.c_int32)
        lib.parity_rope(ctypes.byref(f.pol), T, nq, hd, _h(q), nq * hd, pos, c["rope_theta"])
        lib.parity_rope(ctypes.byref(f.pol), T, nkv, hd, _h(k), nkv * hd, pos, c["rope_theta"])
        out[L + "q_rope"], out[L + "k_rope"] = q, k
        qf, kf, vf = widen(q, half), widen(k, half), widen(proj["v_proj"], half)
        att = np.zeros((T, nq * hd), np.float32)
        lengths = (ctypes.c_uint32 * 1)(T)
        lib.parity_attention(pool, ctypes.byref(f.pol), 1, lengths, nq, nkv, hd, _ptr(qf),
                             nq * hd, _ptr(kf), nkv * hd, _ptr(vf), nkv * hd, _ptr(att), nq * hd)
        out[L + "attn"] = a16 = round16(att, half)
        out[L + "o_proj"] = o = round16(f.linear(widen(a16, half), W + "self_attn.o_proj.weight",
                                                 H), half)
        res, xn = f.residual_norm(o, h, W + "post_attention_layernorm.weight")
        out[L + "attn_residual"], out[L + "mlp_norm"] = res, xn
        sparse = c["num_experts"] > 0 and (i + 1) % max(c["decoder_sparse_step"], 1) == 0 \
            and i not in c["mlp_only_layers"]
        if not sparse:
            g, u, s, y = f.mlp16(xn, W + "mlp.", H)
            out[L + "gate_proj"], out[L + "up_proj"], out[L + "swiglu"] = g, u, s
            out[L + "mlp"] = round16(y, half)
            continue
        E, kk = c["num_experts"], c["num_experts_per_tok"]
        x = widen(xn, half)
        rl = out[L + "router_logits"] = round16(f.linear(x, W + "mlp.gate.weight", E, plain=True),
                                                half)
        rlf = widen(rl, half)
        ids, weights = np.zeros((T, kk), np.uint16), np.zeros((T, kk), np.float32)
        lib.parity_moe_route(ctypes.byref(f.pol), T, E, kk, 1 if c["norm_topk_prob"] else 0,
                             _ptr(rlf), E, None, _ptr(ids), _ptr(weights))
        out[L + "router_ids"], out[L + "router_weights"] = ids.astype(np.int32), weights
        y = np.zeros((T, kk, H), np.float32)
        for e in range(E):
            _, _, _, ye = f.mlp16(xn, W + "mlp.experts.%d." % e, H)
            y[ids == e] = ye[(ids == e).any(axis=1)]
        ysh = gate = None
        if c["shared_expert_intermediate_size"]:
            _, _, _, ysh = f.mlp16(xn, W + "mlp.shared_expert.", H)
            gate = widen(round16(f.linear(x, W + "mlp.shared_expert_gate.weight", 1), half),
                         half).reshape(T)
        mlp = np.zeros((T, H), np.float32)
        lib.parity_moe_combine(ctypes.byref(f.pol), T, H, kk, _ptr(ids), _ptr(weights), _ptr(y),
                               _ptr(ysh) if ysh is not None else None,
                               _ptr(gate) if gate is not None else None, _ptr(mlp))
        out[L + "mlp"] = round16(mlp, half)
    last = "layers.%d." % (c["num_hidden_layers"] - 1)
    res, xn = f.residual_norm(out[last + "mlp"], out[last + "attn_residual"], "model.norm.weight")
    out["final_residual"], out["final_norm"] = res, xn
    # the head as parity_score runs it: its logits (rounded per the policy) and log-probs
    head = "model.embed_tokens.weight" if c["tie_word_embeddings"] else "lm_head.weight"
    V = c["vocab_size"]
    hs = widen(out[last + "attn_residual"], half)
    delta = widen(out[last + "mlp"], half)
    options = parity_score_options()
    lib.parity_score_default_options(ctypes.byref(options))
    lp = np.zeros(T, np.float32)
    logits = np.zeros((T, V), np.float32)
    targets = np.append(toks[1:], 0).astype(np.int32)
    wd = _F16 if half == "f16" else _BF16
    lib.parity_head_logprobs(pool, ctypes.byref(f.plain), 0, ctypes.byref(options), T, H, V,
                             _ptr(hs), H, _ptr(delta), H, wd, _ptr(f.w16("model.norm.weight")),
                             f.eps, _ptr(f.w16(head)), H, _ptr(targets), _ptr(lp), None,
                             _ptr(logits), V)
    out["logits"] = round16(logits, half)
    out["logprobs"] = lp[:T - 1].copy()
    return out
