#!/usr/bin/env python3
"""ABI discipline: the shared library exports exactly the functions include/parity.h declares
with PARITY_API (no internal symbol leaks, no declared function missing); the static library
defines no global symbol but those functions (its internal ones are local, so that it links
into a host with its own forward() or json_parse()); and the version macros agree with the
runtime version functions.

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
archive = os.path.join(build, "lib", "libparity.a")
header = "".join(open(os.path.join(src, "include", h)).read()
                 for h in ("parity.h", "parity_quant.h", "parity_ops.h"))

declared = set(re.findall(r"PARITY_API\s+[^;(]*?\b(parity_\w+)\s*\(", header))


def defined_globals(*nm_args):
    """The global symbols that `nm --defined-only *nm_args` lists, as {name: type letter}."""
    out = subprocess.run(["nm", "--defined-only", *nm_args], capture_output=True, text=True,
                         check=True).stdout
    # "ADDRESS TYPE NAME"; an archive's member headers ("member.o:") and blank lines have fewer
    return {f[2]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 3}


exported = {s for s, t in defined_globals("-D", lib).items() if t in "TtWDdBbRr"}
static = defined_globals("-g", archive)

failures = 0
problems = [
    ("libparity.so: exported but not parity_", sorted(s for s in exported if not s.startswith("parity_"))),
    ("libparity.so: declared but not exported", sorted(declared - exported)),
    ("libparity.so: exported but not declared",
     sorted(s for s in exported if s.startswith("parity_") and s not in declared)),
    ("libparity.a: global but not parity", sorted(s for s in static if not s.startswith("parity"))),
    ("libparity.a: declared but not a global function",
     sorted(s for s in declared if static.get(s) != "T")),
    ("libparity.a: global but not declared",
     sorted(s for s in static if s.startswith("parity") and s not in declared)),
]
for what, names in problems:
    if names:
        failures += 1
        print(f"FAIL: {what}: {', '.join(names)}")
print(f"{len(declared)} functions declared with PARITY_API, {len(exported)} symbols exported by "
      f"libparity.so, {len(static)} global symbols defined by libparity.a")

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
print(f"{len(checks) + len(problems) - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
