"""bench/flow.py's throughput part at a small size: 4:3 videos decoded at a short side, one worker and two, the
backend preprocess chooses (or the one given), every pair counted."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_recipe import run_bench


@pytest.mark.slow
@pytest.mark.parametrize("backend,expected", [("auto", "native"), ("opencv", "opencv")])
def test_the_throughput_runs_count_every_pair_with_each_worker_count(tmp_path, backend, expected):
    out = tmp_path / "flow.json"
    args = ["--parts", "throughput", "--videos", "2", "--frames", "5", "--source", "64x48", "--size", "32"]
    res = run_bench("bench.flow", *args, "--flow-backend", backend, "--workers", "2", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["throughput"]
    assert [r["workers"] for r in rows] == [1, 2]
    assert all(r["pairs"] == 2 * 4 and r["backend"] == expected and r["pairs_per_s"] > 0 for r in rows)
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0
    assert f"flow backend {expected}" in res.stdout
