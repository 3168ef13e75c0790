"""common/console.py: a real `memdpc` process whose output is a pipe prints its tables whole, however long a title
or a cell (at 80 columns a path in a title broke mid-word)."""

from __future__ import annotations

import os
import subprocess
import sys

from memdpc.common.console import PIPE_WIDTH, rich_console

from ..conftest import memdpc_command


def test_a_pipe_gets_whole_tables_and_a_terminal_or_columns_its_own_width(
    tiny_dataset, tmp_path, monkeypatch
):
    from memdpc.preprocess.datasets import build_index
    from memdpc.preprocess.video_index import write_index

    monkeypatch.delenv("COLUMNS", raising=False)  # as a shell's pipe: no width set (pytest-xdist may set one)
    write_index(build_index(tiny_dataset, "ucf101", 1), tmp_path / "index.jsonl")
    out = tmp_path / (
        "frames-of-a-folder-whose-name-alone-is-longer-than-a-line-of-eighty-columns-" + "x" * 20
    )
    args = ["preprocess", "frames", tmp_path / "index.jsonl", "--out", out, "--workers", "1", "--size", "16"]
    res = subprocess.run(memdpc_command(*args), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert f"preprocess rgb → {out}" in res.stdout.splitlines()[0]  # the title on one line
    assert rich_console().width == PIPE_WIDTH  # pytest's output is captured: not a terminal
    script = "from memdpc.common.console import rich_console; print(rich_console(stderr=True).width)"
    env = {**os.environ, "COLUMNS": "120"}
    assert (
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env).stdout
        == "120\n"
    )
