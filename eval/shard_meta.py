"""Reading single members of shards through their DALI index: per-window info and frames, without a scan.

The ``.idx`` of a shard gives each member's data offset and size, so the ``<key>.json`` of every window
(video id, start, fps, label) or the frames of a few windows (for plots) are read with one seek each.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memdpc.common.errors import UserError
from memdpc.pipeline.sample import INFO, is_frame_member
from memdpc.pipeline.shard_set import open_split
from memdpc.pipeline.wds_index import read_index, split_name

__all__ = ["window_frames", "window_info"]


def _members(shard_dir: str | os.PathLike, stream: str, split: str) -> Iterator[tuple[Path, dict]]:
    for tar, idx in open_split(shard_dir, stream, split).shards:
        if not idx.is_file():
            raise UserError(f"{idx}: DALI index of shard {tar.name} is missing")
        for members in read_index(idx):
            yield tar, members


def _read(f, offset: int, size: int) -> bytes:
    f.seek(offset)
    return f.read(size)


def window_info(shard_dir: str | os.PathLike, stream: str, split: str) -> dict[str, dict[str, Any]]:
    """{key: the window's ``<key>.json`` (video_id, start, fps, label, …)} for every window of a split."""
    out: dict[str, dict[str, Any]] = {}
    handles: dict[Path, Any] = {}
    try:
        for tar, members in _members(shard_dir, stream, split):
            name = next((n for n in members if split_name(n)[1] == INFO), None)
            if name is None:
                raise UserError(f"{tar}: a sample without a .json member")
            f = handles.setdefault(tar, open(tar, "rb"))  # noqa: SIM115 — closed below
            out[split_name(name)[0]] = json.loads(_read(f, *members[name]))
    finally:
        for f in handles.values():
            f.close()
    return out


def window_frames(
    shard_dir: str | os.PathLike, stream: str, split: str, keys: Iterable[str]
) -> dict[str, list[bytes]]:
    """{key: JPEG bytes of the window's frames in order} for the requested windows."""
    wanted = set(keys)
    out: dict[str, list[bytes]] = {}
    for tar, members in _members(shard_dir, stream, split):
        frames = sorted(n for n in members if is_frame_member(split_name(n)[1]))
        key = split_name(frames[0])[0] if frames else None
        if key in wanted:
            with open(tar, "rb") as f:
                out[key] = [_read(f, *members[n]) for n in frames]
            if len(out) == len(wanted):
                break
    return out
