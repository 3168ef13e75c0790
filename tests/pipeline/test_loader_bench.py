"""``memdpc bench loader`` (pipeline/loader_bench.py) on shards made by README's recipe: the clip geometry and frame
sizes come from the manifest, and a wrong folder is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import MIXED_FRAME_SIZES, run_memdpc


@pytest.fixture(scope="module")
def stride_one_shards(mixed_size_frames, tmp_path_factory) -> Path:
    """README's recipe (`--clip-stride 1`, small shards) with a short clip, on frames of three sizes."""
    out = tmp_path_factory.mktemp("bench_loader") / "shards"
    index = ["--index", mixed_size_frames / "index.jsonl"]
    cut = "--window-step 2 --clip-stride 1 --max-count 4 --blocks 4 --block-len 3".split()
    where = ["--stream", "rgb", "--out", out, "--split", "train"]
    res = run_memdpc("shard", mixed_size_frames / "frames", *index, *where, *cut)
    assert res.returncode == 0, res.stderr
    return out


@pytest.mark.slow
def test_bench_loader_on_stride_one_shards_of_mixed_frame_sizes(stride_one_shards, tmp_path):
    out = tmp_path / "loader.json"
    res = run_memdpc(
        "bench",
        "loader",
        stride_one_shards,
        "--size",
        "16",
        "--batch-size",
        "2",
        "--batches",
        "2",
        "--repeat",
        "1",
        "--workers",
        "1",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    result = json.loads(out.read_text())
    assert result["clip"] == {"num_blocks": 4, "block_len": 3, "stride": 1}
    assert {tuple(hw) for hw in result["frame_sizes"]} == MIXED_FRAME_SIZES
    rows = {(r["backend"], r["augmentation"]): r for r in result["results"]}
    assert set(rows) == {(b, a) for b in ("torch", "dali") for a in ("full", "off")}
    assert all(r["clips"] == 4 and r["clips_per_s"] > 0 for r in rows.values())
    assert result["size_off"] == 24  # augmentation off: the smallest short side, no frame upsampled
    assert "DALI CPU / torch with full augmentation" in res.stdout


@pytest.mark.parametrize(
    "where, extra, message",
    [
        ("frames", [], "frames: no shard manifests (manifest-<split>.json) here or in its stream folders"),
        ("shards/rgb", [], "shards/rgb: a stream's folder; give the shard folder that holds it"),
        ("shards", ["--split", "test"], "shards: no rgb/test shards (it holds rgb/train); choose with"),
    ],
)
def test_bench_loader_on_a_wrong_folder_is_a_one_line_error(
    mixed_size_frames, stride_one_shards, where, extra, message
):
    folder = {
        "frames": mixed_size_frames / "frames",
        "shards": stride_one_shards,
        "shards/rgb": stride_one_shards / "rgb",
    }[where]
    res = run_memdpc("bench", "loader", folder, *extra, cwd=folder.parent)
    assert res.returncode == 2
    assert message.split(":", 1)[1] in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
