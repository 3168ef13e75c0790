"""The typed shard set: one read of a split's manifest, its facts typed, and the one module that reads manifests."""

from __future__ import annotations

import ast
import hashlib
import shutil
from pathlib import Path

import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard_set import ShardSet, open_split
from memdpc.preprocess.encode import is_planes

from ..conftest import files_opened
from .conftest import PLANES_THIRD

PACKAGE = Path(__file__).resolve().parents[2]


@pytest.fixture
def shards(tiny_shards, tmp_path):
    shutil.copytree(tiny_shards / "rgb", tmp_path / "rgb")
    return tmp_path


def test_a_split_is_read_once_and_typed(shards):
    path = shards / "rgb" / "manifest-train.json"
    split, opened = files_opened(lambda: open_split(shards, "rgb", "train"))
    assert opened.count(path) == 1
    again, opened = files_opened(
        lambda: (open_split(shards, "rgb", "train").shards, open_split(shards, "rgb", "train"))
    )
    assert path not in opened  # the process keeps what it read while the file is the one read
    assert split.path == path and split.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert isinstance(split.clip, ClipSpec) and split.clip.to_dict() == split.manifest["clip"]
    assert (split.num_samples, split.num_videos) == (6, 6) and split.classes == list(
        split.manifest["classes"]
    )
    assert [t.name for t, _ in split.shards] == [f"train-{i:06d}.tar" for i in range(3)]
    assert [i.name for _, i in split.shards] == [f"train-{i:06d}.idx" for i in range(3)]
    assert split.frame_sizes == [(32, 32)]
    assert split.provenance["index"] and split.provenance["frames"]
    assert split.shard_samples == [2, 2, 2] and split.encoding == split.manifest["encoding"]
    assert "third_channel" not in split.manifest and split.third_channel == 128  # unsaid: the zero-flow code


def test_a_planes_flow_split_says_its_encoding_and_third_channel(planes_shards):
    split = open_split(planes_shards, "flow", "train")
    assert is_planes(split.encoding) and split.third_channel == PLANES_THIRD
    assert sum(split.shard_samples) == split.num_samples and len(split.shard_samples) == len(split.shards)


def test_a_rewritten_manifest_is_read_anew(shards):
    before = open_split(shards, "rgb", "test")
    path = shards / "rgb" / "manifest-test.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(path.read_text().replace('"num_samples": 3', '"num_samples": 2', 1))
    tmp.replace(path)  # as manifests are written: a temporary name, then a rename
    after = open_split(shards, "rgb", "test")
    assert (before.num_samples, after.num_samples) == (3, 2) and before.sha256 != after.sha256


def test_missing_and_foreign_splits_are_one_line_errors(shards):
    assert ShardSet(shards, "rgb").has("train") and not ShardSet(shards, "flow").has("train")
    with pytest.raises(UserError, match="manifest-train.json: shard manifest not found"):
        open_split(shards, "flow", "train")
    shutil.copy(shards / "rgb" / "manifest-test.json", shards / "rgb" / "manifest-val.json")
    with pytest.raises(UserError, match="not a rgb/val shard manifest"):
        open_split(shards, "rgb", "val")


def _calls_of(name: str) -> set[str]:
    """The package's modules (tests and benchmarks aside) that call ``name``."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in ("tests", "bench", ".venv", ".ci") or rel.parts[0].startswith("."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == name
            ):
                found.add(str(rel))
    return found


def test_manifests_are_read_through_the_shard_set_only():
    """Every stage reads a split through :class:`ShardSplit`; the manifest's reader has one caller besides its
    own module."""
    assert _calls_of("read_manifest") == {"pipeline/shard_set.py"}
