"""Mixture-of-experts routing record and replay in the Python binding: the sampler's record
(Sampler(record_routes=True), Sampler.routes, Completion.routes) on qwen3-moe-tiny and
qwen2-moe-tiny, synthetic and the transformers checkpoints of test/data/moe; sampled log-probs
== Model.score recomputed == Model.score replaying the record, bitwise, under hf-eager, vllm,
sglang and aligned; forks carry their parent's record; a record replayed under another
policy is what that policy runs (return_routes gives it back), where its own routing differs;
parity.regions.moe_route / moe_combine; and bad input (a record of the wrong size, an expert
id >= num_experts, a repeated id: ParityError PARITY_ERR_INVALID_ARGUMENT). numpy, when
present, for Routes.numpy() and numpy records.

    python3 test/python/test_moe.py BUILD_DIR
"""

import harness

BUILD = harness.setup()

import math  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402
import unittest  # noqa: E402

import parity  # noqa: E402
from parity import ParityError, Routes, regions  # noqa: E402
from parity import _lib  # noqa: E402

DATA = os.path.join(harness.REPO, "test", "data", "moe")
MODELS = ["synthetic:qwen3-moe-tiny", "synthetic:qwen2-moe-tiny",
          os.path.join(DATA, "qwen3-moe-tiny"), os.path.join(DATA, "qwen2-moe-tiny")]
PRESETS = ["hf-eager", "vllm", "sglang", "aligned"]
PROMPTS = [[3, 141, 59, 26, 5, 35, 89], [79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84]]


def bits(values):
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


_models = {}


def model(spec):
    if spec not in _models:
        _models[spec] = parity.Model(spec, threads=2)
    return _models[spec]


def sample(m, policy, n=3, max_tokens=10):
    """n completions of each prompt, the routes recorded; with their full token lists."""
    cs = m.generate(PROMPTS, n=n, max_tokens=max_tokens, policy=policy, record_routes=True,
                    temperature=1.0, seed=17)
    return cs, [PROMPTS[c.prompt_index] + c.tokens for c in cs]


