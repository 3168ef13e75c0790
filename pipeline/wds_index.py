"""DALI WebDataset index files (``.idx``): the same text DALI's ``wds2idx`` tool writes, byte for byte, and
its parser.

Format ``v1.2``: a first line ``v1.2 <num_samples>``, then one line per sample (consecutive tar members
with the same base name), each member as ``<ext> <data_offset> <size> <member_name>`` joined by spaces.
The base name is everything before the first dot of the file name, so keys must be dot-free. We always
name the index explicitly (``<shard>.idx``): ``wds2idx``'s default name also cuts at the first dot.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from memdpc.common.atomic import write_bytes_atomic
from memdpc.common.errors import UserError

__all__ = ["VERSION", "format_index", "index_path", "read_index", "scan_tar", "split_name"]

VERSION = "v1.2"

IndexEntry = tuple[str, int, int]
"""One regular tar member: (name, offset of its data in bytes, size in bytes)."""


def split_name(name: str) -> tuple[str, str]:
    """``dir/key.f00.jpg`` → (``dir/key``, ``f00.jpg``), exactly as ``wds2idx`` splits it."""
    dot = name.find(".", name.rfind("/") + 1)
    return name[:dot], name[dot + 1 :]


def index_path(tar_path: str | os.PathLike) -> Path:
    """The index file of a shard: the same name with ``.idx`` for ``.tar``."""
    return Path(tar_path).with_suffix(".idx")


def scan_tar(path: str | os.PathLike) -> list[IndexEntry]:
    """Regular members of a tar with their data offsets, read from the headers only."""
    try:
        with tarfile.open(path, "r:") as tar:
            return [(m.name, m.offset_data, m.size) for m in tar if m.type == tarfile.REGTYPE]
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"{path}: unreadable tar ({e})") from None


def format_index(entries: Iterable[IndexEntry]) -> str:
    """The index text for members in tar order (raises UserError for an empty shard, as wds2idx does)."""
    samples: list[list[str]] = []
    last = None
    for name, offset, size in entries:
        base, ext = split_name(name)
        if not base or base.endswith("/"):  # hidden files: wds2idx skips them
            continue
        part = f"{ext} {offset} {size} {name}"
        if base != last:
            samples.append([part])
            last = base
        else:
            samples[-1].append(part)
    if not samples:
        raise UserError("cannot index an empty WebDataset shard")
    return f"{VERSION} {len(samples)}\n" + "".join(" ".join(s) + "\n" for s in samples)


def read_index(idx_path: str | os.PathLike) -> Iterator[dict[str, tuple[int, int]]]:
    """Parse an index file: per sample, {member name: (data offset, size)}."""
    lines = Path(idx_path).read_text().splitlines()
    for line in lines[1:]:
        parts = line.split()
        yield {parts[i + 3]: (int(parts[i + 1]), int(parts[i + 2])) for i in range(0, len(parts), 4)}


def index_for_tar(path: str | os.PathLike) -> str:
    """The index text of an existing tar."""
    return format_index(scan_tar(path))


def write_index(tar_path: str | os.PathLike, idx_path: str | os.PathLike | None = None) -> Path:
    """Write the index of ``tar_path`` (to ``idx_path``, default ``<shard>.idx``) atomically."""
    idx = Path(idx_path) if idx_path is not None else index_path(tar_path)
    write_bytes_atomic(idx, index_for_tar(tar_path).encode())
    return idx
