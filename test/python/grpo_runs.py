"""What the tests of examples/python/grpo.py share (test_grpo.py: dask workers; test_grpo_ray.py:
Ray actors): the small run they make, running the example with a step log, the step records
with their floats as exact text and without the timings (to compare runs bit for bit), the
bitwise learner's checks and the check of a usage error."""

import json
import os
import subprocess
import sys

import harness

GRPO = os.path.join(harness.REPO, "examples", "python", "grpo.py")
SMALL = ["--steps", "2", "--groups", "2", "--n", "4", "--line-bytes", "24", "--threads", "1",
         "--quiet", "--svg", ""]
MISMATCH = ["rollout_corr/k3_kl", "training/rollout_probs_diff_max",
            "training/rollout_probs_diff_mean", "token_mult_prob_error", "lp_not_bitwise"]


def exact(value):
    """A value as text that tells every bit: floats by float.hex, containers element-wise."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [exact(v) for v in value]
    return value


def run(args, tmp, name, env=None):
    """Runs grpo.py with args and --log; returns (completed process, step records)."""
    log = os.path.join(tmp, name + ".jsonl")
    p = subprocess.run([sys.executable, GRPO] + args + ["--log", log], capture_output=True,
                       text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise AssertionError("grpo.py %s exited %d:\n%s%s" % (" ".join(args), p.returncode,
                                                              p.stdout, p.stderr))
    with open(log) as f:
        return p, [json.loads(line) for line in f]


def untimed(records):
    return [exact({k: v for k, v in r.items() if not k.startswith("time_")}) for r in records]


def usage_error(test, args, needle, prelude=None, env=None):
    """Asserts that `grpo.py args` exits 2 with `needle` on stderr and no traceback; `prelude` is
    Python run first in the same interpreter (e.g. hiding a module). Returns the process."""
    if prelude:
        cmd = [sys.executable, "-c", "import runpy, sys; %s; sys.argv = %r; "
               "runpy.run_path(%r, run_name='__main__')" % (prelude, [GRPO] + args, GRPO)]
    else:
        cmd = [sys.executable, GRPO] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    test.assertEqual(p.returncode, 2, p.stdout + p.stderr)
    test.assertIn(needle, p.stderr)
    test.assertNotIn("Traceback", p.stderr)
    return p


def assert_exact(test, records, what):
    """The bitwise learner's records: k3 0, probability differences 0, NeMo-RL's multiplicative
    error exactly 1, no token whose log-prob differs in any bit, tokens at every step."""
    for r in records:
        at = "%s step %d" % (what, r["step"])
        test.assertEqual(r["rollout_corr/k3_kl"], 0.0, at)
        test.assertEqual(r["training/rollout_probs_diff_max"], 0.0, at)
        test.assertEqual(r["training/rollout_probs_diff_mean"], 0.0, at)
        test.assertEqual(r["token_mult_prob_error"], 1.0, at)
        test.assertEqual(r["lp_not_bitwise"], 0, at)
        test.assertGreater(r["tokens"], 0, at)
