"""Per-video features for Python users: of shards, exactly what `memdpc eval retrieve` computes; of video files,
what the same video's shards give; a video that does not decode is a one-line error naming it."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.eval.embed import shard_features, video_features
from memdpc.eval.run import evaluate
from memdpc.model.retrieval import center_normalize
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import VideoRecord, write_index

LOAD = {"batch_size": 4, "backend": "torch", "workers": 0}


def test_shard_features_are_the_retrieval_queries(eval_data, checkpoints, tmp_path):
    found = shard_features(checkpoints["rgb"], eval_data.shards, "test", **LOAD)
    result = evaluate("retrieve", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, **LOAD_EVAL)
    arrays = np.load(result.with_suffix(".npz"))
    assert found.video_ids == list(arrays["video_ids"])
    assert np.array_equal(found.labels, arrays["labels"])
    assert np.allclose(center_normalize(found.features), arrays["query"], atol=1e-6)


LOAD_EVAL = {"batch_size": 4, "backend": "torch", "num_workers": 0}


def test_video_features_are_what_the_videos_shards_give(tiny_dataset, checkpoints, tmp_path):
    videos = sorted(tiny_dataset.rglob("*.avi"))[:2]
    found = video_features(checkpoints["rgb"], videos, frame_size=32, clip_stride=1, **LOAD)
    assert len(found.video_ids) == 2 and found.features.shape[0] == 2 and np.isfinite(found.features).all()
    # by hand: the same videos through preprocess and shard, with the checkpoint's blocks (5 × 3)
    records = [VideoRecord(p.stem, str(p), -1, "", "test") for p in videos]
    write_index(records, tmp_path / "index.jsonl")
    preprocess(tmp_path / "index.jsonl", tmp_path / "frames", "rgb", size=32, progress=False)
    run_shard(
        tmp_path / "frames",
        records,
        "rgb",
        tmp_path / "shards",
        "test",
        ShardSettings(clip=ClipSpec(5, 3, 1)),
    )
    by_hand = shard_features(checkpoints["rgb"], tmp_path / "shards", "test", **LOAD)
    assert found.video_ids == by_hand.video_ids
    assert np.array_equal(found.features, by_hand.features)


def test_a_video_that_does_not_decode_is_named(checkpoints, tmp_path):
    bad = tmp_path / "broken.avi"
    bad.write_bytes(b"RIFF" + bytes(200))
    with pytest.raises(UserError, match=str(bad)):
        video_features(checkpoints["rgb"], [bad], frame_size=32, clip_stride=1, **LOAD)
