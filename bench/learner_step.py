#!/usr/bin/env python3
"""The learner's step on GRPO's rollouts: forward, backward and their sum, in seconds, for the
bitwise learner (parity.torch.CausalLM) and the plain PyTorch bf16 learner of
examples/python/grpo.py, on the very sequences a GRPO step scores.

    /usr/bin/python3 bench/learner_step.py [--learners parity,torch] [--repeat 5]
                                           [--step 0] [--threads N] [--gradients fp32|bf16]
                                           [--json FILE]

Samples step --step's rollouts once (grpo.py's prompts, seeds and sampler), then runs each
learner's forward (the log-probs of every sequence) and backward (of their sum) --repeat times,
the learners taking turns so that both see the same load on a shared machine; the first round
is a warm-up and is not counted. Prints the median of each phase and the ratio of the steps,
wall-clock and CPU (the process's user + system time, which other jobs on the machine move
less), then a JSON object. --gradients bf16 runs the parity learner with
CausalLM(gradients="bf16") (grpo.py --learner-gradients bf16). Needs torch (Debian's /usr/bin/python3 with python3-torch).
"""
import argparse
import os
import statistics
import sys
import time

import pybench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "python"))
try:
    import torch
    import grpo
except ImportError as e:
    sys.exit("learner_step: needs torch (%s): run it with /usr/bin/python3 and python3-torch" % e)


def rollouts(args):
    """The sequences (prompt + completion) of one GRPO step, sampled as grpo.py samples them."""
    gargs = grpo.parse_args(["--steps", "1", "--svg", "", "--threads", str(args.threads),
                             "--learner-gradients", args.gradients])
    prompts = grpo.load_prompts()
    max_len = max(len(p) for p in prompts) + gargs.line_bytes
    sampler = grpo.LocalRollouts(gargs, max_len, gargs.threads)
    try:
        chosen = grpo.step_prompts(len(prompts), gargs.seed, args.step, gargs.groups)
        jobs = [(g, prompts[p], grpo.group_seed(gargs.seed, args.step, g))
                for g, p in enumerate(chosen)]
        groups = sampler.sample(0, jobs)
    finally:
        sampler.close()
    seqs = [prompt + tokens for (_, prompt, _), group in zip(jobs, groups)
            for tokens, _, _ in group if tokens]
    return gargs, seqs


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--learners", default="parity,torch")
    ap.add_argument("--repeat", type=int, default=5, help="rounds counted (after one warm-up)")
    ap.add_argument("--step", type=int, default=0, help="the GRPO step whose rollouts to score")
    ap.add_argument("--threads", type=int,
                    default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else os.cpu_count() or 1)
    ap.add_argument("--gradients", default="fp32", choices=["fp32", "bf16"],
                    help="the parity learner's linear backward GEMMs (CausalLM(gradients=...))")
    ap.add_argument("--json", help="also write the JSON object to FILE")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gargs, seqs = rollouts(args)
    names = [s.strip() for s in args.learners.split(",") if s.strip()]
    learners = {name: grpo.make_learner(name, gargs, torch) for name in names}
    times = {name: {"forward": [], "backward": [], "step": [], "step_cpu": []} for name in names}
    for r in range(args.repeat + 1):
        for name in names:
            learner = learners[name]
            # grpo.py's run_learner gives torch one thread while the parity learner runs
            torch.set_num_threads(getattr(learner, "torch_threads", None) or args.threads)
            params = list(learner.named_masters().values())
            for p in params:
                p.grad = None
            out, fw, fc = timed(lambda: learner(seqs, gargs.mode, gargs.temperature))
            loss = sum(lp.sum() for lp in out)
            _, bw, bc = timed(loss.backward)
            if r:
                t = times[name]
                t["forward"].append(fw)
                t["backward"].append(bw)
                t["step"].append(fw + bw)
                t["step_cpu"].append(fc + bc)
    med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    print("%d sequences, %d tokens (GRPO step %d's rollouts); %d threads; median of %d rounds; "
          "parity gradients %s" % (len(seqs), sum(map(len, seqs)), args.step, args.threads,
                                   args.repeat, args.gradients))
    print("%-8s %10s %10s %10s %12s" % ("learner", "forward s", "backward s", "step s",
                                        "step CPU s"))
    for name in names:
        m = med[name]
        print("%-8s %10.3f %10.3f %10.3f %12.3f" % (name, m["forward"], m["backward"], m["step"],
                                                     m["step_cpu"]))
    result = {"bench": "learner_step", "sequences": len(seqs), "tokens": sum(map(len, seqs)),
              "threads": args.threads, "gradients": args.gradients, "repeat": args.repeat, "median": med, "runs": times,
              "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
    if "parity" in med and "torch" in med:
        ratio = med["parity"]["step"] / med["torch"]["step"]
        ratio_cpu = med["parity"]["step_cpu"] / med["torch"]["step_cpu"]
        print("parity / torch: %.2fx wall, %.2fx CPU" % (ratio, ratio_cpu))
        result["ratio"], result["ratio_cpu"] = ratio, ratio_cpu
    pybench.emit(result, args.json)


if __name__ == "__main__":
    main()
