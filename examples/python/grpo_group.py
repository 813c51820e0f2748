#!/usr/bin/env python3
"""Samples a GRPO group — n completions of one prompt, forked from one prefilled KV cache —
then scores the group with the learner and checks the parity.

    python3 examples/python/grpo_group.py [--model DIR] [--prompt TEXT] [--n 8]
        [--max-tokens 64] [--policy aligned] [--learner-policy POLICY] [--temperature 1.0]
        [--top-p P] [--seed S] [--stop 10] [--logprob-mode raw]

Defaults: the byte-level model in models/qwen3-bytes-pystdlib-4.9m (token id = byte value) and
a Python prompt. For each completion it prints its length, why it finished, the sum of the
sampler's log-probs, the learner's, the largest per-token difference, whether every token is
bitwise equal, and the text. No reward is computed: the point is the log-probs an RL update
would read. With the learner on the sampler's policy (the default) every token must be bitwise
equal; the script exits 1 if not. With another --learner-policy it reports the mismatch.
"""
import argparse
import os
import sys
import time
from array import array

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
import parity  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m"))
    ap.add_argument("--prompt", default="def fibonacci(n):\n    \"\"\"Return the n-th "
                                        "Fibonacci number.\"\"\"\n")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--policy", default="aligned", help="the sampler's policy")
    ap.add_argument("--learner-policy", help="the learner's policy (default: the sampler's)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--min-p", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop", type=int, action="append", default=None,
                    help="stop token id (repeatable); default: none")
    ap.add_argument("--logprob-mode", default="raw",
                    choices=["raw", "processed", "processed-truncated"])
    ap.add_argument("--batch", type=int, help="completions decoding together (default: all)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    learner_policy = args.learner_policy or args.policy

    prompt = list(args.prompt.encode())
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p)
    with parity.Model(args.model, threads=args.threads) as model:
        if model.vocab_size < 256:
            sys.exit("error: this example feeds bytes as tokens: it needs a vocabulary of 256+")
        t0 = time.perf_counter()
        with model.sampler(policy=args.policy, max_seqs=args.n + 1, threads=args.threads,
                           max_len=min(len(prompt) + args.max_tokens, model.context)) as s:
            group = s.generate(prompt, n=args.n, max_tokens=args.max_tokens, seed=args.seed,
                               stop=args.stop or (), mode=args.logprob_mode, batch=args.batch,
                               **sampling)
        t1 = time.perf_counter()
        scored = model.score([prompt + c.tokens for c in group], policy=learner_policy,
                             mode=args.logprob_mode, **sampling)
        t2 = time.perf_counter()

    print("prompt: %d tokens, %d completions sampled under %s (%.2fs), scored under %s (%.2fs)"
          % (len(prompt), len(group), args.policy, t1 - t0, learner_policy, t2 - t1))
    print("%3s %5s %-8s %12s %12s %10s %7s  %s" % ("i", "len", "finish", "sum lp (smp)",
                                                   "sum lp (lrn)", "max |d|", "bitwise",
                                                   "text"))
    total = equal = 0
    for c, lp in zip(group, scored):
        learner = lp[len(prompt) - 1:]
        same = sum(a == b for a, b in zip(array("I", array("f", c.logprobs).tobytes()),
                                          array("I", array("f", learner).tobytes())))
        total += len(c.tokens)
        equal += same
        worst = max((abs(a - b) for a, b in zip(c.logprobs, learner) if a != b), default=0.0)
        text = bytes(c.tokens).decode("utf-8", "replace")
        text = text.replace("\n", "\\n")
        print("%3d %5d %-8s %12.4f %12.4f %10.3g %6s  %s"
              % (c.index, len(c.tokens), c.finish_reason, sum(c.logprobs), sum(learner), worst,
                 "yes" if same == len(c.tokens) else "%d/%d" % (same, len(c.tokens)),
                 text[:60] + ("..." if len(text) > 60 else "")))
    print("parity: %d of %d tokens bitwise equal (%.2f%%) between the sampler (%s) and the "
          "learner (%s)" % (equal, total, 100.0 * equal / max(total, 1), args.policy,
                            learner_policy))
    if learner_policy == args.policy and equal != total:
        print("error: same policy, yet the learner's log-probs differ from the sampler's")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
