"""parity-quant-check on the shipped ternary model (models/qwen3-bytes-ternary-4.9m): its
deployed BitNet checkpoint holds exactly the training quantizer's codes of the fp32 latents;
the bf16-cast export beside it (export-bf16-cast/, what onebitllms' quantize_to_1bit makes of
the latents) disagrees on some codes and on the multipliers, and its log-probs differ from the
learner's; both remedies end at 0 differing codes. NVFP4 and MXFP4 exports of the same
latents, written as checkpoints and read back; both remedies end at 0 codes. Plain python3 (no numpy).

    python3 test/python/test_quant_check.py BUILD_DIR
"""
import json
import os
import subprocess
import tempfile

import harness

BUILD = harness.setup()

import unittest  # noqa: E402

MODEL = os.path.join(harness.REPO, "models", "qwen3-bytes-ternary-4.9m")
TOOL = os.path.join(BUILD, "bench", "parity-quant-check")


def run_tool(args, d):
    out = os.path.join(d, "report-%d.json" % len(os.listdir(d)))
    env = dict(os.environ, PARITY_SOURCE_ROOT=harness.REPO)
    p = subprocess.run([TOOL, "--latents", os.path.join(MODEL, "latents"), "--json", out] + args,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout)
    with open(out) as f:
        return p.returncode, json.load(f)


#: The C tool's reports of test_4bit_exports by quantizer (its runs with --write-export are the
#: runs test_python_tool_is_the_c_tool compares with, which then does not repeat them).
EXPORT_REPORTS = {}


def check(deployed):
    with tempfile.TemporaryDirectory(prefix="parity-qc-") as d:
        return run_tool(["--deployed", deployed, "--quantizer", "ternary:bitnet"], d)


