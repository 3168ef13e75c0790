"""Fast plain-USTAR headers: the hot path of sharding, which writes and lists tens of members per sample.

:mod:`tarfile` builds and parses headers slowly in Python (docs/stages.md, Shard); sharding only ever needs plain
regular-file USTAR headers with fixed owner, mode and mtime, so :func:`header` patches a template made by
:mod:`tarfile` itself (same bytes, tested), and :func:`list_members` reads headers directly, refusing
anything that is not a plain regular file (callers then fall back to :mod:`tarfile`). :func:`member_bytes`
and :func:`tar_size` say how large a tar of given members is, before it is written.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["BLOCK", "list_members", "padding"]

BLOCK = tarfile.BLOCKSIZE
RECORD = tarfile.RECORDSIZE
MAX_NAME = 100  # the USTAR name field; longer names need a prefix, which shard keys never use


def _template() -> bytes:
    info = tarfile.TarInfo("x")
    info.size, info.mode, info.mtime = 0, 0o644, 0
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


_TEMPLATE = _template()


class NotPlainUstar(ValueError):
    """A header this module does not handle (not USTAR, not a regular file, long name, bad checksum)."""


def header(name: str, size: int) -> bytes:
    """The 512-byte USTAR header of a regular file, identical to what :mod:`tarfile` writes for it."""
    raw = name.encode()
    if len(raw) > MAX_NAME or size < 0:
        raise NotPlainUstar(f"{name}: name longer than {MAX_NAME} bytes or negative size")
    b = bytearray(_TEMPLATE)
    b[0:MAX_NAME] = raw.ljust(MAX_NAME, b"\0")
    b[124:136] = b"%011o\0" % size
    b[148:156] = b" " * 8
    b[148:156] = b"%06o\0 " % sum(b)
    return bytes(b)


def padding(size: int) -> int:
    """Zero bytes after ``size`` bytes of member data."""
    return -size % BLOCK


def member_bytes(size):
    """Bytes a member of ``size`` data bytes takes in a tar: its header, its data, the padding to a whole block
    (elementwise for an array of sizes)."""
    return BLOCK + size + padding(size)


def tar_size(body: int) -> int:
    """Size of a tar whose members take ``body`` bytes (:func:`member_bytes` summed), as :mod:`tarfile` and
    the shard writer close it: two zero blocks, then zeros to a whole record."""
    n = body + 2 * BLOCK
    return n + padding_to_record(n)


def padding_to_record(n: int) -> int:
    return -n % RECORD


def _octal(field: bytes) -> int:
    return int(field.rstrip(b"\0 ").decode() or "0", 8)


def list_members(f: BinaryIO, file_size: int) -> Iterator[tuple[str, int, int]]:
    """(name, data offset, size) of every member, reading only the headers; NotPlainUstar for anything
    else than plain regular files, ValueError for a truncated or corrupt tar."""
    offset = 0
    while offset + BLOCK <= file_size:
        f.seek(offset)
        h = f.read(BLOCK)
        if h.count(0) == BLOCK:
            return
        if h[257:263] != b"ustar\0" or h[156:157] not in (b"0", b"\0") or h[345:500].strip(b"\0"):
            raise NotPlainUstar(f"member at byte {offset} is not a plain USTAR file")
        if _octal(h[148:156]) != sum(h[:148]) + 256 + sum(h[156:]):
            raise ValueError(f"bad header checksum at byte {offset}")
        size = _octal(h[124:136])
        if offset + BLOCK + size > file_size:
            raise ValueError(f"truncated: member at byte {offset} runs past the end")
        yield h[:MAX_NAME].split(b"\0", 1)[0].decode(), offset + BLOCK, size
        offset += BLOCK + size + padding(size)
    if offset < file_size or file_size == 0:
        raise ValueError("truncated: no end-of-archive marker")
