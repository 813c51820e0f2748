"""Packaging of the binding: `pip install ./python` offline through the in-tree build backend,
then `import parity` from outside the source tree, finding the library through PARITY_LIBRARY
or an installed location.

    python3 test/python/test_packaging.py BUILD_DIR

Needs pip (exits 77, skipped, without it). Nothing is downloaded: pip runs with --no-index.
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

import harness

BUILD = harness.setup()
LIBRARY = os.environ["PARITY_LIBRARY"]
PYTHON_DIR = os.path.join(harness.REPO, "python")
TMP = tempfile.mkdtemp(prefix="parity-pkg-")
if subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE).returncode:
    print("SKIP: %s has no pip" % sys.executable)
    sys.exit(harness.SKIP)
sys.path.insert(0, PYTHON_DIR)
import _parity_build  # noqa: E402

# scores a sequence with the installed package and checks where it came from
PROBE = ("import os, sys, parity\n"
         "assert not parity.__file__.startswith(%r), parity.__file__\n"
         "print(parity.__file__)\n"
         "print(parity.LIBRARY_PATH)\n"
         "print(parity.Model('synthetic:tiny').score([1, 2, 3, 4], policy='aligned'))\n"
         % PYTHON_DIR)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PARITY_LIBRARY", "PYTHONPATH")}
    env.update(extra)
    return env


def run(args, env, cwd):
    return subprocess.run(args, env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)


class TestPackaging(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, PYTHON_DIR)
        import parity
        cls.want = repr(parity.Model("synthetic:tiny").score([1, 2, 3, 4], policy="aligned"))
        cls.version = parity.version()

    def pip_install(self, target):
        # --no-index: nothing may come from a package index; the build backend needs nothing
        p = run([sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
                 "--disable-pip-version-check", "--target", target, PYTHON_DIR],
                clean_env(), TMP)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(os.path.isfile(os.path.join(target, "parity", "_lib.py")))
        self.assertTrue(os.path.isdir(os.path.join(target, "libparity-%s.dist-info"
                                                   % self.version)))

    def test_pip_install_then_import_with_parity_library(self):
        site = os.path.join(TMP, "site")
        self.pip_install(site)
        elsewhere = tempfile.mkdtemp(dir=TMP)
        p = run([sys.executable, "-c", PROBE],
                clean_env(PYTHONPATH=site, PARITY_LIBRARY=LIBRARY), elsewhere)
        self.assertEqual(p.returncode, 0, p.stderr)
        path, lib, scores = p.stdout.splitlines()
        self.assertEqual(path, os.path.join(site, "parity", "__init__.py"))
        self.assertEqual(os.path.realpath(lib), os.path.realpath(LIBRARY))
        self.assertEqual(scores, self.want)
        # without PARITY_LIBRARY and nothing installed where the loader looks, the error
        # names the places (unless this machine has a libparity installed)
        p = run([sys.executable, "-c", PROBE], clean_env(PYTHONPATH=site), elsewhere)
        if p.returncode:
            self.assertIn("no usable libparity; tried, in order:", p.stderr)
            self.assertIn("build tree: not in a source tree", p.stderr)

    def test_venv_with_library_installed_in_its_prefix(self):
        """A venv (made offline, without pip) holding the package, and the library installed
        as `meson install --prefix VENV` would put it (VENV/lib): found with no
        PARITY_LIBRARY."""
        venv = os.path.join(TMP, "venv")
        p = run([sys.executable, "-m", "venv", "--without-pip", venv], clean_env(), TMP)
        self.assertEqual(p.returncode, 0, p.stderr)
        vpy = os.path.join(venv, "bin", "python")
        site = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   clean_env(), TMP).stdout.strip()
        self.pip_install(site)
        libdir = os.path.join(venv, "lib")
        real = os.path.realpath(LIBRARY)
        shutil.copy(real, os.path.join(libdir, os.path.basename(real)))
        os.symlink(os.path.basename(real), os.path.join(libdir, "libparity.so"))
        p = run([vpy, "-c", PROBE], clean_env(), tempfile.mkdtemp(dir=TMP))
        self.assertEqual(p.returncode, 0, p.stderr)
        path, lib, scores = p.stdout.splitlines()
        self.assertTrue(path.startswith(site), path)
        self.assertEqual(lib, os.path.join(libdir, "libparity.so"))
        self.assertEqual(scores, self.want)

    def test_wheel_and_sdist(self):
        out = tempfile.mkdtemp(dir=TMP)
        name = _parity_build.build_wheel(out)
        self.assertEqual(name, "libparity-%s-py3-none-any.whl" % self.version)
        with zipfile.ZipFile(os.path.join(out, name)) as z:
            names = z.namelist()
            info = "libparity-%s.dist-info/" % self.version
            # every module of the package, its subpackages' (parity.serve) included
            package = os.path.join(PYTHON_DIR, "parity")
            modules = sorted(os.path.relpath(os.path.join(root, f), package).replace(os.sep, "/")
                             for root, dirs, files in os.walk(package)
                             if "__pycache__" not in root.split(os.sep)
                             for f in files if f.endswith(".py"))
            self.assertEqual(sorted(n[len("parity/"):] for n in names
                                    if n.startswith("parity/")), modules)
            self.assertEqual({n for n in names if n.startswith(info)},
                             {info + "METADATA", info + "WHEEL", info + "RECORD"})
            meta = z.read(info + "METADATA").decode()
            self.assertIn("Name: libparity\n", meta)
            self.assertIn("Version: %s\n" % self.version, meta)
            self.assertIn("Requires-Python: >=3.8\n", meta)
            self.assertIn("Root-Is-Purelib: true", z.read(info + "WHEEL").decode())
            self.assertIn("Tag: py3-none-any", z.read(info + "WHEEL").decode())
            record = z.read(info + "RECORD").decode().splitlines()
            self.assertEqual(sorted(r.split(",")[0] for r in record), sorted(names))
            for row in record:
                path, digest, size = row.split(",")
                if path == info + "RECORD":
                    self.assertEqual((digest, size), ("", ""))
                    continue
                data = z.read(path)
                self.assertEqual(digest, "sha256=" + base64.urlsafe_b64encode(
                    hashlib.sha256(data).digest()).rstrip(b"=").decode(), path)
                self.assertEqual(int(size), len(data), path)
        # reproducible
        again = tempfile.mkdtemp(dir=TMP)
        _parity_build.build_wheel(again)
        with open(os.path.join(out, name), "rb") as f1, open(os.path.join(again, name),
                                                             "rb") as f2:
            self.assertEqual(f1.read(), f2.read())
        sdist = _parity_build.build_sdist(out)
        self.assertEqual(sdist, "libparity-%s.tar.gz" % self.version)
        with tarfile.open(os.path.join(out, sdist)) as t:
            members = set(t.getnames())
            base = "libparity-%s/" % self.version
            for f in ["PKG-INFO", "pyproject.toml", "_parity_build.py", "README.md"] + \
                    ["parity/" + m for m in modules]:
                self.assertIn(base + f, members)
            self.assertIn("Name: libparity", t.extractfile(base + "PKG-INFO").read().decode())
        # the sdist builds the same wheel
        unpacked = tempfile.mkdtemp(dir=TMP)
        with tarfile.open(os.path.join(out, sdist)) as t:
            t.extractall(unpacked)
        rebuilt = tempfile.mkdtemp(dir=TMP)
        p = run([sys.executable, "-c", "import _parity_build as b; print(b.build_wheel(%r))"
                 % rebuilt], clean_env(), os.path.join(unpacked, base))
        self.assertEqual(p.returncode, 0, p.stderr)
        with zipfile.ZipFile(os.path.join(rebuilt, name)) as z1, \
                zipfile.ZipFile(os.path.join(out, name)) as z2:
            self.assertEqual({n: z1.read(n) for n in z1.namelist()},
                             {n: z2.read(n) for n in z2.namelist()})

    def test_version_is_the_library_s(self):
        self.assertEqual(_parity_build._project()["version"], self.version)


if __name__ == "__main__":
    try:
        harness.run("python-packaging")
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
