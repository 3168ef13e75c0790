"""bench/soak.py: the memory windows of a run's progress, and a tiny run of every stage through the real command
line with its process tree sampled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak import summarise

ROOT = Path(__file__).resolve().parents[2]
MB = 2**20


def test_growth_is_measured_between_the_warm_up_and_the_end_of_the_work():
    """Progress 0 (imports) and 1 (the work done, workers shutting down) count in no window; the start is the
    first sample whose progress moved."""
    samples = [{"progress": 0.0, "main": 10 * MB, "workers": 0}]  # imports
    samples += [
        {"progress": p / 100, "main": (100 + p // 10) * MB, "workers": 50 * MB} for p in range(1, 100)
    ]
    samples += [{"progress": 1.0, "main": 500 * MB, "workers": 1 * MB}]  # shutting down
    out = summarise(samples, warm_up=0.2)
    assert out["main"] == {"start": 100.0, "warm-up": 102.0, "end": 109.0, "growth": 0.0686, "peak": 500.0}
    assert out["workers"]["growth"] == 0.0 and out["workers"]["end"] == 50.0


@pytest.mark.slow
def test_a_tiny_soak_samples_every_stage_and_its_workers(tmp_path):
    out = tmp_path / "soak.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--videos", "20", "--epochs", "4", "--batch-size", "4"]
        + ["--backends", "torch", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "largest growth after warm-up" in res.stdout
    result = json.loads(out.read_text())
    assert list(result["samples"]) == ["preprocess", "shard", "train (torch)"] and result["videos"] == 20
    # the workers were sampled: a tiny epoch's DataLoader workers may live between two of the samples kept
    assert result["peaks"]["preprocess"]["workers"] > 0 and result["peaks"]["train (torch)"]["workers"] > 0
    train = result["samples"]["train (torch)"]
    assert 0 < max(s["progress"] for s in train) <= 3 / 4  # the epoch in progress: the last one is 3 of 4
