"""The directions family: real files in the UCF101 layout, deterministic for a seed, and a class that only the
direction of the camera's motion tells: its optical flow moves the scene the way the class names, and the
opposite class the other way."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.directions import DIRECTION_CLASSES, DirectionConfig, make_directions
from memdpc.preprocess.flow.tvl1_native import tvl1_flow
from memdpc.preprocess.flow.tvl1_params import TVL1Params

from ...conftest import decode_video

SMALL = DirectionConfig(videos_per_class=2, frames=10, size=48)


@pytest.fixture(scope="module")
def small_directions(tmp_path_factory) -> Path:
    return make_directions(tmp_path_factory.mktemp("directions") / "d", SMALL)


def _scene_motion(video: np.ndarray) -> np.ndarray:
    """The mean TV-L1 flow of a video about the frame's centre: x, y (pixels a frame), and the outward and the
    clockwise component (a zoom's and a roll's sense on screen, y pointing down)."""
    grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in video]
    flow = np.mean(
        [tvl1_flow(a, b, TVL1Params(scales=3, warps=3)) for a, b in zip(grey[:-1], grey[1:], strict=True)],
        axis=0,
    )
    h, w = flow.shape[:2]
    y, x = np.mgrid[:h, :w] - np.array([(h - 1) / 2, (w - 1) / 2]).reshape(2, 1, 1)
    r = np.hypot(x, y).clip(min=1)
    u, v = flow[..., 0], flow[..., 1]
    return np.array([u.mean(), v.mean(), ((u * x + v * y) / r).mean(), ((v * x - u * y) / r).mean()])


# the component of _scene_motion each class moves the scene along, and its sign (the camera moves the other way)
EXPECTED = {
    "PanLeft": (0, 1),
    "PanRight": (0, -1),
    "TiltUp": (1, 1),
    "TiltDown": (1, -1),
    "RollClockwise": (3, -1),
    "RollCounterClockwise": (3, 1),
    "ZoomIn": (2, 1),
    "ZoomOut": (2, -1),
}


def test_every_class_moves_the_scene_the_way_it_names(small_directions):
    records = build_index(small_directions, "ucf101", 1)
    assert sorted({r.label_name for r in records}) == sorted(DIRECTION_CLASSES) == sorted(EXPECTED)
    for r in records:
        video = decode_video(Path(r.path))
        assert video.shape == (10, 48, 48, 3) and video.std() > 10
        motion = _scene_motion(video)
        axis, sign = EXPECTED[r.label_name]
        assert sign * motion[axis] > 0.08, (r.id, motion)  # its own direction
        assert abs(motion[axis]) > np.abs(np.delete(motion, axis)).max(), (r.id, motion)  # and mostly it


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    cfg = DirectionConfig(videos_per_class=1, frames=4, size=32, num_classes=2, seed=3)
    a, b = make_directions(tmp_path / "a", cfg), make_directions(tmp_path / "b", cfg)
    c = make_directions(tmp_path / "c", DirectionConfig(**{**cfg.__dict__, "seed": 4}))
    videos = sorted(p.relative_to(a) for p in a.rglob("*.avi"))
    assert len(videos) == 2
    for rel in videos:
        assert (a / rel).read_bytes() == (b / rel).read_bytes() != (c / rel).read_bytes(), rel


def test_cli_writes_the_family_and_refuses_bad_options(tmp_path):
    res = CliRunner().invoke(
        main, ["data", "directions", str(tmp_path / "d"), "--videos-per-class", "1", "--frames", "3"]
    )
    assert res.exit_code == 0, res.output
    assert f"wrote {len(DIRECTION_CLASSES)} classes × 1 videos" in res.output
    bad = CliRunner().invoke(main, ["data", "directions", str(tmp_path / "x"), "--classes", "9"])
    assert bad.exit_code == 2 and bad.output.strip().splitlines()[-1].startswith("Error: --classes must be")
    assert not (tmp_path / "x").exists()
