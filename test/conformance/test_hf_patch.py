"""Tests of parity.hf.patch / unpatch on small random-init transformers models (Qwen3, Qwen2,
Llama; bf16 and fp16; one fp32 model for compute "fp32"), built with transformers' own classes,
saved with save_pretrained and loaded back as a user would (from_pretrained(dtype=...)):

  - every patched region, on the patched model's own inputs (captured with hooks), bitwise equal
    to libparity's C kernel under the same preset: RMSNorm (layer 0 and the final norm),
    residual add + RMSNorm (its residual stream and its output), q/k-norm, RoPE, SwiGLU;
    attention (its dot products are torch GEMMs) within the summation floor and nearer the C
    kernel of its own mode than of the other mode;
  - the patched model's log-probs against parity.Model(dir).score under the same preset: mean
    |d logp| within the GEMMs' floor, and for presets far from transformers' eager (vllm,
    aligned, sglang) far nearer than the unpatched model's (the figures are printed);
  - "hf-eager" patched is transformers' eager forward bit for bit; "sdpa" and "eager" loaded
    models patched alike give the same bits;
  - gradients flow (finite, nonzero, near the unpatched model's); unpatch restores the bits;
    re-patching; bad input (an unsupported class or policy switch, something not a model).

Run with a Python that has PyTorch 2.x and transformers (the conformance tier's venv):
    /work/venv-hf/bin/python test/conformance/test_hf_patch.py [BUILD_DIR]
Exits 77 (skipped) where torch 2.x, transformers or numpy is missing.
"""
import importlib
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
import harness  # noqa: E402

BUILD = harness.setup()
try:
    import numpy as np
    import torch
    import transformers
except ImportError as e:
    print("SKIP: the parity.hf.patch tests need torch 2.x, transformers and numpy (%s): run them "
          "with the conformance tier's virtual environment (scripts/conformance.sh)" % e)
    sys.exit(harness.SKIP)
if int(torch.__version__.split(".")[0]) < 2:
    print("SKIP: the parity.hf.patch tests need torch 2.x, this is %s" % torch.__version__)
    sys.exit(harness.SKIP)

import parity  # noqa: E402
import parity.hf  # noqa: E402
from parity import regions  # noqa: E402
from parity.torch import attention as c_attention  # noqa: E402

patch_module = importlib.import_module("parity.hf.patch")

SEED = 20261207
VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 384, 128, 256, 3, 4, 2, 32
EPS, THETA = 1e-6, 10000.0
BATCH, LENGTH = 2, 40
LOGIT_STD = 2.0              # spread of the output logits (lm_head rescaled to it)
NORM_WEIGHT_STD = 0.2        # norm weights 1 + N(0, this): a weight of 1 rounds nothing
BIAS_STD = 0.05              # Qwen2's q/k/v biases (transformers initialises them 0)
KINDS = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
         "llama": ("LlamaConfig", "LlamaForCausalLM")}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# presets covering both values of every region switch (norm_input, norm_weight, qk_norm,
# rope_table, rope_apply, swiglu, attention)
REGION_PRESETS = ("hf-eager", "hf-sdpa", "vllm", "sglang", "aligned")
MODEL_PRESETS = ("hf-eager", "hf-sdpa", "vllm", "sglang", "aligned", "vllm+aligned",
                 "vllm+fp32-head")
FAR_PRESETS = ("vllm", "sglang", "aligned", "vllm+aligned")   # far from transformers' eager

_TMP = tempfile.mkdtemp(prefix="parity-hf-patch-")
_SAVED = {}


def policy_for(preset, dtype):
    """The preset as run on a model of `dtype` ("+fp16" on float16)."""
    return preset + "+fp16" if dtype == "fp16" else preset


def build(kind):
    """A random-init fp32 model of `kind` with non-degenerate norms, biases and logits."""
    config_name, model_name = KINDS[kind]
    transformers.set_seed(SEED)
    fields = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, max_position_embeddings=512, rms_norm_eps=EPS,
                  rope_theta=THETA, tie_word_embeddings=False)
    if kind == "qwen3":
        fields["head_dim"] = HEAD_DIM
    config = getattr(transformers, config_name)(**fields)
    model = getattr(transformers, model_name)(config).eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + NORM_WEIGHT_STD * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn(p.shape, generator=g))
        tokens = torch.randint(0, VOCAB, (4, 32), generator=g)
        seen = []
        hook = model.lm_head.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
        model(tokens)
        hook.remove()
        x = seen[0].reshape(-1, HIDDEN)
        model.lm_head.weight.mul_(LOGIT_STD / (x @ model.lm_head.weight.T).std().item())
    return model


