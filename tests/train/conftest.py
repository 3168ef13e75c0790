"""Train fixtures: real RGB shards of rendered motion videos, with a small clip geometry for fast CPU runs.

Videos are rendered (``render_video``), JPEG-encoded with OpenCV into per-video frame archives, then sharded
by the real shard writer. Clips are 5 blocks × 3 frames (stride 1), so a tiny network trains in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from memdpc.pipeline.clip import ClipSpec
from memdpc.preprocess.archive import archive_path, write_archive
from memdpc.preprocess.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord

CLIP = ClipSpec(num_blocks=5, block_len=3, stride=1)
FRAMES, SIZE = 24, 32
# A tiny network and clip: every run of the tests uses these settings (plus its own).
TINY_ARGS = ["--stream", "rgb", "--arch", "dpc_r18", "--widths", "4,8,16,16", "--size", "32",
             "--num-blocks", "5", "--block-len", "3", "--pred-steps", "2", "--batch-size", "4",
             "--backend", "torch", "--num-workers", "0", "--no-progress", "--log-every", "1"]


def _jpeg(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return buf.tobytes()


@pytest.fixture(scope="session")
def train_shards(tmp_path_factory) -> Path:
    """RGB shards (train: 16 clips in 4 shards; test: 8 clips) of 12 rendered videos, 3 classes."""
    from memdpc.pipeline.shard import shard_stream

    root = tmp_path_factory.mktemp("train_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(4):
            vid = f"v_{cls}_g{g:02d}"
            frames = render_video(cls, SIZE, FRAMES, np.random.default_rng([ci, g]))
            write_archive(archive_path(root / "archives", "rgb", vid), (_jpeg(f) for f in frames),
                          {"fps": 25.0, "height": SIZE, "width": SIZE, "stream": "rgb", "encoding": "jpeg"})
            records.append(VideoRecord(vid, f"/nowhere/{vid}.avi", ci, cls, "test" if g == 3 else "train",
                                       25.0, FRAMES))
    out = root / "shards"
    for split in ("train", "test"):
        shard_stream(root / "archives", records, "rgb", out, split, clip=CLIP, window_step=8, max_count=4, seed=0)
    return out


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m memdpc.cli …`` in a subprocess with one torch thread."""
    return subprocess.run([sys.executable, "-m", "memdpc.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=thread_env(env))


def thread_env(extra: dict | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.update(extra or {})
    return env
