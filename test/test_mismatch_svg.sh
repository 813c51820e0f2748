#!/usr/bin/env bash
# test_mismatch_svg.sh BUILD_DIR — checks parity-mismatch's JSON and SVG output.
#
# Runs bench/parity-mismatch from BUILD_DIR with tiny settings (synthetic:tiny model, 2
# completions of 8 tokens per prompt, a 40-token growth run), then checks with python3 (standard
# library only):
#   - the JSON parses and has the sections config, pairs, ablation, growth, growth_by_length;
#   - every pair with equal policies on both sides and kernel_order "same" has
#     mean_abs_dlogp == 0 and bitwise_equal_fraction == 1, for every sampler preset;
#   - the kernel-order rows and the ablation rows are there;
#   - each SVG parses as XML and holds its axis labels and legend text (the MoE section's two
#     heatmaps too);
#   - a split-KV segment longer than every sequence leaves the log-probs bitwise unchanged;
#   - on a looped model (synthetic:ouro-tiny) the looped rows: replaying learners bitwise,
#     the dense learner not;
#   - the mixture-of-experts rows (on test/data/moe's two checkpoints, the default): every pair
#     recomputed and replayed, equal policies with the same routes and bitwise log-probs both
#     ways, every replay running the sampler's experts, routes and log-probs that differ
#     between other presets, the CSV's rows; an MoE --model is the section's model; a model
#     without experts in --moe-models is refused with a message.
# If /usr/bin/chromium exists, each SVG is also screenshotted headless and the PNG must be a
# non-empty PNG; if rsvg-convert exists, each SVG must render with it too.
# Prints one line per check and a closing "N passed, N failed"; exits 1 if any failed.
set -u

