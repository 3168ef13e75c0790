"""The video index: one JSON line per video, the hand-off between the dataset readers and every stage.

Fields: ``id`` (unique, safe as a WebDataset key: letters, digits, ``_`` and ``-`` only), ``path``
(absolute), ``label`` (0-based int, -1 when the dataset has no class label), ``label_name``, ``split``
(``train`` / ``test`` / ``val``), and ``extra`` (dataset-specific facts, e.g. Oops failure times).
Preprocessing may add ``fps`` and ``num_frames``.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from memdpc.atomic import atomic_path
from memdpc.errors import UserError

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def video_id(name: str) -> str:
    """A WebDataset-safe id from a file name or relative path: extension dropped, anything else → ``_``."""
    stem = name.rsplit(".", 1)[0] if "." in Path(name).name else name
    return _UNSAFE.sub("_", stem)


@dataclass
class VideoRecord:
    id: str
    path: str
    label: int
    label_name: str
    split: str
    fps: float | None = None
    num_frames: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        if not d["extra"]:
            del d["extra"]
        for k in ("fps", "num_frames"):
            if d[k] is None:
                del d[k]
        return json.dumps(d)


def check_unique(records: list[VideoRecord], source: str | os.PathLike) -> None:
    """Refuse duplicate ids, naming both videos."""
    seen: dict[str, VideoRecord] = {}
    for r in records:
        if r.id in seen:
            raise UserError(f"{source}: duplicate video id '{r.id}' for {seen[r.id].path} and {r.path}")
        seen[r.id] = r


def write_index(records: list[VideoRecord], path: str | os.PathLike) -> None:
    """Write the index as JSONL, atomically (a failed run leaves no partial file)."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(r.to_json() + "\n" for r in records))


def read_index(path: str | os.PathLike) -> list[VideoRecord]:
    """Read a JSONL video index, with a clear error for a missing file or a malformed line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: video index not found")
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(VideoRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise UserError(f"{path}:{lineno}: not a video index record ({e})") from None
    if not records:
        raise UserError(f"{path}: the video index is empty")
    return records


def hold_out_val(records: list[VideoRecord], per_class: int) -> list[VideoRecord]:
    """Move the last ``per_class`` training videos of each class (in id order) to split ``val``.

    For layouts without a validation split (UCF101, HMDB51): the kNN monitor and ``--best-by knn`` then
    choose on videos that are neither trained on nor tested. Every class must keep a training video.
    """
    if per_class < 0:
        raise UserError(f"--val-per-class must be ≥ 0, not {per_class}")
    if per_class == 0:
        return records
    by_class: dict[int, list[str]] = {}
    for r in records:
        if r.split == "train":
            by_class.setdefault(r.label, []).append(r.id)
    val = set()
    for label, ids in sorted(by_class.items()):
        if len(ids) <= per_class:
            name = next(r.label_name for r in records if r.label == label)
            raise UserError(f"class '{name}' has {len(ids)} training video(s): too few to hold {per_class} out "
                            "for validation and still train on one")
        val.update(sorted(ids)[-per_class:])
    return [replace(r, split="val") if r.id in val else r for r in records]


def summary(records: list[VideoRecord]) -> dict[str, Counter]:
    """Per-split counts of videos per class name."""
    out: dict[str, Counter] = {}
    for r in records:
        out.setdefault(r.split, Counter())[r.label_name] += 1
    return out
