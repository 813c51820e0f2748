"""The trained MoE of models/ served by libparity: mean NLL on the four evaluation sequences
under each preset, and how often another preset routes a (token, sparse layer) otherwise than
hf-eager does (the routes each score ran, Model.score(..., return_routes=True)).

    python3 scripts/check_moe_model.py [MODEL_DIR]     (after `ninja -C build`)

Every position of the 512-byte sequences test/data/reference/eval_0{0..3}.bin is routed in
every sparse layer: 4 x 512 x layers decisions. A decision differs when the expert set differs;
"order" counts the decisions whose experts are the same but in another slot order (the
slots' weights differ in order, not the experts run). models/qwen3-moe-bytes-8.4m/README.md
quotes this output; scripts/train_moe.py prints the fp32 forward's NLL to compare.
"""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import parity  # noqa: E402 (from the repository's python/)

PRESETS = ("hf-eager", "vllm", "sglang", "aligned", "fp32")


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "models",
                                                                  "qwen3-moe-bytes-8.4m")
    evals = [open(os.path.join(REPO, "test", "data", "reference", "eval_%02d.bin" % k), "rb").read()
             for k in range(4)]
    m = parity.Model(model_dir)
    try:
        k = m.config["num_experts_per_tok"]
        layers = m.route_stride // k
        print("%s: %s, %d sparse layers, top-%d of %d experts" % (
            os.path.relpath(model_dir, REPO) if model_dir.startswith(REPO) else model_dir,
            m.config["arch"], layers, k, m.config["num_experts"]))
        runs = {p: m.score(evals, policy=p, return_routes=True) for p in PRESETS}
    finally:
        m.close()
    ref_lp, ref_routes = runs["hf-eager"]
    print("%-9s %8s %14s %24s %10s" % ("preset", "mean NLL", "mean |d logp|", "decisions differing",
                                         "order"))
    for p in PRESETS:
        lp, routes = runs[p]
        flat = [x for seq in lp for x in seq]
        ref_flat = [x for seq in ref_lp for x in seq]
        nll = -sum(flat) / len(flat)
        dlp = sum(abs(a - b) for a, b in zip(flat, ref_flat)) / len(flat)
        decisions = differ = order = 0
        for record, ref_record in zip(routes, ref_routes):  # parity.Routes, ids flat in .data
            seq, ref = record.data.tolist(), ref_record.data.tolist()
            for at in range(0, len(seq), k):
                mine, theirs = seq[at:at + k], ref[at:at + k]
                decisions += 1
                if sorted(mine) != sorted(theirs):
                    differ += 1
                elif mine != theirs:
                    order += 1
        print("%-9s %8.4f %14.3g %9d of %d (%.2f%%) %10d" % (
            p, nll, dlp, differ, decisions, 100.0 * differ / decisions, order))


if __name__ == "__main__":
    sys.exit(main())
