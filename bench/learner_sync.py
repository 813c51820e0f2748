#!/usr/bin/env python3
"""The learner's weight sync on a qwen3-0.6b-shaped model: how long parity.torch.CausalLM's
sync_to(model) takes after an optimizer step (the RL loop pays it every step).

    /usr/bin/python3 bench/learner_sync.py [--model synthetic:qwen3-0.6b] [--repeat 3]
                                           [--threads N] [--json FILE]

Builds the module from the model (fp32 masters: 4 bytes a parameter, beside the model's bf16
weights), moves every master off the bf16 grid (a stand-in for optimizer.step(): each value
times (1 + 2^-10), so that every tensor changes and the cast has real rounding to do), then
times sync_to: parity_model_update straight from the masters' memory (no copy on the Python
side; the library casts with round-to-nearest-even, checks finiteness and keeps the fp32
masters), and the check (the module's manifest written with parity_tensor_checksum, then
parity_model_verify). Prints a table of the best of --repeat runs and a JSON object. Needs
torch (Debian's /usr/bin/python3 with python3-torch).
"""
import argparse
import json
import sys
import time

import pybench  # noqa: F401  (puts python/ on sys.path)
import parity  # noqa: E402

try:
    import torch
    from parity.torch import CausalLM
except ImportError as e:
    sys.exit("learner_sync: needs torch (%s): run it with /usr/bin/python3 and python3-torch" % e)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="synthetic:qwen3-0.6b")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--json", help="also write the JSON object to FILE")
    args = ap.parse_args(argv)

    with parity.Model(args.model, threads=args.threads) as model:
        t0 = time.perf_counter()
        lm = CausalLM(model, threads=args.threads)
        build = time.perf_counter() - t0
        n_params = sum(p.numel() for p in lm.parameters())
        updates, verifies = [], []
        for r in range(args.repeat):
            with torch.no_grad():
                for p in lm.parameters():
                    p.mul_(1 + 2.0 ** -10)
            up, ver = lm.sync_to(model)
            updates.append(up)
            verifies.append(ver)
        version = model.version
    best = min(range(args.repeat), key=lambda i: updates[i] + verifies[i])
    up, ver = updates[best], verifies[best]
    gb = n_params * 4 / 1e9
    print("model %s: %d parameters, module built in %.1f s, %d syncs" % (args.model, n_params,
                                                                        build, args.repeat))
    print("%-28s %10s %10s" % ("step", "seconds", "GB/s fp32"))
    print("%-28s %10.3f %10.2f" % ("parity_model_update", up, gb / up))
    print("%-28s %10.3f %10.2f" % ("manifest write + verify", ver, gb / ver))
    print("%-28s %10.3f %10.2f" % ("sync_to total", up + ver, gb / (up + ver)))
    out = {"model": args.model, "parameters": n_params, "module_build_s": round(build, 3),
           "repeat": args.repeat, "update_s": round(up, 4), "verify_s": round(ver, 4),
           "sync_s": round(up + ver, 4), "all_update_s": [round(x, 4) for x in updates],
           "all_verify_s": [round(x, 4) for x in verifies], "model_version": version,
           "cpu_path": parity.cpu_path()}
    text = json.dumps(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
