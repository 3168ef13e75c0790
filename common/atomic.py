"""Atomic file output: write to a temporary name beside the target, rename into place when complete.

A killed process therefore never leaves a half-written file under the final name, and a re-run can
treat "the final name exists" as "this unit of work is done". A write that fails for a fault of the output
(its file system full, a quota, read-only, forbidden: :func:`memdpc.common.errors.resource_fault`) removes the
temporary file and raises :class:`~memdpc.common.errors.ResourceFault`, which stops the run; the file
previously under the final name, if any, is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memdpc.common.errors import output_faults

__all__ = [
    "TMP_PREFIX",
    "atomic_path",
    "remove_stale_tmp",
    "tmp_name",
    "write_bytes_atomic",
    "write_json_atomic",
]

TMP_PREFIX = ".tmp-"


def tmp_name(path: Path, pid: int | None = None) -> Path:
    """The temporary name used while ``path`` is being written by process ``pid`` (default: this one): hidden,
    unique per process, and keeping the extension (OpenCV and tar writers choose their format from it)."""
    return path.with_name(f"{TMP_PREFIX}{os.getpid() if pid is None else pid}-{path.name}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path; on success fsync and rename it to ``path``, on error remove it. A fault of the
    output raised while the block writes (or while this syncs and renames) becomes a ResourceFault."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        with output_faults(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def remove_stale_tmp(folder: str | os.PathLike) -> int:
    """Delete temporary files left in ``folder`` by killed runs; return how many were removed."""
    removed = 0
    for p in Path(folder).glob(f"{TMP_PREFIX}*"):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed += 1
    return removed
