#!/usr/bin/env python3
"""How far each training recipe's gradient is from the fp32 one, on the trained model in
models/: the table of README's "Training in low precision".

    /usr/bin/python3 bench/recipe_gradients.py [--model models/qwen3-bytes-pystdlib-4.9m]
                                               [--threads N] [--json FILE]

One batch (four byte sequences of Python source from examples/python, 64 to 160 tokens), the
loss -sum of each sequence's mean log-prob, and the gradient of every decoder linear weight
(q, k, v, o, gate, up, down of every layer; the embedding, norms and lm_head are not quantized
by any policy here). The reference is parity.torch.CausalLM under policy "fp32" (fp32 forward,
fp32 autograd). Each row is a learner: its policy (the forward the sampler runs) and its
backward (straight-through: fp32 formulas at the quantized values; or a recipe's quantized dgrad
and wgrad GEMMs). Columns, over the concatenated decoder-linear gradients g against g_fp32:
cosine, the relative error |g - g_fp32| / |g_fp32|, and the norm ratio |g| / |g_fp32|; the
seconds of the forward and backward. A recipe the library cannot run yet prints what it lacks.
Needs torch (Debian's /usr/bin/python3 with python3-torch).
"""
import argparse
import json
import os
import sys
import time

import pybench  # noqa: F401  (puts python/ on sys.path)
import parity  # noqa: E402

try:
    import torch
    from parity.torch import CausalLM
except ImportError as e:
    sys.exit("recipe_gradients: needs torch (%s): run it with /usr/bin/python3 and "
             "python3-torch" % e)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# (row label, policy, recipe, whether the learner runs the recipe's backward): a policy of None
# is the recipe's fprop ("aligned" + its gemm and forward rule); a recipe not run names the
# policy only (the straight-through backward under the recipe's forward)
ROWS = [("bf16 (aligned), straight-through", "aligned", None, False),
        ("mxfp8 fwd, straight-through bwd", "aligned+mxfp8:te", None, False),
        ("te-mxfp8", "aligned+mxfp8:te", "te-mxfp8", True),
        ("te-mxfp8-hybrid", "aligned+mxfp8:te", "te-mxfp8-hybrid", True),
        ("nvfp4 (te-2d) fwd, straight-through bwd", None, "te-nvfp4", False),
        ("te-nvfp4", None, "te-nvfp4", True)]


def batch():
    text = open(os.path.join(REPO, "examples", "python", "grpo_group.py"), "rb").read()
    out, at = [], 0
    for n in (160, 64, 120, 96):
        out.append(list(text[at:at + n]))
        at += n + 11
    return out


def gradient(lm, seqs):
    """The concatenated decoder-linear gradients (float64) and the forward+backward seconds."""
    lm.zero_grad()
    t = time.perf_counter()
    loss = -sum(lp.mean() for lp in lm(seqs))
    loss.backward()
    seconds = time.perf_counter() - t
    grads = [p.grad.detach().double().flatten() for name, p in lm.named_parameters()
             if name.split(".")[-2] in LINEAR]
    return torch.cat(grads), seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows as JSON to FILE")
    args = ap.parse_args(argv)
    seqs = batch()
    rows = []
    with parity.Model(args.model, threads=args.threads) as model:
        ref, ref_s = gradient(CausalLM(model, policy="fp32", threads=args.threads), seqs)
        print("reference: policy fp32, |g_fp32| = %.6g over %d decoder-linear weights, "
              "%d tokens, %.2f s" % (ref.norm().item(), ref.numel(), sum(map(len, seqs)),
                                     ref_s))
        print("%-40s %-20s %9s %9s %10s %7s" % ("learner", "policy", "cosine", "rel. err",
                                                "norm ratio", "time_s"))
        for label, policy, recipe, backward in ROWS:
            if policy is None:
                r = parity.Recipe(recipe)
                missing = r.missing()
                if missing:
                    print("%-40s not run: this libparity lacks %s" % (label, ", ".join(missing)))
                    rows.append({"learner": label, "recipe": recipe, "missing": missing})
                    continue
                policy = "aligned+%s:%s" % (r.policy_gemm, r.policy_quantizer)
            recipe = recipe if backward else None
            lm = CausalLM(model, policy=policy, threads=args.threads, recipe=recipe)
            g, s = gradient(lm, seqs)
            cos = (torch.dot(g, ref) / (g.norm() * ref.norm())).item()
            rel = ((g - ref).norm() / ref.norm()).item()
            ratio = (g.norm() / ref.norm()).item()
            print("%-40s %-20s %9.6f %9.6f %10.6f %7.2f" % (label, policy, cos, rel, ratio, s))
            rows.append({"learner": label, "policy": policy, "recipe": recipe, "cosine": cos,
                         "relative_error": rel, "norm_ratio": ratio, "seconds": s})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
