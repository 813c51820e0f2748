#!/usr/bin/env python3
"""GRPO on the byte-level model in models/, with libparity as the sampler, and the sampler /
learner mismatch an RL framework would log, step by step.

    /usr/bin/python3 examples/python/grpo.py [--learner parity|parity:PRESET|torch[,...]]
        [--format FORMAT[:RULE]] [--recipe NAME] [--learner-gradients fp32|bf16] [--steps 20] [--groups 4] [--n 8] [--line-bytes 32] [--lr 1e-4] [--seed 0]
        [--workers N] [--cluster dask|ray] [--scheduler ADDRESS | --ray-address ADDRESS]
        [--log FILE] [--svg FILE]

Needs PyTorch (Debian: python3-torch); rollouts on a dask cluster need dask.distributed (Debian:
python3-distributed), on Ray ray (PyPI: ray; tested with 2.60.0). Prompts come from
examples/python/data/grpo_prompts.json; nothing outside the repository is read.

The run
-------
Each step takes --groups prompts (snippets of Python source from permissively licensed Debian
packages that are not the model's training text, the Python 3.11 standard library; each ends at a
line break) and samples a group of --n completions of each with libparity's sampler: the prompt
is prefilled once and completion i is a fork of it with random stream i, under a seed derived
from (--seed, step, group index) alone. A completion is the next line: sampling stops at a line
break or after --line-bytes bytes. The learner scores prompt + completion (log-probs in the
sampler's mode, --mode: raw, or processed where --temperature is not 1) and takes one Adam step
on its fp32 master weights; then the sampler's weights are synced from the masters (round to
nearest even to bf16), every step, so that every rollout is on-policy up to the sampler/learner
mismatch.

  advantage   A_i = (r_i - mean(r)) / (std(r) + 1e-6) over the group's n rewards (GRPO; std
              with Bessel's correction, as verl's compute_grpo_outcome_advantage);
  objective   per completion token t, with ratio_t = exp(logp_learner_t - logp_sampler_t):
              loss_t = max(-A ratio_t, -A clip(ratio_t, 1 - eps, 1 + eps)) (PPO-clip, eps = --clip)
              averaged over all tokens of the step ("token-mean"); the sampler's log-probs stand
              in for the old policy's, since there is one update per batch of rollouts;
              gradients clipped to norm 1, then Adam (betas 0.9, 0.999, no weight decay).

The reward
----------
1 if the completion is a non-blank line that ends (a line break) within --line-bytes bytes, else
0. Why this one: it is verifiable from the completion's bytes alone, at no cost; the behaviour
it asks for (shorter lines: close the expression, break the line) is one this model can already
produce, so the reward has variance within a group (measured on these prompts at 32 bytes,
with 8 completions each: about a third of the completions earn it, and about 10% are a bare
line break, which "non-blank" keeps from being the shortcut); and it depends mostly on how much
probability the model puts on the line break and on short constructs, which a few dozen Adam
steps on a 5M-parameter model can shift. Measured: in the default run (the bitwise learner)
the reward mean goes from 0.34 at step 0 to 0.84 by step 7 and 0.69-1.0 from step 9 on (mean of
the first five steps 0.44, of the last five 0.98) in under 3 minutes on 2 cores (7.9 s a step
beside a CI run at load 5, 7.0 s of it the learner's forward and backward); the torch
learner's run climbs alike (0.45 -> 0.99, about 2.5 s a step). Once all of a group's
completions earn the reward, its advantages are 0. What the model learns is to write short lines: "    return",
"    else:", "    if x:".

The learners (--learner; several, comma-separated, run one after another, each its own RL
trajectory from the checkpoint: own masters, optimizer and sampler weights)
----------------------------------------------------------------------------------------------
  parity          parity.torch.CausalLM: a torch module whose forward is libparity's forward
                  under the sampler's policy (--policy) and backend, with autograd backward.
                  Its log-probs are the sampler's bit for bit: every mismatch metric is exactly
                  at its perfect value at every step.
  parity:PRESET   the same module under another policy (e.g. parity:hf-eager, parity:vllm).
                  With --recipe NAME (parity.recipes(): te-mxfp8, te-mxfp8-hybrid, te-nvfp4) a
                  parity learner's backward runs the recipe's dgrad and wgrad GEMMs on
                  quantized operands (README, "Training in low precision"); the recipe's fprop
                  must be the policy's (--format mxfp8:te for the MXFP8 recipes), so the
                  log-probs, and every mismatch metric, stay exact. With --learner-gradients
                  bf16 the linear layers' backward GEMMs take the incoming gradient rounded to
                  bf16 and run on bf16 dot products (CausalLM(gradients="bf16"), bf16
                  policies only): a change of the gradient's arithmetic, not of the log-probs.
  torch           a plain PyTorch bf16 Qwen3 written with torch.nn.functional as a user would
                  (HF modeling_qwen3's eager path: RMSNorm with the fp32 variance, q/k-norm,
                  rotate_half RoPE with theta from config.json, GQA causal softmax attention,
                  SwiGLU, lm_head, log_softmax in fp32), its bf16 weights cast from the fp32
                  masters at every forward: the everyday baseline.

The metrics (per step, over every completion token of the step; d = logp_learner - logp_sampler
in fp32, evaluated in float64)
----------------------------------------------------------------------------------------------
  rollout_corr/k3_kl                 mean of exp(d) - d - 1: verl's k3 estimator of
                                     KL(sampler || learner) (verl, trainer/ppo/
                                     rollout_corr_helper.py, compute_offpolicy_metrics:
                                     log_ratio = old_log_prob - rollout_log_prob, k3 =
                                     exp(log_ratio) - log_ratio - 1, masked mean over the
                                     response tokens). Perfect value 0.
  training/rollout_probs_diff_max    max of |exp(logp_learner) - exp(logp_sampler)|, and
  training/rollout_probs_diff_mean   its mean: the sampled tokens' probabilities, as verl's
                                     trainer/ppo/ray_trainer.py logs them. Perfect value 0.
  token_mult_prob_error              mean of exp(|d|): NeMo-RL's multiplicative probability
                                     error (nemo_rl/algorithms/loss_functions.py,
                                     ClippedPGLossFn: masked_mean(exp(|generation_logprobs -
                                     prev_logprobs|))). Its perfect value is 1, not 0.
  lp_not_bitwise                     how many tokens' float32 log-probs differ in any bit.
  reward_mean, loss, clip_frac (share of tokens whose ratio was clipped), grad_norm (before
  clipping), tokens, and the step's wall time split into sampling, learner and sync.

Output: a table on stdout (k3_kl, pdiff_max, pdiff_mean, mult_err and not_bitwise are the five
metrics above), a JSON object per step with --log FILE (the metrics under the names above, the
times as time_*, and digests of the step's rollouts and of the masters after it), an SVG plot of
the mismatch metrics and the reward per step (--svg FILE; default grpo-mismatch.svg in the
current directory, "" for none), and a summary comparing the learners run.

More than one machine
---------------------
--workers N samples on N workers of a cluster instead of in this process; --cluster says which
kind: dask (the default) or ray.

  dask  A dask.distributed LocalCluster of N worker processes, or, with --scheduler ADDRESS, the
        workers of a running cluster. Each worker loads the model once (a worker plugin); every
        step the driver scatters the weights payload to all of them, and groups are tasks,
        spread over the workers as the scheduler likes.
  ray   N Ray actors, each holding a parity.Model and its sampler, placed by a placement group
        of N bundles of one worker's CPUs (--threads / N, at least 1) with strategy SPREAD (on
        as many nodes as the cluster has room on; packed on one node where there is only one).
        Without --ray-address the example starts a local Ray instance of that many CPUs (no
        dashboard, a 256 MiB object store, usage statistics off) and shuts it down at exit; with
        --ray-address ADDRESS ("auto", or HOST:6379 of `ray start --head`; with Ray's default
        token authentication, RAY_AUTH_MODE=token and the cluster's token in ~/.ray/auth_token
        or RAY_AUTH_TOKEN) it joins that cluster and leaves it running, removing only its
        actors and placement group. The driver puts
        each version's payload into the object store once (ray.put); an actor fetches it only
        when the version it is asked to sample is newer than the one it holds. Group g goes to
        actor g mod N.

Either way a worker (dask worker or Ray actor; on another machine it needs this repository at
the same path, or parity importable, and the checkpoint) holds the learner's weights by
version: the payload is the fp32 masters with their version number and the checksums of their
bf16 cast (parity's manifest values); a worker whose weights are older applies them with
parity.Model.update and checks its model against that manifest (parity.Model.verify) before it
samples, so a worker never samples on weights other than the driver's. The learner stays in
the driver. A sequence's tokens and log-probs depend only on (seed, stream, position) and the
weights, and each group's seed only on (--seed, step, group index), so rollouts, rewards,
losses and weights are bitwise the same for any number of workers, on dask or Ray, and
without --workers, for a given --threads (which sets the driver's torch threads, on which the
plain torch learner's arithmetic may depend; test/python/test_grpo.py checks 1 and 2 dask
workers, test/python/test_grpo_ray.py 1 and 2 Ray actors).
"""
import argparse
import hashlib
import json
import math
import os
import random
import sys
import tempfile
import time
from array import array
from xml.sax.saxutils import escape

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON_DIR = os.path.join(REPO, "python")
sys.path.insert(0, PYTHON_DIR)
import parity  # noqa: E402
from parity.policy import policy_struct  # noqa: E402