def checkpoint(kind, dtype):
    """The directory of `kind` saved in `dtype` ("bf16", "fp16" or "fp32") with save_pretrained."""
    key = (kind, dtype)
    if key not in _SAVED:
        d = os.path.join(_TMP, "%s-%s" % key)
        model = build(kind)
        model.to({"fp32": torch.float32, **DTYPES}[dtype]).save_pretrained(d)
        _SAVED[key] = d
    return _SAVED[key]


def load(kind, dtype, attn="eager"):
    torch_dtype = {"fp32": torch.float32, **DTYPES}[dtype]
    return transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint(kind, dtype), dtype=torch_dtype, attn_implementation=attn).eval()


def sequences():
    g = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)


def u16(t):
    """A 16-bit tensor's bits as a numpy uint16 array (what parity.regions reads)."""
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def from_u16(a, dtype):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(dtype)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32),
        b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32))


def logprobs(model, tokens):
    """log p(tokens[t+1] | tokens[..t]), float32 [B, T-1], as transformers users take them."""
    with torch.no_grad():
        logits = model(tokens).logits
    return torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]


class Capture:
    """Forward hooks on a model's modules (inputs and outputs, detached) and on the patch's RoPE
    step; removed on exit."""

    def __init__(self, model):
        self.model, self.seen, self.rope, self.handles = model, {}, [], []

    def __enter__(self):
        for name, module in self.model.named_modules():
            def hook(_m, args, out, name=name):
                self.seen[name] = (tuple(a.detach() if isinstance(a, torch.Tensor) else a
                                         for a in args), out)
            self.handles.append(module.register_forward_hook(hook))
        original = patch_module._rope_heads

        def rope(q, k, cos, sin, state):
            qo, ko = original(q, k, cos, sin, state)
            self.rope.append((q.detach(), k.detach(), qo.detach(), ko.detach()))
            return qo, ko
        patch_module._rope_heads = rope
        self._original = original
        return self

    def __exit__(self, *exc):
        patch_module._rope_heads = self._original
        for h in self.handles:
            h.remove()

    def inp(self, name, i=0):
        return self.seen[name][0][i]

    def out(self, name):
        out = self.seen[name][1]
        return out[0] if isinstance(out, tuple) else out


