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
  - Qwen3-MoE and Qwen2-MoE (test/data/moe): routes and combines bitwise, log-probs, gradients;
  - gradients flow (finite, nonzero, near the unpatched model's); generate with a KV cache and
    activation checkpointing work; unpatch restores the bits; re-patching; bad input (an
    unsupported class, configuration or policy switch, something not a model).

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

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

import parity  # noqa: E402
import parity.hf  # noqa: E402
from parity import regions  # noqa: E402
from parity.torch import attention as c_attention  # noqa: E402

patch_module = importlib.import_module("parity.hf._patch")

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


def distances(model, scorer, tokens, policy, unpatched):
    """Mean |d logp| against scorer.score(tokens) under the policy of the model patched with it,
    and of the unpatched model's log-probs `unpatched`."""
    theirs = torch.tensor(scorer.score(tokens.tolist(), policy=policy))
    parity.hf.patch(model, policy)
    mine = logprobs(model, tokens)
    parity.hf.unpatch(model)
    return float((mine - theirs).abs().mean()), float((unpatched - theirs).abs().mean())


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
            shares = ["%.4f/%.4f" % (n[o], n["hf-sdpa" if o == "hf-eager" else "hf-eager"])
                      for pp, _, o, n in stats if pp == policy]
            print("  %s %s %-10s %d regions bitwise; attention equal to the C kernel's own "
                  "mode / other mode, by layer: %s" % (kind, dtype, policy, checked,
                                                       ", ".join(shares)))

    def test_every_model(self):
        for kind in KINDS:
            for dtype in DTYPES:
                with self.subTest(model=kind, dtype=dtype):
                    self.run_regions(kind, dtype)


class LogprobsAgainstScore(unittest.TestCase):
    """The patched model's log-probs against parity.Model(dir).score under the same preset."""

    def test_every_model_and_preset(self):
        tokens = sequences()
        print("\n  mean |d logp| against parity.Model.score under the same preset, "
              "%d sequences of %d tokens (patched / transformers unpatched, eager)"
              % (BATCH, LENGTH))
        for kind in KINDS:
            for dtype in DTYPES:
                model = load(kind, dtype)
                unpatched = logprobs(model, tokens)
                with parity.Model(checkpoint(kind, dtype)) as pm:
                    for preset in MODEL_PRESETS:
                        policy = policy_for(preset, dtype)
                        near, far = distances(model, pm, tokens, policy, unpatched)
                        print("  %-6s %-5s %-24s %.2e / %.2e  (%.1fx nearer)"
                              % (kind, dtype, policy, near, far, far / near))
                        self.assertLess(near, 1e-2 if dtype == "bf16" else 2e-3,
                                        "%s %s %s: mean |d logp| %.2e beyond the GEMM floor"
                                        % (kind, dtype, policy, near))
                        if preset in FAR_PRESETS:
                            # fp16's rounding points keep 3 more bits: the regions move the
                            # log-probs less, and the GEMMs' floor is most of what is left
                            self.assertGreater(far / near, 3.0 if dtype == "bf16" else 1.25,
                                               "%s %s %s: the patch (%.2e) is not much nearer "
                                               "libparity than transformers (%.2e)"
                                               % (kind, dtype, policy, near, far))

    def test_fp32_attention_under_bf16(self):
        """attention "fp32" under compute "bf16" (a Policy, no preset has it): the attention's
        output unrounded, o_proj an fp32 GEMM over the bf16 weights, rounded."""
        tokens = sequences()
        policy = parity.Policy.from_name("aligned").replace(attention="fp32")
        for kind in ("qwen3", "qwen2"):
            model = load(kind, "bf16")
            with parity.Model(checkpoint(kind, "bf16")) as pm:
                theirs = torch.tensor(pm.score(tokens.tolist(), policy=policy))
                aligned = torch.tensor(pm.score(tokens.tolist(), policy="aligned"))
            parity.hf.patch(model, policy)
            mine = logprobs(model, tokens)
            parity.hf.unpatch(model)
            near = float((mine - theirs).abs().mean())
            apart = float((aligned - theirs).abs().mean())
            print("  %s bf16 aligned with fp32 attention: mean |d logp| %.2e (aligned's eager "
                  "attention is %.2e away)" % (kind, near, apart))
            self.assertLess(near * 3, apart)

    def test_fp32_compute_on_an_fp32_model(self):
        tokens = sequences()
        model = load("qwen3", "fp32")
        with parity.Model(checkpoint("qwen3", "fp32")) as pm:
            theirs = torch.tensor(pm.score(tokens.tolist(), policy="fp32"))
        parity.hf.patch(model, "fp32")
        mine = logprobs(model, tokens)
        parity.hf.unpatch(model)
        near = float((mine - theirs).abs().mean())
        print("  qwen3 fp32 fp32: mean |d logp| %.2e" % near)
        self.assertLess(near, 1e-5)


class SameAsTransformers(unittest.TestCase):
    """hf-eager is what transformers' eager forward does: the patch changes no bit of it; and the
    patch gives the same bits whatever attention implementation the model was loaded with."""

    def test_hf_eager_patched_is_transformers_eager(self):
        """Under hf-eager the patch is transformers' eager forward but for the RMSNorms'
        inverse rms: transformers' rsqrt(mean(x^2) + eps) sums in torch's order and takes
        torch's rsqrt (not correctly rounded in torch 2.15), libparity's 1 / sqrtf(dot16 sum /
        dim + eps) is exact; one ulp of r moves a 16-bit output now and then. With
        transformers' own RMSNorm forwards put back, the patched model gives transformers'
        bits, every other region included; fully patched, the differing logits are printed."""
        tokens = sequences()
        for kind in KINDS:
            for dtype in DTYPES:
                model = load(kind, dtype)
                with torch.no_grad():
                    before = model(tokens).logits
                    parity.hf.patch(model, policy_for("hf-eager", dtype))
                    patched = model(tokens).logits
                    norms = [m for n, m in model.named_modules() if n.endswith("norm")]
                    for m in norms:
                        del m.forward
                    own_norms = model(tokens).logits
                self.assertTrue(same_bits(before, own_norms), "%s %s: hf-eager patched with "
                                "transformers' RMSNorm differs from transformers' eager in %d "
                                "of %d logits" % (kind, dtype, int((before != own_norms).sum()),
                                                  before.numel()))
                # the norms alone, on transformers' inputs: rare one-ulp moves
                seen = {}
                parity.hf.unpatch(model)
                hooks = [m.register_forward_hook(
                    lambda m, a, o: seen.setdefault(id(m), []).append((a[0], o)))
                    for m in norms]
                with torch.no_grad():
                    model(tokens)
                for h in hooks:
                    h.remove()
                moved = total = 0
                pol = parity.Policy.from_name(policy_for("hf-eager", dtype))
                for name, m in model.named_modules():
                    for x, y in seen.get(id(m), []):
                        mine = patch_module._regions._rmsnorm_f32(
                            x.float(), m.weight.float(), m.variance_epsilon, pol,
                            name.endswith(("q_norm", "k_norm"))).to(y.dtype)
                        moved += int((mine != y).sum())
                        total += y.numel()
                print("  %-6s %-5s hf-eager patched vs transformers eager: %d of %d logits "
                      "differ; RMSNorm outputs on transformers' inputs: %d of %d differ; with "
                      "transformers' RMSNorm: bitwise"
                      % (kind, dtype, int((before != patched).sum()), before.numel(), moved,
                         total))
                self.assertLess(moved, 1e-3 * total)

    def test_sdpa_and_eager_models_patched_alike(self):
        tokens = sequences()
        for preset in ("hf-eager", "vllm", "aligned"):
            out = {}
            for attn in ("eager", "sdpa"):
                model = load("qwen3", "bf16", attn)
                parity.hf.patch(model, preset)
                with torch.no_grad():
                    out[attn] = model(tokens).logits
            self.assertTrue(same_bits(out["eager"], out["sdpa"]), preset)

    def test_padding_mask(self):
        """A batch with a left-padded row gives that row the bits it has alone."""
        tokens = sequences()
        model = load("qwen2", "bf16")
        parity.hf.patch(model, "vllm")
        pad = 5
        batch = tokens.clone()
        batch[1, :pad] = 0
        mask = torch.ones_like(batch)
        mask[1, :pad] = 0
        with torch.no_grad():
            both = model(batch, attention_mask=mask,
                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
            alone = model(tokens[1:, pad:]).logits
        self.assertTrue(same_bits(both[1, pad:], alone[0]))


class Gradients(unittest.TestCase):
    def test_backward(self):
        tokens = sequences()
        for kind, preset in (("qwen3", "vllm+aligned"), ("qwen2", "hf-eager"),
                             ("llama", "sglang+fp32-head")):
            grads = {}
            for patched in (False, True):
                model = load(kind, "bf16")
                if patched:
                    parity.hf.patch(model, preset)
                logits = model(tokens).logits
                lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(
                    -1, tokens[:, 1:, None])
                (-lp.mean()).backward()
                grads[patched] = {n: p.grad.float() for n, p in model.named_parameters()}
            for name, g in grads[True].items():
                self.assertTrue(bool(torch.isfinite(g).all()), "%s %s: %s" % (kind, preset, name))
                self.assertGreater(float(g.norm()), 0.0, "%s %s: %s" % (kind, preset, name))
                ref = grads[False][name]
                cos = float((g * ref).sum() / (g.norm() * ref.norm()))
                self.assertGreater(cos, 0.99, "%s %s: %s's gradient has cosine %.4f to the "
                                   "unpatched model's" % (kind, preset, name, cos))


class UsedAsTransformers(unittest.TestCase):
    """The patched model in transformers' own machinery: generate with a KV cache, activation
    checkpointing."""

    def test_generate_with_a_cache(self):
        tokens = sequences()[:1, :10]
        model = load("qwen3", "bf16")
        for preset in ("vllm", "aligned"):
            parity.hf.patch(model, preset)
            with torch.no_grad():
                out = model.generate(tokens, max_new_tokens=8, do_sample=False)
                full = model(out).logits[0, 9:-1].argmax(-1)
            parity.hf.unpatch(model)
            self.assertEqual(full.tolist(), out[0, 10:].tolist(), preset)

    def test_activation_checkpointing(self):
        tokens = sequences()
        grads = []
        for checkpointing in (False, True):
            model = load("llama", "bf16")
            if checkpointing:
                model.gradient_checkpointing_enable()
                model.train()
            parity.hf.patch(model, "vllm+aligned")
            logits = model(tokens, use_cache=False).logits
            lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])
            (-lp.mean()).backward()
            grads.append([p.grad for p in model.parameters()])
        for a, b in zip(*grads):
            self.assertTrue(same_bits(a, b))


