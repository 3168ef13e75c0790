"""ARCHITECTURE.md against the tree: every module and folder it names exists, every package and every module of
the package is named in its map (§1), so that the map is redrawn when the layout changes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "ARCHITECTURE.md").read_text()
MAP = TEXT.split("## 1. Data flow", 1)[1].split("\n## 2.", 1)[0]
OUTSIDE = ("tests", "bench", ".ci", ".venv", ".git", "build")


def package_files() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in OUTSIDE and not p.parts[-2].endswith(".egg-info")
    )


def named(text: str) -> set[str]:
    """Every `x.py`, `x/` or `x/y.py` the text names in backticks (not a placeholder such as `DIR/report/`)."""
    return {m for m in re.findall(r"`([\w./-]+(?:\.py|/))`", text) if not m.split("/")[0].isupper()}


def test_every_module_and_folder_named_exists():
    names = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    missing = []
    for name in named(TEXT):
        if "/" in name.rstrip("/") or name.endswith("/"):
            if not (ROOT / name).exists() and not any(
                (ROOT / d / name).exists() for d in ("preprocess", "pipeline", "model", "train", "eval")
            ):
                missing.append(name)
        elif name not in names:
            missing.append(name)
    assert missing == []


def test_every_package_and_module_is_on_the_map():
    words = named(MAP)
    modules = [p for p in package_files() if p.name != "__init__.py"]
    packages = sorted(
        {p.parent.as_posix() + "/" for p in package_files() if p.name == "__init__.py"} - {"./"}
    )
    assert [p for p in packages if p not in words] == []
    # a module is named with its folder, or by its name in its package's row
    rows = {
        line.split("|")[2].strip(" `"): line
        for line in MAP.splitlines()
        if line.startswith("| ") and "`" in line
    }
    unnamed = []
    for m in modules:
        folder = m.parent.as_posix() + "/" if m.parent != Path(".") else ""
        if m.as_posix() in words or (not folder and f"{m.name}" in words):
            continue
        if f"`{m.name}`" not in rows.get(folder, "") and f"`{m.name}`" not in rows.get(m.name, ""):
            unnamed.append(m.as_posix())
    assert unnamed == []


MAX_FUNCTION_LINES = 80  # a function longer than this holds more than one job: split it


def test_no_function_of_the_package_is_longer_than_a_screen_and_the_loop_is_short():
    long = []
    for path in package_files():
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []
    assert len((ROOT / "train" / "loop.py").read_text().splitlines()) < 400
