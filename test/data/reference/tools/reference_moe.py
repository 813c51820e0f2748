#!/usr/bin/python3
"""Standalone reference forward of Qwen3-MoE and Qwen2-MoE checkpoints, with the rounding points
of transformers eager, vLLM, SGLang and the aligned remedy, written from transformers' modelling
code (Qwen3MoeForCausalLM / Qwen2MoeForCausalLM: the router, the expert loop, the shared expert)
and the frameworks' kernels as ../../moe/README.md and libparity's parity.h ("The policy in
detail") describe them. Shares no code with libparity: torch + numpy only, config.json and the
safetensors files read here (reference.py's reader), per-expert or fused 3-D expert tensors.

  /usr/bin/python3 reference_moe.py --model-dir DIR --mode MODE --tokens FILE.i32 --out OUT.f32
      [--routes-out R.i16] [--replay R.i16] [--order ORDER]

Output: log p(x_t | x_<t), t = 1..T-1, float32; --routes-out the experts each position ran,
int16 [T][sparse layers][k] in slot order; --replay runs those experts instead of the router's.

Every value lives in an fp32 tensor; a "bf16" value is an fp32 value on the bf16 grid, and
rn(x) = x.to(bfloat16).to(float32) is one round-to-nearest-even. Every GEMM is torch's fp32
matmul (OpenBLAS sgemm) of such values: bf16 products are exact in fp32, so a bf16 GEMM with fp32
accumulation and one output rounding is rn(x @ w.T) (+ bias in fp32 before the rounding where
the linear has one). Its summation order is BLAS's, not libparity's, and its exp, rsqrt, cos
are torch's: such differences in the last fp32 bit flip a rare bf16 rounding, which the bf16
forward then carries on. That is the floor a preset is compared within; --order computes the
same forward with one of them changed (ORDERS below) to measure it.

Modes (the dense rounding points are reference.py's for fp32, hf_bf16 and aligned_bf16):
  fp32          the bf16 weights widened, every operation fp32, no rounding anywhere.
  hf_bf16       transformers eager (modeling_qwen3_moe.py / modeling_qwen2_moe.py, bf16):
                norm reads the rounded residual sum, rn(w * rn(x * r)) (q/k-norm too); RoPE
                bf16 tables, rn(rn(x*c) + rn(rot(x)*s)); SwiGLU rn(rn(silu(g)) * u); eager
                attention (rn scores, rn * scale, fp32 softmax rounded, rn(P @ V)); bf16 logits.
                Router: rn logits, fp32 softmax (torch: exp / sum), top-k, renormalised by
                dividing by the chosen sum (norm_topk_prob), weights rounded to bf16. Experts in
                ascending index: gate/up rounded, SwiGLU as above, down rounded, rn(y * w), a
                bf16 running sum in ascending expert index (index_add_ per expert). Qwen2-MoE's
                shared expert: rn(routed + rn(rn(sigmoid(rn gate)) * rn(shared MLP))).
  vllm_bf16     vLLM (compiled, custom ops none; fused_moe Triton; topk_softmax): norm reads the
                fp32 residual sum, rn(w * rn(x * r)); RoPE bf16 tables, one rounding; SwiGLU
                rn(silu(g) * u); flash attention (fp32 scores, P = exp(s - m), l over fp32 P,
                rn(sum rn(P) V / l)); bf16 logits. Router: p = exp(l - m) * (1 / S), top-k,
                renormalised p / (s > 0 ? s : 1), weights fp32. Experts: y the fp32 down
                accumulator, t = rn(y * w); k <= 4 a bf16 running sum in slot order (moe_sum),
                k > 4 the fp32 sum in slot order rounded once. Shared expert as hf_bf16.
  sglang_bf16   SGLang (FlashInfer fused add-RMSNorm, fp32 RoPE cache, fused_moe Triton): norm
                reads the fp32 sum, rn(w * x * r); RoPE fp32 tables, one rounding; SwiGLU fused;
                flash attention. Router as vLLM's but renormalised p * (1 / s). Experts: t =
                rn(y * w); k = 1 t; k = 2 rn(t0 + t1); k > 2 the fp32 sum in slot order rounded
                once. Shared expert as hf_bf16.
  aligned_bf16  hf_bf16 with the norms (fp32 sum in, one rounding), RoPE (fp32 tables, one
                rounding) and SwiGLU (one rounding) as regions; router as hf_bf16 with fp32
                weights; the combine a region: rn(sum over slots of y * w in fp32 [+ sigmoid(g)
                * y_shared, fp32]), one rounding.
Ties at the top-k boundary go to the lower expert index (sorted by (-p, index)); slot order is
descending p, then ascending index.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (its safetensors reader)

F32 = torch.float32
MODES = ("fp32", "hf_bf16", "vllm_bf16", "sglang_bf16", "aligned_bf16")

# The rounding points of each mode: the dense switches, then the router, the routing weights'
# dtype and the combine. norm_input: what a residual RMSNorm reads ("rounded" sum or the "fp32"
# sum); norm / qk_norm: "twice" rn(w * rn(x * r)) or "once" rn(w * x * r); rope_table "bf16" or
# "fp32"; rope / swiglu: "per_op" (HF's roundings) or "fused" (one); attention "eager" or
# "flash"; router "hf" (z / S, p / s), "vllm" (z * (1 / S), p / s guarded), "sglang" (z * (1 / S),
# p * (1 / s)); round_weights: the routing weights to bf16; combine "hf", "vllm", "sglang" or
# "fp32" (the whole weighted sum and the gated shared expert in fp32, one rounding).
RECIPES = {
    "hf_bf16": dict(norm_input="rounded", norm="twice", qk_norm="twice", rope_table="bf16",
                    rope="per_op", swiglu="per_op", attention="eager", router="hf",
                    round_weights=True, combine="hf"),
    "vllm_bf16": dict(norm_input="fp32", norm="twice", qk_norm="twice", rope_table="bf16",
                      rope="fused", swiglu="fused", attention="flash", router="vllm",
                      round_weights=False, combine="vllm"),
    "sglang_bf16": dict(norm_input="fp32", norm="once", qk_norm="once", rope_table="fp32",
                        rope="fused", swiglu="fused", attention="flash", router="sglang",
                        round_weights=False, combine="sglang"),
    "aligned_bf16": dict(norm_input="fp32", norm="once", qk_norm="once", rope_table="fp32",
                         rope="fused", swiglu="fused", attention="eager", router="hf",
                         round_weights=False, combine="fp32"),
}


def rn(x):
    """fp32 -> bf16 (round to nearest even) -> fp32."""
    return x.to(torch.bfloat16).to(F32)


# ----------------------------------------------------------------------------- the checkpoint
class Checkpoint:
    """config.json's MoE fields and the weights as fp32 tensors (bf16 values widened exactly)."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as fh:
            cfg = json.load(fh)
        self.arch = cfg["model_type"]
        if self.arch not in ("qwen3_moe", "qwen2_moe"):
            raise ValueError("model_type %r is neither qwen3_moe nor qwen2_moe" % self.arch)
        self.hidden = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = cfg["rms_norm_eps"]
        rope = cfg.get("rope_parameters") or {}
        self.theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        # transformers 5 writes num_local_experts for qwen3_moe (its attribute_map)
        self.experts = cfg.get("num_experts", cfg.get("num_local_experts"))
        self.top_k = cfg["num_experts_per_tok"]
        self.norm_topk_prob = bool(cfg.get("norm_topk_prob", False))
        step = cfg.get("decoder_sparse_step", 1)
        only = set(cfg.get("mlp_only_layers") or [])
        # Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer: the sparse-layer rule
        self.sparse = [i for i in range(self.layers)
                       if i not in only and self.experts > 0 and (i + 1) % step == 0]
        self.qk_norm = self.arch == "qwen3_moe"
        self.shared = self.arch == "qwen2_moe"
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        path = os.path.join(model_dir, "model.safetensors")
        self.w = {name: torch.from_numpy(values)
                  for name, (_, values) in reference.safetensors_arrays(path).items()}
        self.unfuse()

    def unfuse(self):
        """transformers 5's fused experts (gate_up_proj [E, 2I, H]: gate rows, then up rows;
        down_proj [E, H, I]) as the per-expert names the hub checkpoints use."""
        for layer in self.sparse:
            p = "model.layers.%d.mlp.experts." % layer
            if p + "gate_up_proj" not in self.w:
                continue
            gate_up, down = self.w.pop(p + "gate_up_proj"), self.w.pop(p + "down_proj")
            inter = gate_up.shape[1] // 2
            for e in range(self.experts):
                self.w[p + "%d.gate_proj.weight" % e] = gate_up[e, :inter].contiguous()
                self.w[p + "%d.up_proj.weight" % e] = gate_up[e, inter:].contiguous()
                self.w[p + "%d.down_proj.weight" % e] = down[e].contiguous()

    def head(self):
        return self.w["model.embed_tokens.weight" if self.tied else "lm_head.weight"]


