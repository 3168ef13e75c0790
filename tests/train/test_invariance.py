"""train/invariance.py: ``--motion-invariance auto`` asks labelled videos whether the direction of their global
motion tells their class, through the command line on real flow shards of two example families; it decides the
flow's global shift and gain from that, records the decision in the run's config, and keeps it on resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from memdpc.common.errors import UserError
from memdpc.train.config import config_from_dict
from memdpc.train.invariance import DIRECTION_TELLS, motion_direction
from memdpc.train.prepare import augment_spec

from ..conftest import run_memdpc
from .conftest import family_flow_shards

TINY = [
    "--stream", "flow", "--widths", "8,16,16,16", "--size", "32", "--crop-size", "0", "--batch-size", "4",
    "--epochs", "1", "--blocks", "4", "--block-len", "4", "--pred-steps", "1", "--mem-size", "64",
    "--no-jitter-flow", "--flow-shift", "10", "--flow-gain", "1.5", "--motion-invariance", "auto",
]  # fmt: skip


@pytest.fixture(scope="module")
def kind_shards(tmp_path_factory) -> Path:
    """The built-in family's flow shards: its classes are kinds of motion over a background drifting in a random
    direction, so the direction of a video's global motion does not tell its class."""
    return family_flow_shards(tmp_path_factory.mktemp("synthetic"), "synthetic", 4)


def _config(shards: Path, **kw):
    return config_from_dict(dict(stream="flow", shards=str(shards), size=32, num_blocks=4, block_len=4, **kw))


@pytest.mark.slow
def test_the_direction_of_global_motion_tells_the_directions_familys_classes_and_not_the_built_in_ones(
    direction_shards, kind_shards
):
    directions, kinds = motion_direction(_config(direction_shards)), motion_direction(_config(kind_shards))
    assert min(directions.videos, kinds.videos) >= 3 * 4 and directions.classes == kinds.classes == 4
    assert directions.accuracy >= DIRECTION_TELLS * directions.chance and directions.tells_class
    assert kinds.accuracy < DIRECTION_TELLS * kinds.chance and not kinds.tells_class
    assert directions.words().endswith("it tells their class: the flow's global shift and gain are off")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["directions", "synthetic"])
def test_auto_decides_before_training_says_so_records_it_and_a_resume_keeps_it(
    family, direction_shards, kind_shards, tmp_path
):
    shards = direction_shards if family == "directions" else kind_shards
    decided = "off" if family == "directions" else "on"
    out = tmp_path / "run"
    res = run_memdpc("train", *TINY, "--shards", str(shards), "--out", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr[-3000:]
    said = [line for line in res.stderr.splitlines() if line.startswith("motion invariance (auto): ")]
    assert len(said) == 1 and said[0].endswith(f"the flow's global shift and gain are {decided}")
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["motion_invariance"] == decided and recorded["flow_shift"] == 10
    spec = augment_spec(config_from_dict(recorded))
    assert (spec.flow_shift, spec.flow_gain) == ((0.0, 1.0) if decided == "off" else (10.0, 1.5))
    again = run_memdpc(
        "train", *TINY, "--shards", str(shards), "--out", str(out), "--epochs", "2", "--no-progress"
    )
    assert again.returncode == 0, again.stderr[-3000:]  # resumed: the decision recorded, not asked again
    assert "motion invariance (auto)" not in again.stderr
    assert yaml.safe_load((out / "config.yaml").read_text())["motion_invariance"] == decided


def test_auto_needs_labelled_flow_shards(direction_shards, tmp_path):
    with pytest.raises(UserError, match="decides the flow's augmentation: train --stream flow"):
        motion_direction(config_from_dict(dict(stream="rgb", shards=str(direction_shards))))
