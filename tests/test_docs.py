"""The documentation against the code: the site builds with ``mkdocs build --strict`` (a broken link, anchor or
page fails it), every ``memdpc`` command that README and docs/ show in a bash block parses with the command line
as it is (options, types, choices), and every Python block of docs/ runs (README's own blocks run whole in
tests/test_readme.py, tests/test_own_videos.py and tests/test_quickstart.py)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch

import memdpc
from memdpc.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
GPU_MARK = "<!-- gpu -->"  # a Python block that needs a CUDA device: run only where there is one


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def _expand(text: str, env: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` as ``env`` has them; any other variable (``${ckpt%%/*}``, one not set in the
    block) as a placeholder word."""
    text = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m[1], "x"), text)
    text = re.sub(r"\$\{[^}]*\}", "x", text)
    return re.sub(r"\$(\w+)", lambda m: env.get(m[1], "x"), text)


def _words(line: str) -> list[str]:
    """A shell line's words, with ``;``, ``&&`` and ``|`` as words of their own and comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def memdpc_lines(block: str) -> list[list[str]]:
    """The ``memdpc`` command lines of a bash block, as words: continued lines joined, comments dropped, the
    block's own variables (``NAME=value``, a loop's first value) expanded, env prefixes and ``torchrun … -m
    memdpc.cli`` taken off."""
    env: dict[str, str] = {}
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        segments: list[list[str]] = [[]]
        for word in _words(line):
            if word in (";", "&&", "||", "|"):
                segments.append([])
            else:
                segments[-1].append(word)
        for seg in segments:
            if seg[:1] in (["do"], ["done"]):
                seg = seg[1:]
            if seg[:1] == ["for"] and len(seg) >= 4 and seg[2] == "in":
                env[seg[1]] = _expand(seg[3], env)
                continue
            if len(seg) == 1 and re.fullmatch(r"\w+=.*", seg[0], re.S):
                name, value = seg[0].split("=", 1)
                env[name] = _expand(value, env)
                continue
            expanded = []
            for word in seg:  # an unquoted variable may hold several words ($common)
                value = _expand(word, env)
                expanded += value.split() if "$" in word else [value]
            seg = expanded
            while seg and re.fullmatch(r"\w+=\S*", seg[0]):  # RANK=0 WORLD_SIZE=16 memdpc …
                seg = seg[1:]
            if seg[:1] in (["torchrun"], ["srun"]) and "memdpc.cli" in seg:
                seg = ["memdpc", *seg[seg.index("memdpc.cli") + 1 :]]
            if seg[:1] == ["memdpc"]:
                found.append(seg[1:])
    return found


def parse(args: list[str]) -> None:
    """Parse one command line against the real command line (a group's own options too), without running it."""
    command, name, rest, parent = main, "memdpc", list(args), None
    while True:
        ctx = command.make_context(name, rest, parent=parent)
        if not isinstance(command, click.Group):
            return
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            return
        name, command, rest = command.resolve_command(ctx, rest)
        parent = ctx


def documented_commands() -> list[tuple[str, list[str]]]:
    return [
        (page.name, args)
        for page in [ROOT / "README.md", *PAGES]
        for block in bash_blocks(page.read_text())
        for args in memdpc_lines(block)
    ]


def test_the_site_builds_strictly(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    built = {p.parent.name for p in (tmp_path / "site").rglob("index.html")}
    assert {page.stem for page in PAGES if page.stem != "index"} <= built  # every page, in the nav or not
    # the generated references: every verb and option, every name of memdpc.__all__ with its docstring
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for verb in main.list_commands(click.Context(main)):
        assert f"memdpc {verb}" in cli, verb
    assert "--knn-shards" in cli and "--flow-backend" in cli
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in public_api():
        assert f"{name}" in api and inspect.getdoc(getattr(memdpc, name)).split()[0] in api, name
    assert "ARCHITECTURE" in (tmp_path / "site" / "architecture" / "index.html").read_text()


def public_api() -> list[str]:
    return [n for n in memdpc.__all__ if n != "__version__"]


def test_the_api_page_lists_every_public_name_from_its_home():
    lines = (ROOT / "docs" / "reference" / "api.md").read_text().splitlines()
    listed = [line.removeprefix("::: ") for line in lines if line.startswith("::: ")]
    assert listed == [f"{memdpc._HOMES[n]}.{n}" for n in public_api()]


def test_every_public_name_of_the_package_has_a_docstring():
    """What a module gives others (its ``__all__``) and defines itself, if a function or a class, says what it
    is (the API reference shows it)."""
    from tests.test_package_imports import modules

    missing = []
    for name in modules():
        module = importlib.import_module(name)
        for member in getattr(module, "__all__", []):
            obj = getattr(module, member, None)
            own = getattr(obj, "__module__", None) == name
            if own and (inspect.isfunction(obj) or inspect.isclass(obj)) and not inspect.getdoc(obj):
                missing.append(f"{name}.{member}")
    assert missing == []


def test_every_documented_command_parses():
    found = documented_commands()
    assert len(found) > 100 and {args[0] for _, args in found} >= {
        "index",
        "preprocess",
        "shard",
        "train",
        "eval",
    }
    failed = []
    for page, args in found:
        try:
            parse(args)
        except click.BadParameter as e:
            if "does not exist" not in e.message:  # a path the documented command reads, not here
                failed.append(f"{page}: memdpc {shlex.join(args)}: {e.format_message()}")
        except click.ClickException as e:
            failed.append(f"{page}: memdpc {shlex.join(args)}: {e.format_message()}")
    assert failed == []


def test_the_parser_sees_a_wrong_option_and_expands_the_blocks_variables():
    block = "S=rgb\nfor split in train val; do\n  memdpc shard f --index i --stream $S --out o --split $split \\\n    --blocks 4; done\n"
    assert memdpc_lines(block) == [
        ["shard", "f", "--index", "i", "--stream", "rgb", "--out", "o", "--split", "train", "--blocks", "4"]
    ]
    with pytest.raises(click.ClickException):
        parse(["shard", "f", "--no-such-option"])
    with pytest.raises(click.ClickException):
        parse(["eval", "probe", "ckpt.pt", "--shards", "s", "--out", "o", "--crops", "7"])
    parse(["eval", "--fuse", "a.json", "b.json", "--out", "f.json"])  # a group's own options


def python_blocks(text: str) -> list[tuple[bool, str]]:
    """(needs a GPU, code) of each Python block."""
    return [
        (bool(mark), code) for mark, code in re.findall(rf"({GPU_MARK}\n)?```python\n(.*?)```", text, re.S)
    ]


@pytest.mark.parametrize("page", [p for p in PAGES if "```python" in p.read_text()], ids=lambda p: p.name)
def test_every_python_block_of_the_docs_runs(page, tmp_path):
    blocks = [
        code
        for gpu, code in python_blocks(page.read_text())
        if torch.cuda.is_available() or not gpu  # without CUDA a GPU block is left out
    ]
    res = subprocess.run(
        [sys.executable, "-c", "\n".join(blocks)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