# ----------------------------------------------------------------------------- the forward
#: The reference as it is ("blas"), and the perturbations that measure the floor: the same
#: rounding points with the fp32 values before each rounding computed another way, as another
#: implementation (libparity's) computes them. "reversed-k": every GEMM sums K in the other
#: direction; "reversed-sums": the RMSNorm mean and every softmax's sum over the reversed row;
#: "f64-math": exp, silu, sigmoid, rsqrt and RoPE's cos/sin evaluated in double and rounded to
#: fp32 (correctly rounded, where torch's vectorised float functions may be an ulp off).
ORDERS = ("blas", "reversed-k", "reversed-sums", "f64-math")


class Forward:
    """One sequence's forward under a mode; `order` one of ORDERS; `switches` replace some of
    a bf16 mode's RECIPES entries (e.g. combine="fp32"), for tests that one switch matters."""

    def __init__(self, ckpt, mode, order="blas", **switches):
        if mode not in MODES:
            raise ValueError("mode %r is not one of %s" % (mode, ", ".join(MODES)))
        if order not in ORDERS:
            raise ValueError("order %r is not one of %s" % (order, ", ".join(ORDERS)))
        self.c, self.mode, self.order = ckpt, mode, order
        self.fp32 = mode == "fp32"
        self.r = dict(RECIPES.get(mode, {}))
        unknown = set(switches) - set(self.r)
        if unknown or (switches and self.fp32):
            raise ValueError("switches %s do not apply to mode %s" % (sorted(switches), mode))
        self.r.update(switches)

    # -- rounding and products
    def round(self, x):
        return x if self.fp32 else rn(x)

    def matmul(self, a, b):
        """a [.., K] @ b [K, N] in fp32."""
        if self.order == "reversed-k":
            return a.flip(-1) @ b.flip(-2)
        return a @ b

    def row_sum(self, x):
        """The sum over the last dimension (keepdim)."""
        if self.order == "reversed-sums":
            x = x.flip(-1)
        return x.sum(dim=-1, keepdim=True)

    def exp(self, x):
        return x.double().exp().float() if self.order == "f64-math" else torch.exp(x)

    def softmax(self, x):
        """Softmax over the last dimension in fp32: torch's, or written out (exp(x - max) /
        sum) under the perturbations."""
        if self.order == "blas":
            return torch.softmax(x, dim=-1)
        e = self.exp(x - x.max(dim=-1, keepdim=True).values)
        return e / self.row_sum(e)

    def silu(self, x):
        if self.order == "f64-math":
            x = x.double()
            return (x / (1 + torch.exp(-x))).float()
        return torch.nn.functional.silu(x)

    def sigmoid(self, x):
        if self.order == "f64-math":
            return (1 / (1 + torch.exp(-x.double()))).float()
        return torch.sigmoid(x)

    def linear(self, x, name, bias=None, rounded=True):
        """nn.Linear: x @ W.T (+ b) in fp32, one rounding to bf16 unless `rounded` is False."""
        y = self.matmul(x, self.c.w[name].t())
        if bias is not None:
            y = y + self.c.w[bias]
        return self.round(y) if rounded else y

    # -- the dense regions
    def rmsnorm(self, x, weight, kind):
        """Qwen3MoeRMSNorm / Qwen2MoeRMSNorm of x (fp32 values) under `kind` ("twice", "once")."""
        w = self.c.w[weight]
        if self.order == "blas":
            var = x.pow(2).mean(-1, keepdim=True)
        else:
            var = self.row_sum(x.pow(2)) / x.shape[-1]
        if self.order == "f64-math":
            r = (1 / torch.sqrt(var.double() + self.c.eps)).float()
        else:
            r = torch.rsqrt(var + self.c.eps)
        if self.fp32:
            return w * (x * r)
        if kind == "twice":
            return rn(w * rn(x * r))  # hidden_states.to(input_dtype); self.weight * hidden_states
        return rn(w * (x * r))

    def residual(self, h, delta):
        """(the residual stream h + delta, what the next norm reads)."""
        if self.fp32:
            return h + delta, h + delta
        s = h + delta
        if self.r["norm_input"] == "rounded":
            return rn(s), rn(s)
        return rn(s), s

    def rope_tables(self, n):
        """cos, sin [n, head_dim] in fp32: inv_freq = 1 / theta^(2i / d) and angle = pos *
        inv_freq in fp32 (Qwen3MoeRotaryEmbedding), cat(angles, angles)."""
        hd = self.c.head_dim
        inv_freq = 1.0 / (self.c.theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(F32) / hd))
        angles = torch.arange(n, dtype=torch.int64).to(F32)[:, None] * inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        if self.order == "f64-math":
            return emb.double().cos().float(), emb.double().sin().float()
        return emb.cos(), emb.sin()

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def rope(self, x, cos, sin):
        """x [heads, n, hd]."""
        if self.fp32:
            return x * cos + self.rotate_half(x) * sin
        if self.r["rope_table"] == "bf16":
            cos, sin = rn(cos), rn(sin)
        if self.r["rope"] == "per_op":
            return rn(rn(x * cos) + rn(self.rotate_half(x) * sin))
        return rn(x * cos + self.rotate_half(x) * sin)

    def swiglu(self, g, u):
        act = self.silu(g)
        if self.fp32:
            return act * u
        if self.r["swiglu"] == "per_op":
            return rn(rn(act) * u)
        return rn(act * u)

    def attention(self, x, p, cos, sin):
        c, n = self.c, x.shape[0]
        hd = c.head_dim
        bias = c.arch == "qwen2_moe"
        q = self.linear(x, p + "q_proj.weight", p + "q_proj.bias" if bias else None)
        k = self.linear(x, p + "k_proj.weight", p + "k_proj.bias" if bias else None)
        v = self.linear(x, p + "v_proj.weight", p + "v_proj.bias" if bias else None)
        q, k, v = q.view(n, c.heads, hd), k.view(n, c.kv_heads, hd), v.view(n, c.kv_heads, hd)
        if c.qk_norm:
            kind = None if self.fp32 else self.r["qk_norm"]
            q = self.rmsnorm(q, p + "q_norm.weight", kind)
            k = self.rmsnorm(k, p + "k_norm.weight", kind)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        rep = c.heads // c.kv_heads
        k = k[:, None].expand(c.kv_heads, rep, n, hd).reshape(c.heads, n, hd)  # repeat_kv
        v = v[:, None].expand(c.kv_heads, rep, n, hd).reshape(c.heads, n, hd)
        scaling = hd ** -0.5
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        kind = "fp32" if self.fp32 else self.r["attention"]
        if kind == "eager":  # eager_attention_forward in bf16
            s = rn(rn(self.matmul(q, k.transpose(1, 2))) * scaling)
            s = s.masked_fill(causal, torch.finfo(torch.bfloat16).min)  # + causal_mask
            o = rn(self.matmul(rn(self.softmax(s)), v))
        elif kind == "flash":  # one block over the whole row
            s = (self.matmul(q, k.transpose(1, 2)) * scaling).masked_fill(causal, float("-inf"))
            e = self.exp(s - s.max(dim=-1, keepdim=True).values)
            o = rn(self.matmul(rn(e), v) / self.row_sum(e))
        else:
            s = (self.matmul(q, k.transpose(1, 2)) * scaling).masked_fill(causal, float("-inf"))
            o = self.matmul(self.softmax(s), v)
        o = o.transpose(0, 1).reshape(n, c.heads * hd)
        return self.linear(o, p + "o_proj.weight")

    def mlp(self, x, p, down_rounded=True):
        """Qwen3MoeMLP / Qwen2MoeMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))."""
        gate, up = self.linear(x, p + "gate_proj.weight"), self.linear(x, p + "up_proj.weight")
        act = self.swiglu(gate, up)
        return self.linear(act, p + "down_proj.weight", rounded=down_rounded)

    # -- the sparse block
    def route(self, logits, replay):
        """(ids [n, k] in slot order, weights [n, k]) from the router's logits [n, E]; replay
        [n, k] (or None) gives the ids, whose weights are computed all the same."""
        kind = "hf" if self.fp32 else self.r["router"]
        if kind == "hf":
            probs = self.softmax(logits)  # F.softmax(router_logits, dtype=float)
        else:  # topk_softmax: exp(l - max), times the reciprocal of the row's sum
            z = self.exp(logits - logits.max(dim=-1, keepdim=True).values)
            probs = z * (1.0 / self.row_sum(z))
        n, k = logits.shape[0], self.c.top_k
        if replay is None:
            p = probs.numpy()
            index = np.arange(p.shape[1])
            ids = np.stack([np.lexsort((index, -p[i]))[:k] for i in range(n)])  # (-p, index)
            ids = torch.from_numpy(ids.astype(np.int64))
        else:
            ids = torch.as_tensor(replay, dtype=torch.int64).reshape(n, k)
        w = probs.gather(1, ids)
        if self.c.norm_topk_prob:
            s = w[:, 0].clone()
            for j in range(1, k):  # the chosen probabilities summed in slot order
                s = s + w[:, j]
            s = s[:, None]
            if kind == "hf":
                w = w / s  # router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
            elif kind == "vllm":
                w = w / torch.where(s > 0, s, torch.ones_like(s))
            else:
                w = w * (1.0 / s)
        if not self.fp32 and self.r["round_weights"]:
            w = rn(w)  # router_top_value.to(router_logits.dtype)
        return ids, w

    def moe(self, x, p, replay):
        """Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock of the normed rows x [n, H].
        Returns (the block's output, the ids run [n, k])."""
        c, n = self.c, x.shape[0]
        ids, w = self.route(self.linear(x, p + "gate.weight"), replay)
        k = c.top_k
        combine = "fp32" if self.fp32 else self.r["combine"]
        y = torch.zeros(n, k, c.hidden)  # each (row, slot)'s expert output, the fp32 accumulator
        for e in range(c.experts):  # expert_hit: the experts in ascending index
            rows, slots = (ids == e).nonzero(as_tuple=True)
            if rows.numel():
                y[rows, slots] = self.mlp(x[rows], p + "experts.%d." % e, down_rounded=False)
        if combine == "hf":  # current_hidden_states * weight; index_add_ per expert
            out = torch.zeros(n, c.hidden)
            for e in range(c.experts):
                rows, slots = (ids == e).nonzero(as_tuple=True)
                if rows.numel():
                    out[rows] = rn(out[rows] + rn(rn(y[rows, slots]) * w[rows, slots, None]))
        elif combine == "fp32":
            out = y[:, 0] * w[:, 0, None]
            for j in range(1, k):
                out = out + y[:, j] * w[:, j, None]
        else:  # the fused_moe epilogue rn(acc * w), then moe_sum / SGLang's sum
            t = rn(y * w[:, :, None])
            if (combine == "vllm" and k <= 4) or (combine == "sglang" and k <= 2):
                out = t[:, 0]
                for j in range(1, k):
                    out = rn(out + t[:, j])
            else:
                out = t[:, 0]
                for j in range(1, k):
                    out = out + t[:, j]
                out = rn(out)
        if c.shared:
            gate = self.linear(x, p + "shared_expert_gate.weight")  # [n, 1]
            if combine == "fp32":
                y_shared = self.mlp(x, p + "shared_expert.", down_rounded=False)
                out = out + self.sigmoid(gate) * y_shared
            else:
                y_shared = self.mlp(x, p + "shared_expert.")
                out = rn(out + rn(rn(self.sigmoid(gate)) * y_shared))
        if combine == "fp32":
            out = self.round(out)
        return out, ids

    def logprobs(self, tokens, routes=None):
        """(log p(x_t | x_<t) for t = 1..n-1, fp32 [n-1]; the experts run, int64 [n, sparse
        layers, k]). routes: [n, sparse layers, k] to replay, or None."""
        c = self.c
        ids = torch.as_tensor(tokens, dtype=torch.int64)
        n = ids.shape[0]
        if routes is not None:
            routes = torch.as_tensor(routes, dtype=torch.int64).reshape(n, len(c.sparse), c.top_k)
        cos, sin = self.rope_tables(n)
        h = c.w["model.embed_tokens.weight"][ids]
        s = h
        ran = []
        with torch.no_grad():
            for layer in range(c.layers):
                p = "model.layers.%d." % layer
                kind = None if self.fp32 else self.r["norm"]
                x = self.rmsnorm(s, p + "input_layernorm.weight", kind)
                h, s = self.residual(h, self.attention(x, p + "self_attn.", cos, sin))
                x = self.rmsnorm(s, p + "post_attention_layernorm.weight", kind)
                if layer in c.sparse:
                    slot = c.sparse.index(layer)
                    m, chosen = self.moe(x, p + "mlp.", None if routes is None else routes[:, slot])
                    ran.append(chosen)
                else:
                    m = self.mlp(x, p + "mlp.")
                h, s = self.residual(h, m)
            x = self.rmsnorm(s, "model.norm.weight", None if self.fp32 else self.r["norm"])
            logits = self.round(self.matmul(x, c.head().t()))
            lp = torch.log_softmax(logits, dim=-1)[:-1].gather(1, ids[1:, None])[:, 0]
        return lp, torch.stack(ran, dim=1) if ran else torch.zeros(n, 0, c.top_k, dtype=torch.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--tokens", required=True, help="int32 little-endian token ids")
    ap.add_argument("--out", required=True,
                    help="float32 little-endian, one value a token but the first")
    ap.add_argument("--routes-out", help="int16 [tokens][sparse layers][k]: the experts run")
    ap.add_argument("--replay", help="int16 [tokens][sparse layers][k]: the experts to run")
    ap.add_argument("--order", choices=ORDERS, default="blas",
                    help="the reference, or one of the perturbations that measure the floor")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokens = np.fromfile(args.tokens, dtype="<i4").astype(np.int64)
    if len(tokens) < 2:
        raise SystemExit("need at least 2 tokens")
    ckpt = Checkpoint(args.model_dir)
    replay = np.fromfile(args.replay, dtype="<i2").astype(np.int64) if args.replay else None
    lp, ran = Forward(ckpt, args.mode, args.order).logprobs(tokens, replay)
    lp.numpy().astype("<f4").tofile(args.out)
    if args.routes_out:
        ran.numpy().astype("<i2").tofile(args.routes_out)
    print("%s %s: %d tokens, mean -logp %.4f -> %s"
          % (ckpt.arch, args.mode, len(tokens), -lp.mean().item(), args.out))


if __name__ == "__main__":
    main()
