"""Train fixtures: real RGB shards of rendered motion videos, with a small clip geometry for fast CPU runs.

Videos are rendered (``render_video``), JPEG-encoded with OpenCV into per-video frame archives, then sharded
by the real shard writer. Clips are 5 blocks × 3 frames (stride 1), so a tiny network trains in seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord

from ..conftest import write_jpeg_archive

CLIP = ClipSpec(num_blocks=5, block_len=3, stride=1)
FRAMES, SIZE = 24, 32


@pytest.fixture
def one_thread():
    """Torch on one CPU thread during the test, its thread count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def video_record(ci: int, g: int, split: str) -> VideoRecord:
    """The index record of rendered video ``g`` of class ``ci`` (its archive: ``v_<class>_g<g>``) in ``split``."""
    vid = f"v_{CLASSES[ci]}_g{g:02d}"
    return VideoRecord(vid, f"/nowhere/{vid}.avi", ci, CLASSES[ci], split, 25.0, FRAMES)


@pytest.fixture(scope="session")
def train_shards(tmp_path_factory) -> Path:
    """RGB shards (train: 18 clips in 5 shards; test: 6 clips) of 12 rendered videos, 3 classes (test: one
    video of each); their frame archives in the sibling folder ``archives``."""
    from memdpc.pipeline.shard import shard_stream

    root = tmp_path_factory.mktemp("train_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(4):
            frames = render_video(cls, SIZE, FRAMES, np.random.default_rng([ci, g]))
            write_jpeg_archive(root / "archives", "rgb", f"v_{cls}_g{g:02d}", frames, 25.0)
            records.append(video_record(ci, g, "test" if g == 3 else "train"))
    out = root / "shards"
    for split in ("train", "test"):
        shard_stream(
            root / "archives",
            records,
            "rgb",
            out,
            split,
            ShardSettings(clip=CLIP, window_step=8, max_count=4, seed=0),
        )
    return out


@pytest.fixture(scope="session")
def val_shards(train_shards, tmp_path_factory) -> Path:
    """The train shards and a ``val`` split of two videos, of the first two classes only (the third has none)."""
    from memdpc.pipeline.shard import shard_stream

    out = tmp_path_factory.mktemp("val_data") / "shards"
    shutil.copytree(train_shards, out)
    records = [video_record(0, 3, "val"), video_record(1, 3, "val")]
    shard_stream(
        train_shards.parent / "archives",
        records,
        "rgb",
        out,
        "val",
        ShardSettings(clip=CLIP, max_count=4, seed=0),
    )
    return out


@pytest.fixture(scope="session")
def blank_shards(tmp_path_factory) -> Path:
    """RGB shards (train and test) of 9 videos of one flat grey, 3 classes: no clip, step or position tells
    apart from another, so no model can score a target above the others (the validation loss is chance's)."""
    from memdpc.pipeline.shard import shard_stream

    root = tmp_path_factory.mktemp("blank_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(3):
            write_jpeg_archive(
                root / "archives",
                "rgb",
                f"v_{cls}_g{g:02d}",
                np.full((FRAMES, SIZE, SIZE, 3), 128, np.uint8),
                25.0,
            )
            records.append(video_record(ci, g, "test" if g == 2 else "train"))
    out = root / "shards"
    for split in ("train", "test"):
        shard_stream(
            root / "archives",
            records,
            "rgb",
            out,
            split,
            ShardSettings(clip=CLIP, window_step=8, max_count=4, seed=0),
        )
    return out


def tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``log_dir``: {tag: [(step, value), ...]} in order."""
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tb_images(log_dir: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Every image in the TensorBoard event files of ``log_dir``: {tag: [(step, RGB uint8 (H, W, 3)), ...]}."""
    acc = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    acc.Reload()
    return {
        tag: [
            (
                e.step,
                cv2.imdecode(np.frombuffer(e.encoded_image_string, np.uint8), cv2.IMREAD_COLOR)[..., ::-1],
            )
            for e in acc.Images(tag)
        ]
        for tag in acc.Tags()["images"]
    }
