"""The package's import graph, read from the code (every module's AST): the edges between packages, and
the rules ARCHITECTURE.md §1 states — dependencies follow the data (each package imports only those on a lower
layer of :data:`LAYERS`), eval never imports train, no two modules import each other, nothing of the package
imports the developer benchmarks, and no imports inside functions but the allowed ones below. (``importlib.import_module`` calls, which
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
# the layers, lowest first: a package imports only packages of lower layers (the data flows upward: preprocess →
# pipeline → model → train → eval; the recipes, settings of the runs, below those runs; the reports above them,
# the command line on top)
LAYERS = (
    ("common",),
    ("preprocess", "model"),
    ("viz", "pipeline"),
    ("recipes",),
    ("train", "eval"),
    ("report",),
    ("quickstart",),
    ("commands",),
    ("cli",),
)
PACKAGES = tuple(p for layer in LAYERS for p in layer if p not in ("quickstart", "cli"))
# outside the package: the developers' benchmarks (bench/), CI's scripts (.ci/)
SKIP = {"tests", "bench", ".ci", ".venv", ".git", "build"}
# the files that may import inside functions, and why
LAZY_PREFIXES = (
    "commands/",  # each verb imports its stage when it runs, so `memdpc --help` starts without torch
    # the opencv workers import it without torch; a GPU backend imports torch when built
    "preprocess/flow/backends.py",
)
# optional dependencies, imported where they are used: DALI and Dask's client ([cluster])
LAZY_MODULES = ("nvidia.dali", "distributed")


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


def _is_type_checking(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
    )


def _imported(module: str, path: Path, tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """The memdpc modules (or names) one module imports, with the import node."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    out = []
    typing_only = {  # `if TYPE_CHECKING:` imports, which never run
        id(n) for block in ast.walk(tree) if _is_type_checking(block) for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
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
        if allowed and rel.startswith(LAZY_PREFIXES):
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


def exports(path: Path) -> set[str] | None:
    """A module's ``__all__``, or None where it has none."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def unexported(root: Path = ROOT) -> list[str]:
    """Names that the package's modules and the benchmarks import from a module of the package that its
    ``__all__`` does not list (or that has no ``__all__``): an internal used from outside."""
    mods = modules(root)
    importers = {**mods, **{f"bench.{p.stem}": p for p in (root / "bench").glob("*.py")}}
    out = set()
    for module, path in importers.items():
        for name, node in _imported(module, path, ast.parse(path.read_text(), str(path))):
            target, attr = name.rsplit(".", 1)
            if name in mods or target not in mods or target == module or not isinstance(node, ast.ImportFrom):
                continue
            listed = exports(mods[target])
            if listed is None or attr not in listed:
                out.add(f"{module} imports {attr} from {target}")
    return sorted(out)


def test_what_a_module_gives_others_is_in_its_all():
    assert unexported() == []


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


def layer_violations(edges) -> list[str]:
    """The package edges that go down no layer (to a package of the same or a higher layer)."""
    rank = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    return [f"{a} -> {b}: {imports[0]}" for (a, b), imports in sorted(edges.items()) if rank[a] <= rank[b]]


def test_dependencies_follow_the_data():
    assert layer_violations(graph()) == []


def test_an_upward_import_is_found():  # the check itself can fail
    assert layer_violations({("pipeline", "train"): ["memdpc.pipeline.x -> memdpc.train.y"]}) == [
        "pipeline -> train: memdpc.pipeline.x -> memdpc.train.y"
    ]


def test_the_root_holds_at_most_three_modules():
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "cli.py", "quickstart.py"]


def test_the_package_never_imports_the_benchmarks():
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not [n for n in names if n.split(".")[0] == "bench"], module


@pytest.mark.parametrize(
    "script", sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")
)
def test_every_benchmark_imports(script):
    """The benchmarks, which no other test imports whole: a name they import that moved or went is found here."""
    importlib.import_module(f"bench.{script}")


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_imports(module):
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
    outside = [line for line in every if not line.startswith("commands/")]
    print(
        f"imports inside functions: {len(every)}, outside commands/ {len(outside)}, in eval/ "
        f"{sum(line.startswith('eval/') for line in every)}"
    )
    lazy = function_imports(root)
    print(f"  not allowed ({', '.join(LAZY_PREFIXES)} and {', '.join(LAZY_MODULES)} are): {len(lazy)}")
    print(f"layer violations: {layer_violations(edges) or 'none'}")
    for line in lazy:
        print(f"    {line}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
