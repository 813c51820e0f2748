#!/usr/bin/env python3
"""ABI discipline: the shared library exports exactly the functions include/parity.h declares
with PARITY_API (no internal symbol leaks, no declared function missing), and the version
macros agree with the runtime version functions.

    test/test_abi.py BUILD_DIR
"""
import ctypes
import os
import re
import subprocess
import sys

src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.abspath(sys.argv[1])
lib = os.path.join(build, "lib", "libparity.so")
header = open(os.path.join(src, "include", "parity.h")).read()

declared = set(re.findall(r"PARITY_API\s+[^;(]*?\b(parity_\w+)\s*\(", header))
nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True)
exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[1] in "TtWDdBbRr"}

failures = 0
leaked = sorted(s for s in exported if not s.startswith("parity_"))
missing = sorted(declared - exported)
undeclared = sorted(s for s in exported if s.startswith("parity_") and s not in declared)
for what, names in (("exported but not parity_", leaked), ("declared but not exported", missing),
                    ("exported but not declared", undeclared)):
    if names:
        failures += 1
        print(f"FAIL: {what}: {', '.join(names)}")
print(f"{len(declared)} functions declared with PARITY_API, {len(exported)} symbols exported")

macros = {k: int(v) for k, v in re.findall(r"#define PARITY_VERSION_(MAJOR|MINOR|PATCH) (\d+)", header)}
string = re.search(r'#define PARITY_VERSION_STRING "([^"]+)"', header).group(1)
abi = int(re.search(r"#define PARITY_ABI_VERSION (\d+)", header).group(1))
so = ctypes.CDLL(lib)
so.parity_version.restype = ctypes.c_char_p
number = macros["MAJOR"] * 10000 + macros["MINOR"] * 100 + macros["PATCH"]
checks = [
    ("parity_version() == PARITY_VERSION_STRING", so.parity_version().decode() == string),
    ("parity_version_number() == PARITY_VERSION_NUMBER", so.parity_version_number() == number),
    ("PARITY_VERSION_STRING == MAJOR.MINOR.PATCH",
     string == f"{macros['MAJOR']}.{macros['MINOR']}.{macros['PATCH']}"),
    ("parity_abi_version() == PARITY_ABI_VERSION", so.parity_abi_version() == abi),
]
meson = open(os.path.join(src, "meson.build")).read()
checks.append(("meson project version == PARITY_VERSION_STRING",
               re.search(r"version : '([^']+)'", meson).group(1) == string))
for name, ok in checks:
    if not ok:
        failures += 1
        print(f"FAIL: {name}")
print(f"{len(checks) + 3 - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
