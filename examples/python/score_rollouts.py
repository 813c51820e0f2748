#!/usr/bin/env python3
"""Scores rollouts written by parity-generate under a learner policy and summarises the
sampler/learner mismatch.

    parity-generate --model M --policy vllm --prompt-bytes p.txt --n 16 --max-tokens 64 \\
        --temperature 1 --seed 1 > rollouts.jsonl
    python3 examples/python/score_rollouts.py --model M --policy aligned \\
        --prompt-bytes p.txt rollouts.jsonl

Each line of the rollouts file is {"index", "prompt_len", "tokens", "logprobs"}. The prompt is
not in the file: give the same --prompt-bytes/--prompt-tokens as parity-generate. The learner
scores prompt + completion in the log-prob mode the rollouts were reported in (--logprob-mode,
--temperature, --top-k/--top-p/--min-p as given to parity-generate; raw by default, as its
default), and the summary compares its log-probs with the sampler's, token by token:

  mean |dlogp|     mean of |learner - sampler| (nats)
  signed mean      mean of learner - sampler
  k3 KL            mean of (r - 1) - log r with r = p_learner / p_sampler: an estimate of
                   KL(sampler || learner) from the sampler's own draws
  ratio            r = exp(learner - sampler): mean, min, max, share outside [0.8, 1.25]
  bitwise equal    share of tokens whose float32 log-probs are identical

With the sampler's own policy, backend and mode the learner's numbers are bitwise the
sampler's (libparity's parity contract), and the script says so.
"""
import argparse
import json
import math
import os
import sys
from array import array

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "python"))
import parity  # noqa: E402


def read_prompt(args):
    if args.prompt_bytes:
        with open(args.prompt_bytes, "rb") as f:
            return list(f.read())
    with open(args.prompt_tokens) as f:
        return [int(t) for t in f.read().split()]


def summarise(sampler_lps, learner_lps):
    """The mismatch summary of two equally long lists of per-token log-probs."""
    n = len(sampler_lps)
    if n == 0:
        return {"tokens": 0}
    d = [(l - s) if l != s else 0.0 for s, l in zip(sampler_lps, learner_lps)]
    ratios = [math.exp(x) for x in d]
    sb = array("I", array("f", sampler_lps).tobytes())
    lb = array("I", array("f", learner_lps).tobytes())
    same = sum(a == b for a, b in zip(sb, lb))
    return {
        "tokens": n,
        "mean_abs_dlogp": sum(abs(x) for x in d) / n,
        "max_abs_dlogp": max(abs(x) for x in d),
        "signed_mean_dlogp": sum(d) / n,
        # a token outside the learner's support (-inf) makes the estimate infinite
        "k3_kl": sum((r - 1) - math.log(r) if r > 0 else math.inf for r in ratios) / n,
        "ratio_mean": sum(ratios) / n,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_outside_0.8_1.25": sum(not 0.8 <= r <= 1.25 for r in ratios) / n,
        "bitwise_equal": same / n,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rollouts", help="JSONL from parity-generate ('-' for stdin)")
    ap.add_argument("--model", required=True, help="DIR or synthetic:NAME[:SEED]")
    ap.add_argument("--policy", required=True, help="the learner's policy (e.g. aligned)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-bytes", help="the prompt file given to parity-generate")
    src.add_argument("--prompt-tokens", help="the prompt file given to parity-generate")
    ap.add_argument("--logprob-mode", default="raw",
                    choices=["raw", "processed", "processed-truncated"])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--min-p", type=float)
    ap.add_argument("--backend", default="bf16", choices=["bf16", "openblas"])
    ap.add_argument("--threads", type=int)
    ap.add_argument("--per-completion", action="store_true", help="a line per completion too")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = ap.parse_args(argv)

    prompt = read_prompt(args)
    f = sys.stdin if args.rollouts == "-" else open(args.rollouts)
    with f:
        rollouts = [json.loads(line) for line in f if line.strip()]
    for r in rollouts:
        if r["prompt_len"] != len(prompt):
            sys.exit("error: rollout %d has prompt_len %d, the prompt given has %d tokens"
                     % (r["index"], r["prompt_len"], len(prompt)))
    with parity.Model(args.model, threads=args.threads) as model:
        scored = model.score([prompt + r["tokens"] for r in rollouts], policy=args.policy,
                             mode=args.logprob_mode, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                             backend=args.backend) if rollouts else []
    sampler_all, learner_all, per = [], [], []
    for r, lp in zip(rollouts, scored):
        learner = lp[len(prompt) - 1:]
        # parity-generate printed "%.9g": parsing it back gives the float32 exactly
        sampler = array("f", r["logprobs"]).tolist()
        sampler_all += sampler
        learner_all += learner
        per.append((r["index"], summarise(sampler, learner)))
    summary = summarise(sampler_all, learner_all)
    summary.update(completions=len(rollouts), policy=args.policy, mode=args.logprob_mode)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    if args.per_completion:
        for i, s in per:
            if s["tokens"]:
                print("completion %3d: %4d tokens, mean |dlogp| %.3g, k3 KL %.3g, bitwise %.1f%%"
                      % (i, s["tokens"], s["mean_abs_dlogp"], s["k3_kl"],
                         100 * s["bitwise_equal"]))
    print("%d completions, %d tokens, learner policy %s, mode %s"
          % (len(rollouts), summary["tokens"], args.policy, args.logprob_mode))
    if summary["tokens"]:
        print("  mean |dlogp|    %.6g (max %.6g)" % (summary["mean_abs_dlogp"],
                                                    summary["max_abs_dlogp"]))
        print("  signed mean     %+.6g" % summary["signed_mean_dlogp"])
        print("  k3 KL           %.6g" % summary["k3_kl"])
        print("  ratio           mean %.6f, min %.6f, max %.6f, outside [0.8, 1.25] %.2f%%"
              % (summary["ratio_mean"], summary["ratio_min"], summary["ratio_max"],
                 100 * summary["ratio_outside_0.8_1.25"]))
        print("  bitwise equal   %.2f%%%s" % (100 * summary["bitwise_equal"],
                                              "  (parity: learner == sampler)"
                                              if summary["bitwise_equal"] == 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
