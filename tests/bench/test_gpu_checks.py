"""bench/gpu_checks.sh's steps, their very commands run on the CPU at tiny settings (CHECKS_DEVICE=cpu), so that
the script's first run on a GPU does not fail on a typo."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _checks(out: Path, only: str, timeout: float) -> subprocess.CompletedProcess:
    """bench/gpu_checks.sh OUT on the CPU (CHECKS_DEVICE=cpu), its steps matching ``only``."""
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_checks.sh"), str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CHECKS_DEVICE": "cpu", "CHECKS_ONLY": only, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_the_training_steps_run_and_write_every_table(tmp_path):
    out = tmp_path / "checks"
    res = _checks(out, "train*", timeout=900)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-2:] == ["train: exit 0", "train_compiled: exit 0"], res.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "train.json",
        "train.log",
        "train_compiled.json",
        "train_compiled.log",
    ]
    fast, compiled = (json.loads((out / f"{name}.json").read_text()) for name in ("train", "train_compiled"))
    assert list(fast["variants"]) == ["eager", "fast", "bf16", "graphs", "graphs-bf16"]
    assert list(compiled["variants"]) == ["compile-graphs-bf16", "compile-graphs"]
    for result, batches in ((fast, {"2", "3"}), (compiled, {"2"})):  # the compiled ones compile once on a CPU
        for r in result["variants"].values():
            assert set(r["batches"]) == batches and all(b["clips_per_s"] > 0 for b in r["batches"].values())
            assert "profile" in r and len(r["curve"]) == 3
    assert compiled["variants"]["compile-graphs"]["warnings"] == [
        "--cuda-graphs needs a CUDA device; training on cpu without"
    ]  # compiled (the tracer), without a warning
    # the compiled variants' curves against train.json's eager runs
    assert set(compiled["loss_curve_max_abs_diff"]) == {"eager 2", "compile-graphs-bf16", "compile-graphs"}
    assert compiled["loss_curves"]["eager"] == fast["loss_curves"]["eager"]
    assert "loss curve, 3 steps from one seed" in (out / "train_compiled.log").read_text()


@pytest.mark.slow
def test_the_flow_storage_step_decodes_every_encoding_with_dali(tmp_path):
    """The step that measures the stored flow as the GPU loader decodes it, run with DALI's CPU decoder: every
    candidate's row has DALI's errors, and the default (greyscale planes) comes back without drift."""
    out = tmp_path / "checks"
    res = _checks(out, "flow_storage", timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "flow_storage: exit 0", res.stdout
    rows = json.loads((out / "flow_storage.json").read_text())["storage"]
    default = next(r for r in rows if r["default"])
    assert default["encoding"] == "jpeg-q100-planes" and all(r["dali"]["device"] == "cpu" for r in rows)
    assert max(abs(default["dali"]["signed_x"]), abs(default["dali"]["signed_y"])) <= 0.02
    assert default["dali"]["abs_x"] == default["abs_x"]  # libjpeg-turbo in DALI as in OpenCV


@pytest.mark.slow
def test_the_learning_step_runs_a_cell_and_writes_its_table_and_curves(tmp_path):
    """The learning scan's step, with the smoke plan's one tiny cell on the CPU: its table, curves and cells come
    back under OUT_DIR, its work folder (videos, shards) does not."""
    out = tmp_path / "checks"
    res = _checks(out, "learn", timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "learn: exit 0", res.stdout
    assert sorted(p.name for p in out.iterdir()) == ["learn.json", "learn.log", "learn.md", "learn.png"]
    (cell,) = json.loads((out / "learn.json").read_text())
    assert cell["cell"]["name"] == "smoke" and cell["curve"] and cell["paired"]
