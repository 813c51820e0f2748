"""Known answers for the mixture-of-experts forward (issue 51): libparity's log-probs and routes
under each preset against an independent PyTorch implementation of Qwen3-MoE and Qwen2-MoE
(test/data/reference/tools/reference_moe.py, written from transformers' modelling code, with
each framework's rounding points), on the transformers-made checkpoints test/data/moe/
qwen3-moe-tiny (k = 2, norm_topk_prob, a dense layer) and qwen2-moe-tiny (k = 4, a shared
expert), and qwen3-moe-tiny-k6: the same weights with num_experts_per_tok 6 (vLLM's k > 4 and
SGLang's k > 2 sums). Sequences: test/data/moe/ref's four (lengths 7, 33, 64, 100).

Presets against modes: fp32 - fp32, hf-eager - hf_bf16, vllm - vllm_bf16, sglang - sglang_bf16,
aligned - aligned_bf16. It prints every figure and asserts:
  - the reference is transformers' forward: replaying transformers' routes (ref/*.routing.i16),
    its fp32 mode is within 1e-5 of transformers' fp32 log-probs and its hf_bf16 mode within
    REF_HF_MEAN (mean |dlogp|) of transformers' eager bf16 ones, most of them bitwise;
  - fp32 within TOL_FP32 = 1e-4 (max |dlogp|) of the fp32 mode, the same experts everywhere;
  - each bf16 preset nearer its own mode than any other mode (mean |dlogp|, per model), and
    within the model's floor: the largest mean |dlogp| by which the reference itself moves, in
    any bf16 mode, when it computes the values before each rounding another way (its GEMMs
    summing K in the other direction, its norm and softmax sums over the reversed row, or exp,
    silu, rsqrt, cos in double: reference_moe.ORDERS), as libparity's own kernels do. Such a
    change flips a rare bf16 rounding, which the forward carries on, or none: the figure per
    mode and perturbation is anywhere from 0 to 0.0014 by chance, so the floor is the model's;
  - the modes differ from each other by more than DISCRIMINATE times that floor, and so do the
    MoE points alone: a mode with its combine or its routing weights' dtype switched to
    another framework's moves by more than that (where the two rules differ at all: vLLM's
    and SGLang's sums agree for k = 2 and k = 6), and the preset is nearer its mode than that
    variant, so the agreement pins the combine and the weights. The router's variants
    (dividing by the sum or multiplying by its reciprocal) move no log-prob here: printed;
  - routing: the fraction of (position, sparse layer) expert sets that differ between each
    preset and its mode (at most ROUTE_FRACTION; none differ here), and replaying the mode's
    routes in the library (Model.score(routes=...)) changes no bit where none differ, and
    brings the preset nearer where some do. Against the other modes some sets do differ
    (near-ties that another rounding flips: the comparison can fail); the figures with and
    without replaying that mode's routes are printed (replay moves the mean |dlogp| by a few
    percent either way: a flipped route changes a few positions, the rounding points all).

    /usr/bin/python3 test/python/test_moe_reference.py BUILD_DIR

Needs torch and numpy (Debian: python3-torch, python3-numpy); exits 77 (skipped) without them.
"""

import harness

BUILD = harness.setup()
torch, np = harness.require("MoE reference tests", ["torch", "numpy"],
                            "python3-torch python3-numpy")

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import unittest  # noqa: E402

import parity  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "moe")
sys.path.insert(0, os.path.join(HERE, "..", "data", "reference", "tools"))
import reference_moe  # noqa: E402

#: preset -> the reference mode that follows the same framework
PRESETS = {"fp32": "fp32", "hf-eager": "hf_bf16", "vllm": "vllm_bf16", "sglang": "sglang_bf16",
           "aligned": "aligned_bf16"}
BF16_MODES = [m for m in reference_moe.MODES if m != "fp32"]
#: fp32 preset against the fp32 mode: max |dlogp| (the log-probs are 2-9 nats).
TOL_FP32 = 1e-4
#: the modes' mean |dlogp| from each other, at least this many times the floor.
DISCRIMINATE = 3.0
#: the fraction of (position, sparse layer) expert sets a preset may choose otherwise than its
#: mode (near-ties the floor's differences in the router logits can flip; 2 of 408).
ROUTE_FRACTION = 0.005
#: the reference's hf_bf16 mode against transformers' eager log-probs, transformers' routes
#: replayed: mean |dlogp| bound, and the fraction at least bitwise equal.
REF_HF_MEAN, REF_HF_EQUAL = 2e-3, 0.6
torch.set_num_threads(1)