class PatchAndUnpatch(unittest.TestCase):
    def test_unpatch_restores_the_bits(self):
        tokens = sequences()
        for kind in KINDS:
            model = load(kind, "bf16")
            with torch.no_grad():
                before = model(tokens).logits
                parity.hf.patch(model, "vllm+fp32-head")
                self.assertEqual(patch_module.patched_policy(model), "vllm+fp32-head")
                patched = model(tokens).logits
                self.assertFalse(same_bits(before, patched))
                self.assertIs(parity.hf.unpatch(model), model)
                after = model(tokens).logits
            self.assertTrue(same_bits(before, after), kind)
            self.assertIsNone(patch_module.patched_policy(model))
            left = [n for n, m in model.named_modules() if "forward" in m.__dict__]
            self.assertEqual(left, [], "modules still patched: %s" % left)

    def test_patching_twice_repatches(self):
        tokens = sequences()
        model = load("qwen3", "bf16")
        fresh = load("qwen3", "bf16")
        parity.hf.patch(model, "aligned")
        self.assertIs(parity.hf.patch(model, "vllm"), model)
        parity.hf.patch(fresh, "vllm")
        with torch.no_grad():
            self.assertTrue(same_bits(model(tokens).logits, fresh(tokens).logits))
        self.assertEqual(patch_module.patched_policy(model), "vllm")
        parity.hf.unpatch(model)
        self.assertEqual([n for n, m in model.named_modules() if "forward" in m.__dict__], [])

    def test_package_names_stay_functions(self):
        # The submodules are imported (patch_module above; dump by its first call): the
        # package's names are still its functions, called again after those imports.
        import parity.hf._dump  # noqa: F401
        for name in ("patch", "unpatch", "patched_policy", "dump"):
            self.assertTrue(callable(getattr(parity.hf, name)), name)
        model = load("llama", "bf16")
        parity.hf.patch(model, parity.Policy.from_name("aligned"))
        parity.hf.patch(model, "aligned")
        self.assertEqual(parity.hf.patched_policy(model), "aligned")
        parity.hf.unpatch(model)
        self.assertIsNone(parity.hf.patched_policy(model))


