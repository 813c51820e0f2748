#!/usr/bin/env python3
"""Checks lib/'s layering: folders by layer, no cycle between its files.

    scripts/check-layers.py [BUILD_DIR]

The layers are the folders of lib/ in the order lib/meson.build lists them, lowest first. Two
graphs are checked:
  - includes: a file of lib/ includes a header of its own folder or of a lower one, never of a
    higher one; and no header includes itself through others;
  - symbols (with BUILD_DIR, a configured and built meson build directory; `nm` finds which
    object file defines each global symbol):
    - a header declares only what the files of its own folder define (no umbrella header
      declaring a higher layer's functions);
    - file A uses file B where A's object file refers to a symbol B's defines: B's folder is
      A's or a lower one;
    - file A sees file B where a header A includes (directly or through others) declares a
      symbol B defines; no two files see or use each other through any chain (a cycle), except
      inside lib/kernels/, where the run-time dispatch (cpu.c picks one of the tables, which
      share cpu.c's helpers) is a cycle by design.
Every file of lib/ also opens with a comment (what it holds) and has at most 900 lines.
Prints every violation with the files and symbols behind it, then a summary line; exits 1 on
any violation, 0 otherwise. Standard library only; needs `nm` (binutils) for the second graph.
"""
import os
import re
import subprocess
import sys

from graphs import sccs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(REPO, "lib")
EXEMPT_CYCLES = {"kernels"}
MAX_LINES = 900


def layers():
    """The folders of lib/ in their order, from lib/meson.build's `foreach layer : [...]`."""
    with open(os.path.join(LIB, "meson.build")) as f:
        m = re.search(r"foreach\s+layer\s*:\s*\[([^\]]*)\]", f.read())
    if not m:
        sys.exit("check-layers: lib/meson.build has no `foreach layer : [...]` list")
    return re.findall(r"'([^']+)'", m.group(1))


def sources(order):
    """Every .c and .h file of lib/, as paths relative to lib/ ('base/alloc.c')."""
    out = []
    for folder in order:
        for root, _, files in os.walk(os.path.join(LIB, folder)):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    out.append(os.path.relpath(os.path.join(root, f), LIB))
    stray = [f for f in os.listdir(LIB) if f.endswith((".c", ".h"))]
    return out, stray


def folder(path):
    return path.split(os.sep)[0]


