"""examples/python/grpo.py end to end, on a few small steps: the step logs (everything but the
timings) are bitwise identical whether the rollouts run on 1 or 2 dask workers or in-process;
with the bitwise learner (parity.torch.CausalLM) every mismatch metric is exactly at its
perfect value at every step (with a training recipe too), with the plain PyTorch learner it is
not; bad arguments (the cluster switches' and --recipe's among them) and a missing dask or ray
get a clear message and exit status 2, never a traceback. (Ray actors: test_grpo_ray.py.)

    /usr/bin/python3 test/python/test_grpo.py BUILD_DIR

Needs torch and dask.distributed (Debian: python3-torch python3-distributed); exits 77 (skipped)
without them.
"""

import harness

BUILD = harness.setup()
harness.require("grpo.py tests", ["torch", "distributed"], "python3-torch python3-distributed")

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import unittest  # noqa: E402
import xml.etree.ElementTree as ET  # noqa: E402

from grpo_runs import (GRPO, MISMATCH, SMALL, assert_exact, run, untimed,  # noqa: E402
                       usage_error)


class Grpo(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="test-grpo-")
        cls.learners = "torch,parity"
        cls.runs = {}
        for workers in (None, 1, 2):
            args = SMALL + ["--learner", cls.learners]
            if workers:
                args += ["--workers", str(workers)]
            cls.runs[workers] = run(args, cls.tmp.name, "w%s" % workers)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_workers_bitwise(self):
        """1 and 2 dask workers, and in-process sampling: the same rollouts, rewards, losses,
        metrics and weights, bit for bit."""
        one = untimed(self.runs[1][1])
        self.assertEqual(len(one), 2 * len(self.learners.split(",")))
        for key in ("rollouts_sha", "weights_sha", "loss", "reward_mean"):
            self.assertIn(key, one[0])
        self.assertEqual(untimed(self.runs[2][1]), one, "2 workers against 1")
        self.assertEqual(untimed(self.runs[None][1]), one, "in-process against 1 worker")

    def test_torch_learner_mismatch(self):
        """The plain PyTorch bf16 learner does not reproduce the sampler's log-probs."""
        recs = [r for r in self.runs[1][1] if r["learner"] == "torch"]
        self.assertEqual([r["step"] for r in recs], [0, 1])
        for r in recs:
            self.assertGreater(r["lp_not_bitwise"], 0)
            self.assertGreater(r["rollout_corr/k3_kl"], 0.0)
            self.assertGreater(r["token_mult_prob_error"], 1.0)
            self.assertGreater(r["tokens"], 0)

    def test_parity_learner_exact(self):
        """The bitwise learner: k3 0, probability differences 0, NeMo-RL's multiplicative
        error exactly 1, no token whose log-prob differs in any bit, at every step."""
        for workers, (_, recs) in self.runs.items():
            recs = [r for r in recs if r["learner"] == "parity"]
            self.assertEqual(len(recs), 2)
            assert_exact(self, recs, "workers %s" % workers)

    def test_formats_bitwise(self):
        """--format puts a 4-bit or ternary format on both sides (straight-through gradients in
        the learner): the parity learner stays bitwise at every step."""
        for fmt in ("nvfp4", "ternary:onebitllms"):
            _, recs = run(SMALL + ["--learner", "parity", "--format", fmt], self.tmp.name,
                          "format-" + fmt.replace(":", "-"))
            self.assertEqual(len(recs), 2)
            for r in recs:
                self.assertEqual(r["lp_not_bitwise"], 0, fmt)
                self.assertEqual(r["rollout_corr/k3_kl"], 0.0, fmt)
                self.assertGreater(r["tokens"], 0, fmt)

    def test_nvfp4_recipe_bitwise(self):
        """TE's NVFP4 recipe on both sides (issue 54): the sampler runs nvfp4:te-2d (16 x 16
        weight tiles), the parity learner the same forward with te-nvfp4's backward (stochastic
        rounding, RHT, W^T's tiles): every mismatch metric exactly at its perfect value at every
        step. The recipe's gradients are not the straight-through ones: the same run without
        it syncs other weights after step 0."""
        fmt = ["--learner", "parity", "--format", "nvfp4:te-2d"]
        _, recs = run(SMALL + fmt + ["--recipe", "te-nvfp4"], self.tmp.name, "recipe-te-nvfp4")
        self.assertEqual(len(recs), 2)
        assert_exact(self, recs, "te-nvfp4")
        _, plain = run(SMALL + fmt, self.tmp.name, "format-nvfp4-te-2d")
        assert_exact(self, plain, "nvfp4:te-2d straight through")
        self.assertEqual(recs[0]["rollouts_sha"], plain[0]["rollouts_sha"])
        self.assertNotEqual(recs[0]["grad_norm"], plain[0]["grad_norm"])
        self.assertNotEqual(recs[1]["weights_sha"], plain[1]["weights_sha"])

    def test_learners_share_step_zero(self):
        """Every learner starts from the checkpoint: step 0's rollouts are the same for all."""
        recs = self.runs[None][1]
        self.assertEqual(len({r["rollouts_sha"] for r in recs if r["step"] == 0}), 1)

    def test_table_and_svg(self):
        """The summary names each learner; --svg writes well-formed SVG with the metrics."""
        out = self.runs[None][0].stdout
        self.assertIn("summary", out)
        for name in self.learners.split(","):
            self.assertIn(name, out)
        svg = os.path.join(self.tmp.name, "plot.svg")
        p = subprocess.run([sys.executable, GRPO, "--learner", "torch", "--steps", "2",
                            "--groups", "1", "--n", "2", "--line-bytes", "8", "--threads", "1",
                            "--svg", svg], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("k3_kl", p.stdout)
        root = ET.parse(svg).getroot()
        self.assertTrue(root.tag.endswith("svg"))
        text = " ".join(t.text or "" for t in root.iter() if t.tag.endswith("text"))
        for label in MISMATCH:
            self.assertIn(label, text)

    def test_recipe_bitwise(self):
        """--recipe te-mxfp8-hybrid (the backward on MXFP8 operands, E5M2 gradients) keeps the
        parity learner bitwise at every step: the recipe changes the gradients (step 0's
        gradient norm is not the straight-through run's), not the forward."""
        fmt = ["--learner", "parity", "--format", "mxfp8:te"]
        _, recs = run(SMALL + fmt + ["--recipe", "te-mxfp8-hybrid"], self.tmp.name,
                      "recipe-hybrid")
        self.assertEqual(len(recs), 2)
        assert_exact(self, recs, "te-mxfp8-hybrid")
        _, plain = run(SMALL + fmt, self.tmp.name, "format-mxfp8-te")
        assert_exact(self, plain, "mxfp8:te straight through")
        self.assertEqual(recs[0]["rollouts_sha"], plain[0]["rollouts_sha"])
        self.assertNotEqual(recs[0]["grad_norm"], plain[0]["grad_norm"])

    def assert_usage_error(self, args, needle, prelude=None):
        usage_error(self, args, needle, prelude)

    def test_bad_arguments(self):
        self.assert_usage_error(["--workers", "0"], "--workers must be at least 1")
        self.assert_usage_error(["--learner", "tensorflow"],
                                "is not parity, parity:PRESET or torch")
        self.assert_usage_error(["--learner", "parity:no-such-preset"], "no-such-preset")
        self.assert_usage_error(["--n", "1"], "--n must be at least 2")
        self.assert_usage_error(["--format", "int4"], "is not one of")
        self.assert_usage_error(["--format", "nvfp4", "--learner", "torch"], "no quantized formats")
        self.assert_usage_error(["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
                                "exclude each other")
        self.assert_usage_error(["--scheduler", "tcp://127.0.0.1:1", "--ray-address",
                                 "127.0.0.1:1"], "exclude each other")
        self.assert_usage_error(["--cluster", "dask", "--ray-address", "127.0.0.1:1"],
                                "--cluster dask and --ray-address")
        self.assert_usage_error(["--cluster", "ray", "--scheduler", "tcp://127.0.0.1:1"],
                                "--cluster ray and --scheduler")
        self.assert_usage_error(["--cluster", "ray", "--workers", "0"],
                                "--workers must be at least 1")
        self.assert_usage_error(["--cluster", "spark"], "invalid choice")
        self.assert_usage_error(["--recipe", "te-mxfp8"], "fprop is mxfp8 with quantizer te-rceil")
        self.assert_usage_error(["--recipe", "te-fp8", "--format", "mxfp8:te"], "unknown recipe")
        self.assert_usage_error(["--recipe", "te-mxfp8", "--format", "mxfp8:te", "--learner",
                                 "parity,torch"], "no quantized formats")
        self.assert_usage_error(["--recipe", "te-mxfp8", "--learner", "torch"], "no recipes")
        self.assert_usage_error(["--learner-gradients", "bf16", "--learner", "torch"],
                                "--learner has none")
        self.assert_usage_error(["--learner-gradients", "bf16", "--learner", "parity:fp32"],
                                "compute is fp32")
        self.assert_usage_error(["--learner-gradients", "bf16", "--format", "nvfp4"],
                                "quantized GEMM")
        self.assert_usage_error(["--learner-gradients", "fp16"], "invalid choice")

    def test_missing_dask(self):
        """Where dask.distributed cannot be imported, --workers says so and exits 2."""
        self.assert_usage_error(SMALL + ["--learner", "torch", "--workers", "2"],
                                "need dask.distributed",
                                prelude="sys.modules['distributed'] = None")

    def test_missing_ray(self):
        """Where ray cannot be imported, --cluster ray (and --ray-address) says so and exits 2."""
        for switch in (["--cluster", "ray"], ["--ray-address", "auto"]):
            self.assert_usage_error(SMALL + ["--learner", "torch"] + switch, "needs ray",
                                    prelude="sys.modules['ray'] = None")


if __name__ == "__main__":
    harness.run("python-grpo")
