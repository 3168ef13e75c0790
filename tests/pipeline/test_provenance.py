"""provenance.py: what a manifest records of the index and the archives, what training records of the shards it
reads, and each change between two such records named — on real shards of real archives, re-cut as a user would
re-cut them (videos moved between splits, relabelled, archives rewritten, other options, copied elsewhere)."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

from memdpc.pipeline.provenance import records_digest, shard_changes, split_record
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings, archive_digest, scan_archive
from memdpc.pipeline.shard_set import open_split
from memdpc.preprocess.archive import archive_path, read_archive, write_archive
from memdpc.preprocess.video_index import write_index

from ..conftest import jpeg


def _copy(archives, tmp_path: Path) -> Path:
    root = tmp_path / "archives"
    shutil.copytree(archives.root, root)
    return root


def _shard(root: Path, records, out: Path, seed: int = 0) -> dict[str, dict]:
    """Shards of the train and test splits (max 2 samples each), and what a run records of them (test as val)."""
    for split in ("train", "test"):
        run_shard(root, records, "rgb", out, split, ShardSettings(max_count=2, seed=seed), overwrite=True)
    return {role: split_record(out, "rgb", split) for role, split in (("train", "train"), ("val", "test"))}


def test_the_manifest_records_the_index_the_frames_and_each_archive(long_archives, tmp_path):
    run_shard(long_archives.root, long_archives.index, "rgb", tmp_path, "train")
    provenance = open_split(tmp_path, "rgb", "train").manifest["provenance"]
    index_bytes = long_archives.index.read_bytes()
    assert provenance["index"] == {
        "path": str(long_archives.index.resolve()),
        "sha256": hashlib.sha256(index_bytes).hexdigest(),  # the file's sha256sum: memdpc wrote it
    }
    assert records_digest(long_archives.records) == provenance["index"]["sha256"]
    assert provenance["frames"] == str(long_archives.root.resolve())
    train = [r for r in long_archives.records if r.split == "train"]
    assert provenance["videos"] == {
        r.id: [r.label, archive_digest(scan_archive(archive_path(long_archives.root, "rgb", r.id)))]
        for r in train
    }
    record = split_record(tmp_path, "rgb", "train")
    manifest = tmp_path / "rgb" / "manifest-train.json"
    assert record["manifest"] == str(manifest.resolve())
    assert record["sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert record["videos"] == provenance["videos"]


def test_each_change_of_the_shards_is_named(long_archives, tmp_path):
    root, records = _copy(long_archives, tmp_path), long_archives.records
    out = tmp_path / "shards"
    before = _shard(root, records, out)
    assert shard_changes(before, _shard(root, records, out)) == []  # cut again alike: the same shards
    copied = tmp_path / "copied"
    shutil.copytree(out, copied)
    assert (
        shard_changes(
            before, {r: split_record(copied, "rgb", s) for r, s in (("train", "train"), ("val", "test"))}
        )
        == []
    )
    write_index(records, tmp_path / "index.jsonl")  # the manifest rewritten with the index's path: same data
    run_shard(root, tmp_path / "index.jsonl", "rgb", out, "train", ShardSettings(max_count=2))
    now = split_record(out, "rgb", "train")
    assert (
        now["sha256"] != before["train"]["sha256"] and shard_changes(before, {**before, "train": now}) == []
    )

    train = [r for r in records if r.split == "train"]
    moved = [replace(r, split="test") if r in train[:2] else r for r in records]
    assert shard_changes(before, _shard(root, moved, out)) == ["2 videos moved from train to test"]
    fewer = [r for r in records if r is not train[0]]
    assert shard_changes(before, _shard(root, fewer, out)) == ["1 video removed from train"]
    assert shard_changes(_shard(root, fewer, out), _shard(root, records, out)) == ["1 video added to train"]
    other = next(r for r in records if r.label != train[0].label)
    relabelled = [
        replace(r, label=other.label, label_name=other.label_name) if r is train[0] else r for r in records
    ]
    assert shard_changes(before, _shard(root, relabelled, out)) == ["1 video changed class"]
    assert shard_changes(before, _shard(root, records, out, seed=1)) == [
        "the train shards were cut again with other options (seed 0 → 1)"
    ]
    meta, frames = read_archive(
        archive_path(root, "rgb", train[1].id)
    )  # preprocessed again, at another quality
    lower = [jpeg(cv2.imdecode(np.frombuffer(f, np.uint8), cv2.IMREAD_COLOR), quality=50) for f in frames]
    write_archive(archive_path(root, "rgb", train[1].id), lower, meta)
    assert shard_changes(before, _shard(root, records, out)) == ["the archive of 1 video was rewritten"]


def test_shards_of_a_manifest_without_videos_are_compared_by_their_checksums(long_archives, tmp_path):
    out = tmp_path / "shards"
    before = _shard(long_archives.root, long_archives.records, out)
    older = {
        r: {**rec, "videos": None} for r, rec in before.items()
    }  # a manifest written before this version
    assert shard_changes(older, before) == []
    now = _shard(long_archives.root, long_archives.records, out, seed=2)
    assert shard_changes(older, now) == ["the train shards were cut again with other options (seed 0 → 2)"]
