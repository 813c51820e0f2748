#!/usr/bin/env python3
"""What the Python binding adds to scoring: the same work through Model.score and through bare
ctypes calls of parity_score on pre-built buffers (the C cost, with no Python conversion).

    python3 bench/python_overhead.py [--model DIR|synthetic:NAME] [--seqs 1000] [--len 16]
                                     [--threads 1] [--repeat 5] [--json FILE]

Workloads (each timed --repeat times, best kept):
  c_batched     one parity_score call on all sequences, buffers built beforehand
  py_batched    one Model.score(list of lists) call: conversion + call + splitting the result
  np_batched    one Model.score(2-D numpy array) call (when numpy is installed)
  c_per_seq     one parity_score call per sequence, buffers built beforehand
  py_per_seq    one Model.score(list) call per sequence
The overheads: py_batched / c_batched - 1 and py_per_seq / c_per_seq - 1, and py_per_seq /
c_batched (many small Python calls against one batched C call). On a busy machine these
differences of timings drown in noise, so the wrapper's own cost is also measured directly:
Model.score with parity_score stubbed out (py_only_*), as a share of the C work; the target is
< 5% (target_met).
Prints a table, then one JSON object (also written to --json FILE).
"""
import argparse
import ctypes
import os
import random
import sys
import time
from array import array

