"""Runs the meson suite's Python tests (the suite "python" of test/meson.build) under the
interpreter that runs this script, instead of the ones meson runs them with; e.g. under a
virtual environment's PyTorch 2 and numpy 2 where the suite itself uses Debian's torch 1.13:

    /path/to/venv/bin/python scripts/python-tests.py [--no-skips] [BUILD] [NAME...]

BUILD is a configured and built meson build directory (default: build); NAMEs pick tests of the
suite by name (default: all of them). Each test runs as meson would run it (its command, with the
interpreter replaced by this one; its environment, working directory and timeout), one at a
time, and with torch on one thread unless OMP_NUM_THREADS says otherwise: Debian's torch, which
the suite runs on, uses one; PyPI's takes every core and, spinning against other jobs on a
loaded machine, ran python-learner in 477 s here against 16 s on one thread (the whole suite 605 s
against 114 s), with the same results.

Prints the interpreter with its torch and numpy versions, then per test its result (ok, FAIL,
SKIP: the script exited 77, a module it needs missing), the time it took and the test's closing
line; a failed test's output is printed and every test's is kept in
BUILD/meson-logs/python-tests/NAME.txt. Exit status: 0 when none failed, 1 when one did (or,
with --no-skips, was skipped), 2 for bad arguments.
"""
import importlib
import json
import os
import subprocess
import sys
import time

SUITE = "python"
SKIP_STATUS = 77


def usage_error(message):
    print("python-tests.py: error: %s" % message, file=sys.stderr)
    sys.exit(2)


def suite_tests(build):
    """The tests of SUITE as meson's introspection lists them (dicts with cmd, env, ...)."""
    path = os.path.join(build, "meson-info", "intro-tests.json")
    try:
        with open(path) as f:
            tests = json.load(f)
    except OSError as e:
        usage_error("%s is not a configured meson build directory (%s); run `meson setup %s` "
                    "and `ninja -C %s` first" % (build, e, build, build))
    # meson qualifies suite names with the project's name: "libparity:python"
    return [t for t in tests if any(s.split(":")[-1] == SUITE for s in t["suite"])]


def versions():
    """'torch X, numpy Y' of this interpreter ('absent' for a module it cannot import)."""
    out = []
    for name in ("torch", "numpy"):
        try:
            out.append("%s %s" % (name, importlib.import_module(name).__version__))
        except ImportError:
            out.append("%s absent" % name)
    return ", ".join(out)


def closing_line(output):
    """The test's last non-empty line that says what ran (harness.run's "NAME: N passed, ..."
    or a "SKIP: ..." reason), else its last non-empty line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("SKIP:") or " passed, " in ln:
            return ln
    return lines[-1] if lines else "(no output)"


def run_test(test, build, log_dir):
    """Runs one test under sys.executable; returns (status, seconds, output)."""
    cmd = [sys.executable] + test["cmd"][1:]
    env = dict(os.environ, **test["env"])
    env.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, cwd=test["workdir"] or build, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=test["timeout"])
        status, output = p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        status = None
        output = (e.stdout or b"").decode(errors="replace") + \
            "\n(timed out after %d s)\n" % test["timeout"]
    seconds = time.monotonic() - start
    with open(os.path.join(log_dir, test["name"] + ".txt"), "w") as f:
        f.write("$ %s\n%s" % (" ".join(cmd), output))
    return status, seconds, output


def main(argv):
    no_skips = "--no-skips" in argv
    args = [a for a in argv if a != "--no-skips"]
    if any(a.startswith("-") for a in args):
        usage_error("unknown option %s; usage: PYTHON scripts/python-tests.py [--no-skips] "
                    "[BUILD] [NAME...]" % next(a for a in args if a.startswith("-")))
    build = os.path.abspath(args[0] if args else "build")
    tests = suite_tests(build)
    names = args[1:]
    unknown = [n for n in names if n not in {t["name"] for t in tests}]
    if unknown:
        usage_error("no test %s in the suite %r of %s (it has: %s)"
                    % (", ".join(unknown), SUITE, build, ", ".join(t["name"] for t in tests)))
    if names:
        tests = [t for t in tests if t["name"] in names]
    if not tests:
        usage_error("the build directory %s has no test in the suite %r" % (build, SUITE))
    log_dir = os.path.join(build, "meson-logs", "python-tests")
    os.makedirs(log_dir, exist_ok=True)
    print("the suite %r of %s under %s (Python %s; %s; OMP_NUM_THREADS=%s)"
          % (SUITE, build, sys.executable, sys.version.split()[0], versions(),
             os.environ.get("OMP_NUM_THREADS", "1")), flush=True)
    failed, skipped = [], []
    for test in tests:
        status, seconds, output = run_test(test, build, log_dir)
        result = {0: "ok", SKIP_STATUS: "SKIP"}.get(status, "FAIL")
        print("%-24s %-4s %7.1f s  %s" % (test["name"], result, seconds, closing_line(output)),
              flush=True)
        if result == "FAIL":
            failed.append(test["name"])
            print(output, flush=True)
        elif result == "SKIP":
            skipped.append(test["name"])
    def listed(names):
        return " (%s)" % ", ".join(names) if names else ""
    print("%d test%s: %d ok, %d failed%s, %d skipped%s; logs in %s"
          % (len(tests), "" if len(tests) == 1 else "s", len(tests) - len(failed) - len(skipped),
             len(failed), listed(failed), len(skipped), listed(skipped), log_dir))
    return 1 if failed or (no_skips and skipped) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
