"""bench/flow_e2e.py at tiny sizes on the CPU (the Triton kernels in their interpreter, the batched stage with
the torch backend): every part produces its rows, so the one GPU run does not fail on a typo; and the
fidelity rows read their frames and OpenCV's flows from a reference file made beforehand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.flow_e2e import CHECKS, DATASETS, LENGTHS

ROOT = Path(__file__).resolve().parents[2]  # the checkout, where the package `bench` stands
QUICK = ["--quick", "--device", "cpu", "--backend", "torch"]
SIZES = (32, 24)  # --quick's, largest first


def run(*args, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [sys.executable, "-m", "bench.flow_e2e", *QUICK, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.slow
def test_every_part_gives_its_rows(tmp_path):
    res = run("--sequential-videos", "2", "--out", tmp_path / "flow.json", cwd=tmp_path)
    out = json.loads((tmp_path / "flow.json").read_text())
    assert {(r["size"], r["kernel"], r["batch"]) for r in out["kernel"]} == {
        (s, k, b) for s in SIZES for k, b in (("triton", 2), ("triton", 4), ("torch", 4))
    }
    assert [r["size"] for r in out["roofline"]] == list(SIZES) and all(
        r["iterations_mean"] > 0 for r in out["roofline"]
    )
    assert {(r["size"], r["frames"]) for r in out["fidelity"]} == {
        (s, f) for s in SIZES for f in ("rendered", "video files")
    }
    assert all(r["epd_mean"] < 0.02 and r["identical_codes"] > 0.99 for r in out["fidelity"])
    assert {(r["size"], r["checks"]) for r in out["compaction"]} == {(s, c) for s in SIZES for c in CHECKS}
    pairs = sum(max(2, round(6 * LENGTHS[k % len(LENGTHS)])) - 1 for k in range(4))  # 4 videos, mean 6 frames
    steady = {r["size"]: r for r in out["steady"]}
    assert set(steady) == set(SIZES)
    for r in steady.values():
        assert r["pairs"] == pairs and r["failed"] == 0 and r["backend"] == "torch"
        for key in (
            "pairs_per_s",
            "steady_pairs_per_s",
            "kernel_pairs_per_s",
            "first_archive_s",
            "cores_busy",
            "cores_per_1000",
            "steady_over_kernel",
        ):
            assert r[key] > 0, key
        assert (
            0 < r["device_busy"] < 1 and 0 <= r["waited_for_frames"] < 1 and 0 <= r["waited_for_encoders"] < 1
        )
    assert [(r["in_flight"], r["pairs"]) for r in out["in_flight"]] == [(1, 2 + 3), (2, 2 + 3)]  # 2 videos
    projection = {(r["dataset"], r["cards"]): r for r in out["projection"]}
    assert set(projection) == {(d[0], c) for d in DATASETS for c in (1, 8)}
    for name, *_ in DATASETS:
        one, eight = projection[name, 1], projection[name, 8]
        assert one["hours"] == pytest.approx(8 * eight["hours"]) and eight["cpu_cores"] == pytest.approx(
            8 * one["cpu_cores"]
        )
    for title in (
        "Kernels on",
        "Roofline",
        "Fidelity",
        "distinct decoded pairs",
        "End to end",
        "where its time",
        "two batches in flight",
        "Projection from the steady state at 32²",
    ):
        assert title in res.stdout, title


@pytest.mark.slow
def test_the_fidelity_rows_read_a_reference_made_beforehand(tmp_path):
    """The GPU machine has no OpenCV contrib: the frames and OpenCV's flows come from --make-reference (here
    one flow of it is moved 3 px to the right, and its row says so)."""
    ref = tmp_path / "ref.npz"
    run("--make-reference", ref, cwd=tmp_path)
    saved = dict(np.load(ref))
    assert set(saved) == {"params"} | {
        f"{s}/{f}/{k}" for s in SIZES for f in ("rendered", "video") for k in ("prev", "next", "flow")
    }
    saved["32/video/flow"][..., 0] += 3
    np.savez(ref, **saved)
    run("--parts", "fidelity", "--reference", ref, "--out", tmp_path / "flow.json", cwd=tmp_path)
    out = json.loads((tmp_path / "flow.json").read_text())
    rows = {(r["size"], r["frames"]): r for r in out["fidelity"]}
    assert rows.pop((32, "video files"))["epd_mean"] == pytest.approx(3, abs=0.01)
    assert len(rows) == 3 and all(r["epd_mean"] < 0.02 for r in rows.values()) and out["steady"] == []
