"""Where the hf-eager learner's gradient departs from the fp32 gradient, and whether another
backward could bring it within 2%: on six batches of the trained byte-level model (the first is
test_learner's gradient batch), each parameter's gradient norm against an fp32 reference
(transformers' fp32 model on the same weights), for

  - parity.torch.CausalLM under hf-eager, hf-sdpa and aligned (fp32 formulas backward, straight
    through each rounding point);
  - transformers' own bf16 autograd, eager and sdpa attention: the same forward rounding points
    as hf-eager and hf-sdpa, differentiated another way (softmax at the forward's bf16 scores,
    every gradient rounded to bf16);
  - with --switches, hf-eager with one forward rounding point changed at a time (the learner's
    backward unchanged).

Per batch it prints the largest |norm error| over the 69 parameters (and which), and for
hf-eager the cosine between the learner's and transformers' departures from the reference on
that parameter (near 1: both backwards depart alike, so the departure comes from the forward
they share); then how much the RMSNorm weights' fp32 gradients cancel (sum |terms| / |sum|,
first batch) and, per method, the mean and largest over the batches and how many exceed 2%.

    PYTHON bench/hf_eager_gradient.py [--switches] [--batches N]
        (PYTHON: a Python with torch 2.x and transformers, e.g. the conformance tier's venv)
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    sys.exit("hf_eager_gradient: needs torch 2.x and transformers (%s)" % e)
import parity  # noqa: E402
from parity.torch import CausalLM  # noqa: E402

MODEL = os.path.join(REPO, "models", "qwen3-bytes-pystdlib-4.9m")
TEXT = open(os.path.join(REPO, "examples", "python", "grpo_group.py"), "rb").read()
LENGTHS = [160, 120, 200, 90]
STARTS = [500, 1100, 1700, 2300, 2900, 3500]   # 500: test_learner's gradient batch
#: hf-eager's rounding points, each switched alone to the value aligned (or flash) takes.
SWITCHES = [("qk_norm", "round-once"), ("attention", "flash"), ("rope_apply", "fused"),
            ("rope_table", "fp32"), ("norm_input", "fp32"), ("swiglu", "fused"),
            ("norm_weight", "round-once")]


def batch(start):
    """test_learner's byte_sequences: four sequences of LENGTHS bytes from `start`."""
    out, at = [], start
    for n in LENGTHS:
        out.append(list(TEXT[at:at + n]))
        at += n + 7
    return out


class Transformers:
    def __init__(self, dtype, attention):
        self.model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=dtype,
                                                          attn_implementation=attention)

    def gradients(self, seqs):
        self.model.zero_grad()
        total = 0
        for s in seqs:
            t = torch.tensor([s])
            logits = self.model(input_ids=t).logits[0].float()
            total = total + torch.log_softmax(logits, -1)[:-1].gather(1, t[0, 1:, None]).sum()
        total.backward()
        return {n: p.grad.double().flatten() for n, p in self.model.named_parameters()}


class Learner:
    def __init__(self, policy):
        self.lm = CausalLM(MODEL, policy=policy, threads=2)

    def gradients(self, seqs):
        self.lm.zero_grad()
        sum(lp.sum() for lp in self.lm(seqs)).backward()
        return {n: p.grad.double().flatten() for n, p in self.lm.named_parameters()}


def cancellation(seqs):
    """{norm weight: sum |terms| / |sum of terms|} of each RMSNorm weight's fp32 gradient (its
    terms: the output's gradient times the normalised input, one per row and channel; the
    ratio is the norm over channels of the two sums), from transformers' fp32 model."""
    model = Transformers(torch.float32, "eager").model
    terms, hooks = {}, []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            def hook(module, inputs, output, name=name):
                x = inputs[0].detach()
                xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
                output.register_hook(lambda g: terms.setdefault(name, []).append(
                    (g * xhat).reshape(-1, xhat.shape[-1]).double()))
            hooks.append(module.register_forward_hook(hook))
    for s in seqs:
        t = torch.tensor([s])
        logits = model(input_ids=t).logits[0]
        torch.log_softmax(logits, -1)[:-1].gather(1, t[0, 1:, None]).sum().backward()
    for h in hooks:
        h.remove()
    out = {}
    for name, parts in terms.items():
        rows = torch.cat(parts)
        out[name] = (rows.abs().sum(0).norm() / rows.sum(0).norm()).item()
    return out


def norm_errors(grads, ref):
    """{name: signed relative norm error} against the reference gradients."""
    return {n: ((grads[n].norm() - r.norm()) / r.norm()).item() for n, r in ref.items()}


def short(name):
    return name.replace("model.layers.", "L").replace("self_attn.", "").replace("mlp.", "") \
        .replace(".weight", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switches", action="store_true",
                    help="also hf-eager with each forward rounding point switched alone")
    ap.add_argument("--batches", type=int, default=len(STARTS), help="how many batches (1-6)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    methods = [("learner hf-eager", Learner("hf-eager")),
               ("transformers bf16 eager", Transformers(torch.bfloat16, "eager")),
               ("learner hf-sdpa", Learner("hf-sdpa")),
               ("transformers bf16 sdpa", Transformers(torch.bfloat16, "sdpa")),
               ("learner aligned", Learner("aligned"))]
    if args.switches:
        base = parity.Policy.from_name("hf-eager")
        methods += [("learner hf-eager, %s %s" % sw, Learner(base.replace(**{sw[0]: sw[1]})))
                    for sw in SWITCHES]
    reference = Transformers(torch.float32, "eager")
    worst = {m: [] for m, _ in methods}
    for start in STARTS[:max(1, min(args.batches, len(STARTS)))]:
        seqs = batch(start)
        ref = reference.gradients(seqs)
        grads = {m: g.gradients(seqs) for m, g in methods}
        print("batch at byte %d (%s bytes):" % (start, "+".join(map(str, LENGTHS))))
        for m, _ in methods:
            errs = norm_errors(grads[m], ref)
            name = max(errs, key=lambda n: abs(errs[n]))
            worst[m].append(abs(errs[name]))
            extra = ""
            if m == "learner hf-eager":
                a = grads[m][name] - ref[name]
                b = grads["transformers bf16 eager"][name] - ref[name]
                extra = ("; departure from fp32 vs transformers bf16 eager's: cosine %.3f, "
                         "theirs %+.2f%% on it" % ((a @ b / (a.norm() * b.norm())).item(),
                                                    100 * norm_errors(
                                                        grads["transformers bf16 eager"],
                                                        ref)[name]))
            print("  %-40s %+6.2f%% (%s)%s" % (m, 100 * errs[name], short(name), extra))
        sys.stdout.flush()
    ratios = cancellation(batch(STARTS[0]))
    qk = [r for n, r in ratios.items() if n.endswith(("q_norm", "k_norm"))]
    other = [r for n, r in ratios.items() if not n.endswith(("q_norm", "k_norm"))]
    print("cancellation in the fp32 gradient of the RMSNorm weights (batch at byte %d), "
          "sum |terms| / |sum|: q/k-norms %.1f to %.1f, the other norms %.1f to %.1f"
          % (STARTS[0], min(qk), max(qk), min(other), max(other)))
    print("largest |norm error| of a parameter's gradient against fp32, per batch:")
    for m, _ in methods:
        v = worst[m]
        print("  %-40s mean %.2f%%, largest %.2f%%, batches over 2%%: %d of %d"
              % (m, 100 * sum(v) / len(v), 100 * max(v), sum(x > 0.02 for x in v), len(v)))


if __name__ == "__main__":
    main()
