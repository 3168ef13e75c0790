"""Per-video frame archives: the hand-off from preprocessing to sharding.

One uncompressed tar per video and stream, ``<root>/<stream>/<video_id>.tar``, holding the encoded frames
``000000.jpg, 000001.jpg, …`` in order and, last, ``meta.json`` (``num_frames``, ``fps``, ``height``,
``width``, ``stream``, ``encoding``, plus stage details, and ``frame_bytes``: each frame's size, so that a reader
finds every frame from ``meta.json`` alone, :func:`recorded_frames`). An archive exists under its final name only
when complete (written under a temporary name, then renamed), so its presence means "this video is done".
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError

__all__ = [
    "ArchiveWriter",
    "FRAME_BYTES",
    "META",
    "archive_path",
    "frame_index",
    "frame_name",
    "read_archive",
    "read_meta",
    "recorded_frames",
    "temporary_in_use",
    "write_archive",
]

META = "meta.json"
FRAME_BYTES = "frame_bytes"  # the key of meta.json that lists each frame's size, in order
_FRAME = re.compile(r"^(\d{6})\.jpg$")
# bytes read from an archive's end to find meta.json (its header, data and the tar's end), each where the one
# before did not reach it (a long video's list of frame sizes)
_TAILS = (32 * 1024, 256 * 1024, 2 * 2**20)
_BLOCK = tarfile.BLOCKSIZE


def archive_path(root: str | os.PathLike, stream: str, video_id: str) -> Path:
    """A video's frame archive of one stream: ``<root>/<stream>/<video_id>.tar``."""
    return Path(root) / stream / f"{video_id}.tar"


def frame_name(i: int, ext: str = "jpg") -> str:
    """The member name of frame ``i`` in an archive (``000012.jpg``): zero-padded, so that names sort as frames do."""
    return f"{i:06d}.{ext}"


def frame_index(name: str) -> int | None:
    """The number of a JPEG frame member (``frame_name(i)``), or None for any other name."""
    match = _FRAME.match(name)
    return int(match[1]) if match else None


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


class ArchiveWriter:
    """Append encoded frames to an archive one at a time; it appears under its final name only on commit.

    Use as a context manager: ``add`` frames, then ``commit(meta)``; leaving the block without a commit
    (an exception, or a decision not to keep the video) removes the temporary file. Several writers can
    be open at once, so one decode can feed the RGB and the flow archive of a video. A fault of the output (a
    full disk: :func:`memdpc.common.atomic.atomic_path`) is raised as a
    :class:`~memdpc.common.errors.ResourceFault`, the temporary file removed.

    The temporary file is locked (``flock``) until it is renamed or removed, so that another run on the same
    folder, which removes the temporary archives that killed runs left (:func:`remove_temporaries`), leaves this
    one alone.
    """

    def __init__(self, path: str | os.PathLike, ext: str = "jpg") -> None:
        self.path, self.ext, self.num_frames = Path(path), ext, 0
        self._sizes: list[int] = []
        self._atomic = atomic_path(self.path)
        self._file = None
        self._tar: tarfile.TarFile | None = None
        self._committed = False

    def __enter__(self) -> ArchiveWriter:
        tmp = self._atomic.__enter__()
        try:
            self._file = open(tmp, "wb")  # noqa: SIM115 — closed in __exit__, after the rename
            with contextlib.suppress(OSError):  # a file system without locks: nothing to tell other runs
                fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)
        except BaseException as e:
            if self._file is not None:
                self._file.close()
            self._atomic.__exit__(type(e), e, e.__traceback__)  # a fault of the output is raised as one
            raise
        return self

    def add(self, data: bytes) -> None:
        _add(self._tar, frame_name(self.num_frames, self.ext), data)
        self._tar.members.clear()  # a writing TarFile keeps every header; drop them so memory stays flat
        self._sizes.append(len(data))
        self.num_frames += 1

    def commit(self, meta: dict[str, Any]) -> None:
        """Write ``meta.json`` (with ``num_frames`` and ``frame_bytes`` set) and rename the archive into place on
        exit."""
        meta = {**meta, "num_frames": self.num_frames, FRAME_BYTES: self._sizes}
        _add(self._tar, META, json.dumps(meta).encode())
        self._committed = True

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self._tar.close()  # writes the tar's end: a full disk can fail it too
            self._file.flush()
        except OSError as e:
            if exc is None:
                exc_type, exc, tb = type(e), e, e.__traceback__
        if exc_type is None and not self._committed:
            exc_type, exc = RuntimeError, RuntimeError("not committed")  # discard: remove the temporary file
        try:
            return bool(self._atomic.__exit__(exc_type, exc, tb)) and exc is None
        finally:
            with contextlib.suppress(OSError):  # what a failed write left in its buffer: the file is gone
                self._file.close()  # lets go of the lock