def read(path, dtype):
    return np.fromfile(path, dtype=dtype)


class Case:
    """One checkpoint: the reference's outputs under every mode (and its perturbations, for the
    bf16 modes), and the library's under every preset, recomputed and replaying the mode's
    routes, on the four sequences."""

    def __init__(self, name, directory, data_name):
        self.name, self.data_name = name, data_name
        self.ckpt = reference_moe.Checkpoint(directory)
        self.model = parity.Model(directory, threads=2)
        self.k, self.S = self.ckpt.top_k, len(self.ckpt.sparse)
        self.seqs = [read(os.path.join(DATA, "ref", "%s.seq%d.tokens.i32" % (data_name, i)),
                          "<i4").astype(np.int64) for i in range(4)]
        self.ref, self.moved = {}, {}
        for mode in reference_moe.MODES:
            self.ref[mode] = [self.reference(mode, seq) for seq in self.seqs]
        for mode in BF16_MODES:  # (mode, perturbation) -> mean |dlogp| from the reference
            for order in reference_moe.ORDERS[1:]:
                self.moved[mode, order] = mean_abs(
                    [self.reference(mode, seq, order)[0] for seq in self.seqs],
                    [lp for lp, _ in self.ref[mode]])
        self.floor = max(self.moved.values())
        self.lib, self.replayed = {}, {}
        for preset in PRESETS:
            got = [self.model.score(seq.tolist(), policy=preset, return_routes=True)
                   for seq in self.seqs]
            # the library's record covers the scored positions, len - 1 (parity.Routes)
            self.lib[preset] = [(np.array(lp, dtype=np.float64),
                                 np.array(r.tolist(), dtype=np.int64).reshape(len(seq) - 1,
                                                                              self.S, self.k))
                                for (lp, r), seq in zip(got, self.seqs)]
            for mode in reference_moe.MODES:  # each mode's routes replayed
                self.replayed[preset, mode] = [
                    np.array(self.model.score(seq.tolist(), policy=preset,
                                              routes=routes.reshape(-1).tolist()),
                             dtype=np.float64)
                    for seq, (_, routes) in zip(self.seqs, self.ref[mode])]

    def reference(self, mode, seq, order="blas", routes=None):
        lp, ran = reference_moe.Forward(self.ckpt, mode, order).logprobs(seq, routes)
        return lp.numpy().astype(np.float64), ran.numpy()

    def close(self):
        self.model.close()


def mean_abs(got, want):
    """mean |got - want| over the concatenated sequences."""
    d = np.concatenate([np.abs(np.asarray(g) - np.asarray(w)) for g, w in zip(got, want)])
    return float(d.mean())


def max_abs(got, want):
    return float(max(np.abs(np.asarray(g) - np.asarray(w)).max() for g, w in zip(got, want)))


def route_fraction(a, b):
    """The fraction of (position, sparse layer) whose expert sets differ, and how many, over the
    positions of a (the library's records cover the scored positions, the reference's every one)."""
    differ = sum(int((np.sort(x, -1) != np.sort(y[:x.shape[0]], -1)).any(-1).sum())
                 for x, y in zip(a, b))
    total = sum(x.shape[0] * x.shape[1] for x in a)
    return differ / total, differ, total