class BadInput(unittest.TestCase):
    def assert_refused(self, error, words, fn, *args):
        with self.assertRaises(error) as cm:
            fn(*args)
        for w in words:
            self.assertIn(w, str(cm.exception))
        print("  refused: %s: %s" % (type(cm.exception).__name__, cm.exception))

    def test_not_a_model(self):
        self.assert_refused(TypeError, ["str"], parity.hf.patch, "Qwen/Qwen3-0.6B", "aligned")
        self.assert_refused(TypeError, ["NoneType"], parity.hf.unpatch, None)

    def test_unsupported_class(self):
        config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
        model = transformers.GPT2LMHeadModel(config)
        self.assert_refused(ValueError, ["GPT2LMHeadModel", "Qwen3ForCausalLM"],
                            parity.hf.patch, model, "aligned")
        self.assert_refused(ValueError, ["Linear"], parity.hf.patch,
                            torch.nn.Linear(2, 2), "aligned")

    def test_unsupported_policies(self):
        model = load("qwen3", "bf16")
        self.assert_refused(ValueError, ["gemm", "fp8-block"], parity.hf.patch, model,
                            "vllm+fp8-block:deepseek")
        self.assert_refused(ValueError, ["gemm", "nvfp4"], parity.hf.patch, model,
                            "aligned+nvfp4:modelopt")
        self.assert_refused(ValueError, ["gemm", "ternary"], parity.hf.patch, model,
                            "hf-eager+ternary:bitnet")
        self.assert_refused(ValueError, ["compute", "fp32", "bfloat16"], parity.hf.patch, model,
                            "fp32")
        self.assert_refused(ValueError, ["compute", "fp16"], parity.hf.patch, model,
                            "aligned+fp16")
        self.assert_refused(parity.ParityError, ["no-such-preset"], parity.hf.patch, model,
                            "no-such-preset")
        self.assert_refused(TypeError, ["int"], parity.hf.patch, model, 3)
        half = load("llama", "fp16")
        self.assert_refused(ValueError, ["compute", "bf16", "float16"], parity.hf.patch, half,
                            "vllm")
        # nothing was patched by a refused call
        self.assertIsNone(patch_module.patched_policy(model))
        self.assertEqual([n for n, m in model.named_modules() if "forward" in m.__dict__], [])

    def test_float32_model_under_a_bf16_policy_fails_when_run(self):
        model = load("qwen3", "fp32")
        parity.hf.patch(model, "aligned")   # FSDP's mixed precision would cast it when run
        with self.assertRaises(ValueError) as cm, torch.no_grad():
            model(sequences())
        self.assertIn("compute", str(cm.exception))
        parity.hf.unpatch(model)

    def test_unpatch_of_a_model_not_patched(self):
        self.assert_refused(ValueError, ["not patched"], parity.hf.unpatch,
                            load("qwen2", "bf16"))

    def test_unsupported_configuration(self):
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, hidden_act="gelu")
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        self.assert_refused(ValueError, ["hidden_act", "gelu"], parity.hf.patch, model, "vllm")
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1,
                                          rope_scaling={"rope_type": "linear", "factor": 2.0})
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        self.assert_refused(ValueError, ["rope_type", "linear"], parity.hf.patch, model, "vllm")


