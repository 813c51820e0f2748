"""parity.torch.CausalLM on mixture-of-experts models (Qwen3-MoE, Qwen2-MoE; synthetic and the
transformers checkpoints of test/data/moe): its log-probs equal parity_score's bitwise under
hf-eager, vllm, sglang, aligned, fp32, +fp16 and +fp8-block, routing itself and replaying a
sampler's routing record (under the sampler's policy, the sampler's log-probs), built from a
checkpoint in either expert layout; the router's
gradient against central finite differences of the C router, and the whole model's against
finite differences of its own forward with the routes held fixed; the weight sync of the
experts and the router; bad routing records.

    /usr/bin/python3 test/python/test_moe_learner.py BUILD_DIR

Needs torch (Debian: python3-torch); exits 77 (skipped) without it.
"""

import harness

BUILD = harness.setup()
(torch,) = harness.require("parity.torch MoE learner tests", ["torch"], "python3-torch")

import unittest  # noqa: E402

import parity  # noqa: E402
from parity import ParityError, Policy  # noqa: E402
from parity.torch import CausalLM, moe_combine, moe_route  # noqa: E402
from test_moe import MODELS, PROMPTS, model  # noqa: E402
from test_moe import bits as float_bits  # noqa: E402

POLICIES = ["hf-eager", "vllm", "sglang", "aligned", "fp32", "hf-eager+fp16",
            "vllm+fp8-block:deepseek"]


def bits(values):
    """float32 bit patterns of a sequence of floats or a tensor."""
    return float_bits(values.detach().tolist() if isinstance(values, torch.Tensor) else values)


def sample(m, policy):
    cs = m.generate(PROMPTS, n=2, max_tokens=9, policy=policy, record_routes=True,
                    temperature=1.0, seed=29)
    return cs, [PROMPTS[c.prompt_index] + c.tokens for c in cs]


class Forward(unittest.TestCase):
    def test_forward_equals_score(self):
        seqs = PROMPTS + [[7], [200, 1, 2]]
        for spec in MODELS:
            m = model(spec)
            for policy in POLICIES:
                with self.subTest(model=spec, policy=policy):
                    lm = CausalLM(m, policy=policy, threads=2)
                    want = m.score(seqs, policy=policy)
                    for got, w in zip(lm(seqs), want):
                        self.assertEqual(bits(got), bits(w))
                    lm.close()

    def test_fused_checkpoint_directory(self):
        # built from a directory in transformers 5's fused 3-D expert layout: the same
        # parameters and bits as from the per-expert checkpoint
        import os
        from test_moe import DATA
        seqs = PROMPTS + [[200, 1, 2]]
        for name in ("qwen3-moe-tiny", "qwen2-moe-tiny"):
            with self.subTest(model=name):
                per = CausalLM(os.path.join(DATA, name), policy="hf-eager", threads=2)
                fused = CausalLM(os.path.join(DATA, name + "-fused"), policy="hf-eager",
                                 threads=2)
                p, f = dict(per.named_parameters()), dict(fused.named_parameters())
                self.assertEqual(sorted(p), sorted(f))
                for k in p:
                    self.assertTrue(torch.equal(p[k], f[k]), k)
                want = model(os.path.join(DATA, name)).score(seqs, policy="hf-eager")
                for got, w in zip(fused(seqs), want):
                    self.assertEqual(bits(got), bits(w))
                per.close()
                fused.close()

    def test_replay_equals_sampler_and_score(self):
        for spec in MODELS:
            m = model(spec)
            for sampler in ("vllm", "hf-eager"):
                cs, seqs = sample(m, sampler)
                records = [c.routes for c in cs]
                for policy in (sampler, "sglang", "aligned"):
                    with self.subTest(model=spec, sampler=sampler, policy=policy):
                        lm = CausalLM(m, policy=policy, threads=2)
                        got = lm(seqs, routes=records)
                        want = m.score(seqs, policy=policy, routes=records)
                        for g, w, c in zip(got, want, cs):
                            self.assertEqual(bits(g), bits(w))
                            if policy == sampler:
                                self.assertEqual(bits(g[c.prompt_len - 1:]), bits(c.logprobs))
                        # the records as nested lists, with a last position: the same bits
                        again = lm(seqs, routes=[r.tolist() + [r[0]] for r in records])
                        self.assertEqual([bits(g) for g in again], [bits(g) for g in got])
                        lm.close()

    def test_parameters_and_sync(self):
        m = parity.Model("synthetic:qwen2-moe-tiny:5", threads=2)
        lm = CausalLM(m, policy="vllm", threads=2)
        names = dict(lm.named_parameters())
        for name in ("model.layers.0.mlp.gate.weight",
                     "model.layers.2.mlp.experts.7.down_proj.weight",
                     "model.layers.1.mlp.shared_expert.up_proj.weight",
                     "model.layers.1.mlp.shared_expert_gate.weight"):
            self.assertIn(name, names)
        seqs = [PROMPTS[1]]
        with torch.no_grad():
            names["model.layers.0.mlp.gate.weight"].mul_(3.0)
            names["model.layers.1.mlp.experts.2.up_proj.weight"].add_(0.01)
            names["model.layers.1.mlp.shared_expert_gate.weight"].neg_()
        before = m.score(seqs, policy="vllm")
        lm.sync_to(m)
        after = m.score(seqs, policy="vllm")
        self.assertNotEqual(bits(before[0]), bits(after[0]))
        self.assertEqual(bits(lm(seqs)[0]), bits(after[0]))
        m.close()