class SamplerRecord(unittest.TestCase):
    def test_sampled_recomputed_replayed_bitwise(self):
        for spec in MODELS:
            m = model(spec)
            layers = len(m.sparse_layers)
            for policy in PRESETS:
                with self.subTest(model=spec, policy=policy):
                    cs, seqs = sample(m, policy)
                    for c, seq in zip(cs, seqs):
                        self.assertIsInstance(c.routes, Routes)
                        self.assertEqual(c.routes.shape, (len(seq) - 1, layers,
                                                          m.config["num_experts_per_tok"]))
                    recomputed, ran = m.score(seqs, policy=policy, return_routes=True)
                    replayed, again = m.score(seqs, policy=policy,
                                              routes=[c.routes for c in cs], return_routes=True)
                    for c, rec, rep, r1, r2 in zip(cs, recomputed, replayed, ran, again):
                        sampled = bits(c.logprobs)
                        self.assertEqual(bits(rec[c.prompt_len - 1:]), sampled)
                        self.assertEqual(bits(rep), bits(rec))
                        self.assertEqual(r1, c.routes)
                        self.assertEqual(r2, c.routes)

    def test_record_forms(self):
        """A record as Routes, nested lists, a flat list, of len - 1 or len positions, one
        sequence or several: the same log-probs."""
        m = model(MODELS[1])
        cs, seqs = sample(m, "vllm", n=1, max_tokens=6)
        c, seq = cs[0], seqs[0]
        want = bits(m.score(seq, policy="vllm", routes=c.routes))
        stride = m.route_stride
        forms = [c.routes.tolist(), list(c.routes.data), list(c.routes.data) + [0] * stride,
                 [sum(p, []) for p in c.routes.tolist()]]
        for form in forms:
            self.assertEqual(bits(m.score(seq, policy="vllm", routes=form)), want)
        both = m.score(seqs, policy="vllm", routes=[c.routes for c in cs])
        self.assertEqual(bits(both[0]), want)
        self.assertEqual(c.routes[:3], Routes(c.routes.data[:3 * stride], c.routes.layers,
                                              c.routes.k))
        self.assertEqual(c.routes[2], c.routes.tolist()[2])

    def test_forks_carry_parent_routes(self):
        m = model(MODELS[0])
        with m.sampler(policy="sglang", max_seqs=4, max_len=64, record_routes=True) as s:
            parent = s.add(PROMPTS[1], temperature=1.0, seed=3)
            before = s.routes(parent)
            self.assertEqual(len(before), len(PROMPTS[1]) - 1)
            s.step([parent])
            s.step([parent])
            grown = s.routes(parent)
            self.assertEqual(grown[:len(before)], before)
            child = s.fork(parent, 1, temperature=1.0, seed=3)
            self.assertEqual(s.routes(child), grown)
            s.step([child])
            self.assertEqual(s.routes(child)[:len(grown)], grown)
            tokens, _ = s.tokens(child)
            lp = m.score(tokens, policy="sglang", routes=s.routes(child), return_routes=True)
            self.assertEqual(lp[1], s.routes(child))

    def test_replay_under_another_policy(self):
        """A record sampled under one policy scored by another: the scorer runs the record
        (return_routes gives it back) while its own routing differs on some (position, layer)
        (the same experts in another slot order, or other experts); before the first
        difference the two log-probs agree bit for bit, and where other experts were chosen
        they follow the record, not the scorer's own route."""
        other_experts = 0
        for spec in MODELS:
            m = model(spec)
            for sampler, scorer in (("vllm", "hf-eager"), ("hf-eager", "sglang"),
                                    ("aligned", "vllm")):
                cs, seqs = sample(m, sampler)
                records = [c.routes for c in cs]
                replayed, ran = m.score(seqs, policy=scorer, routes=records, return_routes=True)
                own_lp, own = m.score(seqs, policy=scorer, return_routes=True)
                self.assertEqual(ran, records)
                for rec, mine, lp_replay, lp_own in zip(records, own, replayed, own_lp):
                    if rec == mine:
                        self.assertEqual(bits(lp_replay), bits(lp_own))
                        continue
                    first = min(j for j in range(len(rec)) if rec[j] != mine[j])
                    self.assertEqual(bits(lp_replay[:first]), bits(lp_own[:first]))
                    moved = [j for j in range(len(rec))
                             if any(sorted(a) != sorted(b) for a, b in zip(rec[j], mine[j]))]
                    if moved:
                        other_experts += 1
                        self.assertNotEqual(bits(lp_replay[moved[0]:]), bits(lp_own[moved[0]:]))
        self.assertGreater(other_experts, 0, "no recomputed route chose other experts")

    def test_numpy(self):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy is not installed")
        m = model(MODELS[1])
        cs, seqs = sample(m, "hf-eager", n=1, max_tokens=5)
        r = cs[0].routes
        a = r.numpy()
        self.assertEqual(a.dtype, np.int16)
        self.assertEqual(a.shape, r.shape)
        self.assertEqual(a.tolist(), r.tolist())
        want = bits(m.score(seqs[0], policy="hf-eager", routes=r))
        self.assertEqual(bits(m.score(seqs[0], policy="hf-eager", routes=a)), want)
        self.assertEqual(bits(m.score(seqs[0], policy="hf-eager",
                                      routes=a.reshape(len(r), -1).astype(np.int64))), want)
        ids, w = regions.moe_route(np.array([[0.0, math.log(3), math.log(3), 0.0]]), 2,
                                   policy="hf-eager")
        self.assertEqual(ids.tolist(), [[1, 2]])
        self.assertEqual(w.tolist(), [[0.5, 0.5]])


