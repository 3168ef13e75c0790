"""README's Python block (*From Python*) runs as it is written, in a folder holding a real quickstart run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"<!-- ci:python -->\n```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_the_python_block():
    (block,) = python_blocks()
    assert "import memdpc" in block


def test_the_python_block_runs_as_written(tiny_quickstart, tmp_path):
    (tmp_path / "quickstart").symlink_to(tiny_quickstart)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run(
        [sys.executable, "-c", python_blocks()[0]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [line for line in res.stdout.splitlines() if line.strip()]  # (progress bars leave blank lines)
    assert lines[0].startswith("rgb ") and len(lines) == 5, res.stdout


def test_every_file_of_the_repository_the_readmes_and_the_docs_name_exists():
    """A path into the repository (its first folder is one of the checkout's) names a file that is there."""
    root = README.parent
    folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    missing = []
    pages = [
        README,
        root / "CONTRIBUTING.md",
        root / "bench" / "README.md",
        *sorted((root / "docs").glob("*.md")),
    ]
    for readme in pages:
        for path in set(re.findall(r"`([\w./-]+\.(?:py|sh|json|md|yaml))`", readme.read_text())):
            if path.split("/")[0] in folders and not (root / path).exists():
                missing.append(f"{readme.relative_to(root)}: {path}")
    assert missing == []
