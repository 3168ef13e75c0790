"""bench/learn.py: the smoke plan run for real (render, preprocess, shard, train, evaluate, pair), in its own
process per cell; a rerun resumes from the cells done, ``--dry-run`` runs nothing, ``--report`` only writes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np
import pytest

from bench.learn import (
    BASE_TRAIN,
    CHOSEN,
    FLOW_STATISTICS,
    HELD_OUT_SEEDS,
    VALIDATION_SEEDS,
    Cell,
    Data,
    estimate,
    flow_statistics,
    markdown,
    pool,
    scan,
    smoke,
    tune,
    windows,
)
from memdpc.preprocess.archive import write_archive
from memdpc.preprocess.encode import planes_image
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES, POOL_SEED
from memdpc.quickstart import profile_from
from memdpc.recipes.recipe import load
from tests.conftest import subprocess_env

pytestmark = pytest.mark.slow


def _learn(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.learn", "--plan", "smoke", *map(str, args)],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "OMP_NUM_THREADS": "1"},
        timeout=600,
    )


def test_the_smoke_plan_runs_each_cell_once_and_writes_its_tables(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out" / "learn"
    planned = _learn("--work", work, "--out", out, "--dry-run")
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "smoke:" in planned.stdout and not (work / "cells").exists()

    first = _learn("--work", work, "--out", out)
    assert first.returncode == 0, first.stderr[-3000:]
    result = work / "cells" / "smoke" / "result.json"
    cell = json.loads(result.read_text())
    assert [p["epoch"] for p in cell["curve"]] == [1, 2]  # the kept epoch, then the last
    assert set(cell["baselines"]) == {"random", "random_bn"} and set(cell["paired"]["random"]) == {
        "R@1",
        "top1",
    }
    assert cell["cell"]["validation"] and "knn_baselines" in cell["monitor"]
    (planned_cell,) = smoke()
    # pretrained on the pool's shards, evaluated on the labelled draw's: 3 training videos of each of 3 classes
    assert Path(cell["train"]["shards"]).parent.name == planned_cell.pool.key != planned_cell.data.key
    assert cell["videos"]["gallery"] == 3 * 3 and cell["videos"]["videos"] == 2 * 3
    for where in cell["first_direction"].values():  # the trained model and both baselines
        assert 0 <= where["variance"] <= 1 and 0 <= where["class"] <= 1 and 0 <= where["r"] <= 1
        assert where["follows"] in FLOW_STATISTICS
    assert set(cell["first_direction"]) == {"memdpc", "random", "random_bn"}
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["cell"]["name"] for r in rows] == ["smoke"]
    assert "Validation draws" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    stamp = result.stat().st_mtime_ns
    again = _learn("--work", work, "--out", out, "--report")
    assert again.returncode == 0 and "1 cells, 1 done" in again.stdout
    assert result.stat().st_mtime_ns == stamp  # done cells are read, not run again


def test_the_scan_reports_held_out_draws_and_chooses_on_validation_ones_only():
    cells = scan()
    assert len({c.name for c in cells}) == len(cells)
    assert all(c.validation == c.name.startswith("val-") for c in cells)  # named as what they are
    assert sum(not c.validation for c in cells) > 2 * sum(c.validation for c in cells)
    assert {c.data.family for c in cells} == {"synthetic", "photos"}
    flow = windows(Data(), "flow")
    assert flow["train"] == 15 * 10 * 2  # 48 frames: 47 flow frames, windows of 40 every 4: 2 per video
    assert estimate(Cell("c", Data(), "flow", {"epochs": 20}))["steps"] == 20 * (flow["train"] // 16)
    unlabelled = pool(Data(seed=0))  # four times the videos, a seed of no labelled draw
    assert unlabelled.seed not in HELD_OUT_SEEDS + VALIDATION_SEEDS and unlabelled.videos_per_class == 4 * 24
    pooled = Cell("c", Data(seed=0), "flow", {"epochs": 20}, pool=unlabelled)
    assert estimate(pooled)["steps"] == 20 * (windows(unlabelled, "flow")["train"] // 16)


def test_a_held_out_row_marks_only_a_significant_gain():
    pair = {"difference": 0.2, "interval": [0.1, 0.3], "p": 0.01, "discordant": [20, 4]}
    worse = {**pair, "difference": -0.2, "discordant": [4, 20]}
    row = {
        "cell": {"name": "c", "data": {"family": "synthetic", "seed": 0}, "validation": False},
        "videos": {"gallery": 150, "videos": 80},
        "curve": [{"epoch": 20, "step": 360, "R@1": 0.6, "top1": 0.5}],
        "baselines": {"random": {"R@1": 0.4, "top1": 0.7}, "random_bn": {"R@1": 0.4, "top1": 0.7}},
        "paired": {b: {"R@1": pair, "top1": worse} for b in ("random", "random_bn")},
        "first_direction": {
            m: {"variance": 0.9, "class": 0.05, "follows": "curl", "r": 0.8}
            for m in ("memdpc", "random", "random_bn")
        },
    }
    text = markdown([row])
    assert "Held-out draws" in text and "Validation" not in text
    assert "+20.0 [+10.0, +30.0] p 0.01 ✓" in text and "-20.0 [+10.0, +30.0] p 0.01 ✗" in text
    assert "| c | 0.90 / 0.05 · curl 0.80 |" in text
    assert "| 150 / 80 | 360 |" in text
    pooled = {**row, "cell": {**row["cell"], "pool": asdict(pool(Data(seed=0)))}}
    assert "| 150 / 80 (+ 630) | 360 |" in markdown([pooled])  # the unlabelled videos it was pretrained on
    same = {"difference": 0.0, "interval": None, "p": None, "discordant": [0, 0]}  # right on the same videos
    tied = {**row, "paired": {b: {"R@1": same, "top1": worse} for b in ("random", "random_bn")}}
    assert "| +0.0, no discordant video | +0.0, no discordant video |" in markdown([tied])


@pytest.mark.parametrize(
    ("field", "statistic"),
    [
        (lambda x, y: (np.full_like(x, 12.0), np.zeros_like(y)), "mean x"),
        (lambda x, y: (x / 3, y / 3), "divergence"),  # a zoom: outward from the centre
        (lambda x, y: (-y / 3, x / 3), "curl"),  # a roll about the centre
    ],
)
def test_flow_statistics_tell_a_pan_a_zoom_and_a_roll_apart(tmp_path, field, statistic):
    """Flow codes written as the preprocess stage stores them (planes JPEGs in a frame archive)."""
    y, x = np.mgrid[:32, :32] - 15.5
    u, v = field(x, y)
    codes = np.clip(np.stack([u, v], axis=-1) + 128, 0, 255).astype(np.uint8)
    frame = cv2.imencode(".jpg", planes_image(codes), [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
    write_archive(tmp_path / "v.tar", [frame] * 3, {"encoding": "jpeg-planes"})
    stats = dict(zip(FLOW_STATISTICS, flow_statistics(tmp_path / "v.tar"), strict=True))
    magnitude = {k: abs(v) for k, v in stats.items() if k != "speed"}
    assert max(magnitude, key=magnitude.get) == statistic and stats["speed"] > 4


def test_the_shipped_example_recipe_is_a_pooled_setting_the_tune_plan_tried_on_validation_draws():
    """`memdpc quickstart --recipe example-flow-pool` renders, trains and evaluates as one of the tune plan's
    pooled cells does, on each family the plan tuned it on (the pool's size is the family's own); the family
    whose classes are directions was never tuned on, and the recipe still names its pool."""
    tuned = {c.data.family for c in tune()}
    assert tuned < set(EXAMPLE_FAMILIES) and "directions" not in tuned
    assert set(load("example-flow-pool").quickstart["pool"]) == set(EXAMPLE_FAMILIES)
    for family in sorted(tuned):
        recipe = profile_from(load("example-flow-pool").quickstart, "example-flow-pool", family)
        # and the rule that turns the flow's shift and gain off where the direction of motion is the class
        assert recipe.train == {
            **BASE_TRAIN,
            **CHOSEN,
            "size": 32,
            "val_split": "val",
            "motion_invariance": "auto",
        }
        assert (recipe.streams, recipe.checkpoint) == (("flow",), "last")
        (cell,) = [
            c
            for c in tune()
            if c.pool
            and c.data.family == family
            and c.train == {**CHOSEN, "size": 32}
            and c.data.videos_per_class == recipe.data["videos_per_class"]
            and c.pool.videos_per_class == recipe.pool * c.data.videos_per_class
        ]
        d = cell.data
        assert recipe.data == {"videos_per_class": d.videos_per_class, "frames": d.frames, "size": d.size}
        clip = recipe.clip
        assert (clip.num_blocks, clip.block_len, clip.stride) == (d.blocks, d.block_len, 1)
        assert recipe.window_step == d.window_step and cell.pool.seed == d.seed + POOL_SEED