DEFAULT_MODEL = os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m")
PROMPTS = os.path.join(HERE, "data", "grpo_prompts.json")
NEWLINE = 10
PLUGIN = "parity-grpo"
ERROR_EXIT = 2  # bad arguments, a missing dependency (as argparse)


class UsageError(Exception):
    """A problem with the command line or the environment: printed, exit status 2."""


# ---- prompts, seeds, reward -------------------------------------------------------------------

def load_prompts(path=PROMPTS):
    """The prompt snippets, as lists of byte values (token ids)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return [list(p["text"].encode("utf-8")) for p in doc["prompts"]]


def step_prompts(n_prompts, seed, step, groups):
    """Indices of the prompts of one step: the prompts in an order shuffled once per pass over
    them (by seed and pass number), `groups` at a time."""
    out = []
    for g in range(groups):
        k = step * groups + g
        epoch, at = divmod(k, n_prompts)
        order = list(range(n_prompts))
        random.Random("grpo-prompts:%d:%d" % (seed, epoch)).shuffle(order)
        out.append(order[at])
    return out


def group_seed(seed, step, group):
    """The sampler seed of one group: a 64-bit hash of (run seed, step, group index), so that
    which worker samples a group, or with which others, changes nothing."""
    h = hashlib.blake2b(b"grpo-group:%d:%d:%d" % (seed, step, group), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def line_reward(tokens, line_bytes):
    """1.0 for a non-blank line ended by a line break within line_bytes bytes, else 0.0."""
    return 1.0 if (0 < len(tokens) <= line_bytes and tokens[-1] == NEWLINE
                   and bytes(tokens).strip() != b"") else 0.0


# ---- the sampler side (in-process, on a dask worker or in a Ray actor) ---------------------------

class RolloutEngine:
    """A libparity model and sampler, and the version of the learner's weights they hold.

    Runs in the driver (no --workers), inside each dask worker or in each Ray actor. It imports
    nothing from the driver's module namespace that a remote worker could not unpickle: parity
    is passed in."""

    def __init__(self, parity_module, model_path, policy, backend, threads, max_len, n):
        self.model = parity_module.Model(model_path, threads=threads)
        self.sampler = self.model.sampler(policy=policy, backend=backend, max_seqs=n + 1,
                                          max_len=min(max_len, self.model.context),
                                          threads=threads)
        self.version = 0  # the learner's optimizer steps these weights come from
        self.verified = False

    def apply(self, payload):
        """Brings the weights to payload["version"] if they are older: parity.Model.update with
        the fp32 masters (the library rounds to nearest even; SAMPLER_MASTERS), then a manifest
        check (also of version 0, the checkpoint as loaded, against the learner's masters)."""
        if payload["version"] == self.version and self.verified:
            return
        if payload["version"] < self.version:
            raise RuntimeError("weights of version %d sent to a worker holding version %d"
                               % (payload["version"], self.version))
        before = self.model.version
        if payload["tensors"] is not None:
            self.model.update(payload["tensors"], masters=SAMPLER_MASTERS)
            if self.model.version != before + 1:
                raise RuntimeError("parity.Model.update did not count the update (version %d "
                                   "-> %d)" % (before, self.model.version))
        problems = self.verify(payload["checksums"], payload["manifest_version"])
        if problems:
            raise RuntimeError("after the update to version %d the worker's weights differ "
                               "from the learner's: %s" % (payload["version"],
                                                           "; ".join(problems[:5])))
        self.version = payload["version"]
        self.verified = True

    def verify(self, checksums, manifest_version):
        """parity.Model.verify against a manifest of the given bf16 checksums (of that manifest
        version) and this model's own update count; returns the differences (empty when it
        holds exactly those weights)."""
        entries = ['%s: {"shape": %s, "dtype": "BF16", "fnv1a64": "%016x"}'
                   % (json.dumps(name), json.dumps(list(shape)), h)
                   for name, (shape, h) in checksums.items()]
        fd, path = tempfile.mkstemp(prefix="grpo-manifest-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write('{"version": %d, "manifest_version": %d, "tensors": {%s}}\n'
                        % (self.model.version, manifest_version, ", ".join(entries)))
            return self.model.verify(path)
        finally:
            os.unlink(path)

    def sample(self, jobs, n, line_bytes, temperature, mode):
        """Samples each job's group: jobs are (group index, prompt tokens, seed). Returns, per
        job, (group index, [(tokens, logprobs, finish_reason)] * n)."""
        out = []
        for g, prompt, seed in jobs:
            group = self.sampler.generate(prompt, n=n, max_tokens=line_bytes, seed=seed,
                                          stop=[NEWLINE], temperature=temperature, mode=mode)
            out.append((g, [(c.tokens, c.logprobs, c.finish_reason) for c in group]))
        return out

    def close(self):
        self.sampler.close()
        self.model.close()


# What a sync leaves of the learner's fp32 masters in the sampler's model (Model.update's
# `masters`): "where-read" keeps them only where a copy the model built reads them. The
# sampler, made before any sync, is the model's only reader: under a bf16 policy nothing reads
# masters and the first sync writes no 4 bytes a parameter of new memory (bench/learner_sync.py);
# under an fp32-, fp16-compute or quantized policy the library keeps what the sampler reads,
# so its log-probs are those of a model that kept every master.
SAMPLER_MASTERS = "where-read"


def weights_payload(version, masters):
    """What a sampler needs to reach a version: the fp32 masters as (dtype, shape, bytes) for
    parity.Model.update (none for version 0, the checkpoint every sampler loads) and the
    checksums of their bf16 cast (parity.manifest.checksum: the manifest's values) with the
    manifest version they are of."""
    tensors = None
    if version > 0:
        tensors = {}
        for name, t in masters.items():
            t = t.detach().contiguous()
            tensors[name] = ("F32", tuple(t.shape), t.numpy().tobytes())
    checksums = {name: parity.manifest.checksum(t.detach(), name) for name, t in masters.items()}
    return {"version": version, "tensors": tensors, "checksums": checksums,
            "manifest_version": parity.MANIFEST_VERSION}


class LocalRollouts:
    """Sampling in this process, on a model the learner syncs itself."""

    def __init__(self, args, max_len, threads):
        self.engine = RolloutEngine(parity, args.model, args.policy, args.backend, threads,
                                    max_len, args.n)
        self.args = args

    def start(self, run, masters):
        """A learner's trajectory begins (on a fresh engine: one per learner); the checkpoint
        the sampler loaded must be the learner's initial weights."""
        self.engine.apply(weights_payload(0, masters))

    def sync(self, version, learner):
        """The learner pushes its masters into the sampler's model (and checks them there)."""
        seconds = learner.sync(self.engine.model)
        self.engine.version = version
        return seconds

    def sample(self, version, jobs):
        if self.engine.version != version:
            raise RuntimeError("the sampler holds version %d, the learner is at %d"
                               % (self.engine.version, version))
        res = self.engine.sample(jobs, self.args.n, self.args.line_bytes, self.args.temperature,
                                 self.args.mode)
        return [r[1] for r in sorted(res)]

    def close(self):
        self.engine.close()


def _import_parity(python_dir, library):
    """In a worker process: the binding of this repository (or the one installed there) and the
    library the driver uses, where that path exists on the worker's machine."""
    if os.path.isdir(python_dir) and python_dir not in sys.path:
        sys.path.insert(0, python_dir)
    if library and os.path.isfile(library):
        os.environ.setdefault("PARITY_LIBRARY", library)
    import parity as parity_module
    return parity_module


def _worker_state():
    from distributed import get_worker
    return get_worker().plugins[PLUGIN]


def _sample_task(run, version, payload, jobs, n, line_bytes, temperature, mode):
    """A dask task: brings the worker's engine of run `run` to `version` and samples `jobs`."""
    state = _worker_state()
    with state.lock:
        engine = state.engine(run)
        engine.apply(payload)
        if engine.version != version:
            raise RuntimeError("worker at version %d asked to sample version %d"
                               % (engine.version, version))
        return engine.sample(jobs, n, line_bytes, temperature, mode)


def _make_plugin_class():
    from distributed import WorkerPlugin

    class RolloutPlugin(WorkerPlugin):
        """Per worker: loads the model once per run (a learner's trajectory) and keeps it."""

        def __init__(self, python_dir, library, model_path, policy, backend, threads, max_len,
                     n):
            self.python_dir, self.library = python_dir, library
            self.config = (model_path, policy, backend, threads, max_len, n)
            self.run, self.current = None, None

        def setup(self, worker):
            import threading
            self.parity = _import_parity(self.python_dir, self.library)
            self.lock = threading.Lock()

        def engine(self, run):
            """The engine of a run, opened at its first task (the previous run's closed)."""
            if run != self.run:
                self.teardown(None)
                self.current = RolloutEngine(self.parity, *self.config)
                self.run = run
            return self.current

        def teardown(self, worker):
            if self.current is not None:
                self.current.close()
            self.current, self.run = None, None

    return RolloutPlugin


class ClusterRollouts:
    """What sampling on a cluster's workers (dask or Ray) shares: each learner's trajectory is a
    run of its own, named so that one run's models are never another's, and a weight sync is a
    push of the version's payload (which the workers apply when they next sample)."""

    def __init__(self):
        self.session = os.urandom(8).hex()  # tells this run's models from another's
        self.run = None

    def run_name(self, run):
        return "%s-%d" % (self.session, run)

    def sync(self, version, learner):
        t0 = time.perf_counter()
        self.push(version, learner.named_masters())
        return time.perf_counter() - t0


class DaskRollouts(ClusterRollouts):
    """Sampling on dask workers: groups are tasks; weights travel as a scattered payload."""

    def __init__(self, args, max_len):
        try:
            import distributed
        except ImportError as e:
            raise UsageError("--workers/--scheduler need dask.distributed, which this Python "
                             "(%s) cannot import (%s); on Debian: apt-get install "
                             "python3-distributed" % (sys.executable, e)) from None
        import logging
        super().__init__()
        self.args = args
        self.cluster = None
        # the workers load the same library and, on this machine, the same binding
        os.environ.setdefault("PARITY_LIBRARY", parity.LIBRARY_PATH)
        if __name__ != "__main__":  # imported as a module: ship its code to the workers
            import cloudpickle
            cloudpickle.register_pickle_by_value(sys.modules[__name__])
        if args.scheduler:
            try:
                self.client = distributed.Client(args.scheduler, timeout=20)
            except (OSError, TimeoutError) as e:
                raise UsageError("cannot reach the dask scheduler at %s: %s"
                                 % (args.scheduler, e)) from None
            threads = None
        else:
            threads = max(1, args.threads // args.workers)
            self.cluster = distributed.LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True,
                dashboard_address=None, silence_logs=logging.ERROR)
            self.client = distributed.Client(self.cluster)
        n_workers = len(self.client.scheduler_info()["workers"])
        self.description = ("%d dask worker%s (%s)" % (
            n_workers, "" if n_workers == 1 else "s",
            args.scheduler or "LocalCluster, %d thread%s each" % (threads,
                                                                  "" if threads == 1 else "s")))
        plugin = _make_plugin_class()(PYTHON_DIR, parity.LIBRARY_PATH, args.model, args.policy,
                                      args.backend, threads, max_len, args.n)
        # Client.register_plugin since distributed 2023.9 (PyPI's 2026.8 has only it); Debian's
        # 2022.12 has only register_worker_plugin
        register = getattr(self.client, "register_plugin", None)
        (register or self.client.register_worker_plugin)(plugin, name=PLUGIN)
        self.payload = None

    def start(self, run, masters):
        """A learner's trajectory begins: the workers open a fresh model for it, which must hold
        the learner's initial weights (version 0)."""
        self.run = self.run_name(run)
        self.push(0, masters)

    def push(self, version, masters):
        """Scatters the version's weights to every worker."""
        payload = weights_payload(version, masters)
        # (a list of one: dask scatters a dict's values one by one)
        self.payload = self.client.scatter([payload], broadcast=True, hash=False)[0]

    def sample(self, version, jobs):
        a = self.args
        futures = [self.client.submit(_sample_task, self.run, version, self.payload, [job], a.n,
                                      a.line_bytes, a.temperature, a.mode, pure=False)
                   for job in jobs]
        try:
            res = [r for part in self.client.gather(futures) for r in part]
        except (parity.ParityError, RuntimeError):
            raise
        except Exception as e:  # a worker lost, a scheduler gone: dask's own exceptions
            raise RuntimeError("sampling on the dask workers failed: %s: %s"
                               % (type(e).__name__, e)) from None
        return [r[1] for r in sorted(res, key=lambda r: r[0])]

    def close(self):
        try:
            if self.cluster is None:  # a cluster that outlives the run: free the models there
                self.client.unregister_worker_plugin(PLUGIN)
        finally:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()



def _make_actor_class(ray):
    """The Ray actor class (made once ray is imported: the module imports without it)."""

    @ray.remote
    class RolloutActor:
        """One rollout worker: a RolloutEngine per run (a learner's trajectory), brought to the
        driver's weights by version before it samples."""

        def __init__(self, python_dir, library, config):
            self.parity = _import_parity(python_dir, library)
            self.config = config
            self.run, self.engine = None, None

        def where(self):
            """(node address, process id, the library's version): where the actor runs."""
            return ray.util.get_node_ip_address(), os.getpid(), self.parity.version()

        def open(self, run):
            """A fresh model and sampler for a run (the previous run's closed)."""
            self.close()
            self.engine = RolloutEngine(self.parity, *self.config)
            self.run = run

        def sample(self, run, version, payload_box, jobs, n, line_bytes, temperature, mode):
            """Samples jobs on the weights of `version`. payload_box is [ObjectRef] of that
            version's payload (in a list, so that Ray passes the reference and not the value):
            fetched only when this actor holds an older version."""
            if run != self.run or self.engine is None:
                raise RuntimeError("actor asked to sample run %r, it holds run %r"
                                   % (run, self.run))
            if self.engine.version != version or not self.engine.verified:
                self.engine.apply(ray.get(payload_box[0]))
            if self.engine.version != version:
                raise RuntimeError("actor at version %d asked to sample version %d"
                                   % (self.engine.version, version))
            return self.engine.sample(jobs, n, line_bytes, temperature, mode)

        def close(self):
            if self.engine is not None:
                self.engine.close()
            self.engine, self.run = None, None

    return RolloutActor


RAY_OBJECT_STORE_BYTES = 256 << 20  # a local instance's object store: a few versions' weights
RAY_PLACEMENT_SECONDS = 120  # how long the placement group may wait for room


def _probe_ray_address(address, seconds=10):
    """Raises UsageError unless something accepts a TCP connection at a HOST:PORT address
    (ray://HOST:PORT too): Ray itself retries an address where nothing listens for minutes.
    "auto" and other forms are left to ray.init."""
    import socket
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
    except OSError as e:
        raise UsageError("--ray-address %s: nothing answers there (%s); a Ray cluster's head "
                         "listens on port 6379 unless `ray start --head --port` said another"
                         % (address, e)) from None


class RayRollouts(ClusterRollouts):
    """Sampling on Ray actors placed by a placement group of spread bundles; weights travel
    through the object store once per version."""

    def __init__(self, args, max_len):
        try:
            import ray
            from ray.util.placement_group import placement_group, placement_group_table
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as e:
            raise UsageError("--cluster ray needs ray, which this Python (%s) cannot import (%s); "
                             "it is on PyPI (pip install ray; tested with 2.60.0), not in "
                             "Debian" % (sys.executable, e)) from None
        import logging
        super().__init__()
        self.ray, self.args = ray, args
        self.actors, self.group, self.started = [], None, False
        if __name__ != "__main__":  # imported as a module: ship its code to the actors
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        # no usage statistics sent anywhere (a local instance would report them by default)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        workers = args.workers
        threads = max(1, args.threads // workers)
        if args.ray_address:
            _probe_ray_address(args.ray_address)
        try:
            if args.ray_address:
                ray.init(address=args.ray_address, logging_level=logging.ERROR,
                         log_to_driver=False)
            else:
                # "local": a new instance even where `ray start` left one running on this machine
                # (which address=None would join)
                ray.init(address="local", num_cpus=workers * threads, include_dashboard=False,
                         object_store_memory=RAY_OBJECT_STORE_BYTES,
                         logging_level=logging.ERROR, log_to_driver=False)
                self.started = True
        except Exception as e:  # ConnectionError, RuntimeError, ValueError: Ray's own choice
            where = ("join the Ray cluster at %s" % args.ray_address if args.ray_address
                     else "start a local Ray instance (%d CPUs, %d MiB object store)"
                     % (workers * threads, RAY_OBJECT_STORE_BYTES >> 20))
            ray.shutdown()  # whatever part of it did start
            hint = ""
            if args.ray_address and "RAY_AUTH_MODE" not in os.environ:
                hint = ("; a cluster with token authentication (what `ray start` sets up by "
                        "default) needs RAY_AUTH_MODE=token here, and its token in "
                        "~/.ray/auth_token or RAY_AUTH_TOKEN")
            raise UsageError("cannot %s: %s: %s%s" % (where, type(e).__name__, e, hint)) from None
        try:
            self._place(workers, threads, max_len, placement_group, placement_group_table,
                        PlacementGroupSchedulingStrategy)
        except BaseException:
            self.close()
            raise

    def _place(self, workers, threads, max_len, placement_group, placement_group_table,
               strategy_class):
        """The placement group (one bundle of `threads` CPUs per worker, SPREAD) and an actor
        in each bundle; raises UsageError when the cluster has no room or an actor fails."""
        ray, args = self.ray, self.args
        bundle = {"CPU": threads}
        self.group = placement_group([dict(bundle) for _ in range(workers)], strategy="SPREAD")
        try:
            ray.get(self.group.ready(), timeout=RAY_PLACEMENT_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise UsageError("the Ray cluster has no room for %d bundle%s of %s (strategy SPREAD) "
                             "after %d s; it has %s, of which %s free (--workers and --threads "
                             "set the bundles)"
                             % (workers, "" if workers == 1 else "s", bundle,
                                RAY_PLACEMENT_SECONDS, ray.cluster_resources(),
                                ray.available_resources())) from None
        actor_class = _make_actor_class(ray)
        config = (args.model, args.policy, args.backend, threads, max_len, args.n)
        self.actors = [actor_class.options(
            num_cpus=threads, scheduling_strategy=strategy_class(
                placement_group=self.group, placement_group_bundle_index=i))
            .remote(PYTHON_DIR, parity.LIBRARY_PATH, config) for i in range(workers)]
        try:
            where = ray.get([a.where.remote() for a in self.actors])
        except ray.exceptions.RayError as e:
            raise UsageError("the Ray actors could not start (each needs parity importable and "
                             "libparity at %s or its own PARITY_LIBRARY): %s"
                             % (parity.LIBRARY_PATH, e)) from None
        nodes = set(placement_group_table(self.group)["bundles_to_node_id"].values())
        self.description = "%d Ray actor%s (%s; one bundle of %d CPU%s each, SPREAD over %d " \
                           "node%s; library %s)" % (
                               workers, "" if workers == 1 else "s",
                               "joined %s" % args.ray_address if args.ray_address
                               else "local Ray instance", threads, "" if threads == 1 else "s",
                               len(nodes), "" if len(nodes) == 1 else "s", where[0][2])
        self.version, self.payload = None, None

    def _call(self, refs, what):
        """ray.get of the actors' calls; an actor's failure becomes a RuntimeError naming it."""
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None)
            raise RuntimeError("%s on the Ray actors failed: %s" % (
                what, "%s: %s" % (type(cause).__name__, cause) if cause is not None
                else "%s: %s" % (type(e).__name__, e))) from None

    def start(self, run, masters):
        """A learner's trajectory begins: every actor opens a fresh model, which must hold the
        learner's initial weights (version 0)."""
        self.run = self.run_name(run)
        self._call([a.open.remote(self.run) for a in self.actors], "opening the models")
        self.push(0, masters)

    def push(self, version, masters):
        """Puts the version's weights into the object store, once for every actor."""
        self.payload = self.ray.put(weights_payload(version, masters))
        self.version = version

    def sample(self, version, jobs):
        if version != self.version:
            raise RuntimeError("the driver pushed version %s, the learner is at %d"
                               % (self.version, version))
        a = self.args
        n = len(self.actors)
        refs = [actor.sample.remote(self.run, version, [self.payload], jobs[i::n], a.n,
                                    a.line_bytes, a.temperature, a.mode)
                for i, actor in enumerate(self.actors) if jobs[i::n]]
        res = [r for part in self._call(refs, "sampling") for r in part]
        return [r[1] for r in sorted(res, key=lambda r: r[0])]

    def close(self):
        ray = self.ray
        try:
            if not self.started:  # a cluster that outlives the run: free what this run took
                for actor in self.actors:
                    ray.kill(actor)
                if self.group is not None:
                    ray.util.remove_placement_group(self.group)
        finally:
            self.actors, self.group = [], None
            ray.shutdown()  # stops a local instance; disconnects from a joined cluster


# ---- the learners ------------------------------------------------------------------------------

class TorchLearner:
    """A plain PyTorch bf16 Qwen3, as a user writes one with torch.nn.functional following
    transformers' modeling_qwen3 (eager attention): fp32 masters, cast to bf16 at each forward."""

    def __init__(self, model_path, torch):
        self.torch = torch
        with open(os.path.join(model_path, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("model_type") != "qwen3":
            raise UsageError("--learner torch implements Qwen3; %s is %r"
                             % (model_path, cfg.get("model_type")))
        if cfg.get("rope_scaling"):
            raise UsageError("--learner torch implements default RoPE only; %s has rope_scaling "
                             "%r" % (model_path, cfg["rope_scaling"]))
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.theta = cfg.get("rope_theta", 10000.0)
        self.tied = bool(cfg.get("tie_word_embeddings"))
        from parity.torch import read_checkpoint  # safetensors -> {name: fp32 tensor}
        self.masters = {name: torch.nn.Parameter(t.contiguous())
                        for name, t in read_checkpoint(model_path).items()}
        self.description = "plain PyTorch bf16 Qwen3 (torch.nn.functional)"

    def named_masters(self):
        return self.masters

    def _rms_norm(self, x, weight):
        # Qwen3RMSNorm.forward
        torch = self.torch
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return weight * h.to(dtype)

    def _rotate_half(self, x):
        half = x.shape[-1] // 2
        return self.torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def _rope(self, length):
        # Qwen3RotaryEmbedding (default rope type): fp32 angles, cos/sin cast to the bf16 dtype
        torch = self.torch
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64)
                                         .float() / self.head_dim))
        pos = torch.arange(length, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)

    def __call__(self, sequences, mode, temperature):
        """log p(x_t | x_<t), t = 1..len-1, of each sequence (1-D fp32 tensors, with grad)."""
        torch = self.torch
        F = torch.nn.functional
        bf16 = torch.bfloat16
        w = {name: p.to(bf16) for name, p in self.masters.items()}  # the learner's cast
        lengths = [len(s) for s in sequences]
        B, T = len(sequences), max(lengths)
        ids = torch.zeros(B, T, dtype=torch.long)  # right-padded: causal attention never
        for i, s in enumerate(sequences):           # lets a real position see the padding
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        cos, sin = self._rope(T)
        mask = torch.full((T, T), torch.finfo(bf16).min, dtype=bf16).triu(1)
        scaling = D ** -0.5
        h = F.embedding(ids, w["model.embed_tokens.weight"])
        for i in range(self.layers):
            p = "model.layers.%d." % i
            x = self._rms_norm(h, w[p + "input_layernorm.weight"])
            q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(B, T, H, D)
            k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(B, T, KV, D)
            v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(B, T, KV, D)
            q = self._rms_norm(q, w[p + "self_attn.q_norm.weight"]).transpose(1, 2)
            k = self._rms_norm(k, w[p + "self_attn.k_norm.weight"]).transpose(1, 2)
            v = v.transpose(1, 2)
            q = q * cos + self._rotate_half(q) * sin
            k = k * cos + self._rotate_half(k) * sin
            k = k.repeat_interleave(H // KV, dim=1)  # repeat_kv
            v = v.repeat_interleave(H // KV, dim=1)
            scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(bf16)
            o = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, H * D)
            h = h + F.linear(o, w[p + "self_attn.o_proj.weight"])
            x = self._rms_norm(h, w[p + "post_attention_layernorm.weight"])
            gate = F.linear(x, w[p + "mlp.gate_proj.weight"])
            up = F.linear(x, w[p + "mlp.up_proj.weight"])
            h = h + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        h = self._rms_norm(h, w["model.norm.weight"])
        head = w["model.embed_tokens.weight"] if self.tied else w["lm_head.weight"]
        logits = F.linear(h, head).float()
        if mode == "processed" and temperature not in (0.0, 1.0):
            logits = logits / temperature
        logprobs = F.log_softmax(logits, dim=-1)
        out = []
        for i, s in enumerate(sequences):
            n = len(s)
            out.append(logprobs[i, :n - 1].gather(-1, ids[i, 1:n, None]).squeeze(-1))
        return out

    def sync(self, model):
        """Pushes RNE(masters) into the sampler's model and checks it against their manifest
        (parity.Model.sync, SAMPLER_MASTERS); returns the seconds."""
        return sum(model.sync(self.masters, masters=SAMPLER_MASTERS))


class ParityLearner:
    """parity.torch.CausalLM: libparity's forward as a torch module, gradients by autograd."""

    def __init__(self, model_path, policy, backend, threads, recipe=None, seed=0,
                 gradients="fp32"):
        from parity.torch import CausalLM
        self.lm = CausalLM(model_path, policy=policy, backend=backend, threads=threads,
                           recipe=recipe, gradients=gradients)
        self.policy = policy
        self.seed = seed
        self.description = "parity.torch.CausalLM, policy %s" % policy
        # Its forward and backward compute on the library's pool; torch runs only glue ops
        # between the library's calls, elementwise (their bits do not depend on torch's thread
        # count). With torch's own threads those wake between the library's calls and, on
        # OpenMP's default active wait, spin on the cores the pool needs: run_learner gives
        # torch one thread from the forward to the end of the backward.
        self.torch_threads = 1
        if recipe:
            self.description += ", recipe %s" % recipe
        if gradients != "fp32":
            self.description += ", %s gradients" % gradients

    def begin_step(self, step):
        """The recipe's stochastic rounding is keyed by (run seed, step) and a stream per
        layer: the same run gives the same gradients."""
        self.lm.recipe_seed = self.seed * 1000003 + step

    def named_masters(self):
        return dict(self.lm.named_parameters())

    def __call__(self, sequences, mode, temperature):
        return self.lm(sequences, mode=mode, temperature=temperature)

    def sync(self, model):
        """CausalLM.sync_to: parity_model_update with the masters (SAMPLER_MASTERS), then the
        manifest check; returns the seconds (it reports update and check separately)."""
        return sum(self.lm.sync_to(model, masters=SAMPLER_MASTERS))


def make_learner(spec, args, torch):
    if spec == "torch":
        return TorchLearner(args.model, torch)
    policy = args.policy if spec == "parity" else spec.split(":", 1)[1]
    return ParityLearner(args.model, policy, args.backend, args.threads, args.recipe, args.seed,
                         getattr(args, "learner_gradients", "fp32"))


# ---- one step ----------------------------------------------------------------------------------

def f32_bits(values, torch):
    return values.detach().contiguous().view(torch.int32)


def mismatch(learner_lp, sampler_lp, torch):
    """The step's mismatch metrics from the concatenated per-token log-probs (fp32 tensors)."""
    d = (learner_lp.detach().double() - sampler_lp.double())
    p_diff = (learner_lp.detach().double().exp() - sampler_lp.double().exp()).abs()
    return {
        "rollout_corr/k3_kl": (d.exp() - d - 1.0).mean().item(),
        "training/rollout_probs_diff_max": p_diff.max().item(),
        "training/rollout_probs_diff_mean": p_diff.mean().item(),
        "token_mult_prob_error": d.abs().exp().mean().item(),
        "lp_not_bitwise": int((f32_bits(learner_lp, torch) != f32_bits(sampler_lp, torch))
                              .sum().item()),
    }


def advantages(rewards, torch):
    r = torch.tensor(rewards, dtype=torch.float32)
    return (r - r.mean()) / (r.std() + 1e-6)


def digest(groups):
    """sha256 of every completion's tokens and log-prob bits, in order (first 16 hex digits)."""
    h = hashlib.sha256()
    for group in groups:
        for tokens, logprobs, finish in group:
            h.update(array("i", tokens).tobytes())
            h.update(array("f", logprobs).tobytes())
            h.update(finish.encode())
    return h.hexdigest()[:16]


def weights_digest(masters):
    h = hashlib.sha256()
    for name in sorted(masters):
        h.update(name.encode())
        h.update(masters[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def run_learner(spec, run, args, prompts, rollouts, torch, emit):
    """One RL trajectory with one learner; emit(record) gets each step's record."""
    learner = make_learner(spec, args, torch)
    masters = learner.named_masters()
    params = list(masters.values())
    opt = torch.optim.Adam(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    rollouts.start(run, masters)
    version = 0
    records = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        chosen = step_prompts(len(prompts), args.seed, step, args.groups)
        jobs = [(g, prompts[p], group_seed(args.seed, step, g)) for g, p in enumerate(chosen)]
        groups = rollouts.sample(version, jobs)
        t1 = time.perf_counter()

        seqs, sampler_lp, adv_tok, rewards = [], [], [], []
        for (g, prompt, _), group in zip(jobs, groups):
            r = [line_reward(tokens, args.line_bytes) for tokens, _, _ in group]
            rewards.extend(r)
            a = advantages(r, torch)
            for (tokens, lps, _), a_i in zip(group, a):
                if not tokens:
                    continue
                seqs.append((len(prompt), prompt + tokens))
                sampler_lp.append(torch.tensor(lps, dtype=torch.float32))
                adv_tok.append(a_i.expand(len(tokens)))
        if hasattr(learner, "begin_step"):
            learner.begin_step(step)
        # torch's thread count is restored even when the forward or backward raises
        glue_threads = getattr(learner, "torch_threads", None)
        if glue_threads:
            torch.set_num_threads(glue_threads)
        try:
            out = learner([s for _, s in seqs], args.mode, args.temperature)
            learner_lp = torch.cat([lp[plen - 1:] for (plen, _), lp in zip(seqs, out)])
            sampler_lp = torch.cat(sampler_lp)
            adv = torch.cat(adv_tok)
            metrics = mismatch(learner_lp, sampler_lp, torch)

            ratio = torch.exp(learner_lp - sampler_lp)
            clipped = ratio.clamp(1.0 - args.clip, 1.0 + args.clip)
            loss = torch.max(-adv * ratio, -adv * clipped).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
        finally:
            if glue_threads:
                torch.set_num_threads(args.threads)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        version += 1
        t2 = time.perf_counter()

        sync = rollouts.sync(version, learner)  # weight sync, every step
        t3 = time.perf_counter()

        rec = {"learner": spec, "step": step, "version": version}
        rec["reward_mean"] = sum(rewards) / len(rewards)
        rec.update(metrics)
        rec.update({
            "tokens": int(learner_lp.numel()),
            "loss": loss.item(),
            "clip_frac": ((ratio != clipped).double().mean().item()),
            "grad_norm": grad_norm.item(),
            "rollouts_sha": digest(groups),
            "example": bytes(groups[0][0][0]).decode("utf-8", "replace"),
            "weights_sha": weights_digest(masters),
            "time_step": t3 - t0, "time_sample": t1 - t0, "time_learn": t2 - t1,
            "time_sync": sync,
        })
        records.append(rec)
        emit(rec)
    last = (jobs[0][1], [tokens for tokens, _, _ in groups[0]])
    return learner.description, records, last


# ---- output ------------------------------------------------------------------------------------

COLUMNS = [("step", "%4s", "%4d"), ("reward_mean", "%7s", "%7.3f"),
           ("rollout_corr/k3_kl", "%10s", "%10.3g"),
           ("training/rollout_probs_diff_max", "%10s", "%10.3g"),
           ("training/rollout_probs_diff_mean", "%10s", "%10.3g"),
           ("token_mult_prob_error", "%10s", "%10.6f"),
           ("lp_not_bitwise", "%11s", "%11d"), ("tokens", "%6s", "%6d"),
           ("loss", "%9s", "%9.4f"), ("time_step", "%7s", "%7.2f")]
HEADS = {"reward_mean": "reward", "rollout_corr/k3_kl": "k3_kl",
         "training/rollout_probs_diff_max": "pdiff_max",
         "training/rollout_probs_diff_mean": "pdiff_mean",
         "token_mult_prob_error": "mult_err", "lp_not_bitwise": "not_bitwise",
         "time_step": "time_s"}


def table_header():
    return " ".join(h % HEADS.get(k, k) for k, h, _ in COLUMNS)


def table_row(rec):
    return " ".join(f % rec[k] for k, _, f in COLUMNS)


PANELS = [("reward_mean", "reward mean"),
          ("rollout_corr/k3_kl", "rollout_corr/k3_kl"),
          ("training/rollout_probs_diff_max", "training/rollout_probs_diff_max"),
          ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_mean"),
          ("token_mult_prob_error", "token_mult_prob_error (perfect: 1)"),
          ("lp_not_bitwise", "lp_not_bitwise (tokens whose log-probs differ)")]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _tick(v, span):
    """A tick label with the digits the axis' span needs (1.0055 on an axis from 1 to 1.011)."""
    if v == 0:
        return "0"
    extra = max(0, math.floor(math.log10(abs(v))) - math.floor(math.log10(span)))
    return "%.*g" % (3 + extra, v)


def write_svg(path, runs, title):
    """An SVG (hand-written, standard library) of each metric per step, one line per learner:
    runs is [(learner, [records])]."""
    pw, ph, ml, mr, mt, mb = 300, 170, 62, 14, 30, 34
    cols, rows = 3, (len(PANELS) + 2) // 3
    width, top = cols * (pw + ml + mr), 52
    height = top + rows * (ph + mt + mb) + 10
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">'
           % (width, height, width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14" text-anchor="middle">%s</text>'
           % (width // 2, escape(title))]
    x = 10
    for i, (name, _) in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        out.append('<line x1="%d" y1="36" x2="%d" y2="36" stroke="%s" stroke-width="2"/>'
                   % (x, x + 22, c))
        out.append('<text x="%d" y="40">%s</text>' % (x + 27, escape(name)))
        x += 40 + 7 * len(name)
    steps = max((len(recs) for _, recs in runs), default=1)
    for k, (key, label) in enumerate(PANELS):
        r, c = divmod(k, cols)
        x0 = c * (pw + ml + mr) + ml
        y0 = top + r * (ph + mt + mb) + mt
        vals = [rec[key] for _, recs in runs for rec in recs]
        lo, hi = min(vals + [0.0]), max(vals + [0.0])
        if key == "token_mult_prob_error":
            lo, hi = min(vals + [1.0]), max(vals + [1.0])
        if key == "reward_mean":
            lo, hi = 0.0, 1.0
        if hi == lo:
            hi = lo + 1.0
        xmax = max(steps - 1, 1)

        def px(s):
            return x0 + pw * s / xmax

        def py(v):
            return y0 + ph - ph * (v - lo) / (hi - lo)
        out.append('<text x="%d" y="%d" text-anchor="middle">%s</text>'
                   % (x0 + pw // 2, y0 - 8, escape(label)))
        out.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>'
                   % (x0, y0, pw, ph))
        for f in (0.0, 0.5, 1.0):
            v = lo + f * (hi - lo)
            yy = py(v)
            out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>'
                       % (x0 + 1, yy, x0 + pw - 1, yy))
            out.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                       % (x0 - 4, yy + 4, _tick(v, hi - lo)))
        for s in sorted({0, xmax // 2, xmax}):
            out.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>'
                       % (px(s), y0 + ph + 14, s))
        out.append('<text x="%d" y="%d" text-anchor="middle" fill="#555">step</text>'
                   % (x0 + pw // 2, y0 + ph + 28))
        for i, (_, recs) in enumerate(runs):
            pts = " ".join("%.1f,%.1f" % (px(rec["step"]), py(rec[key])) for rec in recs)
            color = COLORS[i % len(COLORS)]
            if len(recs) == 1:
                out.append('<circle cx="%s" cy="%s" r="2.5" fill="%s"/>'
                           % (tuple(pts.split(",")) + (color,)))
            else:
                out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6"/>'
                           % (pts, color))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def summary(results, line_bytes):
    """The closing comparison of the learners run, and what each wrote at its last step."""
    lines = ["", "summary (per learner: reward mean over the first and last 5 steps; mismatch "
             "over all steps)",
             "%-22s %7s %7s %11s %11s %12s %16s %8s" % (
                 "learner", "r_first", "r_last", "k3_kl mean", "pdiff max", "mult_err mean",
                 "not bitwise", "time_s")]
    for spec, desc, recs, _ in results:
        k = min(5, len(recs))
        first = sum(r["reward_mean"] for r in recs[:k]) / k
        last = sum(r["reward_mean"] for r in recs[-k:]) / k
        tokens = sum(r["tokens"] for r in recs)
        bad = sum(r["lp_not_bitwise"] for r in recs)
        lines.append("%-22s %7.3f %7.3f %11.3g %11.3g %12.6f %16s %8.1f" % (
            spec, first, last, sum(r["rollout_corr/k3_kl"] for r in recs) / len(recs),
            max(r["training/rollout_probs_diff_max"] for r in recs),
            sum(r["token_mult_prob_error"] for r in recs) / len(recs),
            "%d/%d" % (bad, tokens), sum(r["time_step"] for r in recs)))
    for spec, desc, recs, (prompt, completions) in results:
        exact = all(r["rollout_corr/k3_kl"] == 0.0 and r["training/rollout_probs_diff_max"] == 0.0
                    and r["training/rollout_probs_diff_mean"] == 0.0
                    and r["token_mult_prob_error"] == 1.0 and r["lp_not_bitwise"] == 0
                    for r in recs)
        lines.append("  %s: %s; %s" % (spec, desc, "sampler and learner log-probs bitwise equal "
                                       "at every step (k3 0, probs diff 0, mult_err exactly 1)"
                                       if exact else "mismatch at %d of %d steps" % (
                                           sum(r["lp_not_bitwise"] > 0 for r in recs),
                                           len(recs))))
        tail = [ln for ln in bytes(prompt).decode("utf-8", "replace").splitlines() if ln.strip()]
        lines.append("    last step, group 0: after %r%s it wrote"
                     % (tail[-1] if tail else "", " (and a blank line)"
                        if bytes(prompt).endswith(b"\n\n") else ""))
        for tokens in completions:
            text = bytes(tokens).decode("utf-8", "replace")
            lines.append("      %-6s %r" % ("+1" if line_reward(tokens, line_bytes) else "0",
                                           text))
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="GRPO on the byte-level model with libparity as the sampler; logs the "
                    "sampler/learner mismatch per step. See the module docstring.")
    ap.add_argument("--learner", default="parity",
                    help="parity, parity:PRESET or torch; several comma-separated run one after "
                         "another (default: parity)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="checkpoint directory")
    ap.add_argument("--policy", default="aligned", help="the sampler's policy (default aligned)")
    ap.add_argument("--format", help="a quantized format on both sides, FORMAT or FORMAT:RULE "
                                     "(nvfp4, mxfp4, ternary, fp8-block, mxfp8; default rules "
                                     "modelopt, ocp, bitnet, deepseek, ocp): appended to --policy "
                                     "and to every parity learner's preset")
    ap.add_argument("--recipe", help="a training recipe for the parity learners' backward "
                                     "(parity.recipes(): te-mxfp8, te-mxfp8-hybrid, te-nvfp4): "
                                     "dgrad and wgrad on quantized operands; its fprop must be "
                                     "the policy's (te-mxfp8*: --format mxfp8:te)")
    ap.add_argument("--learner-gradients", default="fp32", choices=["fp32", "bf16"],
                    help="the parity learners' linear backward GEMMs: fp32 (default) or bf16 "
                         "(the incoming gradient rounded to bf16, the GEMMs on bf16 dot "
                         "products; bf16 policies only)")
    ap.add_argument("--backend", default="bf16", choices=["bf16", "openblas"],
                    help="the sampler's (and parity learner's) GEMM backend")
    ap.add_argument("--mode", choices=["raw", "processed"],
                    help="log-prob mode of both sides (default: raw at temperature 1, else "
                         "processed, the distribution sampled from)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    ap.add_argument("--steps", type=int, default=20, help="RL steps per learner (default 20)")
    ap.add_argument("--groups", type=int, default=4, help="prompts (groups) per step")
    ap.add_argument("--n", type=int, default=8, help="completions per group")
    ap.add_argument("--line-bytes", type=int, default=32,
                    help="the reward's line length; also the most bytes sampled")
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate")
    ap.add_argument("--clip", type=float, default=0.2, help="PPO clip epsilon")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int,
                    help="threads of the driver and, split among --workers (at least 1 each), "
                         "of the workers' samplers (default: the CPUs this process may use)")
    ap.add_argument("--workers", type=int, metavar="N",
                    help="sample on N workers of a cluster (--cluster) instead of in-process: "
                         "dask worker processes of a LocalCluster, or Ray actors")
    ap.add_argument("--cluster", choices=["dask", "ray"],
                    help="where --workers run: dask.distributed (the default) or Ray; "
                         "--scheduler implies dask, --ray-address ray")
    ap.add_argument("--scheduler", metavar="ADDRESS",
                    help="sample on the running dask cluster at this address (its workers, all "
                         "of them)")
    ap.add_argument("--ray-address", metavar="ADDRESS",
                    help="join the running Ray cluster at this address ('auto', or HOST:6379) "
                         "and place the --workers actors (default 1) there; default: a local "
                         "Ray instance started for the run and shut down at exit")
    ap.add_argument("--log", help="write a JSON object per step to this file")
    ap.add_argument("--svg", default="grpo-mismatch.svg",
                    help="the plot of the metrics per step (default grpo-mismatch.svg; '' for "
                         "none)")
    ap.add_argument("--quiet", action="store_true", help="no per-step table")
    args = ap.parse_args(argv)

    def positive(name, value, low=1):
        if value is not None and value < low:
            ap.error("--%s must be at least %d, not %d" % (name, low, value))
    positive("steps", args.steps)
    positive("groups", args.groups)
    positive("n", args.n, 2)
    positive("line-bytes", args.line_bytes)
    positive("workers", args.workers)
    positive("threads", args.threads)
    if args.seed < 0:
        ap.error("--seed must be >= 0")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        ap.error("--lr must be a positive number")
    if not (0 < args.clip < 1):
        ap.error("--clip must be in (0, 1)")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        ap.error("--temperature must be positive (sampling; 0 = greedy has no log-prob ratio)")
    if args.mode is None:
        args.mode = "raw" if args.temperature == 1.0 else "processed"
    if args.workers and args.scheduler:
        ap.error("--workers and --scheduler exclude each other")
    if args.scheduler and args.ray_address:
        ap.error("--scheduler (a dask cluster) and --ray-address (a Ray cluster) exclude each "
                 "other")
    implied = "dask" if args.scheduler else "ray" if args.ray_address else None
    if args.cluster and implied and args.cluster != implied:
        ap.error("--cluster %s and --%s (a %s cluster) exclude each other"
                 % (args.cluster, "scheduler" if implied == "dask" else "ray-address", implied))
    args.cluster = args.cluster or implied or ("dask" if args.workers else None)
    if args.cluster == "ray":
        args.workers = args.workers or 1
    elif args.cluster == "dask" and not (args.workers or args.scheduler):
        args.workers = 1
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    specs = [s.strip() for s in args.learner.split(",") if s.strip()]
    if not specs:
        ap.error("--learner: name at least one learner")
    if args.format:
        default_rules = {"nvfp4": "modelopt", "mxfp4": "ocp", "ternary": "bitnet",
                         "fp8-block": "deepseek", "mxfp8": "ocp"}
        fmt = args.format if ":" in args.format else \
            "%s:%s" % (args.format, default_rules.get(args.format, ""))
        if fmt.split(":")[0] not in default_rules:
            ap.error("--format: %r is not one of %s" % (args.format, ", ".join(default_rules)))
        if "torch" in specs:
            ap.error("--format: the torch learner has no quantized formats (use parity learners)")
        args.policy += "+" + fmt
        specs = [s + "+" + fmt if s.startswith("parity:") else s for s in specs]
    for s in specs:
        if s in ("parity", "torch"):
            continue
        if s.startswith("parity:") and s[7:]:
            try:
                policy_struct(s[7:])
            except (parity.ParityError, TypeError, ValueError) as e:
                ap.error("--learner %s: %s" % (s, e))
            continue
        ap.error("--learner: %r is not parity, parity:PRESET or torch" % s)
    args.learners = specs
    try:
        policy_struct(args.policy)
    except (parity.ParityError, TypeError, ValueError) as e:
        ap.error("--policy: %s" % e)
    if args.recipe:
        if "torch" in specs:
            ap.error("--recipe: the torch learner has no recipes (use parity learners)")
        try:
            recipe = parity.Recipe(args.recipe)
            for s in specs:
                recipe.check_policy(args.policy if s == "parity" else s[7:])
        except ValueError as e:
            ap.error("--recipe: %s" % e)
    if args.learner_gradients != "fp32":
        if all(s == "torch" for s in specs):
            ap.error("--learner-gradients: it is the parity learners' (the torch learner's "
                     "backward is its own); --learner has none")
        from parity.learner import _check_gradients
        from parity.policy import Policy
        for s in specs:
            if s == "torch":
                continue
            name = args.policy if s == "parity" else s[7:]
            try:
                _check_gradients(args.learner_gradients, Policy.from_name(name),
                                 policy_struct(name), parity.Recipe(args.recipe)
                                 if args.recipe else None)
            except ValueError as e:
                ap.error("--learner-gradients with --learner %s: %s" % (s, e))
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error("--model %s: no config.json there" % args.model)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print("grpo.py: error: the learners need PyTorch (%s); on Debian: apt-get install "
              "python3-torch, and run with /usr/bin/python3" % e, file=sys.stderr)
        return ERROR_EXIT
    torch.set_num_threads(args.threads)
    prompts = load_prompts()
    max_len = max(len(p) for p in prompts) + args.line_bytes
    try:
        log = open(args.log, "w") if args.log else None
    except OSError as e:
        print("grpo.py: error: --log: %s" % e, file=sys.stderr)
        return ERROR_EXIT

    def emit(rec):
        if log:
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if not args.quiet:
            print(table_row(rec), flush=True)

    remote = None
    results = []
    try:
        if args.cluster:
            remote = (RayRollouts if args.cluster == "ray" else DaskRollouts)(args, max_len)
            where = remote.description
        else:
            where = "in-process, %d thread%s" % (args.threads, "" if args.threads == 1 else "s")
        print("GRPO on %s: %d steps x %d groups x %d completions; reward: a non-blank line "
              "within %d bytes; sampler %s/%s (%s), log-probs %s; Adam lr %g"
              % (os.path.basename(os.path.normpath(args.model)), args.steps, args.groups, args.n,
                 args.line_bytes, args.policy, args.backend, where, args.mode, args.lr),
              flush=True)
        for run, spec in enumerate(args.learners):
            if not args.quiet:
                print("\nlearner %s" % spec)
                print(table_header(), flush=True)
            # each learner its own trajectory: a fresh sampler model (here, or on the workers)
            rollouts = remote or LocalRollouts(args, max_len, args.threads)
            try:
                desc, recs, last = run_learner(spec, run, args, prompts, rollouts, torch, emit)
            finally:
                if rollouts is not remote:
                    rollouts.close()
            results.append((spec, desc, recs, last))
        print(summary(results, args.line_bytes))
        if args.svg:
            write_svg(args.svg, [(spec, recs) for spec, _, recs, _ in results],
                      "GRPO with libparity's sampler (%s): sampler/learner mismatch per step"
                      % args.policy)
            print("plot: %s" % os.path.abspath(args.svg))
        if args.log:
            print("log: %s" % os.path.abspath(args.log))
    except UsageError as e:
        print("grpo.py: error: %s" % e, file=sys.stderr)
        return ERROR_EXIT
    except (parity.ParityError, RuntimeError, OSError) as e:
        print("grpo.py: error: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("grpo.py: interrupted", file=sys.stderr)
        return 130
    finally:
        if log:
            log.close()
        if remote is not None:
            remote.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