class RegionsBitwise(unittest.TestCase):
    """Each patched region on the patched model's own inputs against libparity's C kernel."""

    def check_equal(self, mine, theirs, what):
        diff = int((mine.view(torch.int16) != theirs.view(torch.int16)).sum())
        self.assertEqual(diff, 0, "%s: %d of %d elements differ from the C kernel"
                         % (what, diff, mine.numel()))

    def run_regions(self, kind, dtype):
        tokens = sequences()
        model = load(kind, dtype)
        half = DTYPES[dtype]
        stats = []
        for preset in REGION_PRESETS:
            policy = policy_for(preset, dtype)
            parity.hf.patch(model, policy)
            with Capture(model) as cap, torch.no_grad():
                model(tokens)
            parity.hf.unpatch(model)
            checked = 0

            def rms(name, x, qk=False):
                w = u16(dict(model.named_modules())[name].weight)
                rows = u16(x).reshape(-1, w.size)
                out = regions.rmsnorm(rows, w, policy=policy, eps=EPS, qk_norm=qk)
                return from_u16(out, half).reshape(x.shape)

            def rms_res(name, delta, residual):
                w = u16(dict(model.named_modules())[name].weight)
                res, out = regions.rmsnorm_residual(u16(delta).reshape(-1, w.size),
                                                    u16(residual).reshape(-1, w.size), w,
                                                    policy=policy, eps=EPS)
                return (from_u16(res, half).reshape(delta.shape),
                        from_u16(out, half).reshape(delta.shape))

            # layer 0's input norm on the embedding
            name = "model.layers.0.input_layernorm"
            self.check_equal(cap.out(name), rms(name, cap.inp(name)), "%s %s %s" % (kind, policy,
                                                                                    name))
            checked += 1
            for i in range(LAYERS):
                p = "model.layers.%d." % i
                stream = cap.inp(p[:-1]).to(half)  # the residual stream the layer takes
                # the post-attention residual add + norm
                res, out = rms_res(p + "post_attention_layernorm", cap.out(p + "self_attn"),
                                   stream)
                self.check_equal(cap.out(p + "post_attention_layernorm"), out,
                                 "%s %s layer %d residual+norm" % (kind, policy, i))
                self.check_equal(cap.inp(p + "post_attention_layernorm").to(half), res,
                                 "%s %s layer %d residual stream" % (kind, policy, i))
                # the MLP's residual add + the next layer's input norm (or the final norm)
                nxt = "model.layers.%d.input_layernorm" % (i + 1) if i + 1 < LAYERS \
                    else "model.norm"
                res2, out2 = rms_res(nxt, cap.out(p + "mlp"), res)
                self.check_equal(cap.out(nxt), out2, "%s %s %s" % (kind, policy, nxt))
                after = cap.inp("model.layers.%d" % (i + 1)) if i + 1 < LAYERS \
                    else cap.inp("model.norm")
                self.check_equal(after.to(half), res2, "%s %s stream after layer %d"
                                 % (kind, policy, i))
                # q/k-norm
                if kind == "qwen3":
                    for qk in ("q_norm", "k_norm"):
                        n = p + "self_attn." + qk
                        self.check_equal(cap.out(n), rms(n, cap.inp(n), qk=True),
                                         "%s %s %s" % (kind, policy, n))
                # RoPE (rows = tokens, positions 0..T-1 in each sequence)
                q_in, k_in, q_out, k_out = cap.rope[i]
                positions = np.tile(np.arange(LENGTH, dtype=np.int32), BATCH)
                for x, y, what in ((q_in, q_out, "q"), (k_in, k_out, "k")):
                    a = u16(x).reshape(BATCH * LENGTH, x.shape[2], x.shape[3]).copy()
                    regions.rope(a, positions, policy=policy, theta=THETA)
                    self.check_equal(y.reshape(a.shape), from_u16(a, half),
                                     "%s %s layer %d RoPE(%s)" % (kind, policy, i, what))
                # SwiGLU
                g, u = cap.out(p + "mlp.gate_proj"), cap.out(p + "mlp.up_proj")
                sw = regions.swiglu(u16(g).reshape(-1, INTERMEDIATE),
                                    u16(u).reshape(-1, INTERMEDIATE), policy=policy)
                self.check_equal(cap.inp(p + "mlp.down_proj"),
                                 from_u16(sw, half).reshape(g.shape),
                                 "%s %s layer %d SwiGLU" % (kind, policy, i))
                checked += 5 + (2 if kind == "qwen3" else 0) + 2
                # attention: the C kernel on the same q, k, v, per mode
                v = cap.out(p + "self_attn.v_proj").reshape(BATCH * LENGTH, KV_HEADS, -1)
                qf = q_out.reshape(BATCH * LENGTH, HEADS, -1).float().contiguous()
                kf = k_out.reshape(BATCH * LENGTH, KV_HEADS, -1).float().contiguous()
                mine = cap.inp(p + "self_attn.o_proj").reshape(BATCH * LENGTH, HEADS, -1)
                near = {}
                for other in ("hf-eager", "hf-sdpa"):  # eager and flash
                    with torch.no_grad():
                        theirs = c_attention(qf, kf, v.float().contiguous(), [LENGTH] * BATCH,
                                             policy=policy_for(other, dtype)).to(half)
                    near[other] = float((mine == theirs).float().mean())
                own = "hf-eager" if parity.Policy.from_name(policy).attention == 0 else "hf-sdpa"
                stats.append((policy, i, own, near))
                self.assertGreaterEqual(near[own], 0.97, "%s %s layer %d attention: only %.4f "
                                        "of the elements equal the C kernel's (%s)"
                                        % (kind, policy, i, near[own], near))
                other = "hf-sdpa" if own == "hf-eager" else "hf-eager"
                self.assertGreater(near[own], near[other], "%s %s layer %d attention is not "
                                   "nearer its own mode: %s" % (kind, policy, i, near))
            print("  %s %s %-10s %d regions bitwise; attention equal to the C kernel's own "
                  "mode / other mode: %s" % (kind, dtype, policy, checked,
                                             ", ".join("%.4f/%.4f" % (n[o], n["hf-sdpa" if o ==
                                                       "hf-eager" else "hf-eager"])
                                                       for pp, _, o, n in stats if pp == policy)))

    def test_qwen3_bf16(self):
        self.run_regions("qwen3", "bf16")

    def test_qwen3_fp16(self):
        self.run_regions("qwen3", "fp16")

    def test_qwen2_bf16(self):
        self.run_regions("qwen2", "bf16")

    def test_llama_bf16(self):
        self.run_regions("llama", "bf16")

    def test_llama_fp16(self):
        self.run_regions("llama", "fp16")


def main():
    try:
        harness.run("test_hf_patch")
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