class Regions(unittest.TestCase):
    def test_route_and_combine(self):
        logits = [0.0, math.log(3), math.log(3), 0.0]
        ids, w = regions.moe_route(logits, 2, True, "hf-eager", n_experts=4)
        self.assertEqual(list(ids), [1, 2])       # the tie to the lower index
        self.assertEqual(list(w), [0.5, 0.5])
        ids, w = regions.moe_route(logits, 2, True, "hf-eager", n_experts=4, replay=[3, 0])
        self.assertEqual(list(ids), [3, 0])
        self.assertEqual(list(w), [0.5, 0.5])
        out = regions.moe_combine([4, 8, 8, -4], [5, 2], [0.25, 0.75], 2, "aligned", [2, 6], [0])
        self.assertEqual(list(out), [8.0, 2.0])   # 0.25 y0 + 0.75 y1 + sigmoid(0) y_shared

    def test_forward_layer_equals_score(self):
        """The router on the model's own logits gives the routes the scorer records."""
        m = model(MODELS[0])
        seq = PROMPTS[0]
        _, ran = m.score(seq, policy="vllm", return_routes=True)
        self.assertEqual(len(ran), len(seq) - 1)

    def test_bad_input(self):
        logits = [0.0, 1.0, 2.0, 3.0]
        for replay, what in (([1, 1], "repeated"), ([0, 4], "not below")):
            with self.assertRaises(ParityError) as e:
                regions.moe_route(logits, 2, True, "hf-eager", n_experts=4, replay=replay)
            self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
            self.assertIn(what, str(e.exception))
        with self.assertRaises(ParityError) as e:
            regions.moe_route(logits, 5, True, "hf-eager", n_experts=4)
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
        with self.assertRaises(ParityError) as e:
            regions.moe_route(logits, 2, True, "hf-eager", n_experts=3)
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")


class BadInput(unittest.TestCase):
    def check_invalid(self, call, *words):
        with self.assertRaises(ParityError) as e:
            call()
        self.assertEqual(e.exception.status, "PARITY_ERR_INVALID_ARGUMENT")
        for w in words:
            self.assertIn(w, str(e.exception))

    def test_scorer_refuses_bad_records(self):
        m = model(MODELS[0])
        seq = PROMPTS[0]
        _, good = m.score(seq, policy="vllm", return_routes=True)
        ids = list(good.data)
        E, k = m.config["num_experts"], m.config["num_experts_per_tok"]
        self.check_invalid(lambda: m.score(seq, routes=ids[:-1]), "expert ids")
        self.check_invalid(lambda: m.score(seq, routes=ids + ids[:k]), "expert ids")
        beyond = list(ids)
        beyond[k + 1] = E
        self.check_invalid(lambda: m.score(seq, routes=beyond), "not below num_experts")
        repeated = list(ids)
        repeated[2 * k + 1] = repeated[2 * k]
        self.check_invalid(lambda: m.score(seq, routes=repeated), "repeated")
        self.check_invalid(lambda: m.score(seq, routes=[-1] + ids[1:]), "outside")
        self.check_invalid(lambda: m.score([seq, seq], routes=[good]), "one routing record")
        wrong = Routes(good.data, good.layers * k, 1)
        self.check_invalid(lambda: m.score(seq, routes=wrong), "layers")

    def test_dense_model_and_no_record(self):
        dense = model("synthetic:tiny")
        self.assertEqual(dense.route_stride, 0)
        self.assertEqual(dense.sparse_layers, [])
        self.check_invalid(lambda: dense.sampler(record_routes=True), "no sparse layers")
        self.check_invalid(lambda: dense.score([1, 2, 3], routes=[]), "no sparse layers")
        m = model(MODELS[0])
        with m.sampler(max_seqs=2, max_len=32) as s:
            seq = s.add(PROMPTS[0])
            self.check_invalid(lambda: s.routes(seq), "record_routes")
        cs = m.generate(PROMPTS[:1], n=1, max_tokens=3)
        self.assertIsNone(cs[0].routes)

    def test_config_lists_dense_layers(self):
        self.assertEqual(model(MODELS[2]).config["mlp_only_layers"], [1])
        self.assertEqual(model(MODELS[2]).sparse_layers, [0, 2])
        self.assertEqual(model(MODELS[2]).route_stride, 4)


if __name__ == "__main__":
    harness.run("python-moe")
