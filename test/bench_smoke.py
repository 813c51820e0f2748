"""The benchmark programs in bench/ run, on every CPU path of this machine, and what they
check and report holds: no speed is judged here (speed lives in bench/ itself).

  python3 test/bench_smoke.py BUILD_DIR

- gemm-bench --check: every sampled output of every GEMM case, on every SIMD path, is
  bitwise the portable kernels' ("check": "ok" in its JSON).
- attn-bench: every path it runs prints every kernel row, and the packed kernels (where a
  table has them) take their fast path on the realistic inputs it makes, from 8 queries on:
  a change that made them fall back to the widening kernels (a range check gone wrong, say)
  would otherwise only show as a slower row.
- sampling-bench and parity-speed --quick (on synthetic:tiny) run to their JSON, with a
  result for every setting or row they say they ran.
- parity-speed --formats: a row of every format preset, its bytes (a quantized one reads
  fewer bytes of linear weights than bf16), and, with a stand-in llama-bench on GGUFs of five
  types, each preset compared with llama.cpp's nearest types and no other.
"""
import json
import os
import subprocess
import sys
import tempfile


def run(build, name, *args, path=None, timeout=600, may_fail=False):
    """The program's standard output; its exit status must be 0 unless may_fail (then
    (status, output)). Its standard error is shown where it fails."""
    exe = os.path.join(build, "bench", name)
    env = dict(os.environ)
    if path:
        env["PARITY_CPU_PATH"] = path
    p = subprocess.run([exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, env=env, timeout=timeout)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    if err:
        sys.stdout.write(err[-2000:])
    if may_fail:
        return p.returncode, out
    if p.returncode != 0:
        raise AssertionError("%s %s exited %d:\n%s%s" % (name, " ".join(args), p.returncode,
                                                         out[-3000:], err[-2000:]))
    return out


def load(path):
    with open(path) as f:
        return json.load(f)


# A stand-in for llama.cpp's llama-bench: its CSV for a GGUF named TYPE.gguf, pp at 1000 and
# tg at 100 tokens/s whatever the type (the model_type as llama.cpp names the file's type).
FAKE_LLAMA_BENCH = """#!/usr/bin/env python3
import os, sys
a = sys.argv
gguf, p, n = a[a.index("-m") + 1], a[a.index("-p") + 1], a[a.index("-n") + 1]
kind = os.path.basename(gguf)[:-len(".gguf")]
names = {"MXFP4_MOE": "MXFP4 MoE", "BF16": "BF16 (guessed)"}
print("build_commit,cpu_info,backends,model_type,n_prompt,n_gen,avg_ts,stddev_ts")
print('"abc","stand-in CPU","CPU","llama ?B %s",%s,0,1000.0,1.0' % (names.get(kind, kind), p))
print('"abc","stand-in CPU","CPU","llama ?B %s",0,%s,100.0,1.0' % (names.get(kind, kind), n))
"""

# The llama.cpp types each format preset is compared with (bf16 vllm with BF16).
NEAREST = {
    "vllm": {"BF16"},
    "aligned": {"BF16"},
    "vllm+fp8-block:deepseek": {"Q8_0"},
    "vllm+mxfp8:ocp": {"Q8_0"},
    "vllm+nvfp4:modelopt": {"Q4_0", "MXFP4 MoE"},
    "vllm+mxfp4:ocp": {"Q4_0", "MXFP4 MoE"},
    "vllm+ternary:bitnet": {"TQ2_0"},
}


def check_formats(build, tmp, check):
    bench = os.path.join(tmp, "llama-bench")
    with open(bench, "w") as f:
        f.write(FAKE_LLAMA_BENCH)
    os.chmod(bench, 0o755)
    ggufs = ",".join(os.path.join(tmp, t + ".gguf")
                     for t in ("BF16", "Q8_0", "Q4_0", "MXFP4_MOE", "TQ2_0"))
    path = os.path.join(tmp, "formats.json")
    os.environ["LLAMA_BENCH"] = bench
    try:
        run(build, "parity-speed", "--quick", "--formats", "--model", "synthetic:tiny",
            "--peers", "llama", "--ggufs", ggufs, "--batches", "1", "--json", path)
    finally:
        del os.environ["LLAMA_BENCH"]
    doc = load(path)
    decode = {r["preset"]: r for r in doc["results"] if r["phase"] == "decode"}
    check(set(decode) == set(NEAREST), "parity-speed --formats: decode rows of %s"
          % sorted(decode))
    check(doc["config"]["formats"] is True, "parity-speed --formats: config.formats")
    memory = {m["preset"]: m for m in doc["memory"]["presets"]}
    check(set(memory) == set(NEAREST) and doc["memory"]["source"] == "parity_model_bytes",
          "parity-speed --formats: the bytes of every preset")
    bf16 = memory.get("vllm", {})
    for preset, m in memory.items():
        quantized = preset not in ("vllm", "aligned")
        smaller = m["step_linear_bytes"] < bf16.get("step_linear_bytes", 0)
        check(smaller == quantized and m["held_for_preset_bytes"] <= m["held_bytes"],
              "parity-speed --formats: %s reads %d bytes of linear weights a step (bf16: %d), "
              "holds %d of %d" % (preset, m["step_linear_bytes"], bf16.get("step_linear_bytes", 0),
                                  m["held_for_preset_bytes"], m["held_bytes"]))
        row = decode.get(preset)
        want = (m["step_linear_bytes"] + m["step_head_bytes"] + m["step_vector_bytes"] +
                m["embedding_row_bytes"])
        check(row is not None and row["step_bytes"] > want and row["achieved_gbs"] > 0,
              "parity-speed --formats: %s's decode step counts its weights, embedding row and "
              "KV positions (%s > %d)" % (preset, row and row["step_bytes"], want))
    peers = {r["weights"] for r in doc["peers"] if r["peer"] == "llama"}
    check(peers == {"BF16", "Q8_0", "Q4_0", "MXFP4 MoE", "TQ2_0"},
          "parity-speed: llama-bench ran on every GGUF (%s)" % sorted(peers))
    for preset, types in NEAREST.items():
        ratios = [r for r in doc["ratios"] if r["preset"] == preset and r["peer"] == "llama" and
                  r["phase"] == "decode"]
        got = {r["peer_weights"] for r in ratios}
        right = all(abs(r["libparity_over_peer"] - decode[preset]["tokens_per_s"] / 100.0)
                    <= 1e-3 * r["libparity_over_peer"] + 1e-4 for r in ratios)
        check(got == types and right, "parity-speed: %s's decode beside llama.cpp's %s (%s)"
              % (preset, sorted(types), sorted(got)))


def main():
    build = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="parity-bench-smoke-")
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    # attn-bench: every path, every kernel row, the packed kernels on their fast path
    path = os.path.join(tmp, "attn.json")
    run(build, "attn-bench", "--reps", "1", "--blocks", "2", "--json", path)
    rows = load(path)["results"]
    paths = sorted({r["path"] for r in rows})
    check("portable" in paths, "attn-bench ran the portable path (paths: %s)" % paths)
    for p in paths:
        kernels = {(r["kernel"], r["queries"]) for r in rows if r["path"] == p}
        want = {(k, q) for k in ("q.k", "P.V") for q in (2, 8, 32)}
        want |= {("softmax", 1)}
        check(want <= kernels, "attn-bench %s: every kernel row (missing %s)"
              % (p, sorted(want - kernels)))
        packed = [r for r in rows if r["path"] == p and r["kernel"] in ("q.k packed", "P.V grained")
                  and r["queries"] >= 8]
        slow = [(r["kernel"], r["queries"]) for r in packed if not r["fast_path"]]
        check(not slow, "attn-bench %s: %d packed rows, all on their fast path %s"
              % (p, len(packed), slow))
        check(all(r["ns_per_call"] > 0 for r in rows if r["path"] == p),
              "attn-bench %s: every row timed" % p)

    # gemm-bench: the bitwise check of every case on every SIMD path (PARITY_CPU_PATH), on one
    # thread, decode's M = 1 and the tiles path's M = 20
    for p in paths:
        if p == "portable":
            continue
        rc, out = run(build, "gemm-bench", "--json", "--check", "--quick", "--threads", "1",
                      "--m", "1,20", "--reps", "1", "--min-time", "0", path=p, may_fail=True)
        try:
            doc = json.loads(out)
        except ValueError:
            check(False, "gemm-bench on %s exited %d without its JSON:\n%s" % (p, rc, out[-2000:]))
            continue
        cases = doc["cases"]
        check(doc["kernels"] == p and len(cases) >= 12,
              "gemm-bench on %s: %d cases (6 shapes x 2 M)" % (doc["kernels"], len(cases)))
        bad = [c for c in cases if c.get("check") != "ok"]
        check(rc == 0 and not bad, "gemm-bench --check on %s (exit %d): every case bitwise the "
              "portable kernels' %s" % (p, rc, [(c["shape"], c["M"], c.get("check")) for c in bad]))

    # sampling-bench: every setting
    path = os.path.join(tmp, "sampling.json")
    run(build, "sampling-bench", "--reps", "1", "--vocab", "4096", "--json", path)
    settings = load(path)["settings"]
    check(len(settings) >= 5 and all(s["ms"] > 0 for s in settings),
          "sampling-bench: %d settings, each timed" % len(settings))

    # parity-speed --quick on the tiny model: its rows and the JSON's sections
    path = os.path.join(tmp, "speed.json")
    run(build, "parity-speed", "--quick", "--model", "synthetic:tiny", "--json", path)
    doc = load(path)
    results = doc["results"]
    phases = sorted({r["phase"] for r in results})
    check(set(phases) >= {"prefill", "decode"}, "parity-speed: phases %s" % phases)
    check(all(r["tokens_per_s"] > 0 for r in results),
          "parity-speed: %d rows, each with a speed" % len(results))
    check(bool(doc["machines"]), "parity-speed: the machine's limits")

    # parity-speed --formats, with a stand-in llama-bench on five GGUF types: a row of every
    # format preset, the bytes each reads and holds, and each compared with its nearest types
    check_formats(build, tmp, check)

    if failures:
        print("bench-smoke: %d failed" % len(failures))
        sys.exit(1)
    print("bench-smoke: all passed")


if __name__ == "__main__":
    main()