def temporary_in_use(path: str | os.PathLike) -> bool:
    """Whether a live writer holds the temporary archive ``path`` (:class:`ArchiveWriter` locks it); False for
    one a killed run left, or where the file system has no locks."""
    try:
        with open(path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def write_archive(
    path: str | os.PathLike, frames: Iterable[bytes], meta: dict[str, Any], ext: str = "jpg"
) -> int:
    """Write encoded frames (consumed as they come, so memory stays flat) and ``meta.json`` atomically.

    Returns the number of frames written; ``meta['num_frames']`` is set to it.
    """
    with ArchiveWriter(path, ext) as w:
        for data in frames:
            w.add(data)
        w.commit(meta)
    return w.num_frames


def _meta_in_tail(tail: bytes) -> tuple[dict[str, Any], int] | None:
    """``meta.json`` as the last member of a tar whose last bytes (from a multiple of 512 on) are ``tail``, and
    where its header begins in ``tail``; None when it is not there. Members start on 512-byte blocks; the
    tar ends with zero blocks, so the last member's data ends in the last block that is not all zeros."""
    block = _BLOCK
    end = len(tail)
    while end >= block and not tail[end - block : end].strip(b"\0"):
        end -= block
    for h in range(end - block, -1, -block):
        header = tail[h : h + block]
        if not header.startswith(META.encode() + b"\0"):
            continue
        try:
            size = int(header[124:136].rstrip(b"\0 ").decode() or "0", 8)
            checksum = int(header[148:156].rstrip(b"\0 ").decode(), 8)
        except ValueError:
            continue
        if checksum != sum(header[:148]) + 256 + sum(header[156:]):
            continue
        data_end = h + block + size
        if data_end <= end and end - data_end < block:  # the data ends in the last block before the zeros
            return json.loads(tail[h + block : data_end]), h
    return None


def _meta_at_end(path: Path) -> tuple[dict[str, Any] | None, int]:
    """(``meta.json``, the offset of its header) from the archive's last bytes; meta None when they do not hold
    it (a tar written otherwise)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        for tail in _TAILS:
            start = max(0, size - tail) // _BLOCK * _BLOCK
            f.seek(start)
            found = _meta_in_tail(f.read())
            if found is not None:
                return found[0], start + found[1]
            if start == 0:
                break
    return None, 0


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """An archive's ``meta.json`` alone, cheaply: it is the last member, so reading the archive's last
    kilobytes finds it (a full walk of the headers only for a tar written otherwise). UserError when the
    archive is unreadable or has no ``meta.json``."""
    path = Path(path)
    try:
        meta = _meta_at_end(path)[0]
        if meta is None:
            with tarfile.open(path, "r:") as tar:
                member = next((m for m in tar if m.name == META and m.isfile()), None)
                meta = json.loads(tar.extractfile(member).read()) if member else None
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path}: unreadable frame archive ({e})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: frame archive has no {META} (incomplete or not a memdpc archive)")
    return meta


def recorded_frames(path: str | os.PathLike) -> tuple[dict[str, Any], np.ndarray, np.ndarray] | None:
    """An archive's ``meta.json`` (without ``frame_bytes``) and the data offset and size of each frame, from
    ``meta.json`` alone: the sizes it records, laid out as :class:`ArchiveWriter` writes them (a 512-byte header
    before each member, its data padded to 512 bytes), and checked against where ``meta.json`` itself begins.
    None where the archive records no sizes (an earlier version wrote it), they do not lead to ``meta.json``, or
    its end is unreadable: its headers then tell. OSError where the file cannot be opened."""
    try:
        meta, at = _meta_at_end(Path(path))
    except ValueError:  # JSONDecodeError: a damaged meta.json
        return None
    sizes = meta.get(FRAME_BYTES) if isinstance(meta, dict) else None
    if not isinstance(sizes, list) or len(sizes) != meta.get("num_frames"):
        return None
    try:
        sizes = np.array(sizes, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if sizes.ndim != 1 or (sizes < 0).any():
        return None
    members = _BLOCK + sizes + -sizes % _BLOCK
    ends = np.cumsum(members)
    if (ends[-1] if len(ends) else 0) != at:
        return None
    offsets = ends - members + _BLOCK
    return {k: v for k, v in meta.items() if k != FRAME_BYTES}, offsets, sizes


def read_archive(path: str | os.PathLike) -> tuple[dict[str, Any], list[bytes]]:
    """Read an archive: its metadata and the encoded frames in order. Corrupt or incomplete → UserError."""
    path = Path(path)
    try:
        with tarfile.open(path, "r:") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"{path}: unreadable frame archive ({e})") from None
    if META not in members:
        raise UserError(f"{path}: frame archive has no {META} (incomplete or not a memdpc archive)")
    meta = json.loads(members.pop(META))
    frames = [members[k] for k in sorted(members)]
    if len(frames) != meta.get("num_frames"):
        raise UserError(f"{path}: {len(frames)} frames, but {META} says {meta.get('num_frames')}")
    return meta, frames
