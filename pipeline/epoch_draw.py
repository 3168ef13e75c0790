"""Epochs of a fixed number of windows per video (``clips_per_video``): which samples an epoch takes, and how
the loaders read only those.

The paper and the reference implementation draw one 40-frame sample per video per epoch, its start chosen at
random every epoch; the shards hold each training video's windows (a start every ``--window-step`` frames).
With ``clips_per_video`` k, epoch e takes k of each video's windows (all of them where it has fewer), drawn
from ``(seed, epoch)`` alone: every rank draws the same set, which the loaders then divide among the ranks.
The number drawn is the same every epoch, so batches per epoch are known before it starts.

The samples of a split are listed by the shards' DALI indexes (:func:`read_catalog`: key, so video and start,
and byte range of every sample, in shard order). Samples not drawn are never read nor decoded: the DALI reader
is given, per epoch, indexes that list only the drawn samples (:func:`write_drawn_indexes`), and the torch
loader reads each drawn sample's byte range (:func:`read_sample`).
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from memdpc.common.errors import UserError
from memdpc.pipeline.sample import parse_key
from memdpc.pipeline.ustar import BLOCK, list_members, padding
from memdpc.pipeline.wds_index import VERSION, split_name

__all__ = ["Catalog", "draw", "rank_slice", "read_catalog", "read_sample", "shuffled", "write_drawn_indexes"]

_DRAW, _ORDER = 11, 13  # salts of the epoch's draw and of the torch loader's sample order


@dataclass(frozen=True)
class Catalog:
    """Every sample of a split's shards, in shard order (shard by shard, as their indexes list them)."""

    shards: list[tuple[Path, Path]]  # (tar, idx)
    shard: np.ndarray  # int32 per sample: its shard
    line: np.ndarray  # int32 per sample: its position in its shard's index
    video: np.ndarray  # int32 per sample: its video, an index into ``videos``
    start: np.ndarray  # int32 per sample: the window's first frame
    span: (
        np.ndarray
    )  # int64 (n, 2): the sample's bytes in its tar, from its first header to its last member's end
    videos: list[str]

    def __len__(self) -> int:
        return len(self.shard)

    @property
    def num_videos(self) -> int:
        return len(self.videos)

    def drawn_count(self, clips_per_video: int) -> int:
        """Samples every epoch takes: ``clips_per_video`` per video, or all of a video's windows where fewer."""
        return int(np.minimum(np.bincount(self.video, minlength=self.num_videos), clips_per_video).sum())


def _first_and_last(line: str) -> tuple[str, int, int, int]:
    """(first member's name, first data offset, last data offset, last size) of one index line."""
    _, offset, _, name = line.split(" ", 4)[:4]
    _, last_offset, last_size, _ = line.rsplit(" ", 4)[-4:]
    return name, int(offset), int(last_offset), int(last_size)


def read_catalog(shards: Sequence[tuple[Path, Path]]) -> Catalog:
    """The catalog of the samples listed by the shards' DALI indexes. The byte ranges assume plain USTAR
    members (one 512-byte header each), which the shard writer writes."""
    shard, line, video, start, span = [], [], [], [], []
    ids: dict[str, int] = {}
    for s, (_, idx) in enumerate(shards):
        lines = Path(idx).read_text().splitlines()[1:]
        for i, text in enumerate(lines):
            try:
                name, first, last, size = _first_and_last(text)
                video_id, begin = parse_key(split_name(name)[0])
            except ValueError:
                raise UserError(
                    f"{idx}: line {i + 2} is not a sample of a DALI index; shard that split again"
                ) from None
            shard.append(s)
            line.append(i)
            video.append(ids.setdefault(video_id, len(ids)))
            start.append(begin)
            span.append((first - BLOCK, last + size + padding(size)))
    return Catalog(
        list(shards),
        np.array(shard, np.int32),
        np.array(line, np.int32),
        np.array(video, np.int32),
        np.array(start, np.int32),
        np.array(span, np.int64).reshape(-1, 2),
        list(ids),
    )


def draw(catalog: Catalog, clips_per_video: int, seed: int, epoch: int) -> np.ndarray:
    """The samples epoch ``epoch`` takes (indices into the catalog, ascending): ``clips_per_video`` windows
    of each video, drawn without repetition, uniformly and anew every epoch, from ``(seed, epoch)``."""
    if clips_per_video < 1:
        raise ValueError("clips_per_video must be ≥ 1")
    priority = np.random.default_rng([seed, epoch, _DRAW]).random(len(catalog))
    order = np.lexsort((priority, catalog.video))  # by video, each video's windows in random order
    grouped = catalog.video[order]
    first_of_video = np.searchsorted(grouped, grouped)  # where each video's run begins
    rank_in_video = np.arange(len(order)) - first_of_video
    return np.sort(order[rank_in_video < clips_per_video])


def shuffled(drawn: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The drawn samples in the torch loader's order for the epoch (a permutation from ``(seed, epoch)``)."""
    return drawn[np.random.default_rng([seed, epoch, _ORDER]).permutation(len(drawn))]


def rank_slice(n: int, rank: int, world_size: int) -> slice:
    """Which of ``n`` samples a rank reads: a contiguous part, as DALI's reader divides a sample sequence."""
    return slice(n * rank // world_size, n * (rank + 1) // world_size)


def write_drawn_indexes(
    catalog: Catalog, drawn: np.ndarray, folder: str | os.PathLike
) -> list[tuple[Path, Path]]:
    """Write, into ``folder``, one DALI index per shard holding drawn samples that lists only those; return the
    (tar, index) pairs, in shard order. DALI's reader then reads exactly the drawn samples. One pass over the
    drawn samples, shard by shard."""
    folder = Path(folder)
    pairs = []
    drawn = drawn[np.argsort(catalog.shard[drawn], kind="stable")]  # by shard; already so when ascending
    shards = catalog.shard[drawn]
    starts = np.flatnonzero(np.diff(shards, prepend=-1))  # where each shard's drawn samples begin
    bounds = [*starts.tolist(), len(drawn)]
    for begin, end in itertools.pairwise(bounds):
        s = int(shards[begin])
        tar, idx = catalog.shards[s]
        lines = Path(idx).read_text().splitlines()[1:]
        keep = [lines[i] for i in catalog.line[drawn[begin:end]]]
        path = folder / f"{s:06d}-{Path(idx).name}"
        path.write_text(f"{VERSION} {len(keep)}\n" + "".join(f"{text}\n" for text in keep))
        pairs.append((Path(tar), path))
    return pairs


def read_sample(f: BinaryIO, span: Sequence[int]) -> dict[str, bytes | str]:
    """One sample read from an open tar by its byte range: ``{"__key__": key, member: bytes, …}``, the form
    ``webdataset`` gives (members named by what follows the key, e.g. ``f00.jpg``)."""
    begin, end = int(span[0]), int(span[1])
    f.seek(begin)
    data = f.read(end - begin)
    sample: dict[str, bytes | str] = {}
    for name, offset, size in list_members(io.BytesIO(data), len(data)):
        key, member = split_name(name)
        sample["__key__"] = key
        sample[member] = data[offset : offset + size]
    return sample
