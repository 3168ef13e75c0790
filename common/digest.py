"""The SHA-256 of a file's bytes, read in chunks (memory stays flat): what ``sha256sum`` prints, and how memdpc
names a file's content wherever it records one (shards, manifests, source videos)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["file_sha256"]


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file's bytes (hex), read in chunks of ``chunk`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
