"""The package's import graph, read from the code (every module's AST): the edges between packages, and
the rules ARCHITECTURE.md §1 states — eval never imports train, no two packages or modules import each
other, and no imports inside functions but the allowed ones below. (``importlib.import_module`` calls, which
the AST does not follow, stay within their package: ``memdpc.model``'s names, the flow backends.)

Run as a script, it prints the package → package edges, of this tree or of another checkout's:
    python tests/test_package_imports.py [ROOT]
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the package memdpc is the repository root
PACKAGES = ("preprocess", "pipeline", "model", "train", "eval", "bench")
SKIP = {"tests", ".venv", ".git", "build"}
# the files that may import inside functions, and why
LAZY_FILES = {
    "cli.py",  # each verb imports its stage when it runs, so `memdpc --help` starts without torch
    # the opencv workers import it without torch; a GPU backend imports torch when built
    "preprocess/flow/backends.py",
}
# optional dependencies, imported where they are used: DALI, Dask's client ([cluster]), and the collectives
# of torch.distributed.nn, which torch builds without distributed support lack
LAZY_MODULES = ("nvidia.dali", "distributed", "torch.distributed.nn")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package, by dotted name (memdpc.train.loop) → file."""
    found = {}
    tops = [p for p in root.iterdir() if p.name not in SKIP and not p.name.endswith(".egg-info")]
    paths = [p for p in tops if p.suffix == ".py"] + [f for p in tops if p.is_dir() for f in p.rglob("*.py")]
    for path in sorted(paths):
        rel = path.relative_to(root)
        parts = ["memdpc", *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """The memdpc modules (or names) one module imports, with the import node."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node) for a in node.names if a.name.split(".")[0] == "memdpc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.split(".")[0] != "memdpc":
                continue
            out += [(f"{name}.{a.name}", node) for a in node.names]  # `from memdpc import train` is a module
    return out


def unit(module: str) -> str:
    """The node of the package graph a module belongs to: its package, or itself for a root module."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in PACKAGES:
        return parts[1]
    return parts[1] if len(parts) >= 2 else "memdpc"


def module_edges(root: Path = ROOT) -> set[tuple[str, str]]:
    """(module, module) for every import of one memdpc module by another, wherever it stands in the file."""
    mods = modules(root)
    edges = set()
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for name, _node in _imported(module, path, tree):
            target = name
            while target not in mods and "." in target:  # `from memdpc.x import func` → memdpc.x
                target = target.rsplit(".", 1)[0]
            if target != module:
                edges.add((module, target))
    return edges


def graph(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(package, package) → the imports behind the edge, as 'module -> module'."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, target in sorted(module_edges(root)):
        a, b = unit(module), unit(target)
        if a != b and b != "memdpc":
            edges.setdefault((a, b), []).append(f"{module} -> {target}")
    return edges


def cycles(edges) -> list[list[str]]:
    """Every strongly connected set of more than one package (Tarjan)."""
    adj: dict[str, list[str]] = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, [])
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def function_imports(root: Path = ROOT, allowed: bool = True) -> list[str]:
    """Imports inside functions (with ``allowed``, outside the files and optional modules allowed them)."""
    out = []
    for _module, path in modules(root).items():
        rel = path.relative_to(root).as_posix()
        if allowed and rel in LAZY_FILES:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or "."]
                else:
                    continue
                if not (allowed and all(n.startswith(LAZY_MODULES) for n in names)):
                    out.append(f"{rel}:{node.lineno} {', '.join(names)}")
    return sorted(set(out))


def test_eval_never_imports_train():
    assert ("eval", "train") not in graph()


def test_no_import_cycle_between_packages():
    assert cycles(graph()) == []


def test_no_import_cycle_between_modules():
    assert cycles(module_edges()) == []


def test_every_package_module_is_seen():
    mods = modules()
    for pkg in PACKAGES:
        assert f"memdpc.{pkg}" in mods
    assert {"train", "eval", "pipeline", "model", "preprocess"} <= {a for a, _ in graph()}


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_imports(module):
    """Also the benchmarks, which no other test imports: a name they import that moved or went is found here."""
    importlib.import_module(module)


def test_imports_at_the_top():
    assert function_imports() == []


def test_cycles_are_found():  # the check itself can fail
    assert cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]


def main(root: Path = ROOT) -> None:
    edges = graph(root)
    for a, b in sorted(edges):
        print(f"{a} -> {b}  ({len(edges[a, b])} module pairs)")
    print(f"package cycles: {cycles(edges) or 'none'}; module cycles: {cycles(module_edges(root)) or 'none'}")
    print(f"eval -> train: {('eval', 'train') in edges}")
    every = function_imports(root, allowed=False)
    outside_cli = [line for line in every if not line.startswith("cli.py:")]
    print(
        f"imports inside functions: {len(every)}, outside cli.py {len(outside_cli)}, in eval/ "
        f"{sum(line.startswith('eval/') for line in every)}"
    )
    lazy = function_imports(root)
    print(f"  not allowed ({', '.join(sorted(LAZY_FILES))} and {', '.join(LAZY_MODULES)} are): {len(lazy)}")
    for line in lazy:
        print(f"    {line}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
