"""examples/python/grpo.py with its rollouts on Ray actors (--cluster ray): the step logs
(everything but the timings) are bitwise those of in-process sampling for 1 and 2 actors on a
local Ray instance the example starts, and for 2 actors on a running cluster it joins
(--ray-address, a `ray start --head` this test starts on this machine), which it leaves running
with every CPU free again; the bitwise learner's mismatch metrics are exactly at their perfect
values on the actors; the placement (one bundle per actor, SPREAD) is reported; an address where
nothing listens is a clear exit 2, not minutes of Ray retrying.

    PYTHON test/python/test_grpo_ray.py BUILD_DIR

Needs torch and ray (ray from PyPI: it is not in Debian; tested with ray 2.60.0); exits 77
(skipped) without them, as under the meson suite's Debian python3. The conformance tier runs it
in its virtual environment (scripts/python-tests.py --no-skips).
"""

import harness

BUILD = harness.setup()

import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402

LEARNERS = "torch,parity"
# Ray's settings, for the cluster this test starts, the instances the example starts and this
# process (which joins the cluster to check it; Ray reads them once, at import): no usage
# statistics, token authentication (Ray's default; the token in ~/.ray/auth_token), no 30 s
# drain at SIGTERM.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
os.environ.update(RAY_ENV)

try:
    import torch  # noqa: F401
    import ray
except ImportError as e:
    print("SKIP: grpo.py's Ray tests need torch and ray (%s): PyPI's ray (tested with 2.60.0), "
          "in the conformance tier's virtual environment" % e)
    sys.exit(harness.SKIP)

from grpo_runs import SMALL, assert_exact, run, untimed, usage_error  # noqa: E402



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """A one-node Ray cluster of 2 CPUs (`ray start --head --block`), stopped by SIGTERM to its
    process group (SIGKILL for what is left after 30 s)."""

    def __init__(self, tmp, env):
        self.port = free_port()
        self.address = "127.0.0.1:%d" % self.port
        self.log_path = os.path.join(tmp, "ray-head.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
             "--port", str(self.port), "--num-cpus", "2", "--include-dashboard", "false",
             "--object-store-memory", str(256 << 20), "--disable-usage-stats"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with open(self.log_path) as f:
                if "Ray runtime started" in f.read():
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(1)
        self.stop()
        with open(self.log_path) as f:
            raise AssertionError("`ray start --head` did not start:\n%s" % f.read()[-3000:])

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the cluster's processes still there
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


class GrpoRay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="test-grpo-ray-")
        cls.env = dict(os.environ)
        cls.runs = {}
        args = SMALL + ["--learner", LEARNERS]
        cls.runs["in-process"] = run(args, cls.tmp.name, "in-process")
        for workers in (1, 2):
            cls.runs["local-%d" % workers] = run(
                args + ["--cluster", "ray", "--workers", str(workers)], cls.tmp.name,
                "local-%d" % workers, env=cls.env)
        cls.head = RayHead(cls.tmp.name, cls.env)
        try:
            cls.runs["joined-2"] = run(args + ["--ray-address", cls.head.address, "--workers", "2"],
                                       cls.tmp.name, "joined-2", env=cls.env)
            cls.head_after = cls.cluster_state(cls.head.address)
        finally:
            cls.head.stop()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    @staticmethod
    def cluster_state(address):
        """(CPUs, CPUs free, placement groups not removed) of the running cluster at address,
        once its CPUs are all free again or after 30 s."""
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        try:
            deadline = time.monotonic() + 30
            while True:
                total = ray.cluster_resources().get("CPU", 0)
                free = ray.available_resources().get("CPU", 0)
                if free == total or time.monotonic() > deadline:
                    break
                time.sleep(1)
            groups = [g for g in ray.util.placement_group_table().values()
                      if g["state"] != "REMOVED"]
            return total, free, groups
        finally:
            ray.shutdown()

    def test_actors_bitwise(self):
        """1 and 2 actors on a local instance, 2 on a joined cluster, and in-process sampling:
        the same rollouts, rewards, losses, metrics and weights, bit for bit."""
        here = untimed(self.runs["in-process"][1])
        self.assertEqual(len(here), 2 * len(LEARNERS.split(",")))
        for key in ("rollouts_sha", "weights_sha", "loss", "reward_mean"):
            self.assertIn(key, here[0])
        for name in ("local-1", "local-2", "joined-2"):
            self.assertEqual(untimed(self.runs[name][1]), here, name + " against in-process")

    def test_parity_learner_exact(self):
        """The bitwise learner on Ray-sampled rollouts: every mismatch metric at its perfect
        value (grpo_runs.assert_exact), at every step."""
        for name in ("local-1", "local-2", "joined-2"):
            recs = [r for r in self.runs[name][1] if r["learner"] == "parity"]
            self.assertEqual(len(recs), 2)
            assert_exact(self, recs, name)

    def test_placement_reported(self):
        """The run names its actors, their bundles, the strategy and where the cluster is."""
        out = self.runs["local-2"][0].stdout
        self.assertIn("2 Ray actors (local Ray instance; one bundle of 1 CPU each, SPREAD over "
                      "1 node", out)
        self.assertIn("1 Ray actor (local Ray instance; one bundle of 1 CPU each",
                      self.runs["local-1"][0].stdout)
        self.assertIn("2 Ray actors (joined %s; one bundle of 1 CPU each, SPREAD over 1 node"
                      % self.head.address, self.runs["joined-2"][0].stdout)

    def test_joined_cluster_left_clean(self):
        """A joined cluster outlives the run with its actors and placement group gone: all its
        CPUs free, no placement group left."""
        total, free, groups = self.head_after
        self.assertEqual(total, 2)
        self.assertEqual(free, total)
        self.assertEqual(groups, [])

    def test_unreachable_address(self):
        """An address where nothing listens: exit 2 within seconds, saying so."""
        t0 = time.monotonic()
        usage_error(self, SMALL + ["--learner", "torch", "--ray-address",
                                   "127.0.0.1:%d" % free_port()],
                    "nothing answers there", env=self.env)
        self.assertLess(time.monotonic() - t0, 60)


if __name__ == "__main__":
    harness.run("python-grpo-ray")
