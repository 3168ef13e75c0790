"""Manifests: loading with clear errors, and verification that catches every kind of damage."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.manifest import read_manifest, shard_paths, verify_shards


@pytest.fixture
def shards(tiny_shards, tmp_path):
    shutil.copytree(tiny_shards / "rgb", tmp_path / "rgb")
    return tmp_path


def test_read_manifest(shards):
    m, sha256 = read_manifest(shards, "rgb", "train")
    assert sha256 == hashlib.sha256((shards / "rgb" / "manifest-train.json").read_bytes()).hexdigest()
    assert m["num_samples"] == 6 and len(m["shards"]) == 3
    assert [t.name for t, _ in shard_paths(shards, m)] == [f"train-{i:06d}.tar" for i in range(3)]
    with pytest.raises(UserError, match="manifest-train.json: shard manifest not found"):
        read_manifest(shards, "flow", "train")
    (shards / "rgb" / "manifest-val.json").write_text("{not json")
    with pytest.raises(UserError, match="unreadable"):
        read_manifest(shards, "rgb", "val")
    shutil.copy(shards / "rgb" / "manifest-test.json", shards / "rgb" / "manifest-val.json")
    with pytest.raises(UserError, match="not a rgb/val shard manifest"):
        read_manifest(shards, "rgb", "val")


def test_verify_passes_on_intact_shards_and_names_each_problem(shards):
    assert [r.problems for r in verify_shards(shards)] == [[], []]
    folder = shards / "rgb"
    (folder / "test-000001.tar").unlink()
    idx = folder / "train-000000.idx"
    idx.write_text(idx.read_text().replace("f00.jpg 512", "f00.jpg 1024", 1))
    shutil.copy(folder / "train-000001.tar", folder / "train-000099.tar")
    m = json.loads((folder / "manifest-train.json").read_text())
    m["shards"][2]["num_samples"] += 1
    (folder / "manifest-train.json").write_text(json.dumps(m))
    problems = {r.manifest.name: " | ".join(r.problems) for r in verify_shards(shards)}
    assert "test-000001.tar: shard or its index is missing" in problems["manifest-test.json"]
    train = problems["manifest-train.json"]
    assert "train-000000.idx: index does not match" in train
    assert "train-000099.tar" in train and "train-000002.tar: 2 samples, manifest says 3" in train


def test_verify_needs_a_manifest(tmp_path):
    with pytest.raises(UserError, match="no shard manifests"):
        verify_shards(tmp_path)
