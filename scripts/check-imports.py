"""Fails (exit 1) when the modules of the `parity` package import each other in a cycle.

    scripts/check-imports.py [--graph]

Reads every .py file under python/parity with the standard library's ast and follows each
`import` and `from ... import` that names a module of the package, the ones inside functions
(imported on first use) included: a deferred import is still a dependency. A module's implicit
import of its own package's __init__ is not counted (every submodule has it). --graph prints
every edge. The cycles found are printed as module lists, one a line.
"""
import ast
import os
import sys

from graphs import sccs

PACKAGE = "parity"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", PACKAGE)


def module_files():
    """{dotted module name: path} of every module under ROOT (a package is its __init__)."""
    out = {}
    for root, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(root, f), os.path.dirname(ROOT))[:-3]
            parts = rel.split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = os.path.join(root, f)
    return out


def imports_of(name, path, modules):
    """The modules of the package that the module `name` (file `path`) imports."""
    is_package = os.path.basename(path) == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                if node.module:
                    base += node.module.split(".")
                source = ".".join(base)
            else:
                source = node.module or ""
            if source not in modules:
                continue
            # `from P import m` imports the submodule P.m when there is one, P otherwise
            for alias in node.names:
                sub = source + "." + alias.name
                found.add(sub if sub in modules else source)
    found.discard(name)
    # a module's own package is imported before it in any case: not an edge of its own
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return found - parents


def cycles(graph):
    """The strongly connected components of more than one module, each sorted."""
    return [c for c in sccs(sorted(graph), graph) if len(c) > 1]


def main(argv):
    modules = module_files()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    if "--graph" in argv:
        for name in sorted(graph):
            for target in sorted(graph[name]):
                print("%s -> %s" % (name, target))
    found = cycles(graph)
    for component in found:
        print("import cycle: %s" % " <-> ".join(component))
    if not found:
        print("%d modules of %s, %d imports between them, no cycle"
              % (len(graph), PACKAGE, sum(len(v) for v in graph.values())))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