build=${1:?usage: test_mismatch_svg.sh BUILD_DIR}
exe="$build/bench/parity-mismatch"
[ -x "$exe" ] || { echo "error: $exe is not built" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

check() {  # check NAME COMMAND...: runs the command, counts and reports the result
    local name=$1
    shift
    if "$@" >"$tmp/check.log" 2>&1; then
        echo "ok   $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name"
        sed 's/^/     /' "$tmp/check.log"
        failed=$((failed + 1))
    fi
}

run_bench() {
    "$exe" --model synthetic:tiny --n 2 --max-tokens 8 --growth-tokens 40 --threads 2 \
        --svg "$tmp/svg" --json "$tmp/out.json" --csv "$tmp/out.csv" --quiet >"$tmp/stdout.txt"
}

check_json() {
    python3 - "$tmp/out.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("config", "pairs", "ablation", "growth", "growth_by_length"):
    assert key in d, "missing section " + key
cfg = d["config"]
for key in ("model", "build", "cpu_path", "threads", "seed", "sampler_policies"):
    assert key in cfg, "config lacks " + key
equal = [p for p in d["pairs"] if p["sampler"] == p["learner"] and p["kernel_order"] == "same"]
assert equal, "no equal-policy pairs"
for p in equal:
    assert p["tokens"] > 0, p
    assert p["mean_abs_dlogp"] == 0, (p["sampler"], p["mean_abs_dlogp"])
    assert p["bitwise_equal_fraction"] == 1, (p["sampler"], p["bitwise_equal_fraction"])
missing = set(cfg["sampler_policies"]) - {p["sampler"] for p in equal}
assert not missing, "no equal-policy pair for " + ", ".join(sorted(missing))
orders = {p["kernel_order"] for p in d["pairs"]}
assert any(o.startswith("split_k") for o in orders), "no kernel-order rows: %s" % orders
assert len(d["ablation"]) >= 9, "ablation has %d rows" % len(d["ablation"])
assert d["ablation"][-1]["mean_abs_dlogp"] == 0, "learner equal to sampler is not exact"
mismatched = [p for p in d["pairs"] if p["sampler"] == "vllm" and p["learner"] == "hf-eager"
              and p["kernel_order"] == "same"]
assert mismatched and mismatched[0]["mean_abs_dlogp"] > 0, "vllm -> hf-eager shows no mismatch"
print("%d equal-policy pairs exact, %d pairs" % (len(equal), len(d["pairs"])))
EOF
}

check_svgs() {
    python3 - "$tmp/svg" <<'EOF'
import os, sys
import xml.etree.ElementTree as ET
expect = {
    "heatmap_k3.svg": ["sampler policy", "learner policy", "legend", "mean k3 KL"],
    "hist_logratio.svg": ["log importance ratio", "fraction of tokens", "legend"],
    "growth_position.svg": ["position in the completion", "mean |logp_learner", "legend"],
    "growth_length.svg": ["completion length", "sequence log-ratio", "legend"],
    "moe_routes.svg": ["sampler -> learner", "qwen3-moe-bytes-8.4m", "qwen2-moe-tiny", "legend",
                       "fraction of decisions", "vllm+nvfp4:modelopt -> vllm"],
    "moe_logprob.svg": ["sampler -> learner", "qwen3-moe-bytes-8.4m replay", "legend",
                        "qwen2-moe-tiny recompute", "mean |d logp|"],
}
ns = "{http://www.w3.org/2000/svg}"
for name, wanted in expect.items():
    path = os.path.join(sys.argv[1], name)
    root = ET.parse(path).getroot()
    assert root.tag == ns + "svg", "%s: root is %s" % (name, root.tag)
    texts = " | ".join(t.text or "" for t in root.iter(ns + "text"))
    for w in wanted:
        assert w in texts, "%s: no text '%s'" % (name, w)
    print(name, "ok")
EOF
}

screenshot() {  # screenshot SVG: headless chromium; the PNG must exist and be a PNG
    local svg=$1 png="$tmp/$(basename "$1" .svg).png"
    timeout 120 /usr/bin/chromium --headless --no-sandbox --disable-gpu \
        --disable-background-networking --disable-component-update --disable-sync \
        --no-first-run --user-data-dir="$tmp/chromium" --screenshot="$png" \
        --window-size=900,700 "file://$svg" || return 1
    [ -s "$png" ] && [ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]
}

# A split-KV segment longer than every sequence is one segment: the same sums as no split, so
# the kernel-order row must be bitwise equal to the sampler's own policy.
check_one_segment() {
    "$exe" --model synthetic:tiny --n 2 --max-tokens 8 \
        --policies vllm,sglang --learners vllm,sglang \
        --kernel-policies all --split-k 0 --split-kv 4096 --ablation none --growth-tokens 0 \
        --moe-models none --json "$tmp/one.json" --quiet >/dev/null || return 1
    python3 - "$tmp/one.json" <<'EOF2'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [p for p in d["pairs"] if p["kernel_order"] == "split_kv=4096" and p["same_policy"]]
assert len(rows) == 2, rows
for p in rows:
    assert p["bitwise_equal_fraction"] == 1, (p["sampler"], p["bitwise_equal_fraction"])
print("split_kv=4096 rows bitwise equal to no split")
EOF2
}

render_rsvg() {
    rsvg-convert -o "$tmp/rsvg.png" "$1" && [ -s "$tmp/rsvg.png" ]
}

check "parity-mismatch runs" run_bench
check "JSON: equal policies exact, mismatch, kernel-order and ablation rows" check_json
check "SVGs parse, with axis labels and legends" check_svgs
check "split-KV in one segment equals no split" check_one_segment

# A looped model: the looped rows, the replaying learners bitwise, the dense one not.
check_looped() {
    "$exe" --model synthetic:ouro-tiny --policies aligned --ablation none --growth-tokens 0 \
        --greedy-tokens 0 --n 2 --max-tokens 12 --moe-models none --json "$tmp/looped.json" \
        --quiet >/dev/null &&
    python3 - "$tmp/looped.json" <<'EOF'
import json, sys
rows = {r["learner"]: r for r in json.load(open(sys.argv[1]))["looped"]}
assert len(rows) == 5, sorted(rows)
for exact in ("aligned replay", "hf-eager rule"):
    assert rows[exact]["bitwise_equal_fraction"] == 1 and rows[exact]["tokens"] > 0, rows[exact]
assert rows["aligned dense"]["mean_abs_dlogp"] > 0, rows["aligned dense"]
print("looped rows:", {k: v["mean_abs_dlogp"] for k, v in rows.items()})
EOF
}
check "looped model: replay bitwise, dense learner not" check_looped

# The MoE section of the first run: its two default models, each pair recomputed and replayed.
check_moe() {
    python3 - "$tmp/out.json" "$tmp/out.csv" <<'EOF'
import csv, json, sys
d = json.load(open(sys.argv[1]))
models = {m["model"]: m for m in d["moe_models"]}
assert sorted(m["arch"] for m in models.values()) == ["qwen2_moe", "qwen3_moe"], models
for m in models.values():
    assert m["sparse_layers"] > 0 and 0 <= m["expert_load_min_share"] < m["expert_load_max_share"]
rows = d["moe"]
pairs = {(r["model"], r["sampler"], r["learner"]): r for r in rows}
assert len(pairs) == len(rows), "duplicate rows"
for r in rows:
    m = models[r["model"]]
    assert r["tokens"] > 0 and r["route_positions"] == r["tokens"], r
    assert r["route_decisions"] == r["route_positions"] * m["sparse_layers"], r
    if r["routing_replayed"]:
        assert r["route_decisions_differing"] == 0, ("replay did not run the record", r)
    else:
        assert (r["model"], r["sampler"], r["learner"] + " replay") in pairs, r
    if r["same_policy"]:
        assert r["route_decisions_differing"] == 0 and r["route_positions_differing"] == 0, r
        assert r["mean_abs_dlogp"] == 0 and r["bitwise_equal_fraction"] == 1, r
equal = [r for r in rows if r["same_policy"]]
assert len(equal) >= 2 * 2 * 4, "%d equal-policy rows" % len(equal)
for model in models:
    for learner in ("hf-eager", "hf-eager replay"):
        r = pairs[(model, "vllm", learner)]
        assert r["mean_abs_dlogp"] > 0, ("no mismatch", r)
    r = pairs[(model, "vllm+nvfp4:modelopt", "vllm")]
    assert r["route_decisions_differing"] > 0, ("nvfp4 against bf16 routes alike", r)
c = d["checks"]
assert c["moe_equal_policy_rows_exact"] and c["moe_replays_ran_sampler_routes"], c
assert c["moe_equal_policy_rows"] == len(equal), c
moe_csv = [r for r in csv.DictReader(open(sys.argv[2])) if r["section"] == "moe"]
assert len(moe_csv) == len(rows), (len(moe_csv), len(rows))
assert all(r["route_decisions"] for r in moe_csv), moe_csv[0]
print("%d MoE rows on %d models, %d with equal policies exact" % (len(rows), len(models),
                                                                  len(equal)))
EOF
}
check "MoE rows: equal policies exact both ways, replays follow the record" check_moe

# An MoE --model is the section's model; a model without experts is refused.
check_moe_model() {
    local model
    model="$(cd "$(dirname "$0")" && pwd)/data/moe/qwen2-moe-tiny"
    "$exe" --model "$model" --policies vllm --ablation none --growth-tokens 0 --greedy-tokens 0 \
        --n 1 --max-tokens 6 --moe-pairs vllm/vllm,vllm/sglang --json "$tmp/moe.json" --quiet \
        >/dev/null || return 1
    python3 - "$tmp/moe.json" "$model" <<'EOF' || return 1
import json, sys
d = json.load(open(sys.argv[1]))
assert [m["model"] for m in d["moe_models"]] == [sys.argv[2]], d["moe_models"]
assert len(d["moe"]) == 4 and d["checks"]["moe_equal_policy_rows_exact"], d["moe"]
print("MoE --model: the section's model")
EOF
    if "$exe" --model synthetic:tiny --moe-models synthetic:tiny --policies vllm --ablation none \
        --growth-tokens 0 --greedy-tokens 0 --n 1 --max-tokens 4 --quiet >/dev/null \
        2>"$tmp/err.txt"; then
        echo "a model without experts was accepted"
        return 1
    fi
    grep -q "has no experts" "$tmp/err.txt" || { cat "$tmp/err.txt"; return 1; }
}
check "MoE model from --model; a dense --moe-models refused" check_moe_model
for svg in "$tmp"/svg/*.svg; do
    if [ -x /usr/bin/chromium ]; then
        check "chromium screenshot of $(basename "$svg")" screenshot "$svg"
    fi
    if command -v rsvg-convert >/dev/null; then
        check "rsvg-convert renders $(basename "$svg")" render_rsvg "$svg"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