class MoEReference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="parity-moe-ref-")
        k6 = os.path.join(cls.tmp, "qwen3-moe-tiny-k6")
        os.mkdir(k6)
        shutil.copy(os.path.join(DATA, "qwen3-moe-tiny", "model.safetensors"), k6)
        with open(os.path.join(DATA, "qwen3-moe-tiny", "config.json")) as fh:
            cfg = json.load(fh)
        cfg["num_experts_per_tok"] = 6
        with open(os.path.join(k6, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=2)
        cls.cases = [Case("qwen3-moe-tiny", os.path.join(DATA, "qwen3-moe-tiny"), "qwen3-moe-tiny"),
                     Case("qwen2-moe-tiny", os.path.join(DATA, "qwen2-moe-tiny"), "qwen2-moe-tiny"),
                     Case("qwen3-moe-tiny-k6", k6, "qwen3-moe-tiny")]

    @classmethod
    def tearDownClass(cls):
        for c in cls.cases:
            c.close()
        shutil.rmtree(cls.tmp)

    def test_cases(self):
        """The checkpoints are what the docstring says: the sums each combine takes differ."""
        got = [(c.ckpt.arch, c.k, c.ckpt.sparse, c.ckpt.shared, c.ckpt.norm_topk_prob)
               for c in self.cases]
        self.assertEqual(got, [("qwen3_moe", 2, [0, 2], False, True),
                               ("qwen2_moe", 4, [0, 1, 2], True, False),
                               ("qwen3_moe", 6, [0, 2], False, True)])
        self.assertEqual([len(s) for s in self.cases[0].seqs], [7, 33, 64, 100])

    def test_reference_is_transformers(self):
        """The reference against transformers 5.25's own outputs, transformers' routes replayed
        (its fp32 forward's for the fp32 mode)."""
        for c in self.cases[:2]:
            for mode, tag, routing in (("fp32", "fp32", "fp32.routing"),
                                       ("hf_bf16", "hf_eager", "routing")):
                got, want = [], []
                for i, seq in enumerate(c.seqs):
                    base = os.path.join(DATA, "ref", "%s.seq%d." % (c.data_name, i))
                    routes = read(base + routing + ".i16", "<i2").astype(np.int64)
                    got.append(c.reference(mode, seq, routes=routes)[0])
                    want.append(read(base + tag + ".logp.f32", "<f4").astype(np.float64))
                equal = np.mean(np.concatenate([g == w for g, w in zip(got, want)]))
                mx, mean = max_abs(got, want), mean_abs(got, want)
                print("%s: reference %s against transformers' %s (its routes replayed): max "
                      "|dlogp| %.3g, mean %.3g, %.1f%% bitwise equal"
                      % (c.name, mode, tag, mx, mean, 100 * equal))
                if mode == "fp32":
                    self.assertLess(mx, 1e-5, c.name)
                else:
                    self.assertLess(mean, REF_HF_MEAN, c.name)
                    self.assertGreater(equal, REF_HF_EQUAL, c.name)

    def test_fp32(self):
        for c in self.cases:
            got = [lp for lp, _ in c.lib["fp32"]]
            want = [lp for lp, _ in c.ref["fp32"]]
            frac, differ, total = route_fraction([r for _, r in c.lib["fp32"]],
                                                 [r for _, r in c.ref["fp32"]])
            mx = max_abs(got, want)
            print("%s: fp32 against the fp32 reference: max |dlogp| %.3g, mean %.3g; expert "
                  "sets differ in %d of %d" % (c.name, mx, mean_abs(got, want), differ, total))
            self.assertLess(mx, TOL_FP32, c.name)
            self.assertEqual(differ, 0, c.name)

    def test_bf16_presets(self):
        """Each bf16 preset: nearest its own mode, within the floor."""
        for c in self.cases:
            for mode in BF16_MODES:
                print("%s: the reference %s against itself computed another way, mean |dlogp|: "
                      "%s" % (c.name, mode, ", ".join("%s %.5f" % (o, c.moved[mode, o])
                                                      for o in reference_moe.ORDERS[1:])))
            print("%s: floor %.5f" % (c.name, c.floor))
            for preset, own in PRESETS.items():
                if preset == "fp32":
                    continue
                got = [lp for lp, _ in c.lib[preset]]
                dist = {m: mean_abs(got, [lp for lp, _ in c.ref[m]]) for m in reference_moe.MODES}
                print("%s: %-8s mean |dlogp| from each mode: %s (max from its own %.3g)"
                      % (c.name, preset, ", ".join("%s %.4f" % kv for kv in dist.items()),
                         max_abs(got, [lp for lp, _ in c.ref[own]])))
                nearest = min(dist, key=dist.get)
                self.assertEqual(nearest, own, "%s, %s: %s" % (c.name, preset, dist))
                self.assertLessEqual(dist[own], c.floor, "%s, %s: %.4g, floor %.4g"
                                     % (c.name, preset, dist[own], c.floor))

    def test_modes_discriminate(self):
        """The modes differ from each other by more than DISCRIMINATE x the floor: every
        pair, per model."""
        for c in self.cases:
            for i, a in enumerate(BF16_MODES):
                for b in BF16_MODES[i + 1:]:
                    d = mean_abs([lp for lp, _ in c.ref[a]], [lp for lp, _ in c.ref[b]])
                    print("%s: %s against %s: mean |dlogp| %.4f (%.1fx the floor)"
                          % (c.name, a, b, d, d / c.floor))
                    self.assertGreater(d, DISCRIMINATE * c.floor, "%s: %s, %s" % (c.name, a, b))

    def test_moe_switches(self):
        """The combine and the routing weights' dtype each matter beyond the floor, and the
        library follows its mode's."""
        pinned = set()
        for c in self.cases:
            for preset, own in PRESETS.items():
                if preset == "fp32":
                    continue
                recipe = reference_moe.RECIPES[own]
                variants = [dict(combine=x) for x in ("hf", "vllm", "sglang", "fp32")
                            if x != recipe["combine"]]
                variants.append(dict(round_weights=not recipe["round_weights"]))
                variants += [dict(router=x) for x in ("hf", "vllm", "sglang")
                             if x != recipe["router"]]
                lib = [lp for lp, _ in c.lib[preset]]
                mode_lp = [lp for lp, _ in c.ref[own]]
                for switch in variants:
                    moved = [reference_moe.Forward(c.ckpt, own, **switch).logprobs(seq)[0]
                             .numpy().astype(np.float64) for seq in c.seqs]
                    d_mode, d_lib = mean_abs(moved, mode_lp), mean_abs(moved, lib)
                    what = "%s: %s with %s" % (c.name, own, switch)
                    print("%s: moves %.5f (%.1fx the floor); %s from it %.5f, from %s %.5f"
                          % (what, d_mode, d_mode / c.floor, preset, d_lib, own,
                             mean_abs(lib, mode_lp)))
                    if d_mode > DISCRIMINATE * c.floor:
                        self.assertLess(mean_abs(lib, mode_lp), d_lib, what)
                        pinned.add((preset, next(iter(switch))))
        # every bf16 preset's combine and weights are pinned on some checkpoint
        self.assertEqual(pinned, {(p, s) for p in PRESETS if p != "fp32"
                                  for s in ("combine", "round_weights")})

    def test_routing_and_replay(self):
        """The expert sets each preset chose against each mode's, and that mode's routes
        replayed in the library."""
        cross_differ = 0
        for c in self.cases:
            for preset, own in PRESETS.items():
                for mode in reference_moe.MODES:
                    frac, differ, total = route_fraction([r for _, r in c.lib[preset]],
                                                         [r for _, r in c.ref[mode]])
                    want = [lp for lp, _ in c.ref[mode]]
                    before = mean_abs([lp for lp, _ in c.lib[preset]], want)
                    after = mean_abs(c.replayed[preset, mode], want)
                    print("%s: %-8s expert sets differing from %-12s %3d of %d (%.2f%%); mean "
                          "|dlogp| %.5f, replaying its routes %.5f%s"
                          % (c.name, preset, mode + ":", differ, total, 100 * frac, before,
                             after, " (its own mode)" if mode == own else ""))
                    if mode != own:
                        cross_differ += differ
                        continue
                    self.assertLessEqual(frac, ROUTE_FRACTION, "%s, %s" % (c.name, preset))
                    if differ:
                        self.assertLess(after, before, "%s, %s" % (c.name, preset))
                    else:  # the same routes: replaying them changes no bit
                        for (lp, _), replayed in zip(c.lib[preset], c.replayed[preset, mode]):
                            self.assertTrue(np.array_equal(lp, replayed),
                                            "%s, %s" % (c.name, preset))
        self.assertGreater(cross_differ, 0)


if __name__ == "__main__":
    harness.run("test_moe_reference")
