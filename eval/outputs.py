"""The files one ``memdpc eval`` task writes under ``--out``, the checkpoint and the shards they come from.

Results files record the checkpoint they were made from (its path and SHA-256, ``source``) and each split of
shards they read (its manifest's path and SHA-256, ``shards``), so a task
refuses to replace results of another checkpoint (or of the same file since changed) unless told
``--overwrite``; the same checkpoint evaluated again rewrites its own. Every file a task writes or keeps
(feature caches, the finetune state, the finetuned classifier, plots) is added here: the results file lists
them (the command line names them at the end), and an interrupted task says which ones it kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.model.checkpoint import Checkpoint
from memdpc.pipeline.provenance import manifest_identity

__all__ = ["Outputs"]


def checkpoint_source(checkpoint: str | os.PathLike | Checkpoint) -> dict[str, str]:
    """``{"checkpoint": resolved path, "sha256": of its bytes}``: what results and caches are keyed by (of a
    :class:`~memdpc.model.checkpoint.Checkpoint`, the digest of the bytes it was read from)."""
    path = Path(checkpoint).resolve()
    if isinstance(checkpoint, Checkpoint):
        return {"checkpoint": str(path), "sha256": checkpoint.sha256}
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return {"checkpoint": str(path), "sha256": digest.hexdigest()}


@dataclass
class Outputs:
    """Where a task writes (``folder``), from which checkpoint, and what it has written so far."""

    folder: Path
    checkpoint: Path | Checkpoint
    overwrite: bool = False
    files: dict[Path, tuple[str, str]] = field(default_factory=dict)  # path -> (role, what an interrupt kept)

    @functools.cached_property
    def source(self) -> dict[str, str]:
        """:func:`checkpoint_source` of the checkpoint, made once (after the task has loaded it: a file that
        is none gets the loader's error first)."""
        return checkpoint_source(self.checkpoint)

    def claim(self, name: str) -> Path:
        """The path of the results file ``name``; refuses (before any work) one that holds results of another
        checkpoint, unless ``overwrite``."""
        path = self.folder / name
        if self.overwrite or not path.is_file():
            return path
        try:
            before = json.loads(path.read_text()).get("source") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            before = {}
        if before.get("sha256") == self.source["sha256"]:
            return path
        if not before:
            whose = "of a checkpoint it does not record (an earlier memdpc wrote it)"
        elif before.get("checkpoint") == self.source["checkpoint"]:
            whose = f"of {before['checkpoint']} as it was before it changed"
        else:
            whose = f"of another checkpoint, {before.get('checkpoint')}"
        raise UserError(
            f"{path} holds results {whose}; give another --out for {self.source['checkpoint']}, "
            "or --overwrite to replace them"
        )

    def add(self, role: str, path: str | os.PathLike, kept: str = "") -> None:
        """Record a file written (or reused) under ``role`` (a key of ``results.FILE_ROLES``); ``kept`` is what
        an interrupt after this point reports (empty: nothing worth saying)."""
        self.files[Path(path)] = (role, kept)

    def listing(self) -> dict[str, list[str]]:
        """{role: file names relative to ``folder``} for the results file."""
        out: dict[str, list[str]] = {}
        for path, (role, _) in self.files.items():
            out.setdefault(role, []).append(os.path.relpath(path, self.folder))
        return out

    def kept(self, first: str = "") -> list[str]:
        """What an interrupt or a fault leaves behind, and how to go on; ``first``: what to do before the same
        command runs again (e.g. ``free space there``)."""
        notes = [kept for _, kept in self.files.values() if kept]
        then = f"{first}, then " if first else ""
        if not notes:
            return [f"nothing written to {self.folder} yet; {then}the same command starts again"]
        return [*notes, f"{then}the same command resumes"]

    def record(self, data: EvalData, splits: tuple[str, ...]) -> dict[str, Any]:
        """What the results file records of its inputs and outputs: ``source``, ``shards`` (per split of
        ``data`` the task read: :func:`~memdpc.pipeline.provenance.manifest_identity`) and ``files``."""
        shards = {split: manifest_identity(data.loader.shards, data.loader.stream, split) for split in splits}
        return {"source": self.source, "shards": shards, "files": self.listing()}
