#!/usr/bin/env python3
"""The learner's weight sync on a qwen3-0.6b-shaped model: how long parity.torch.CausalLM's
sync_to(model) takes after an optimizer step (the RL loop pays it every step).

    /usr/bin/python3 bench/learner_sync.py [--model synthetic:qwen3-0.6b] [--repeat 3]
                                           [--threads N] [--masters where-read|keep]
                                           [--json FILE]

Builds the module from the model (fp32 masters: 4 bytes a parameter, beside the model's bf16
weights, read straight from the model; the time is printed), moves every master off the bf16
grid (a stand-in for optimizer.step(): each value times (1 + 2^-10), so that every tensor
changes and the cast has real rounding to do), then
times sync_to: parity_model_update straight from the masters' memory (no copy on the Python
side; the library casts with round-to-nearest-even and checks finiteness), and the check (the module's manifest written with parity_tensor_checksums, then
parity_model_verify_on, both on --threads threads: the model's). Prints a table of the best of
--repeat runs, its CPU seconds (all threads: on a shared machine the wall clock also counts
other processes' time), then each sync in order with its CPU and system seconds (the first of
a run is the one that finds the model as loaded: it is quoted on its own), and a JSON object.
--masters is the sync's (parity_model_update_with): "where-read" (the default here, what a
learner syncing a bf16 sampler does) leaves the model no fp32 masters, since nothing built
reads them, so the first sync writes no new memory for the model's bf16 weights it owns;
"keep" keeps them, so the first sync writes 4 bytes a parameter of fresh memory (the
library's default, for a model whose fp32 readers come later). Needs torch (Debian's /usr/bin/python3 with
python3-torch).
"""
import argparse
import json
import resource
import sys
import time

import pybench  # noqa: F401  (puts python/ on sys.path)
import parity  # noqa: E402

try:
    import torch
    from parity.torch import CausalLM
except ImportError as e:
    sys.exit("learner_sync: needs torch (%s): run it with /usr/bin/python3 and python3-torch" % e)


def _cpu_seconds():
    """(User, system) CPU seconds of this process so far, all its threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _since(c0):
    """(User, system) CPU seconds since c0 = _cpu_seconds()."""
    c1 = _cpu_seconds()
    return c1[0] - c0[0], c1[1] - c0[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic:qwen3-0.6b")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--masters", choices=sorted(parity.MASTERS), default="where-read",
                    help="what the update keeps of the fp32 values (Model.update's masters)")
    ap.add_argument("--json", help="also write the JSON object to FILE")
    args = ap.parse_args(argv)

    with parity.Model(args.model, threads=args.threads) as model:
        t0, c0 = time.perf_counter(), _cpu_seconds()
        lm = CausalLM(model, threads=args.threads)
        build, build_cpu = time.perf_counter() - t0, sum(_since(c0))
        n_params = sum(p.numel() for p in lm.parameters())
        runs = []
        for r in range(args.repeat):
            with torch.no_grad():
                for p in lm.parameters():
                    p.mul_(1 + 2.0 ** -10)
            c0 = _cpu_seconds()
            up, ver = lm.sync_to(model, masters=args.masters)
            user, system = _since(c0)
            runs.append((up, ver, user + system, system))
        version = model.version
    up, ver, cpu, _ = min(runs, key=lambda run: run[0] + run[1])
    gb = n_params * 4 / 1e9
    print("model %s: %d parameters, %d threads, %d syncs, masters %s"
          % (args.model, n_params, model.threads, args.repeat, args.masters))
    print("CausalLM(model) built in %.2f s (%.2f s of CPU)" % (build, build_cpu))
    print("%-28s %10s %10s" % ("step", "seconds", "GB/s fp32"))
    print("%-28s %10.3f %10.2f" % ("parity_model_update", up, gb / up))
    print("%-28s %10.3f %10.2f" % ("manifest write + verify", ver, gb / ver))
    print("%-28s %10.3f %10.2f" % ("sync_to total", up + ver, gb / (up + ver)))
    print("%-28s %10.3f" % ("sync_to CPU (all threads)", cpu))
    print("each sync, in order (the first allocates what the model did not hold yet):")
    print("%-6s %10s %10s %10s %10s %10s" % ("sync", "update", "verify", "total", "CPU", "of it sys"))
    for r, (u, v, c, s) in enumerate(runs):
        print("%-6d %10.3f %10.3f %10.3f %10.3f %10.3f" % (r + 1, u, v, u + v, c, s))
    out = {"model": args.model, "parameters": n_params, "threads": model.threads,
           "module_build_s": round(build, 3), "module_build_cpu_s": round(build_cpu, 3),
           "repeat": args.repeat, "masters": args.masters, "update_s": round(up, 4), "verify_s": round(ver, 4),
           "sync_s": round(up + ver, 4), "sync_cpu_s": round(cpu, 4),
           "all_update_s": [round(run[0], 4) for run in runs],
           "all_verify_s": [round(run[1], 4) for run in runs],
           "all_cpu_s": [round(run[2], 4) for run in runs],
           "all_sys_s": [round(run[3], 4) for run in runs],
           "first_sync_s": round(runs[0][0] + runs[0][1], 4), "model_version": version,
           "cpu_path": parity.cpu_path()}
    text = json.dumps(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