def includes(path):
    """The lib/ headers that lib/PATH includes with quotes, resolved as the compiler does (the
    file's own directory, then lib/); headers outside lib/ (parity.h) are left out."""
    found = []
    with open(os.path.join(LIB, path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            for base in (os.path.dirname(path), ""):
                cand = os.path.normpath(os.path.join(base, m.group(1)))
                if os.path.isfile(os.path.join(LIB, cand)):
                    found.append((n, cand))
                    break
    return found


def objects(build, files):
    """{lib source path: object file} for the .c files of lib/, found under BUILD/lib: meson
    names an object of SUBDIR/x.c built from lib/ 'SUBDIR_x.c.o', and one built from
    lib/SUBDIR/ 'x.c.o' in a .p directory below BUILD/lib/SUBDIR."""
    objs = {}
    for root, _, names in os.walk(os.path.join(build, "lib")):
        for name in names:
            if name.endswith(".c.o"):
                rel = os.path.relpath(root, os.path.join(build, "lib")).split(os.sep)
                objs.setdefault(name, []).append((rel, os.path.join(root, name)))
    found, missing = {}, []
    for path in files:
        if not path.endswith(".c"):
            continue
        d, base = os.path.dirname(path), os.path.basename(path)
        cands = [p for rel, p in objs.get(d.replace(os.sep, "_") + "_" + base + ".o", [])]
        cands += [p for rel, p in objs.get(base + ".o", []) if rel[0] == d.split(os.sep)[0]]
        if cands:
            found[path] = max(cands, key=os.path.getmtime)
        else:
            missing.append(path)
    return found, missing


def strip_bodies(text):
    """text without what stands between braces (inline functions' bodies, struct members,
    initialisers): a call inside an inline function is a use, not a declaration."""
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def header_declarations(files, defined):
    """{header: the global symbols of the library that it declares}: a name defined by an
    object file that the header (comments and brace-enclosed bodies left out) writes as a
    prototype `name(`, or as an `extern` object."""
    out = {}
    for h in files:
        if not h.endswith(".h"):
            continue
        with open(os.path.join(LIB, h), encoding="utf-8") as f:
            text = strip_bodies(re.sub(r"/\*.*?\*/|//[^\n]*", "", f.read(), flags=re.S))
        names = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", text))
        names |= set(re.findall(r"\bextern\b[^;(]*?\b(\w+)\s*(?:\[[^\]]*\])?\s*;", text))
        out[h] = {s for s in names if s in defined}
    return out


def include_closure(files, inc_edges):
    """{file: every lib/ header it includes, directly or through other headers}."""
    out = {}
    for f in files:
        seen, todo = set(), [f]
        while todo:
            for h in inc_edges.get(todo.pop(), ()):
                if h not in seen:
                    seen.add(h)
                    todo.append(h)
        out[f] = seen
    return out


def nm(obj, *flags):
    out = subprocess.run(["nm", *flags, obj], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


def main():
    order = layers()
    rank = {f: i for i, f in enumerate(order)}
    files, stray = sources(order)
    problems = []
    for f in stray:
        problems.append("lib/%s: a file outside the layer folders" % f)
    for path in files:
        with open(os.path.join(LIB, path), encoding="utf-8") as f:
            text = f.read()
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append("lib/%s: %d lines, over %d" % (path, lines, MAX_LINES))
        if not text.lstrip().startswith(("/*", "//")):
            problems.append("lib/%s: does not open with a comment saying what it holds" % path)
    inc_edges = {}
    for path in files:
        for line, h in includes(path):
            inc_edges.setdefault(path, set()).add(h)
            if folder(h) not in rank:
                problems.append("lib/%s:%d includes lib/%s, outside the layer folders"
                                % (path, line, h))
            elif rank[folder(h)] > rank[folder(path)]:
                problems.append("lib/%s:%d includes lib/%s: %s/ is above %s/"
                                % (path, line, h, folder(h), folder(path)))
    for comp in sccs(files, inc_edges):
        if len(comp) > 1:
            problems.append("an include cycle: " + ", ".join("lib/" + c for c in comp))
    n_sym = 0
    if len(sys.argv) > 1:
        build = os.path.abspath(sys.argv[1])
        objs, missing = objects(build, files)
        for path in missing:
            problems.append("lib/%s: no object file under %s/lib (built?)" % (path, build))
        defined, used = {}, {}
        for path, obj in objs.items():
            for f in nm(obj, "--defined-only"):
                if len(f) == 3 and f[1] in "TDBRVWGS":
                    defined.setdefault(f[2], path)
            used[path] = {f[-1] for f in nm(obj, "--undefined-only") if f}
        sym_edges, why = {}, {}
        for path, syms in used.items():
            for s in syms:
                dep = defined.get(s)
                if dep and dep != path:
                    sym_edges.setdefault(path, set()).add(dep)
                    why.setdefault((path, dep), []).append(s)
        for (a, b), syms in sorted(why.items()):
            n_sym += 1
            if rank[folder(b)] > rank[folder(a)]:
                problems.append("lib/%s uses lib/%s (%s): %s/ is above %s/"
                                % (a, b, ", ".join(sorted(syms)[:4]), folder(b), folder(a)))
        declares = header_declarations(files, defined)
        for h, syms in sorted(declares.items()):
            alien = sorted(s for s in syms if folder(defined[s]) != folder(h))
            if alien:
                problems.append("lib/%s declares what another folder defines: %s"
                                % (h, ", ".join("%s (%s)" % (s, defined[s]) for s in alien[:6])
                                   + (" and %d more" % (len(alien) - 6) if len(alien) > 6 else "")))
        closure = include_closure(files, inc_edges)
        for path in objs:
            for h in closure.get(path, ()):
                for s in declares.get(h, ()):
                    dep = defined[s]
                    if dep != path:
                        sym_edges.setdefault(path, set()).add(dep)
                        why.setdefault((path, dep), []).append("%s via %s" % (s, h))
        for comp in sccs(sorted(objs), sym_edges):
            if len(comp) > 1 and not all(folder(c) in EXEMPT_CYCLES for c in comp):
                pairs = ["%s -> %s (%s)" % (a, b, ", ".join(sorted(why[(a, b)])[:2]))
                         for a in comp for b in comp if (a, b) in why]
                problems.append("a cycle of %d files that see or use each other (%s); for "
                                "example: %s%s" % (len(comp), ", ".join(comp), "; ".join(pairs[:6]),
                                                   " and %d more" % (len(pairs) - 6)
                                                   if len(pairs) > 6 else ""))
    for p in problems:
        print("check-layers: " + p)
    print("check-layers: %d folders (%s), %d files, %d include edges, %d use edges: %d problem%s"
          % (len(order), " < ".join(order), len(files), sum(len(v) for v in inc_edges.values()),
             n_sym, len(problems), "" if len(problems) == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
