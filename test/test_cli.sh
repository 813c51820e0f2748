#!/bin/sh
# The command-line tools agree with each other, as text:
#   - parity-generate prints identical lines for --batch 1 and --batch 8 (same seed);
#   - for every completion, parity-score on prompt + completion (same model, policy,
#     temperature, mode and truncation) prints exactly the log-probs parity-generate reported;
#   - for a looped model, parity-score --depths replays parity-generate's exit depths, and its
#     dense readouts (--every-loop, --readout K, --readout expected-logits) agree.
#   test/test_cli.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model="$src/models/qwen3-bytes-pystdlib-4.9m"
prompt="$src/test/data/reference/eval_01.bin"
head -c 40 "$prompt" > "$tmp/prompt.bin"
passed=0
failed=0
check() { if [ "$1" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2"; fi; }

# parity-generate with the arguments $4.. at --batch 1 into $tmp/$2.jsonl, and at --batch $3
# with 2 threads: the same lines (else a failure named $1).
generate_twice() {
    gen_what=$1 gen_out=$2 gen_batch=$3
    shift 3
    "$build/examples/parity-generate" "$@" --batch 1 > "$tmp/$gen_out.jsonl"
    "$build/examples/parity-generate" "$@" --batch "$gen_batch" --threads 2 > "$tmp/$gen_out.b.jsonl"
    if cmp -s "$tmp/$gen_out.jsonl" "$tmp/$gen_out.b.jsonl"; then check ok
    else check no "$gen_what: --batch 1 and --batch $gen_batch differ"; fi
}

# Each completion I of the parity-generate lines in $2, into $tmp/$1seqI.txt (prompt then
# completion tokens) and $tmp/$1wantI.txt (its log-probs as printed, one a line); given the
# model's loops $3, its exit depths too, after those of the prompt (every loop), into
# $tmp/$1depthI.txt.
split_completions() {
    python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, prefix, path = sys.argv[1:4]
loops = int(sys.argv[4]) if len(sys.argv) > 4 else None
prompt = list(open(tmp + "/prompt.bin", "rb").read())
for line in open(path):
    c = json.loads(line)
    i = c["index"]
    with open("%s/%sseq%d.txt" % (tmp, prefix, i), "w") as f:
        f.write(" ".join(map(str, prompt + c["tokens"])))
    if loops is not None:
        with open("%s/%sdepth%d.txt" % (tmp, prefix, i), "w") as f:
            f.write(" ".join(map(str, [loops] * (len(prompt) - 1) + c["exit_depths"] + [1])))
    with open("%s/%swant%d.txt" % (tmp, prefix, i), "w") as f:
        f.write("".join("%s\n" % x for x in line.split('"logprobs": [')[1].split("]")[0].split(", ")))
PY
}

for policy in vllm hf-eager aligned; do
    for mode in raw processed processed-truncated; do
        args="--model $model --policy $policy --prompt-bytes $tmp/prompt.bin --n 6 --max-tokens 12
              --temperature 0.8 --top-k 40 --top-p 0.9 --seed 11 --logprob-mode $mode"
        # shellcheck disable=SC2086
        generate_twice "$policy/$mode" b1 8 $args
        # each completion, rescored by parity-score, as text
        split_completions "" "$tmp/b1.jsonl"
        for i in 0 1 2 3 4 5; do
            n=$(wc -l < "$tmp/want$i.txt")
            "$build/examples/parity-score" --model "$model" --policy "$policy" --tokens "$tmp/seq$i.txt" \
                --temperature 0.8 --top-k 40 --top-p 0.9 --logprob-mode "$mode" | tail -n "$n" > "$tmp/got$i.txt"
            if cmp -s "$tmp/want$i.txt" "$tmp/got$i.txt"; then check ok; else check no "$policy/$mode completion $i: parity-score differs"; fi
        done
    done
done
# a looped model (Ouro): early exit in parity-generate, the printed exit depths replayed by
# parity-score --depths, under both KV rules; without --depths the dense learner differs
for kv in last-exited full; do
    args="--model synthetic:ouro-tiny:5 --policy hf-eager --prompt-bytes $tmp/prompt.bin --n 4
          --max-tokens 10 --temperature 0.9 --seed 3 --exit-rule threshold --exit-threshold 0.6
          --min-depth 1 --max-depth 4 --loop-kv $kv"
    # shellcheck disable=SC2086
    generate_twice "ouro/$kv" o1 4 $args
    split_completions o "$tmp/o1.jsonl" 4
    for i in 0 1 2 3; do
        n=$(wc -l < "$tmp/owant$i.txt")
        "$build/examples/parity-score" --model synthetic:ouro-tiny:5 --policy hf-eager --tokens "$tmp/oseq$i.txt" \
            --depths "$tmp/odepth$i.txt" --loop-kv $kv | tail -n "$n" > "$tmp/ogot$i.txt"
        if cmp -s "$tmp/owant$i.txt" "$tmp/ogot$i.txt"; then check ok; else check no "ouro/$kv completion $i: the replay differs"; fi
    done
    "$build/examples/parity-score" --model synthetic:ouro-tiny:5 --policy hf-eager --tokens "$tmp/oseq0.txt" \
        | tail -n "$(wc -l < "$tmp/owant0.txt")" > "$tmp/odense.txt"
    if cmp -s "$tmp/owant0.txt" "$tmp/odense.txt"; then check no "ouro/$kv: the dense learner equals the early-exit sampler"; else check ok; fi
done
# a depth out of range: a message naming it
echo "4 4 0" > "$tmp/bad_depths.txt"
printf '1 2 3' > "$tmp/three.txt"
if "$build/examples/parity-score" --model synthetic:ouro-tiny:5 --policy aligned --tokens "$tmp/three.txt" \
    --depths "$tmp/bad_depths.txt" 2> "$tmp/err"; then
    check no "depth 0 accepted"
else
    grep -q "depth 0" "$tmp/err" && check ok || check no "no message naming depth 0"
fi

# the dense readouts: --every-loop's column K is --readout K's, its last the default readout's;
# the expected logits are another readout
score_ouro() { "$build/examples/parity-score" --model synthetic:ouro-tiny:5 --policy hf-eager --bytes "$tmp/prompt.bin" "$@"; }
score_ouro --every-loop > "$tmp/every.txt"
for k in 1 2 3 4; do
    score_ouro --readout $k > "$tmp/loop$k.txt"
    cut -d' ' -f$k "$tmp/every.txt" > "$tmp/col$k.txt"
    if cmp -s "$tmp/loop$k.txt" "$tmp/col$k.txt"; then check ok; else check no "--readout $k is not --every-loop's column $k"; fi
done
score_ouro > "$tmp/dense.txt"
if cmp -s "$tmp/dense.txt" "$tmp/loop4.txt"; then check ok; else check no "the last loop is not the dense readout"; fi
score_ouro --readout expected-logits > "$tmp/mix.txt"
if [ -s "$tmp/mix.txt" ] && ! cmp -s "$tmp/mix.txt" "$tmp/dense.txt"; then check ok; else check no "the expected logits are missing or the last loop's"; fi
if score_ouro --readout 5 2> "$tmp/err"; then check no "--readout 5 accepted"; else
    grep -q "readout_loop 5 is not in 1..4" "$tmp/err" && check ok || check no "no message naming readout_loop 5"; fi

# errors: a message on stderr and a non-zero exit, never a crash
if "$build/examples/parity-score" --model synthetic:nope --policy aligned --bytes "$tmp/prompt.bin" 2> "$tmp/err"; then
    check no "unknown model accepted"
else
    grep -q "error:" "$tmp/err" && check ok || check no "no error message"
fi
echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