class QuantCheck(unittest.TestCase):
    def test_deployed_is_the_training_quantizers(self):
        rc, r = check(MODEL)
        self.assertEqual(rc, 0)
        self.assertEqual(r["deployed"]["differ"], 0)
        self.assertEqual(r["deployed"]["scales_differ"], 0)
        self.assertEqual(r["deployed"]["equal"], 1.0)
        # the bf16-cast export path disagrees, and both remedies end at exactly 0
        self.assertGreater(r["export"]["differ"], 0)
        self.assertLess(r["export"]["equal"], 1.0)
        self.assertEqual(r["remedy_written"]["differ"], 0)
        self.assertEqual(r["remedy_written"]["equal"], 1.0)
        self.assertEqual(r["remedy_adjusted"]["differ"], 0)
        self.assertGreater(r["remedy_adjusted"]["moved"], 0)

    def test_the_bf16_cast_export(self):
        rc, r = check(os.path.join(MODEL, "export-bf16-cast"))
        self.assertEqual(rc, 0)
        self.assertEqual(r["deployed"]["differ"], r["export"]["differ"])
        self.assertGreater(r["deployed"]["differ"], 0)
        self.assertEqual(r["deployed"]["scales_differ"], r["export"]["scales_differ"])
        self.assertLess(r["deployed"]["equal"], 1.0)

    def test_4bit_exports(self):
        """NVFP4 and MXFP4 exports of the latents: the bf16 cast moves codes and block scales;
        the export written as a checkpoint (ModelOpt NVFP4, MXFP4 blocks) reads back as the
        deployed checkpoint with exactly those differences; remedy 1 (the training codes
        written in the format's layout) ends at 0 codes, 0 scales, log-probs bitwise."""
        evals = ["--eval", os.path.join(harness.REPO, "test", "data", "reference", "eval_00.bin")]
        for q in ("nvfp4:modelopt", "mxfp4:ocp"):
            with tempfile.TemporaryDirectory(prefix="parity-qc-4bit-") as d:
                export = os.path.join(d, "export")
                rc, r = run_tool(["--quantizer", q, "--policy", "vllm", "--write-export", export]
                                 + evals, d)
                self.assertEqual(rc, 0, q)
                EXPORT_REPORTS[q] = r
                self.assertGreater(r["export"]["differ"], 0, q)
                self.assertGreater(r["export"]["scales_differ"], 0, q)
                self.assertEqual(r["remedy_written"]["differ"], 0, q)
                self.assertEqual(r["remedy_written"]["equal"], 1.0, q)
                # remedy 2: the training codes and block scales; MXFP4 then is bitwise the
                # learner, NVFP4 keeps the bf16 amax's tensor scale (one per weight)
                self.assertEqual(r["remedy_adjusted"]["differ"], 0, q)
                self.assertGreater(r["remedy_adjusted"]["moved"], 0, q)
                if q.startswith("mxfp4"):
                    self.assertEqual(r["remedy_adjusted"]["scales_differ"], 0, q)
                    self.assertEqual(r["remedy_adjusted"]["equal"], 1.0, q)
                else:
                    self.assertLessEqual(r["remedy_adjusted"]["scales_differ"], 7 * 6, q)
                self.assertEqual(os.path.exists(os.path.join(export, "hf_quant_config.json")),
                                 q.startswith("nvfp4"), q)
                rc, r2 = run_tool(["--quantizer", q, "--policy", "vllm", "--deployed", export]
                                  + evals, d)
                self.assertEqual(rc, 0, q)
                self.assertEqual(r2["deployed"]["differ"], r["export"]["differ"], q)
                self.assertEqual(r2["deployed"]["scales_differ"], r["export"]["scales_differ"], q)
                self.assertEqual(r2["deployed"]["equal"], r["export"]["equal"], q)

    def test_python_tool_is_the_c_tool(self):
        """parity.quant_check (pure Python: its own safetensors reader and writer, the layouts'
        packing, parity.Model serving the exports) reports the C tool's counts and, scoring
        through the same library, the same log-prob statistics, for each format."""
        from parity import quant_check
        evals = [os.path.join(harness.REPO, "test", "data", "reference", "eval_00.bin")]
        cases = [("ternary:bitnet", "hf-eager", os.path.join(MODEL, "export-bf16-cast")),
                 ("nvfp4:modelopt", "vllm", None), ("mxfp4:ocp", "vllm", None)]
        for q, preset, deployed in cases:
            with tempfile.TemporaryDirectory(prefix="parity-qc-py-") as d:
                args = ["--quantizer", q, "--policy", preset, "--eval"] + evals
                if deployed:
                    args += ["--deployed", deployed]
                c = EXPORT_REPORTS.get(q) if preset == "vllm" and not deployed else None
                if c is None:
                    rc, c = run_tool(args, d)
                    self.assertEqual(rc, 0, q)
                p = quant_check.check(os.path.join(MODEL, "latents"), q, preset, deployed, evals)
                for key in ("export", "deployed") if deployed else ("export",):
                    for field in ("codes", "differ", "scales", "scales_differ"):
                        if field in c[key]:
                            self.assertEqual(p[key][field], c[key][field], (q, key, field))
                    for field in ("nll", "mean_abs", "k3", "equal"):
                        if field in c[key]:
                            self.assertAlmostEqual(p[key][field], c[key][field], 5, (q, key, field))
                self.assertEqual(p["remedy_written"]["differ"], c["remedy_written"]["differ"], q)
                self.assertEqual(p["remedy_written"]["equal"], c["remedy_written"]["equal"], q)
                for field in ("differ", "moved", "scales_differ"):
                    self.assertEqual(p["remedy_adjusted"][field], c["remedy_adjusted"][field], (q, field))
                self.assertAlmostEqual(p["remedy_adjusted"]["equal"], c["remedy_adjusted"]["equal"], 5, q)
                self.assertAlmostEqual(p["learner_nll"], c["learner_nll"], 5, q)
                self.assertAlmostEqual(p["reference_nll"], c["reference_nll"], 5, q)


if __name__ == "__main__":
    harness.run("test_quant_check")