import pybench  # noqa: F401  (puts python/ on sys.path)
import parity  # noqa: E402
from parity import _lib  # noqa: E402
from parity.model import score_options  # noqa: E402
from parity.policy import policy_struct  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best_of(work, repeat, clock):
    """The best time of each workload over `repeat` rounds, the workloads interleaved in each
    round so that a slow spell of the machine hits all of them alike."""
    times = {name: float("inf") for name, _ in work}
    for _ in range(repeat):
        for name, fn in work:
            t0 = clock()
            fn()
            times[name] = min(times[name], clock() - t0)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models",
                                                    "qwen3-bytes-pystdlib-4.9m"))
    ap.add_argument("--policy", default="aligned")
    ap.add_argument("--seqs", type=int, default=1000)
    ap.add_argument("--len", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="also write the JSON summary here")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: this process's CPU time (time.process_time; steady on a busy "
                         "machine, and with one thread all the work is this process's); "
                         "wall: time.perf_counter")
    args = ap.parse_args()

    model = parity.Model(args.model, threads=args.threads)
    rnd = random.Random(0)
    vocab = model.vocab_size
    seqs = [[rnd.randrange(vocab) for _ in range(args.len)] for _ in range(args.seqs)]

    # the bare C path: a scorer like the Model's, buffers built once
    lib = _lib.lib
    params = _lib.parity_scorer_params()
    lib.parity_scorer_default_params(ctypes.byref(params))
    params.policy = policy_struct(args.policy)
    params.n_threads = args.threads
    scorer = _lib.scorer_p()
    lib.parity_scorer_create(model._handle, ctypes.byref(params), ctypes.byref(scorer))
    opts = score_options()
    flat = array("i", [t for s in seqs for t in s])
    lengths = array("I", [args.len] * args.seqs)
    out = array("f", bytes(4 * args.seqs * (args.len - 1)))
    i32p, u32p, f32p = (ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_uint32),
                        ctypes.POINTER(ctypes.c_float))
    tok_c = (ctypes.c_int32 * len(flat)).from_buffer(flat)
    len_c = (ctypes.c_uint32 * len(lengths)).from_buffer(lengths)
    out_c = (ctypes.c_float * len(out)).from_buffer(out)
    per_seq = []
    for i in range(args.seqs):
        per_seq.append((ctypes.cast(ctypes.byref(tok_c, 4 * i * args.len), i32p),
                        ctypes.cast(ctypes.byref(len_c, 4 * i), u32p),
                        ctypes.cast(ctypes.byref(out_c, 4 * i * (args.len - 1)), f32p)))
    score = lib.parity_score

    def c_batched():
        score(scorer, ctypes.byref(opts), tok_c, len_c, args.seqs, out_c, None, None, None)

    def c_per_seq():
        o = ctypes.byref(opts)
        for t, n, lp in per_seq:
            score(scorer, o, t, n, 1, lp, None, None, None)

    def py_batched():
        return model.score(seqs, policy=args.policy)

    def py_per_seq():
        return [model.score(s, policy=args.policy) for s in seqs]

    # the same numbers all ways
    c_batched()
    want = out.tobytes()
    assert array("f", [v for lp in py_batched() for v in lp]).tobytes() == want
    assert array("f", [v for lp in py_per_seq() for v in lp]).tobytes() == want
    work = [("c_batched", c_batched), ("py_batched", py_batched), ("c_per_seq", c_per_seq),
            ("py_per_seq", py_per_seq)]
    try:
        import numpy as np
        mat = np.array(seqs, dtype=np.int64)
        assert model.score(mat, policy=args.policy).tobytes() == want
        work.insert(2, ("np_batched", lambda: model.score(mat, policy=args.policy)))
    except ImportError:
        pass

    for _, fn in work:  # warm the scorer caches and the CPU
        fn()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = best_of(work, args.repeat, clock)

    # the wrapper's own cost, without the C work: Model.score with parity_score stubbed out
    # (a direct measure, immune to how noisy the C timings are on a busy machine)
    import parity.model as pm

    class NoScore:
        def __getattr__(self, name):
            return getattr(lib, name)

        @staticmethod
        def parity_score(*a):
            return 0

    pm.lib = NoScore()
    try:
        stub = best_of([("py_only_batched", py_batched), ("py_only_per_seq", py_per_seq)],
                       max(args.repeat, 5), clock)
    finally:
        pm.lib = lib
    lib.parity_scorer_free(scorer)
    model.close()

    tokens = args.seqs * args.len
    result = {
        "model": args.model, "policy": args.policy, "seqs": args.seqs, "len": args.len,
        "threads": args.threads, "repeat": args.repeat, "cpu_path": parity.cpu_path(),
        "clock": args.clock,
        "python": sys.version.split()[0],
        "seconds": {k: round(v, 6) for k, v in times.items()},
        "us_per_seq": {k: round(1e6 * v / args.seqs, 2) for k, v in times.items()},
        "overhead_batched": round(times["py_batched"] / times["c_batched"] - 1, 4),
        "overhead_per_seq": round(times["py_per_seq"] / times["c_per_seq"] - 1, 4),
        "per_seq_vs_batched_c": round(times["py_per_seq"] / times["c_batched"] - 1, 4),
    }
    result["python_us_per_call"] = round(1e6 * stub["py_only_per_seq"] / args.seqs, 2)
    result["python_us_per_batched_call"] = round(1e6 * stub["py_only_batched"], 1)
    result["python_share_per_seq"] = round(stub["py_only_per_seq"] / times["c_per_seq"], 4)
    result["python_share_batched"] = round(stub["py_only_batched"] / times["c_batched"], 4)
    if "np_batched" in times:
        result["overhead_numpy_batched"] = round(times["np_batched"] / times["c_batched"] - 1, 4)
    result["target_met"] = (result["python_share_batched"] < 0.05
                            and result["python_share_per_seq"] < 0.05)

    print("%d sequences x %d tokens (%d tokens), %s, policy %s, %d thread(s), path %s, %s time"
          % (args.seqs, args.len, tokens, os.path.basename(args.model.rstrip("/")), args.policy,
             args.threads, parity.cpu_path(), args.clock))
    print("%-12s %10s %12s %12s" % ("workload", "seconds", "us/seq", "tokens/s"))
    for name, t in times.items():
        print("%-12s %10.4f %12.1f %12.0f" % (name, t, 1e6 * t / args.seqs, tokens / t))
    print("overhead: batched %+.2f%%, per sequence %+.2f%%%s; per-sequence Python calls vs one "
          "batched C call %+.2f%%" % (100 * result["overhead_batched"],
                                      100 * result["overhead_per_seq"],
                                      ", numpy batched %+.2f%%" % (100 * result[
                                          "overhead_numpy_batched"])
                                      if "overhead_numpy_batched" in result else "",
                                      100 * result["per_seq_vs_batched_c"]))
    print("the wrapper alone (parity_score stubbed): %.1f us per call, %.1f us for the batched "
          "call: %.2f%% of the per-sequence C work, %.2f%% of the batched C work (target < 5%%: "
          "%s)" % (result["python_us_per_call"], result["python_us_per_batched_call"],
                   100 * result["python_share_per_seq"], 100 * result["python_share_batched"],
                   "met" if result["target_met"] else "NOT met"))
    pybench.emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
