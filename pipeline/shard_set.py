"""A stream's shard folder, typed: what the loaders, training, evaluation and reports read of its manifests.

:class:`ShardSet` is one stream's folder of a shard folder; :meth:`ShardSet.split` gives a :class:`ShardSplit`,
one split's manifest read once (:func:`memdpc.pipeline.manifest.read_manifest`) with its facts typed: the clip
geometry, classes, counts, frame sizes, provenance, the (tar, index) path of each shard and the manifest's
SHA-256. The manifest's dict stays at the file boundary (``ShardSplit.manifest``) for what writes it anew.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import frame_sizes, manifest_path, read_manifest, shard_paths

__all__ = ["ShardSet", "ShardSplit", "open_split"]


@dataclass(frozen=True, eq=False)
class ShardSplit:
    """One split of a stream's shards: its manifest as read, and its facts typed."""

    root: Path  # the shard folder (that holds ``<stream>/manifest-<split>.json``)
    stream: str
    split: str
    manifest: Mapping[str, Any]  # the file as read: callers read it, never change it
    sha256: str  # of the manifest's bytes, as ``sha256sum`` gives it

    @property
    def path(self) -> Path:
        """The manifest's file."""
        return manifest_path(self.root, self.stream, self.split)

    @cached_property
    def clip(self) -> ClipSpec:
        """The clip geometry the shards were cut with."""
        return ClipSpec(**self.manifest.get("clip", {}))

    @property
    def classes(self) -> list[str]:
        """Class names (index = label); empty for unlabelled videos."""
        return list(self.manifest.get("classes") or [])

    @property
    def num_samples(self) -> int:
        return int(self.manifest.get("num_samples", 0))

    @property
    def num_videos(self) -> int:
        return int(self.manifest.get("num_videos", 0))

    @property
    def provenance(self) -> Mapping[str, Any]:
        """What the shards were made from (:mod:`memdpc.pipeline.provenance`); empty for older manifests."""
        return self.manifest.get("provenance") or {}

    @cached_property
    def frame_sizes(self) -> list[tuple[int, int]]:
        """(height, width) of the samples' frames, most samples first (:func:`~memdpc.pipeline.manifest.frame_sizes`)."""
        return frame_sizes(self.manifest)

    @cached_property
    def shards(self) -> list[tuple[Path, Path]]:
        """(tar, DALI index) path of every shard."""
        return shard_paths(self.root, self.manifest)

    @property
    def shard_samples(self) -> list[int]:
        """The number of samples of every shard, in the order of :attr:`shards`."""
        return [int(s["num_samples"]) for s in self.manifest["shards"]]

    @property
    def encoding(self) -> str:
        """How the frames are stored in the shards (:mod:`memdpc.preprocess.encode`); empty for older manifests."""
        return str(self.manifest.get("encoding") or "")

    @property
    def third_channel(self) -> int:
        """The value the loaders put in a flow frame's third channel, which a planes encoding does not store
        (128, the zero-flow code, where the manifest does not say)."""
        return int(self.manifest.get("third_channel", 128))


@dataclass(frozen=True)
class ShardSet:
    """One stream's shards in a shard folder; each split's manifest read once per process."""

    root: Path
    stream: str

    def has(self, split: str) -> bool:
        """Whether the folder holds a manifest of ``split``."""
        return manifest_path(self.root, self.stream, split).is_file()

    def split(self, split: str) -> ShardSplit:
        """The split's :class:`ShardSplit`; UserError where its manifest is missing, unreadable or another's."""
        manifest, sha256 = read_manifest(self.root, self.stream, split)
        return ShardSplit(self.root, self.stream, split, manifest, sha256)


def open_split(shard_dir: str | os.PathLike, stream: str, split: str) -> ShardSplit:
    """``ShardSet(shard_dir, stream).split(split)``."""
    return ShardSet(Path(shard_dir), stream).split(split)
