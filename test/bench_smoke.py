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

    if failures:
        print("bench-smoke: %d failed" % len(failures))
        sys.exit(1)
    print("bench-smoke: all passed")


if __name__ == "__main__":
    main()
