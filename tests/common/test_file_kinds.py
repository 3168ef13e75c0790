"""file_kinds.py: what the files memdpc writes (and a user might give in the wrong place) look like, each
made for real — OpenCV videos and images, torch.save, numpy, the shard writer's tar format, JSON as the
stages write it."""

from __future__ import annotations

import json
import tarfile

import cv2
import numpy as np
import pytest
import torch

from memdpc.common import file_kinds
from memdpc.eval.results import save_result


def _video(path, fourcc: str) -> None:
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 10.0, (32, 32))
    for i in range(5):
        out.write(np.full((32, 32, 3), 40 * i, np.uint8))
    out.release()


@pytest.mark.parametrize("name, fourcc", [("v.avi", "MJPG"), ("v.mp4", "mp4v")])
def test_videos(tmp_path, name, fourcc):
    _video(tmp_path / name, fourcc)
    assert file_kinds.describe(tmp_path / name) == "a video file"


def test_pytorch_files_whole_truncated_and_legacy(tmp_path):
    torch.save({"w": torch.zeros(100)}, tmp_path / "a.pt")
    torch.save({"w": torch.zeros(100)}, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    assert (
        file_kinds.describe(tmp_path / "a.pt")
        == file_kinds.describe(tmp_path / "old.pth")
        == file_kinds.TORCH
    )
    (tmp_path / "cut.pt").write_bytes((tmp_path / "a.pt").read_bytes()[:300])
    assert file_kinds.describe(tmp_path / "cut.pt") == file_kinds.TORCH_DAMAGED
    (tmp_path / "junk.pt").write_bytes(b"\x00\x80" * 40)
    assert file_kinds.describe(tmp_path / "junk.pt") == file_kinds.BINARY
    (tmp_path / "empty.pt").write_bytes(b"")
    assert file_kinds.describe(tmp_path / "empty.pt") == "an empty file"


def test_what_the_stages_write(tmp_path):
    result = {
        "kind": "retrieval",
        "stream": "rgb",
        "dataset": "d",
        "split": "test",
        "classes": ["c"] * 2000,
    }  # longer than the first 4 KiB read
    arrays = {
        "video_ids": np.array(["q"]),
        "labels": np.zeros(1, int),
        "gallery_ids": np.array(["g0", "g1"]),
        "gallery_labels": np.zeros(2, int),
        "neighbours": np.array([[0, 1]]),
    }
    path = save_result(tmp_path / "retrieval-rgb.json", result, arrays)
    assert file_kinds.describe(path) == file_kinds.RESULTS
    assert file_kinds.describe(path.with_suffix(".npz")).startswith("a numpy .npz file")
    (tmp_path / "m.jsonl").write_text(json.dumps({"kind": "train", "step": 4, "loss": 1.0}) + "\n" * 2)
    assert file_kinds.describe(tmp_path / "m.jsonl") == "a run's metrics"
    (tmp_path / "metrics.jsonl").write_text("")  # a run killed before its first log line
    assert file_kinds.describe(tmp_path / "metrics.jsonl") == "a run's metrics"
    (tmp_path / "my.yaml").write_text("stream: rgb\nshards: shards/\nout: runs/rgb\n")
    assert file_kinds.describe(tmp_path / "my.yaml") == "a run config"
    (tmp_path / "index.jsonl").write_text(json.dumps({"id": "v", "path": "v.avi", "label": 0}) + "\n")
    assert file_kinds.describe(tmp_path / "index.jsonl") == "a video index"
    (tmp_path / "manifest-test.json").write_text(json.dumps({"clip": {}, "shards": []}))
    assert file_kinds.describe(tmp_path / "manifest-test.json") == "a shard manifest"
    cv2.imwrite(str(tmp_path / "f.png"), np.zeros((4, 4, 3), np.uint8))
    cv2.imwrite(str(tmp_path / "f.jpg"), np.zeros((4, 4, 3), np.uint8))
    assert file_kinds.describe(tmp_path / "f.png") == file_kinds.describe(tmp_path / "f.jpg") == "an image"
    with tarfile.open(tmp_path / "train-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        tar.add(tmp_path / "f.png", "k.0000.jpg")
    assert file_kinds.describe(tmp_path / "train-000000.tar").startswith("a tar archive")
    (tmp_path / "notes.txt").write_text("grüße\n")
    assert file_kinds.describe(tmp_path / "notes.txt") == "a text file"
    assert file_kinds.describe(tmp_path) == "a folder"
    (tmp_path / file_kinds.QUICKSTART_RECORD).write_text("{}")
    assert file_kinds.describe(tmp_path) == file_kinds.QUICKSTART
