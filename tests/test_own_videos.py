"""README's "Your own videos" block, run verbatim (only its three settings at the top changed) on a messy folder
of generated videos, on the DALI loader, to the fused tables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memdpc.preprocess.report import read_report

from .conftest import MESSY_BROKEN, MESSY_VIDEOS

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(marker: str) -> str:
    """The ```bash block that follows ``<!-- marker -->`` in README.md."""
    text = README.read_text()
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```bash\n(.*?)```", text, re.S)
    assert match, f"README.md has no bash block after <!-- {marker} -->"
    return match[1]


def with_settings(block: str, **settings: str) -> str:
    """The block with the values of its ``NAME=value`` setting lines replaced; each must be there."""
    for name, value in settings.items():
        block, n = re.subn(rf"^{name}=\S+", f"{name}={value}", block, flags=re.M)
        assert n == 1, f"README's block sets {name} {n} times"
    return block


@pytest.mark.slow
def test_readme_own_videos_block_runs_on_a_messy_folder_to_the_fused_tables(messy_folder, tmp_path):
    """README's block on the DALI loader, which ``BACKEND=auto`` takes where it is installed (the torch loader on
    frames of mixed sizes: tests/pipeline/test_loader.py; its whole chain: the tiny quickstart's test)."""
    work = tmp_path / "work"
    backend = "dali"
    script = with_settings(
        readme_block("ci:own-videos"), VIDEOS=str(messy_folder), WORK=str(work), BACKEND=backend
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "200",
        "OMP_NUM_THREADS": "2",
    }
    res = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, env=env, timeout=1500)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    assert "VIDEOIO" not in output and "[mjpeg @" not in output  # FFmpeg's messages went to the report

    # one test and one val video per class, among the files that read
    index = [json.loads(line) for line in (work / "index.jsonl").read_text().splitlines()]
    assert len(index) == len(MESSY_VIDEOS) + len(MESSY_BROKEN)
    for split in ("test", "val"):
        assert sorted(r["label_name"] for r in index if r["split"] == split) == [
            "jumping",
            "spinning",
            "zooming",
        ]

    # the broken files are reported with their reason, every real video made it
    failures = [v for v in read_report(work / "frames").entries("flow").values() if v["status"] == "failed"]
    failed = {Path(f["path"]).relative_to(messy_folder).as_posix(): f["reason"] for f in failures}
    assert sorted(failed) == sorted(MESSY_BROKEN)
    assert {f["split"] for f in failures} == {"train"}  # the held-out splits lost nothing
    assert "truncated" in failed[MESSY_BROKEN[0]] and "not a readable video" in failed[MESSY_BROKEN[1]]
    for name in MESSY_BROKEN:
        assert f"failed {name.replace('/', '__').rsplit('.', 1)[0]}" in output
    assert len(list((work / "frames" / "flow").glob("*.tar"))) == len(MESSY_VIDEOS)

    # frames of several sizes, a portrait one among them, go through shards, training and evaluation
    sizes = json.loads((work / "shards" / "rgb" / "manifest-train.json").read_text())["frame_sizes"]
    assert len(sizes) == 3 and any(s["height"] > s["width"] for s in sizes)
    for stream in ("rgb", "flow"):
        config = (work / "runs" / stream / "config.yaml").read_text()
        assert re.search(r"^val_split: val$", config, re.M) and f"backend: {backend}" in config
    fused = {
        kind: json.loads((work / "eval" / f"fused-{kind}.json").read_text())
        for kind in ("retrieval", "probe")
    }
    assert {f["stream"] for f in fused.values()} == {"rgb+flow"}
    assert {"R@1", "R@5"} <= fused["retrieval"]["metrics"].keys() and fused["probe"]["counts"]["videos"] == 3
    for kind in fused:
        assert f"wrote {work / 'eval' / f'fused-{kind}.json'}" in output