def spaced_logits(rows, experts, seed):
    """Router logits whose sorted values are at least 0.25 apart (no top-k choice moves under
    a perturbation of 1e-2)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.arange(experts, dtype=torch.float64) * 0.5 - 1.5
    out = torch.stack([base[torch.randperm(experts, generator=g)] for _ in range(rows)])
    return (out + torch.rand(rows, experts, generator=g, dtype=torch.float64) * 0.25).float()


class Gradients(unittest.TestCase):
    def test_router_gradient_finite_differences(self):
        """d/d(logits) of sum(c * weights) for each router rule and norm_topk_prob, under
        compute fp32 (no rounding point, so the forward is a smooth fp32 function of the
        logits), against central differences of the C router with h = 1e-2. The tolerance,
        2e-4 + 1e-3 |g|, holds the truncation error h^2/6 |f'''| (softmax derivatives of these
        O(1) sums are below 1: < 2e-5) and the fp32 rounding of the forward over 2h
        (6e-8 x |f| / 2e-2: < 1e-5) with room."""
        h = 1e-2
        for router in ("hf", "vllm", "sglang", "topk-softmax"):
            for norm in (True, False):
                if router == "topk-softmax" and not norm:
                    continue
                pol = Policy.from_name("fp32").replace(moe_router=router)
                logits = spaced_logits(5, 8, 3).requires_grad_()
                c = torch.randn(5, 3, generator=torch.Generator().manual_seed(4))
                w, ids = moe_route(logits, 3, norm, pol)
                (w * c).sum().backward()
                g = logits.grad
                fd = torch.zeros_like(g)
                with torch.no_grad():
                    for r in range(5):
                        for e in range(8):
                            x = logits.detach().clone()
                            x[r, e] += h
                            wp, ip = moe_route(x, 3, norm, pol)
                            x[r, e] -= 2 * h
                            wm, im = moe_route(x, 3, norm, pol)
                            self.assertTrue(torch.equal(ip, ids) and torch.equal(im, ids))
                            fd[r, e] = ((wp * c).sum().double() - (wm * c).sum().double()) / (2 * h)
                with self.subTest(router=router, norm=norm):
                    err = (g - fd).abs()
                    self.assertTrue(bool((err <= 2e-4 + 1e-3 * g.abs()).all()),
                                    "max error %g" % float(err.max()))
                    # the experts not chosen get a gradient only through the softmax's sum
                    if router == "topk-softmax":
                        unchosen = torch.ones_like(g, dtype=torch.bool).scatter(1, ids, False)
                        self.assertTrue(bool((g[unchosen] == 0).all()))

    def test_combine_gradient(self):
        """The combine's gradient under compute fp32 is that of sum_s w_s y_s + sigmoid(g)
        y_shared, which torch differentiates independently."""
        pol = "fp32"
        gen = torch.Generator().manual_seed(8)
        y = torch.randn(4, 3, 6, generator=gen).requires_grad_()
        w = torch.rand(4, 3, generator=gen).requires_grad_()
        ys = torch.randn(4, 6, generator=gen).requires_grad_()
        gate = torch.randn(4, generator=gen).requires_grad_()
        ids = torch.tensor([[0, 1, 2], [5, 3, 1], [2, 7, 4], [6, 0, 3]])
        out = moe_combine(y, w, ids, pol, ys, gate)
        c = torch.randn(4, 6, generator=gen)
        grads = torch.autograd.grad((out * c).sum(), (y, w, ys, gate))
        ref = (w.unsqueeze(2) * y).sum(1) + torch.sigmoid(gate).unsqueeze(1) * ys
        self.assertTrue(torch.allclose(out, ref, rtol=1e-6, atol=1e-6))
        want = torch.autograd.grad((ref * c).sum(), (y, w, ys, gate))
        for a, b in zip(grads, want):
            self.assertTrue(torch.allclose(a, b, rtol=1e-5, atol=1e-6))

    def test_model_gradient_finite_differences(self):
        """d(sum of log-probs)/d(router and expert weights) of the whole model under "fp32"
        with a routing record replayed (the choice fixed, the loss smooth), against central
        differences of the module's own forward, h = 2e-2 on the fp32 masters, at the entries
        of largest gradient. Tolerance 3% + 2e-3: the forward's fp32 rounding (about 1e-5 of
        the loss over 2h, < 1e-3) and the truncation error of the weight perturbation."""
        for spec in MODELS[:2]:
            m = model(spec)
            cs, seqs = sample(m, "fp32")
            seqs, records = seqs[:2], [c.routes for c in cs[:2]]
            lm = CausalLM(m, policy="fp32", threads=2)
            loss = sum(lp.sum() for lp in lm(seqs, routes=records))
            loss.backward()
            params = dict(lm.named_parameters())
            for name in ("model.layers.0.mlp.gate.weight",
                         "model.layers.%d.mlp.experts.%d.up_proj.weight"
                         % (m.sparse_layers[-1], int(records[0][0][-1][0]))):
                p = params[name]
                flat = p.grad.reshape(-1).abs()
                for i in torch.topk(flat, 3).indices.tolist():
                    with torch.no_grad():
                        keep = p.view(-1)[i].item()
                        p.view(-1)[i] = keep + 2e-2
                        up = sum(lp.double().sum() for lp in lm(seqs, routes=records))
                        p.view(-1)[i] = keep - 2e-2
                        down = sum(lp.double().sum() for lp in lm(seqs, routes=records))
                        p.view(-1)[i] = keep
                    fd = float(up - down) / 4e-2
                    g = float(p.grad.view(-1)[i])
                    with self.subTest(model=spec, name=name, index=i):
                        self.assertLess(abs(g - fd), 0.03 * abs(g) + 2e-3, (g, fd))
            lm.close()


class BadInput(unittest.TestCase):
    def test_bad_records(self):
        m = model(MODELS[0])
        lm = CausalLM(m, policy="vllm", threads=2)
        seq = PROMPTS[0]
        _, good = m.score(seq, policy="vllm", return_routes=True)
        E, k = m.config["num_experts"], m.config["num_experts_per_tok"]
        ids = list(good.data)
        beyond, repeated = list(ids), list(ids)
        beyond[1] = E
        repeated[k + 1] = repeated[k]
        for routes, words in (([ids[:-1]], "expert ids"), ([beyond], "not below"),
                              ([repeated], "repeated"), ([good, good], "one per sequence")):
            with self.subTest(words=words):
                with self.assertRaises(ParityError) as e:
                    lm([seq], routes=routes)
                self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
                self.assertIn(words, str(e.exception))
        dense = CausalLM(model("synthetic:tiny"), threads=1)
        with self.assertRaises(ParityError) as e:
            dense([seq], routes=[good])
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
        with self.assertRaises(ParityError) as e:
            moe_route(torch.zeros(2, 4), 2, True, "vllm", replay=torch.tensor([[0, 0], [1, 2]]))
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")


if __name__ == "__main__":
    harness.run("python-moe-learner")
