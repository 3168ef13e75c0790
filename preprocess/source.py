"""A source video's identity as its frame archives record it, and how the file there now differs from it.

``meta.json`` records the file an archive was made from: ``source`` (its path), ``source_size``,
``source_mtime_ns`` and ``source_sha256`` (the SHA-256 of its bytes, read once the video is decoded, from the
page cache). Comparing costs a ``stat``; the digest is read again only where size and modification time disagree
about a change (the same size, another time: a copy or a touch that kept the bytes, or another file of the same
size). ``preprocess`` (a rerun), ``shard`` (the archives it cuts), ``eval`` (the shards it reads) and ``report``
(the chain of a result) all compare through :func:`source_changes`. Where the index names another path than the
archive records, :func:`same_bytes` tells the source moved or copied with its folder (the same size and SHA-256)
from another video with the same id.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from memdpc.common.digest import file_sha256

__all__ = ["same_bytes", "source_changes"]


def source_changes(meta: dict[str, Any], path: str | os.PathLike | None = None) -> list[str]:
    """How the file at ``path`` (default: the recorded ``source``) differs from the source ``meta`` records, in
    words (``size 16434 → 184156 bytes``, ``modified … → …``, ``content: SHA-256 … → …``); empty when it is the same,
    when the archive records no identity (written before it did), or when the file is gone (its archive is all
    that is left of it: nothing to compare)."""
    path = meta.get("source") if path is None else path
    if path is None or "source_size" not in meta:
        return []
    try:
        stat = os.stat(path)
    except OSError:
        return []
    changes = []
    if stat.st_size != meta["source_size"]:
        changes.append(f"size {meta['source_size']} → {stat.st_size} bytes")
    if stat.st_mtime_ns != meta.get("source_mtime_ns"):
        changes.append(f"modified {_when(meta.get('source_mtime_ns'))} → {_when(stat.st_mtime_ns)}")
        if len(changes) == 1 and "source_sha256" in meta:  # the same size at another time: the same bytes?
            try:
                now = file_sha256(path)
            except OSError:
                return []
            if now == meta["source_sha256"]:
                return []  # touched, or copied with its bytes
            changes.append(f"content: SHA-256 {meta['source_sha256'][:12]} → {now[:12]}")
    return changes


def same_bytes(meta: dict[str, Any], path: str | os.PathLike) -> bool:
    """Whether the file at ``path`` holds the bytes of the source ``meta`` records (its size, then its SHA-256):
    the source moved or copied elsewhere, e.g. with the folder it and its archives are in. False where ``meta``
    records no digest or the file does not read."""
    if "source_sha256" not in meta:
        return False
    try:
        stat = os.stat(path)
        return stat.st_size == meta["source_size"] and file_sha256(path) == meta["source_sha256"]
    except OSError:
        return False


def _when(mtime_ns: Any) -> str:
    if not isinstance(mtime_ns, int):
        return "?"
    return datetime.fromtimestamp(mtime_ns / 1e9).isoformat(sep=" ", timespec="seconds")
