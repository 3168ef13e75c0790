"""bench/train.py on the CPU at tiny settings: every variant's loss curve against eager's two runs, its profile
(every kind of work and part of the model, shares adding up, the layout copies counted) and its throughput per
batch size, where a batch that does not fit is a one-line row."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bench.step_profile import KINDS
from memdpc.model.parts import PARTS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # the benchmark itself, end to end, in fresh processes

TINY = [
    "--device",
    "cpu",
    "--size",
    "32",
    "--widths",
    "4,8,16,16",
    "--mem-size",
    "16",
    "--steps",
    "10",
    "--curve-steps",
    "3",
    "--profile-steps",
    "1",
    "--backends",
    "",
]
TOO_BIG = 100_000  # clips: 49 GB of input alone


def _capped_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, resource.RLIM_INFINITY))  # so that TOO_BIG really fails


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench_train") / "train.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.train",
            *TINY,
            "--variants",
            "eager,fast",
            "--batch-sizes",
            f"2,{TOO_BIG}",
            "--profile",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_capped_address_space,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text()), res.stdout


def test_each_variant_and_batch_size_gets_a_throughput_row(bench):
    result, stdout = bench
    assert (
        list(result["variants"]) == ["eager", "fast"] and result["card"] == "CPU" and result["peak"] is None
    )
    for name, r in result["variants"].items():
        row = r["batches"]["2"]
        assert row["clips_per_s"] > 0 and row["peak_memory"] > 0 and row["share_of_peak"] is None
        assert row["tflop_per_s"] == pytest.approx(result["flops_per_clip"]["2"] * row["clips_per_s"] / 1e12)
        if name == "eager":
            assert row["ratio_to_eager"] == 1.0
    assert "eager fp32 (--no-fast)" in stdout and "fast fp32" in stdout and "× eager (batch 2)" in stdout


def test_a_batch_that_does_not_fit_is_a_one_line_row_naming_its_size(bench):
    result, stdout = bench
    message = (
        f"--batch-size {TOO_BIG} does not fit in the memory of cpu: a step asked for 49.2 GB more than was "
        "free; lower --batch-size"
    )
    assert all(r["batches"][str(TOO_BIG)] == {"error": message} for r in result["variants"].values())
    assert stdout.count(f"--batch-size {TOO_BIG} does not fit") == 2


def test_each_variant_is_profiled_by_kind_and_part(bench):
    result, stdout = bench
    for r in result["variants"].values():
        p = r["profile"]
        assert list(p["by_kind"]) == list(KINDS) and list(p["by_part"]) == [*PARTS, "optimizer", "rest"]
        assert sum(k["share"] for k in p["by_kind"].values()) == pytest.approx(1.0)
        assert sum(k["share"] for k in p["by_part"].values()) == pytest.approx(1.0)
        assert p["layout_copies_per_step"] == sum(p["layout_copies_by_part"].values())
    assert "profile, one step at the first batch size (before: eager; after: the others)" in stdout
    for title in (
        "CPU time by kind of work",
        "CPU time by part of the model",
        "one step (mean of 1 profiled)",
    ):
        assert stdout.count(title) == 2, title
    assert stdout.count("│ layout copies ") >= 4  # the step table's row and the kind table's, per variant


def test_loss_curves_are_held_against_eager_s_run_to_run_spread(bench):
    result, stdout = bench
    curves = result["loss_curves"]
    assert list(curves) == ["eager", "eager 2", "fast"] and all(len(c) == 3 for c in curves.values())
    assert len(set(curves["eager"])) == 3  # it learns
    # the CPU repeats itself, and the fast defaults are the eager step there
    assert result["loss_curve_max_abs_diff"] == {"eager 2": 0.0, "fast": 0.0}
    assert "eager fp32, run 2 (the spread)" in stdout and "│ fast fp32 " in stdout
