"""Eval fixtures: real RGB and flow shards of rendered motion videos and a real (one-step) pretrained
checkpoint, with a small clip geometry (5 blocks × 3 frames, stride 1) and a tiny network for fast CPU runs.

Videos are rendered, JPEG-encoded with OpenCV into per-video frame archives (the "flow" archives hold
frame differences, which is all evaluation needs to know about flow), sharded by the real shard writer,
and the checkpoint comes from the real training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord, write_index

from ..conftest import TINY_TRAIN, frame_diffs, reference_weights, write_jpeg_archive

CLIP = ClipSpec(num_blocks=5, block_len=3, stride=1)  # span 15 frames; eval windows every 6 frames
SIZE, FPS = 32, 10.0
FRAMES = (15, 27, 21, 33)  # per video of a class: 1, 3, 2, 4 eval windows
NUM_CLASSES = 3


@dataclass(frozen=True)
class EvalFixture:
    shards: Path
    index: Path  # video index, with Oops-style failure times in extra["t"]
    records: list[VideoRecord]


def _archives(root: Path, vid: str, frames: np.ndarray) -> None:
    flow = frame_diffs(frames)
    flow = np.concatenate([flow, flow[-1:]])  # same frame count as rgb, so both streams have equal windows
    write_jpeg_archive(root, "rgb", vid, frames, FPS)
    write_jpeg_archive(root, "flow", vid, flow, FPS)


@pytest.fixture(scope="session")
def eval_data(tmp_path_factory) -> EvalFixture:
    """Shards of 12 videos (3 classes × 4; videos 0, 1 train, 2, 3 test) for streams rgb and flow."""
    from memdpc.pipeline.shard import shard_stream

    root = tmp_path_factory.mktemp("eval_data")
    records = []
    for ci, cls in enumerate(CLASSES[:NUM_CLASSES]):
        for g, n in enumerate(FRAMES):
            vid = f"v_{cls}_g{g:02d}"
            _archives(root / "archives", vid, render_video(cls, SIZE, n, np.random.default_rng([ci, g])))
            t = (n / FPS) * (0.3 + 0.1 * g)  # failure time inside the video
            records.append(
                VideoRecord(
                    vid, f"/nowhere/{vid}.avi", ci, cls, "train" if g < 2 else "test", FPS, n, extra={"t": t}
                )
            )
    write_index(records, root / "index.jsonl")
    out = root / "shards"
    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            shard_stream(
                root / "archives",
                records,
                stream,
                out,
                split,
                ShardSettings(clip=CLIP, window_step=6, max_count=4, seed=0),
            )
    return EvalFixture(out, root / "index.jsonl", records)


TRAIN_ARGS = {
    **TINY_TRAIN,
    "arch": "memdpc_r18",
    "mem_size": 16,
    "epochs": 1,
    "max_steps": 1,
    "val_split": "none",
}


def pretrain(shards: Path, out: Path, stream: str, seed: int = 0) -> Path:
    """One real training step of a tiny MemDPC on ``stream``; returns checkpoints/last.pt."""
    from memdpc.train.config import config_from_dict
    from memdpc.train.loop import train

    run = train(
        config_from_dict(
            {**TRAIN_ARGS, "stream": stream, "shards": str(shards), "out": str(out), "seed": seed}
        )
    )
    return run / "checkpoints" / "last.pt"


@pytest.fixture(scope="session")
def checkpoints(eval_data, tmp_path_factory) -> dict[str, Path]:
    """{stream: checkpoint} for rgb and flow (the run folders, runs/<stream>, beside them)."""
    root = tmp_path_factory.mktemp("eval_runs")
    return {s: pretrain(eval_data.shards, root / s, s) for s in ("rgb", "flow")}


@pytest.fixture(scope="session")
def other_rgb(eval_data, tmp_path_factory) -> Path:
    """A second rgb checkpoint (another seed), for results of another checkpoint in the same --out."""
    return pretrain(eval_data.shards, tmp_path_factory.mktemp("eval_runs_b") / "rgb", "rgb", seed=1)


REFERENCE_WIDTHS = (4, 8, 16, 16)


@pytest.fixture(scope="session")
def released(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """{"memdpc" | "classifier": (file in the reference layout, its weights under memdpc's names)}: a
    bidirectional MemDPC and a 3-class LC classifier (the tiny network), saved as the reference code saves."""
    root = tmp_path_factory.mktemp("released")
    out = {}
    for kind, name, kw in (
        ("memdpc", "memdpc_r18", {"mem_size": 16}),
        ("classifier", "classifier_r18", {"num_classes": NUM_CLASSES}),
    ):
        weights, ref = reference_weights(name, seed=3, widths=REFERENCE_WIDTHS, **kw)
        path = root / f"{kind}_ucf101_rgb.pth.tar"
        torch.save({"epoch": 99, "state_dict": ref, "best_acc": 0.5, "optimizer": {}, "iteration": 10}, path)
        out[kind] = (path, weights)
    return out
