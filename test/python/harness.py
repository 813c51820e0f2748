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


def run(name):
    """Runs the unittest cases of the calling script's __main__; prints the closing line
    "NAME: N passed, N failed, N skipped" and exits 0 or 1."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    print("%s: %d passed, %d failed, %d skipped" % (name, passed, failed, skipped))
    sys.exit(0 if failed == 0 and result.testsRun > 0 else 1)
