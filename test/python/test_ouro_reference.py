"""Known-answer test of the Ouro (looped) forward: libparity's log-probs on synthetic:ouro-tiny
against an independent fp32 PyTorch implementation written here from the description of
ByteDance Ouro (transformers' remote-code modeling_ouro.py), on the weights the model saves
(model.save: config.json + model.safetensors, read here with a small safetensors reader).

Two variants of the model: "synthetic" as built, and "sharpened" (some weights replaced with
Model.update, see sharpened()): the synthetic sandwich norms have weights ~0.02, so the loops
barely move the state and attention and log-probs are close to uniform, which would let a bug
hide; the sharpened one has full-size residual updates, contrasted attention and log-probs
spread over -11..-3. Every check runs on both, on seeded random sequences of lengths 1..40.

It asserts:
  - the config is ouro-tiny's, and the saved checkpoint holds exactly the Ouro tensor names,
    shaped as the config says (and the update's values);
  - Model.score(policy="fp32") (dense: every position runs all T loops) agrees with the
    reference within TOL_FP32 = 1e-5 (max |difference| of the log-probs, absolute);
  - Model.score(policy="fp32", depths=..., loop_kv="last-exited") agrees with the reference's
    replay of the schedule within 1e-5, for the schedules all-1, all-T, random depths,
    (T, 2, 2, 2, ...) and (T, 2, 4, 3, 2, T, 2, 4, 3, 2, ...);
  - the dense learner's readouts under "fp32" within 1e-5 of the reference's: every loop's
    log-probs (score(loop_logprobs=True)), each loop read alone (readout=k) and HF's expected
    logits, sum_t p_t lm_head(state_t) with the gate's exit distribution
    (readout="expected-logits"); and they discriminate: the expected logits are neither the
    last loop's nor the mixture with the weights reversed (by 0.02 nats and more);
  - the "hf-eager" preset (bf16 everywhere) is within BF16_BOUNDS of the fp32 reference, mean
    and max |dlogp|, dense and replayed, and its dense readouts too (bounds ~2-3x above the
    figures measured);
  - parity.torch.CausalLM on the looped model: replaying each sampled completion's schedule
    (threshold exits, both KV rules, hf-eager and aligned) gives the sampler's log-probs bit
    for bit, its dense forward and every-loop readout Model.score's; under fp32 its gradient
    of a replayed schedule's log-probs matches the reference's autograd within 1e-4 relative
    (1e-6 measured), while the reference with the K/V copies detached is 0.2-0.4 off: the
    gradient flows through the copies, the schedule held constant;
  - the cases discriminate (on the reference): all-1 is not dense, and where a read position
    runs deeper than an earlier one (so attends to its copied K/V) the replay differs from
    "the dense forward read at depth d_j" by more than 10 * TOL_FP32 (0.58 nats at least on
    the sharpened model), so the fp32 agreement tests the LAST_EXITED rule and not just the
    read-out depth; elsewhere, as in (T, 2, 2, ...), the two are equal; and the replay with
    every depth T is the plain dense forward (self-checks of the reference).

    /usr/bin/python3 test/python/test_ouro_reference.py BUILD_DIR

Needs torch and numpy (Debian: python3-torch, python3-numpy); exits 77 (skipped) without them.
"""

import harness

BUILD = harness.setup()
torch, np = harness.require("Ouro reference tests", ["torch", "numpy"],
                            "python3-torch python3-numpy")

import json  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import unittest  # noqa: E402

import parity  # noqa: E402

# The byte-level reference's tools: its safetensors reader.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                "reference", "tools"))
import reference  # noqa: E402

SPEC = "synthetic:ouro-tiny:7"
#: fp32 against the fp32 reference: max |dlogp|, absolute (the log-probs are ~3-6 nats).
TOL_FP32 = 1e-5
#: hf-eager (bf16 weights, activations and rounding points) against the fp32 reference:
#: variant -> (bound on the mean |dlogp|, bound on the max). Measured, dense and replayed alike:
#: synthetic mean 0.0015, max 0.0048 (log-probs -5.9..-5.1, near-uniform); sharpened mean
#: 0.016, max 0.073 (log-probs -10.9..-3.1; larger activations, sharper softmaxes: more bf16
#: rounding reaches the log-probs). The bounds are ~3x above that.
BF16_BOUNDS = {"synthetic": (0.005, 0.015), "sharpened": (0.05, 0.2)}
torch.set_num_threads(1)


