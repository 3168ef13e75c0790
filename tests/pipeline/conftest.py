"""Pipeline fixtures: per-video frame archives of both streams, and shards made from them.

Archives are built here directly (OpenCV decode, then ``write_jpeg_archive`` of ``tests/conftest.py``),
independent of the preprocess stage. The "flow" archives hold n−1 3-channel uint8 images (here: absolute
differences of consecutive frames), which is all sharding and loading need to know about flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.archive import archive_path, write_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.encode import FLOW_ENCODING
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord, write_index

from ..conftest import decode_video, frame_diffs, write_jpeg_archive


@dataclass(frozen=True)
class Archives:
    root: Path  # holds rgb/<id>.tar and flow/<id>.tar
    index: Path  # the video index (JSONL)
    records: list[VideoRecord]


def write_stream_archives(root: Path, video_id: str, frames: np.ndarray, fps: float = 25.0) -> None:
    """Write the rgb archive (n frames) and the flow archive (n−1 frames) of one video."""
    write_jpeg_archive(root, "rgb", video_id, frames, fps)
    write_jpeg_archive(root, "flow", video_id, frame_diffs(frames), fps)


def make_archives(root: Path, records: list[VideoRecord], frames: dict[str, np.ndarray]) -> Archives:
    for r in records:
        write_stream_archives(root, r.id, frames[r.id])
    write_index(records, root / "index.jsonl")
    return Archives(root, root / "index.jsonl", records)


@pytest.fixture(scope="session")
def tiny_archives(tiny_dataset, tmp_path_factory) -> Archives:
    """Frame archives of ``tiny_dataset`` (9 videos × 30 frames of 32×32; 6 train, 3 test): all shorter than
    one 120-frame window, so each gives one padded sample."""
    records = build_index(tiny_dataset, "ucf101", 1)
    frames = {r.id: decode_video(Path(r.path)) for r in records}
    return make_archives(tmp_path_factory.mktemp("tiny_archives"), records, frames)


LONG_FRAMES = (200, 150, 121, 60)  # several windows; exactly one window with n−1 = 120; one short video


@pytest.fixture(scope="session")
def long_archives(tmp_path_factory) -> Archives:
    """Archives of 8 rendered videos (16×16) long enough for several windows, 2 classes × 4, split 2:2."""
    root = tmp_path_factory.mktemp("long_archives")
    records, frames = [], {}
    for ci, cls in enumerate(CLASSES[:2]):
        for g, n in enumerate(LONG_FRAMES):
            vid = f"v_{cls}_g{g:02d}"
            frames[vid] = render_video(cls, 16, n, np.random.default_rng([ci, g]))
            split = "test" if g % 2 else "train"
            records.append(VideoRecord(vid, f"/nowhere/{vid}.avi", ci, cls, split, 25.0, n))
    return make_archives(root, records, frames)


@pytest.fixture(scope="session")
def mixed_archives(mixed_size_dataset, tmp_path_factory) -> Archives:
    """Frame archives of ``mixed_size_dataset``: 8 videos of three frame sizes (48×64, 64×36 portrait, 40×40),
    6 train and 2 test, each shorter than one window (one padded sample per video)."""
    records = build_index(mixed_size_dataset, "folder")
    frames = {r.id: decode_video(Path(r.path)) for r in records}
    return make_archives(tmp_path_factory.mktemp("mixed_archives"), records, frames)


@pytest.fixture(scope="session")
def mixed_shards(mixed_archives, tmp_path_factory) -> Path:
    """Shards of ``mixed_archives``: streams rgb and flow × splits train and test, 2 samples per shard."""
    out = tmp_path_factory.mktemp("mixed_shards")
    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            shard_stream(
                mixed_archives.root,
                mixed_archives.records,
                stream,
                out,
                split,
                ShardSettings(max_count=2, seed=0),
            )
    return out


@pytest.fixture(scope="session")
def tiny_shards(tiny_archives, tmp_path_factory) -> Path:
    """Shards of ``tiny_archives``: streams rgb and flow × splits train and test, 2 samples per shard."""
    out = tmp_path_factory.mktemp("tiny_shards")
    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            shard_stream(
                tiny_archives.root,
                tiny_archives.records,
                stream,
                out,
                split,
                ShardSettings(max_count=2, seed=0),
            )
    return out


PLANES_HW = (36, 44)  # 36 rows: not a whole number of JPEG blocks, so the x plane is padded
PLANES_THIRD = 0  # not the default 128: the loaders put back what the archives record


@pytest.fixture(scope="session")
def planes_shards(tmp_path_factory) -> Path:
    """Flow shards in the default encoding (greyscale planes) with the third channel 0: 4 rendered videos of 30
    frames of 36×44 (2 classes; 2 train, 2 test; one padded sample each), 2 samples per shard. The stand-in
    flow's x and y are two colour channels of the frame differences, so the two planes differ."""
    root = tmp_path_factory.mktemp("planes")
    records = []
    for ci, cls in enumerate(CLASSES[:2]):
        for g, split in enumerate(("train", "test")):
            vid = f"v_{cls}_g{g:02d}"
            frames = render_video(cls, PLANES_HW[1], 30, np.random.default_rng([ci, g]))[:, : PLANES_HW[0]]
            codes = frame_diffs(frames)[..., ::-1].copy()  # x: red differences, y: green
            codes[..., 2] = PLANES_THIRD
            meta = {"fps": 25.0, "height": PLANES_HW[0], "width": PLANES_HW[1], "stream": "flow"}
            meta |= {"encoding": FLOW_ENCODING.name, "flow": {"third_channel": PLANES_THIRD}}
            write_archive(archive_path(root, "flow", vid), [FLOW_ENCODING.encode_rgb(c) for c in codes], meta)
            records.append(VideoRecord(vid, f"/nowhere/{vid}.avi", ci, cls, split, 25.0, 30))
    for split in ("train", "test"):
        shard_stream(root, records, "flow", root / "shards", split, ShardSettings(max_count=2, seed=0))
    return root / "shards"


WINDOWED_CLIP = ClipSpec(
    num_blocks=4, block_len=2, stride=1
)  # 8 frames: a 24-frame video has windows 0, 4, 8, 12


@pytest.fixture(scope="session")
def windowed_shards(tmp_path_factory) -> Path:
    """RGB train shards (3 samples each) of 7 rendered videos (16×16, 3 classes; clip :data:`WINDOWED_CLIP`,
    window step 4): 6 of 24 frames with 4 windows each, one of 14 frames with 2: 26 samples in 9 shards."""
    root = tmp_path_factory.mktemp("windowed")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g, n in enumerate((24, 24, 14) if ci == 0 else (24, 24)):
            vid = f"v_{cls}_g{g:02d}"
            write_jpeg_archive(
                root / "archives", "rgb", vid, render_video(cls, 16, n, np.random.default_rng([ci, g])), 25.0
            )
            records.append(VideoRecord(vid, f"/nowhere/{vid}.avi", ci, cls, "train", 25.0, n))
    out = root / "shards"
    shard_stream(
        root / "archives",
        records,
        "rgb",
        out,
        "train",
        ShardSettings(clip=WINDOWED_CLIP, window_step=4, max_count=3, seed=0),
    )
    return out
