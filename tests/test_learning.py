"""The chain learns: rendered videos → TV-L1 flow → frame archives → shards → the loader → training, on a small
learnable case, must leave the pretext loss on held-apart videos (the ``test`` split: never trained on, never used
to pick a checkpoint) well below chance. The loss scores each prediction only against the targets at its own map
position (``--negatives same_position``), so the positional shortcut cannot pass the check.

The same check is run with the flow codes of the archives scrambled (each frame's codes through a random
one-to-one table, as a codec or loader that misread them would): it must fail there, so that a change that
stops the chain learning turns this test red."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.archive import read_archive, write_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import hold_out, write_index
from memdpc.train.config import config_from_dict
from memdpc.train.loop import train
from memdpc.train.pretext import pretext_scores

pytestmark = pytest.mark.slow

SIZE, FRAMES = 32, 32
CLIP = ClipSpec(num_blocks=4, block_len=4, stride=1)
LEARNT = 0.75  # the held-apart loss at most this fraction of chance's: the chain learnt
TRAIN = dict(
    widths=[8, 16, 32, 32],
    size=SIZE,
    crop_size=0,
    batch_size=16,
    epochs=12,
    pred_steps=2,
    negatives="same_position",
    temperature=0.1,
    schedule="constant",
    jitter_flow=False,
    knn_every=0,
    log_every=50,
)


def _render(folder: Path) -> Path:
    """Eight videos of each of the built-in family's ten motions."""
    return make_synthetic(folder, SyntheticConfig(videos_per_class=8, frames=FRAMES, size=SIZE, seed=7))


def _scramble_flow_codes(frames: Path) -> None:
    """Every flow frame of the archives under ``frames`` re-encoded (as JPEG at quality 100) after a random
    one-to-one table of codes, one table per frame."""
    rng = np.random.default_rng(0)
    for path in sorted((frames / "flow").rglob("*.tar")):
        meta, images = read_archive(path)
        scrambled = []
        for data in images:
            codes = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
            table = rng.permutation(256).astype(np.uint8)
            scrambled.append(cv2.imencode(".jpg", table[codes], [cv2.IMWRITE_JPEG_QUALITY, 100])[1].tobytes())
        write_archive(path, scrambled, meta)


def held_apart_pretext(
    videos: Path, work: Path, broken: Callable[[Path], None] | None = None
) -> dict[str, float]:
    """Flow of ``videos`` preprocessed (then ``broken``, where given), sharded and trained on; the pretext scores
    of the last checkpoint on the held-apart ``test`` videos."""
    torch.set_num_threads(1)
    index = work / "index.jsonl"
    write_index(hold_out(build_index(videos, "ucf101", 1), 2), index)
    preprocess(
        index, work / "frames", "flow", size=SIZE, tvl1={"scales": 3, "warps": 3}, workers=1, progress=False
    )
    if broken:
        broken(work / "frames")
    for split in ("train", "val", "test"):
        settings = ShardSettings(clip=CLIP, window_step=2, max_count=8, seed=0)
        run_shard(work / "frames", index, "flow", work / "shards", split, settings)
    config = config_from_dict(
        dict(
            stream="flow",
            shards=str(work / "shards"),
            out=str(work / "run"),
            seed=0,
            num_blocks=CLIP.num_blocks,
            block_len=CLIP.block_len,
            val_split="val",
            progress=False,
            num_workers=0,
            **TRAIN,
        )
    )
    run = train(config)
    return pretext_scores(run / "checkpoints" / "last.pt", config, "test")


def learnt(scores: dict[str, float]) -> bool:
    return scores["loss"] <= LEARNT * scores["chance"]


def test_the_chain_learns_on_held_apart_videos(tmp_path):
    scores = held_apart_pretext(_render(tmp_path / "videos"), tmp_path / "work")
    assert learnt(scores), scores
    assert scores["top1"] > 1 / (TRAIN["batch_size"] * TRAIN["pred_steps"]), scores  # above a uniform guess


def test_the_same_check_fails_when_the_flow_codes_are_scrambled(tmp_path):
    scores = held_apart_pretext(_render(tmp_path / "videos"), tmp_path / "work", broken=_scramble_flow_codes)
    assert scores["batches"] > 0 and not learnt(scores), scores