# the checkpoints transformers 5.25 wrote (test/data/moe/tools/make_moe_reference.py)
MOE_CHECKPOINTS = {name: os.path.join(harness.REPO, "test", "data", "moe", name)
                   for name in ("qwen3-moe-tiny", "qwen2-moe-tiny")}
MOE_PRESETS = ("hf-eager", "vllm", "sglang", "aligned", "vllm+aligned")


def moe_policies():
    """The MoE presets and a topk-softmax router (every moe_router, moe_weights, moe_combine)."""
    return list(MOE_PRESETS) + [parity.Policy.from_name("vllm").replace(
        moe_router="topk-softmax", moe_weights="rounded", moe_combine="fp32")]


def load_moe(name):
    return transformers.AutoModelForCausalLM.from_pretrained(
        MOE_CHECKPOINTS[name], dtype=torch.bfloat16, attn_implementation="eager",
        experts_implementation="eager").eval()   # the modelling file's loop, not grouped_mm


def moe_tokens(model):
    return sequences() % model.config.vocab_size


class MixtureOfExperts(unittest.TestCase):
    """Qwen3-MoE and Qwen2-MoE (test/data/moe): the route and the combine on the patched model's
    own router logits and expert outputs bitwise as parity_moe_route / parity_moe_combine; the
    log-probs against Model.score; gradients."""

    def test_route_and_combine_bitwise(self):
        for name in MOE_CHECKPOINTS:
            model = load_moe(name)
            tokens = moe_tokens(model)
            for policy in moe_policies():
                if isinstance(policy, parity.Policy) and not model.config.norm_topk_prob:
                    continue   # a topk-softmax router needs norm_topk_prob
                routes, combines = [], []
                route, combine = patch_module._moe_route, patch_module._moe_combine

                def spy_route(logits, k, norm, state):
                    w, ids = route(logits, k, norm, state)
                    routes.append((logits.detach(), k, norm, w.detach(), ids))
                    return w, ids

                def spy_combine(y, w, ids, state, ys=None, gate=None):
                    out = combine(y, w, ids, state, ys, gate)
                    combines.append((y.detach(), w.detach(), ids, None if ys is None else
                                     ys.detach(), None if gate is None else gate.detach(),
                                     out.detach()))
                    return out
                patch_module._moe_route, patch_module._moe_combine = spy_route, spy_combine
                try:
                    parity.hf.patch(model, policy)
                    with torch.no_grad():
                        model(tokens)
                    parity.hf.unpatch(model)
                finally:
                    patch_module._moe_route, patch_module._moe_combine = route, combine
                self.assertTrue(routes and len(routes) == len(combines))
                for (logits, k, norm, w, ids), (y, w2, ids2, ys, gate, out) in zip(routes,
                                                                                 combines):
                    c_ids, c_w = regions.moe_route(logits.numpy(), k, norm_topk_prob=norm,
                                                   policy=policy)
                    self.assertTrue(np.array_equal(c_ids.astype(np.int64), ids.numpy()),
                                    "%s %s: the experts chosen differ" % (name, policy))
                    self.assertTrue(np.array_equal(c_w.view(np.uint32),
                                                   w.numpy().view(np.uint32)),
                                    "%s %s: the routing weights differ" % (name, policy))
                    c_out = regions.moe_combine(
                        y.numpy(), ids.numpy(), w.numpy(), k, policy=policy,
                        y_shared=None if ys is None else ys.numpy(),
                        shared_gate=None if gate is None else gate.numpy())
                    self.assertTrue(np.array_equal(c_out.view(np.uint32),
                                                   out.numpy().view(np.uint32)),
                                    "%s %s: the combine differs in %d of %d" % (
                                        name, policy, int((c_out != out.numpy()).sum()),
                                        c_out.size))
                print("  %s %s: %d sparse layers' routes and combines bitwise"
                      % (name, policy if isinstance(policy, str) else "vllm+topk-softmax",
                         len(routes)))

    def test_logprobs_against_score(self):
        for name in MOE_CHECKPOINTS:
            model = load_moe(name)
            tokens = moe_tokens(model)
            unpatched = logprobs(model, tokens)
            with parity.Model(MOE_CHECKPOINTS[name]) as pm:
                for preset in MOE_PRESETS:
                    near, far = distances(model, pm, tokens, preset, unpatched)
                    print("  %-15s %-13s mean |d logp| %.2e patched / %.2e transformers"
                          % (name, preset, near, far))
                    self.assertLess(near, 2e-3, "%s %s" % (name, preset))
                    if preset != "hf-eager":
                        self.assertLess(near * 5, far, "%s %s" % (name, preset))

    def test_gradients(self):
        for name in MOE_CHECKPOINTS:
            model = load_moe(name)
            tokens = moe_tokens(model)
            parity.hf.patch(model, "vllm")
            logits = model(tokens).logits
            lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])
            (-lp.mean()).backward()
            for n, p in model.named_parameters():
                self.assertTrue(bool(torch.isfinite(p.grad).all()), "%s: %s" % (name, n))
                if "experts" not in n:   # an expert no token chose has no gradient
                    self.assertGreater(float(p.grad.float().norm()), 0.0, "%s: %s" % (name, n))
            router = [p.grad for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")]
            self.assertTrue(router and all(float(g.float().norm()) > 0 for g in router))
            parity.hf.unpatch(model)

    def test_topk_softmax_needs_norm_topk_prob(self):
        model = load_moe("qwen2-moe-tiny")   # norm_topk_prob false
        with self.assertRaises(ValueError) as cm:
            parity.hf.patch(model, parity.Policy.from_name("vllm").replace(
                moe_router="topk-softmax"))
        self.assertIn("moe_router", str(cm.exception))
        self.assertIsNone(patch_module.patched_policy(model))


def main():
    try:
        harness.run("test_hf_patch")
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