# ---- the checkpoint ---------------------------------------------------------------------------

def read_safetensors(path):
    """{name: float32 torch tensor} from a .safetensors file (BF16, F16 or F32 tensors)."""
    return {name: torch.from_numpy(values)
            for name, (_, values) in reference.safetensors_arrays(path).items()}


def expected_shapes(cfg):
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q_dim = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_dim = cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    if cfg["early_exit_gate"]:
        shapes["model.early_exit_gate.weight"] = [1, H]
        shapes["model.early_exit_gate.bias"] = [1]
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [V, H]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        shapes.update({
            p + "input_layernorm.weight": [H], p + "input_layernorm_2.weight": [H],
            p + "post_attention_layernorm.weight": [H],
            p + "post_attention_layernorm_2.weight": [H],
            p + "self_attn.q_proj.weight": [q_dim, H], p + "self_attn.k_proj.weight": [kv_dim, H],
            p + "self_attn.v_proj.weight": [kv_dim, H], p + "self_attn.o_proj.weight": [H, q_dim],
            p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H],
            p + "mlp.down_proj.weight": [H, I]})
    return shapes


# ---- the reference ----------------------------------------------------------------------------

class Reference:
    """Ouro's forward in plain PyTorch, in `dtype` (float32 for the test)."""

    def __init__(self, weights, cfg, dtype=torch.float32):
        self.W = {k: v.to(dtype) for k, v in weights.items()}
        self.dtype = dtype
        self.H = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.hd = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg["rope_theta"]
        self.layers = cfg["num_hidden_layers"]
        self.T = cfg["total_ut_steps"]
        self.head = self.W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] \
            else self.W["lm_head.weight"]

    def rms(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rope_tables(self, n):
        """cos and sin, [n, 1, hd], of cat(angles, angles), angle = pos * inv_freq (computed in
        float64, then cast)."""
        i = torch.arange(self.hd // 2, dtype=torch.float64)
        inv_freq = self.theta ** (-(i * 2) / self.hd)
        angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    def qkv(self, l, x, cos, sin):
        """Layer l's q [n, heads, hd], and k, v [n, kv_heads, hd] (q and k rotated) of the
        hidden states x (the input layernorm applied here)."""
        p = "model.layers.%d." % l
        n = x.shape[0]
        x = self.rms(x, self.W[p + "input_layernorm.weight"])
        q = (x @ self.W[p + "self_attn.q_proj.weight"].T).view(n, self.heads, self.hd)
        k = (x @ self.W[p + "self_attn.k_proj.weight"].T).view(n, self.kv_heads, self.hd)
        v = (x @ self.W[p + "self_attn.v_proj.weight"].T).view(n, self.kv_heads, self.hd)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        return q, k, v

    def attention(self, q, k, v):
        """Causal GQA softmax attention: [n, heads * hd]."""
        n = q.shape[0]
        group = self.heads // self.kv_heads
        out = torch.empty(n, self.heads, self.hd, dtype=self.dtype)
        mask = torch.ones(n, n, dtype=torch.bool).triu(1)
        for h in range(self.heads):
            kh, vh = k[:, h // group], v[:, h // group]
            scores = (q[:, h] @ kh.T) * self.hd ** -0.5
            scores = scores.masked_fill(mask, float("-inf"))
            out[:, h] = torch.softmax(scores, dim=-1) @ vh
        return out.reshape(n, self.heads * self.hd)

    def finish_layer(self, l, h, q, k, v):
        """The rest of decoder layer l after q, k, v: attention, o_proj, the sandwich norms,
        the residuals and the MLP."""
        p = "model.layers.%d." % l
        a = self.attention(q, k, v) @ self.W[p + "self_attn.o_proj.weight"].T
        h = h + self.rms(a, self.W[p + "input_layernorm_2.weight"])
        x = self.rms(h, self.W[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(x @ self.W[p + "mlp.gate_proj.weight"].T)
        up = x @ self.W[p + "mlp.up_proj.weight"].T
        m = (gate * up) @ self.W[p + "mlp.down_proj.weight"].T
        return h + self.rms(m, self.W[p + "post_attention_layernorm_2.weight"])

    def logprobs(self, ids, loop_states):
        """log p(x_t | x_<t), t = 1..n-1, position t-1's logits taken from loop_states[t-1]
        (its normed state at the loop it exits after)."""
        logits = loop_states @ self.head.T
        lp = torch.log_softmax(logits, dim=-1)
        return lp[:-1].gather(1, ids[1:, None]).squeeze(1)

    def dense(self, seq):
        """Every position runs every loop. Returns (log-probs, [n, T, hidden] the normed state
        after each loop)."""
        ids = torch.tensor(seq, dtype=torch.long)
        cos, sin = self.rope_tables(len(seq))
        h = self.W["model.embed_tokens.weight"][ids]
        per_loop = []
        for _ in range(self.T):
            for l in range(self.layers):
                h = self.finish_layer(l, h, *self.qkv(l, h, cos, sin))
            h = self.rms(h, self.W["model.norm.weight"])
            per_loop.append(h)
        states = torch.stack(per_loop, dim=1)
        return self.logprobs(ids, states[:, -1]), states

    def exit_pdf(self, states):
        """The exit distribution [n, T] from the gate on each loop's normed state:
        lambda_t = sigmoid(gate), p_t = lambda_t * remaining and remaining *= 1 - lambda_t
        before the last loop, which takes the remaining mass."""
        gate = states @ self.W["model.early_exit_gate.weight"].T + \
            self.W["model.early_exit_gate.bias"]
        lam = torch.sigmoid(gate.squeeze(-1))
        remaining, pdf = torch.ones_like(lam[:, 0]), []
        for t in range(self.T):
            if t < self.T - 1:
                pdf.append(lam[:, t] * remaining)
                remaining = remaining * (1 - lam[:, t])
            else:
                pdf.append(remaining)
        return torch.stack(pdf, dim=1)

    def loop_logprobs(self, seq):
        """Dense: every loop's log-probs, [n - 1, T]."""
        ids = torch.tensor(seq, dtype=torch.long)
        _, states = self.dense(seq)
        return torch.stack([self.logprobs(ids, states[:, t]) for t in range(self.T)], dim=1)

    def expected_logits(self, seq):
        """Dense: the log-probs of the expected logits sum_t p_t * lm_head(state_t)."""
        ids = torch.tensor(seq, dtype=torch.long)
        _, states = self.dense(seq)
        pdf = self.exit_pdf(states)
        logits = sum(pdf[:, t, None] * (states[:, t] @ self.head.T) for t in range(self.T))
        lp = torch.log_softmax(logits, dim=-1)
        return lp[:-1].gather(1, ids[1:, None]).squeeze(1)

    def replay(self, seq, depths, detach_copies=False):
        """The depth schedule with LAST_EXITED K/V: loop d runs the positions whose depth is
        > d; in each layer, an exited position's K/V are the previous loop's K/V of that layer
        (so a copy of its K/V at its last loop); an exited position keeps its last normed
        state, and its log-prob is read from it."""
        ids = torch.tensor(seq, dtype=torch.long)
        depths = torch.tensor(depths, dtype=torch.long)
        assert depths.min() >= 1 and depths.max() <= self.T
        cos, sin = self.rope_tables(len(seq))
        state = self.W["model.embed_tokens.weight"][ids]
        prev_kv = [None] * self.layers  # layer l's K/V at the previous loop
        for d in range(int(depths.max())):
            active = depths > d
            keep = (~active)[:, None, None]
            h = state
            for l in range(self.layers):
                q, k, v = self.qkv(l, h, cos, sin)
                if d > 0:
                    pk, pv = prev_kv[l]
                    if detach_copies:
                        pk, pv = pk.detach(), pv.detach()
                    k = torch.where(keep, pk, k)
                    v = torch.where(keep, pv, v)
                prev_kv[l] = (k, v)
                h = self.finish_layer(l, h, q, k, v)
            h = self.rms(h, self.W["model.norm.weight"])
            state = torch.where(active[:, None], h, state)
        return self.logprobs(ids, state)


# ---- the cases --------------------------------------------------------------------------------

LENGTHS = [1, 2, 3, 9, 17, 26, 40]


def sequences(vocab):
    g = torch.Generator().manual_seed(20240)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENGTHS]


def schedules(n, T, seed):
    """name -> one depth (1..T) per token."""
    g = torch.Generator().manual_seed(seed)
    pattern = [T, 2, 4, 3, 2]
    return {
        "all-1": [1] * n,
        "all-T": [T] * n,
        "random": torch.randint(1, T + 1, (n,), generator=g).tolist(),
        "T,2,2,2,...": [T] + [2] * (n - 1),
        "T,2,4,3,2,...": [min(pattern[i % len(pattern)], T) for i in range(n)],
    }


def copies_matter(depths):
    """Whether some read position (0..n-2) runs deeper than an earlier position, so attends to
    that position's copied K/V."""
    n = len(depths)
    return any(depths[a] < depths[b] for b in range(n - 1) for a in range(b))


def sharpened(weights, cfg):
    """New values for some weights of the synthetic model, on the bf16 grid (so the saved bf16
    checkpoint is exactly the fp32 master): the synthetic sandwich norms (input_layernorm_2,
    post_attention_layernorm_2) have weights ~0.02, which make every residual update ~2% of
    its size, near-uniform attention and log-probs close to -ln(vocab); here they are ~1, q
    and k are 4x (attention scores of std ~1.5) and lm_head 10x (peaked log-probs)."""
    g = torch.Generator().manual_seed(31)
    H = cfg["hidden_size"]
    new = {}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        for norm in ("input_layernorm_2", "post_attention_layernorm_2"):
            new[p + norm + ".weight"] = 1.0 + 0.1 * torch.randn(H, generator=g)
        for proj in ("q_proj", "k_proj"):
            name = p + "self_attn.%s.weight" % proj
            new[name] = 4.0 * weights[name]
    new["lm_head.weight"] = 10.0 * weights["lm_head.weight"]
    return {k: v.to(torch.bfloat16).float().numpy() for k, v in new.items()}


def bits(values):
    """The float32 bit patterns of a list or tensor of log-probs."""
    if isinstance(values, torch.Tensor):
        values = values.detach().tolist()
    return [struct.unpack("<I", struct.pack("<f", x))[0] for x in values]


def as_tensor(values):
    return torch.tensor(list(values), dtype=torch.float64)


class Variant:
    """A model under test, its saved weights and the reference on them."""

    def __init__(self, name, sharpen):
        self.name = name
        self.model = parity.Model(SPEC, threads=1)
        self.cfg = self.model.config
        if sharpen:
            with tempfile.TemporaryDirectory() as d:
                self.model.save(d)
                synthetic = read_safetensors(os.path.join(d, "model.safetensors"))
            self.model.update(sharpened(synthetic, self.cfg))
        with tempfile.TemporaryDirectory() as d:
            self.model.save(d)
            self.weights = read_safetensors(os.path.join(d, "model.safetensors"))
        self.ref = Reference(self.weights, self.cfg)
        self.T = self.cfg["total_ut_steps"]
        self.seqs = sequences(self.cfg["vocab_size"])


class Ouro(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.variants = [Variant("synthetic", False), Variant("sharpened", True)]

    @classmethod
    def tearDownClass(cls):
        for v in cls.variants:
            v.model.close()

    def test_config_and_checkpoint(self):
        for v in self.variants:
            cfg = v.cfg
            self.assertEqual(cfg["arch"], "ouro")
            self.assertEqual((cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"],
                              cfg["num_hidden_layers"], cfg["num_attention_heads"],
                              cfg["num_key_value_heads"], cfg["head_dim"],
                              cfg["total_ut_steps"]), (256, 64, 160, 2, 4, 2, 16, 4))
            self.assertTrue(cfg["early_exit_gate"])
            self.assertFalse(cfg["tie_word_embeddings"])
            got = {name: list(t.shape) for name, t in v.weights.items()}
            self.assertEqual(got, expected_shapes(cfg), v.name)
        # the update took: the sharpened checkpoint holds the new values
        base, sharp = (v.weights for v in self.variants)
        self.assertTrue(torch.equal(sharp["lm_head.weight"],
                                    (10.0 * base["lm_head.weight"]).to(torch.bfloat16).float()))

    def test_reference_replay_all_T_is_dense(self):
        for v in self.variants:
            for seq in v.seqs:
                if len(seq) < 2:
                    continue
                dense, _ = v.ref.dense(seq)
                replayed = v.ref.replay(seq, [v.T] * len(seq))
                self.assertLess((dense - replayed).abs().max().item(), 1e-6,
                                "%s, length %d" % (v.name, len(seq)))

    def compare(self, got, want, what):
        """(max |got - want|, sum of |got - want|, how many) over the log-probs."""
        got, want = as_tensor(got), want.double()
        self.assertEqual(got.shape, want.shape, what)
        if got.numel() == 0:
            return 0.0, 0.0, 0
        self.assertTrue(torch.isfinite(got).all().item(), what)
        diff = (got - want).abs()
        return diff.max().item(), diff.sum().item(), diff.numel()

    def check(self, v, policy, replay):
        """Scores every sequence of variant v (dense, or under every schedule when replay)
        under `policy` against the reference; prints and returns (max |dlogp|, mean |dlogp|,
        where the max was)."""
        worst, total, count = (0.0, ""), 0.0, 0
        for i, seq in enumerate(v.seqs):
            n = len(seq)
            if replay:
                cases = [(name, dict(depths=d, loop_kv="last-exited"), v.ref.replay(seq, d))
                         for name, d in schedules(n, v.T, seed=100 + i).items()]
            else:
                cases = [("dense", {}, v.ref.dense(seq)[0])]
            for name, opts, want in cases:
                what = "%s, %s, length %d, %s" % (v.name, policy, n, name)
                got = v.model.score(seq, policy=policy, **opts)
                mx, s, k = self.compare(got, want, what)
                worst = max(worst, (mx, what))
                total, count = total + s, count + k
        mean = total / count
        print("%s %s %s against the fp32 reference: max |dlogp| %.3g (%s), mean %.3g"
              % (v.name, policy, "replay" if replay else "dense", worst[0], worst[1], mean))
        return worst[0], mean, worst[1]

    def test_fp32(self):
        for v in self.variants:
            for replay in (False, True):
                mx, _, where = self.check(v, "fp32", replay)
                self.assertLess(mx, TOL_FP32, where)

    def test_hf_eager(self):
        for v in self.variants:
            for replay in (False, True):
                mx, mean, where = self.check(v, "hf-eager", replay)
                mean_bound, max_bound = BF16_BOUNDS[v.name]
                self.assertLess(mean, mean_bound, where)
                self.assertLess(mx, max_bound, where)

    def check_readouts(self, v, policy):
        """The dense readouts of variant v under `policy` against the reference: every loop's
        log-probs (Scores.loop_logprobs), each loop read alone (readout=k) and the expected
        logits; returns {readout: (max |dlogp|, mean |dlogp|)}."""
        stats = {}
        for i, seq in enumerate(v.seqs):
            n = len(seq)
            every = v.ref.loop_logprobs(seq)
            got = v.model.score(seq, policy=policy, loop_logprobs=True).loop_logprobs
            cases = [("every loop", [x for row in got for x in row], every.reshape(-1)),
                     ("expected logits", v.model.score(seq, policy=policy,
                                                       readout="expected-logits"),
                      v.ref.expected_logits(seq))]
            cases += [("loop %d" % k, v.model.score(seq, policy=policy, readout=k),
                       every[:, k - 1]) for k in range(1, v.T + 1)]
            for name, have, want in cases:
                mx, total, count = self.compare(have, want, "%s, %s, length %d, %s"
                                                % (v.name, policy, n, name))
                key = "loop k" if name.startswith("loop ") else name
                m0, t0, c0 = stats.get(key, (0.0, 0.0, 0))
                stats[key] = (max(m0, mx), t0 + total, c0 + count)
        out = {}
        for key, (mx, total, count) in stats.items():
            out[key] = (mx, total / count)
            print("%s %s %s against the fp32 reference: max |dlogp| %.3g, mean %.3g"
                  % (v.name, policy, key, mx, total / count))
        return out

    def test_dense_readouts_fp32(self):
        for v in self.variants:
            for key, (mx, _) in self.check_readouts(v, "fp32").items():
                self.assertLess(mx, TOL_FP32, "%s, %s" % (v.name, key))

    def test_dense_readouts_hf_eager(self):
        for v in self.variants:
            mean_bound, max_bound = BF16_BOUNDS[v.name]
            for key, (mx, mean) in self.check_readouts(v, "hf-eager").items():
                self.assertLess(mean, mean_bound, "%s, %s" % (v.name, key))
                self.assertLess(mx, max_bound, "%s, %s" % (v.name, key))

    def test_readouts_discriminate(self):
        """What the readouts' fp32 agreement rules out, on the reference: the expected logits
        are neither the last loop's nor a mixture with the exit distribution reversed, and
        the loops differ from each other, by more than 10 * TOL_FP32."""
        for v in self.variants:
            gaps = {"last loop": 0.0, "reversed weights": 0.0, "loop 1 vs T": 0.0}
            for seq in v.seqs:
                if len(seq) < 2:
                    continue
                ids = torch.tensor(seq)
                _, states = v.ref.dense(seq)
                pdf = v.ref.exit_pdf(states).flip(1)
                logits = sum(pdf[:, t, None] * (states[:, t] @ v.ref.head.T)
                             for t in range(v.T))
                reversed_mix = torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0]
                mix, every = v.ref.expected_logits(seq), v.ref.loop_logprobs(seq)
                for key, other in (("last loop", every[:, -1]), ("reversed weights", reversed_mix),
                                   ("loop 1 vs T", None)):
                    d = (every[:, 0] - every[:, -1]) if other is None else (mix - other)
                    gaps[key] = max(gaps[key], d.abs().max().item())
            print("%s: expected logits against %s" % (v.name, ", ".join(
                "%s %.3g" % kv for kv in gaps.items())))
            for key, gap in gaps.items():
                self.assertGreater(gap, 10 * TOL_FP32, "%s, %s" % (v.name, key))

    def test_torch_learner_replays_bitwise(self):
        """parity.torch.CausalLM on a looped model: the replay of each completion's schedule
        under its KV rule gives the early-exit sampler's log-probs bit for bit, the dense
        forward and its every-loop readout Model.score's."""
        from parity.torch import CausalLM
        for v in self.variants:
            prompt = v.seqs[4][:9]
            for pol in ("hf-eager", "aligned"):
                lm = CausalLM(v.model, policy=pol, threads=2)
                for kv in ("last-exited", "full"):
                    with v.model.sampler(policy=pol, loop_kv=kv) as s:
                        got = s.generate(prompt, n=3, max_tokens=10, seed=3, temperature=1.0,
                                         exit_rule="threshold", exit_threshold=0.6)
                    seqs = [prompt + c.tokens for c in got]
                    lps = lm(seqs, depths=[c.schedule(v.T) for c in got])
                    for c, lp in zip(got, lps):
                        self.assertEqual(bits(lp[len(prompt) - 1:]), bits(c.logprobs),
                                         "%s, %s, %s" % (v.name, pol, kv))
                    self.assertTrue(any(min(c.exit_depths) < v.T for c in got))
                dense = lm(seqs, loop_logprobs=True)
                want = v.model.score(seqs, policy=pol, loop_logprobs=True)
                for (lp, every), w_lp, w_every in zip(dense, want.logprobs, want.loop_logprobs):
                    self.assertEqual(bits(lp), bits(w_lp))
                    self.assertEqual(bits(every.reshape(-1)), bits([x for r in w_every for x in r]))
                with self.assertRaisesRegex(parity.ParityError, "sampled with loop_kv"):
                    lm(seqs, depths=[c.schedule(v.T) for c in got], loop_kv="last-exited")
                with self.assertRaisesRegex(parity.ParityError, "depth 0 is not in 1..4"):
                    lm([prompt], depths=[[0] * len(prompt)])
                lm.close()

    def test_torch_learner_gradient(self):
        """The torch learner's gradient under a replayed schedule, fp32, against the fp32
        reference's autograd (the copied K/V carry gradient to their exit loop); and the
        reference with the copies detached is farther off than that, so the agreement tests
        the gradient through the copies."""
        from parity.torch import CausalLM
        names = ["model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
                 "model.layers.1.mlp.down_proj.weight", "lm_head.weight"]
        v = self.variants[1]
        seq = v.seqs[6][:26]
        d = schedules(len(seq), v.T, seed=106)["random"]
        self.assertTrue(copies_matter(d))
        lm = CausalLM(v.model, policy="fp32", threads=2)
        (-lm([seq], depths=[d], loop_kv="last-exited")[0].sum()).backward()
        got = {n: lm._param(n).grad.clone() for n in names}
        lm.close()

        def ref_grads(detach):
            leaves = {k: t.clone().requires_grad_(True) for k, t in v.weights.items()}
            ref = Reference(leaves, v.cfg)
            (-ref.replay(seq, d, detach_copies=detach).sum()).backward()
            return {n: leaves[n].grad for n in names}

        want, detached = ref_grads(False), ref_grads(True)
        for n in names:
            scale = want[n].abs().max().item()
            err = (got[n] - want[n]).abs().max().item() / scale
            off = (detached[n] - want[n]).abs().max().item() / scale
            print("%s: gradient of %s against the reference: max relative %.2g (detached "
                  "copies: %.2g)" % (v.name, n, err, off))
            self.assertLess(err, 1e-4, n)
            if "k_proj" in n or "v_proj" in n:
                self.assertGreater(off, 100 * max(err, 1e-7), n)

    def test_cases_discriminate(self):
        """What the fp32 agreement rules out, on the reference: the depth matters (all-1 is
        not dense); and the replay against the dense forward read at depth d_j differs by more
        than 10 * TOL_FP32 exactly where copies_matter (a read position attends to an earlier
        position's copied K/V), and agrees otherwise (a self-check of the reference). The
        random and T,2,4,3,2 schedules must have such cases."""
        for v in self.variants:
            shown, smallest = set(), float("inf")
            for i, seq in enumerate(v.seqs):
                n = len(seq)
                if n < 2:
                    continue
                ids = torch.tensor(seq)
                dense, states = v.ref.dense(seq)
                shallow = v.ref.replay(seq, [1] * n)
                self.assertGreater((shallow - dense).abs().max().item(), 10 * TOL_FP32)
                for name, d in schedules(n, v.T, seed=100 + i).items():
                    read_at_depth = v.ref.logprobs(ids, states[torch.arange(n),
                                                                torch.tensor(d) - 1])
                    effect = (v.ref.replay(seq, d) - read_at_depth).abs().max().item()
                    what = "%s, length %d, %s: effect %.3g" % (v.name, n, name, effect)
                    if copies_matter(d):
                        self.assertGreater(effect, 10 * TOL_FP32, what)
                        shown.add(name)
                        smallest = min(smallest, effect)
                    else:
                        self.assertLess(effect, 1e-6, what)
            self.assertEqual(shown, {"random", "T,2,4,3,2,..."}, v.name)
            print("%s: smallest effect of the K/V copies on a log-prob %.3g" % (v.name, smallest))


if __name__ == "__main__":
    harness.run("test_ouro_reference")
