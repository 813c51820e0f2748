"""Shared set-up of the Python test scripts.

Each script is run as `python3 test/python/test_X.py [BUILD_DIR_OR_LIBRARY]`:
  - an argument that is a directory is the meson build directory (the library is
    BUILD_DIR/lib/libparity.so, the command-line tools BUILD_DIR/examples/);
  - an argument that is a file is the library itself (PARITY_LIBRARY);
  - without an argument, the environment variable PARITY_LIBRARY, else <repo>/build.
The binding is imported from <repo>/python. Exit status: 0 passed, 1 failed, 77 skipped (what
meson counts as a skip).
"""
import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = 77


def setup():
    """Points PARITY_LIBRARY at the library under test and puts python/ on sys.path.
    Returns the build directory (where examples/parity-score lives)."""
    arg = sys.argv[1] if len(sys.argv) > 1 else None
    if arg and os.path.isdir(arg):
        build = os.path.abspath(arg)
        os.environ["PARITY_LIBRARY"] = os.path.join(build, "lib", "libparity.so")
    elif arg:
        os.environ["PARITY_LIBRARY"] = os.path.abspath(arg)
        build = os.path.dirname(os.path.dirname(os.path.abspath(arg)))
    elif os.environ.get("PARITY_LIBRARY"):
        build = os.path.dirname(os.path.dirname(os.path.abspath(os.environ["PARITY_LIBRARY"])))
    else:
        build = os.path.join(REPO, "build")
        os.environ["PARITY_LIBRARY"] = os.path.join(build, "lib", "libparity.so")
    if not os.path.isfile(os.environ["PARITY_LIBRARY"]):
        sys.exit("error: no library at %s: build first (meson setup build && ninja -C build) "
                 "or pass the build directory" % os.environ["PARITY_LIBRARY"])
    sys.path.insert(0, os.path.join(REPO, "python"))
    return build


def require(what, modules, packages):
    """Imports the named modules and returns them, in order; without one of them prints why
    `what` is skipped (and the Debian `packages` that provide them) and exits SKIP."""
    import importlib
    try:
        return [importlib.import_module(m) for m in modules]
    except ImportError as e:
        print("SKIP: %s need %s (%s); install %s and run them with /usr/bin/python3"
              % (what, " and ".join(modules), e, packages))
        sys.exit(SKIP)


def tool(build, name):
    return os.path.join(build, "examples", name)


def runnable_paths():
    """Every kernel path this CPU runs (set_cpu_path refuses the others); the path in force
    before is restored."""
    import parity
    default, paths = parity.cpu_path(), []
    for name in parity.cpu_paths():
        try:
            parity.set_cpu_path(name)
            paths.append(name)
        except parity.ParityError:
            pass
    parity.set_cpu_path(default)
    return paths


def run(name):
    """Runs the unittest cases of the calling script's __main__; prints the closing line
    "NAME: N passed, N failed, N skipped" and exits 0 or 1."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    # an error in setUpClass (reported on no TestCase) is a failure but not a test run
    failed_runs = sum(isinstance(test, unittest.TestCase)
                      for test, _ in result.failures + result.errors)
    passed = result.testsRun - failed_runs - len(result.unexpectedSuccesses) - skipped
    print("%s: %d passed, %d failed, %d skipped" % (name, passed, failed, skipped))
    sys.exit(0 if failed == 0 and result.testsRun > 0 else 1)


def pip_downloads(output):
    """(files, megabytes) that pip's install output says it downloaded ("Downloading
    NAME.whl (12.3 MB)" lines; the wheels' .metadata fetched first are left out)."""
    import re
    units = {"kB": 1e-3, "MB": 1.0, "GB": 1e3}
    found = re.findall(r"Downloading (\S+) \(([0-9.]+) (kB|MB|GB)\)", output)
    found = [(size, unit) for file, size, unit in found if not file.endswith(".metadata")]
    return len(found), sum(float(size) * units[unit] for size, unit in found)


def venv(build, name, requirements, timeout=900):
    """The Python of a virtual environment BUILD/venv-NAME holding the PyPI `requirements` (pip
    requirement strings), created and installed on the first call and reused after: a file
    BUILD/venv-NAME/parity-requirements.txt records what was installed, and a different list
    installs again. Prints what the install took (downloads from PyPI, not pip's cache: pip
    runs with --no-cache-dir, so the figures are what a fresh machine fetches). Exits SKIP only
    where this Python has no venv
    module or no ensurepip (Debian: apt-get install python3-venv); where it has them, a failed
    install (PyPI unreachable, say) is a failure, exit 1. Returns the venv's python path."""
    import shutil
    import subprocess
    import time
    try:
        import ensurepip  # noqa: F401
        import venv as _venv  # noqa: F401
    except ImportError as e:
        print("SKIP: the %s virtual environment needs Python's venv and ensurepip (%s); "
              "install python3-venv" % (name, e))
        sys.exit(SKIP)
    d = os.path.join(build, "venv-" + name)
    py = os.path.join(d, "bin", "python")
    stamp = os.path.join(d, "parity-requirements.txt")
    want = "\n".join(requirements) + "\n"
    try:
        with open(stamp) as f:
            if f.read() == want and os.path.isfile(py):
                return py
    except OSError:
        pass
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    steps = [[sys.executable, "-m", "venv", d],
             [py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
              "--no-cache-dir", "--progress-bar", "off"] + list(requirements)]
    out = ""
    for cmd in steps:
        left = timeout - (time.monotonic() - t0)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=max(left, 1))
            out, ok = p.stdout.decode("utf-8", "replace"), p.returncode == 0
        except subprocess.TimeoutExpired:
            out, ok = "(timed out after %d s)" % timeout, False
        if not ok:
            print("FAIL: %s: `%s` failed, so the virtual environment %s could not be made (is "
                  "PyPI reachable?):\n%s" % (name, " ".join(cmd), d, out[-3000:]))
            sys.exit(1)
    size = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                size += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    with open(stamp, "w") as f:
        f.write(want)
    wheels, megabytes = pip_downloads(out)
    print("%s: installed %s into %s in %.1f s (download and install; %d files, %.0f MB "
          "downloaded; %.0f MB on disk)" % (name, " ".join(requirements), d,
                                           time.monotonic() - t0, wheels, megabytes, size / 1e6))
    return py
