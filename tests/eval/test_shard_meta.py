"""Single shard members through the DALI index: window info and frames."""

from __future__ import annotations

import cv2
import numpy as np

from memdpc.eval.shard_meta import window_frames, window_info


def test_window_info_reads_every_json(eval_data):
    info = window_info(eval_data.shards, "rgb", "test")
    by_id = {r.id: r for r in eval_data.records}
    assert len(info) == 3 * (1 + 3)  # 3 classes × test videos of 1 and 3 windows
    for key, w in info.items():
        assert key == f"{w['video_id']}_{w['start']:05d}"
        assert w["label"] == by_id[w["video_id"]].label and w["fps"] == 10.0


def test_window_frames_are_the_clip_frames(eval_data):
    key = sorted(window_info(eval_data.shards, "rgb", "train"))[0]
    frames = window_frames(eval_data.shards, "rgb", "train", [key, "nothing_00000"])
    assert list(frames) == [key] and len(frames[key]) == 15
    img = cv2.imdecode(np.frombuffer(frames[key][0], np.uint8), cv2.IMREAD_COLOR)
    assert img.shape == (32, 32, 3)
