"""The video index: one JSON line per video, the hand-off between the dataset readers and every stage.

Fields: ``id`` (unique, safe as a WebDataset key: letters, digits, ``_`` and ``-`` only), ``path``
(absolute), ``label`` (0-based int, -1 when the dataset has no class label), ``label_name``, ``split``
(``train`` / ``test`` / ``val``), and ``extra`` (dataset-specific facts, e.g. Oops failure times).
Preprocessing may add ``fps`` and ``num_frames``.

Beside an index, ``<index>.manifests`` lists the shard manifests made from it, one resolved path a line
(:func:`add_dependant`, by ``memdpc shard``), so that ``memdpc index`` can tell which shards an index it would
write over was made for (:func:`dependants`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common.atomic import atomic_path
from memdpc.common.digest import file_sha256
from memdpc.common.errors import UserError
from memdpc.common.file_kinds import INDEX_KIND, describe
from memdpc.common.wording import plural

__all__ = [
    "SPLIT_NAMES",
    "VIDEO_EXTS",
    "VideoRecord",
    "add_dependant",
    "check_unique",
    "dependants",
    "hold_out",
    "index_text",
    "read_index",
    "summary",
    "video_id",
    "write_index",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
VIDEO_EXTS = (".avi", ".mp4", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg")
SPLIT_NAMES = ("train", "val", "test")  # the splits an index holds
INDEX_HINT = "give the JSONL file `memdpc index DATASET_ROOT --layout …` writes"


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


def index_text(records: list[VideoRecord]) -> str:
    """The index file's text: one JSON line per record."""
    return "".join(r.to_json() + "\n" for r in records)


def write_index(records: list[VideoRecord], path: str | os.PathLike) -> None:
    """Write the index as JSONL, atomically (a failed run leaves no partial file)."""
    with atomic_path(path) as tmp:
        tmp.write_text(index_text(records))


def _dependants_path(index: str | os.PathLike) -> Path:
    return Path(f"{index}.manifests")


def add_dependant(index: str | os.PathLike, manifest: str | os.PathLike) -> None:
    """Record that the shard manifest ``manifest`` was made from ``index`` (once; under a lock, so that shard
    runs of several splits and streams at once all land). Where the index's folder is not writable nothing is
    recorded: ``index`` then cannot name these shards when it is asked to write over the index."""
    line = f"{Path(manifest).resolve()}\n"
    with contextlib.suppress(OSError), open(_dependants_path(index), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if line not in f.readlines():
            f.write(line)


def dependants(index: str | os.PathLike) -> list[Path]:
    """The shard manifests made from ``index`` as it is now: those its ``.manifests`` file lists that are still
    there and whose ``provenance`` names this file with the SHA-256 of its bytes."""
    try:
        listed = _dependants_path(index).read_text().splitlines()
        digest = file_sha256(index)
    except OSError:
        return []
    path, out = str(Path(index).resolve()), []
    for line in dict.fromkeys(listed):
        try:
            made_from = json.loads(Path(line).read_text()).get("provenance", {}).get("index") or {}
        except (OSError, ValueError, AttributeError):
            continue
        if made_from.get("path") == path and made_from.get("sha256") == digest:
            out.append(Path(line))
    return out


_TEXT_KINDS = (INDEX_KIND, "an empty file", "a text file", "a JSON file", "a YAML file")


def read_index(path: str | os.PathLike) -> list[VideoRecord]:
    """Read a JSONL video index, with a one-line error for a missing file, a folder or any other file given
    instead (a video, a results file, a checkpoint: :func:`memdpc.common.file_kinds.describe` says which), or a
    malformed line."""
    path = Path(path)
    if path.is_dir():
        raise UserError(
            f"{path}: is a folder, not a video index; `memdpc index {path} --layout folder` (or "
            "the dataset's layout) writes the index file"
        )
    if not path.is_file():
        raise UserError(f"{path}: video index not found; {INDEX_HINT}")
    kind = describe(path)
    if kind not in _TEXT_KINDS:  # a video, a results file, a checkpoint, …: say so; text: name the bad line
        raise UserError(f"{path}: is {kind}, not a video index; {INDEX_HINT}")
    records = []
    with open(path, encoding="utf-8", errors="replace") as f:  # line by line: the file is never held whole
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(VideoRecord(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise UserError(f"{path}:{lineno}: not a video index record ({e})") from None
    if not records:
        raise UserError(f"{path}: the video index is empty")
    return records


def hold_out(
    records: list[VideoRecord],
    val_per_class: int = 0,
    test_per_class: int = 0,
    *,
    seed: int | None = None,
    check: Callable[[VideoRecord], str | None] | None = None,
) -> list[VideoRecord]:
    """Move training videos of each class (unlabelled videos: of all of them) to split ``test`` (first) and then
    to ``val``.

    For layouts without such splits (a plain folder; UCF101 and HMDB51 have no ``val``, which the kNN monitor
    and ``--best-by knn`` choose on). Without ``seed`` the held-out videos are the last training videos of each
    class in id order (``test`` the last ``test_per_class``, ``val`` the last ``val_per_class`` of the rest, so
    ``val`` alone is what it was before ``test_per_class`` existed); with ``seed`` they are drawn at random per
    class (classes in label order, one generator). ``check`` (a video → why it is unusable, or None) is asked
    about the videos in that order until enough pass: those it refuses are passed over and stay in ``train``,
    so that a held-out split is not lost to files that will not read. Every class must keep a training video.
    """
    for option, n in (("--val-per-class", val_per_class), ("--test-per-class", test_per_class)):
        if n < 0:
            raise UserError(f"{option} must be ≥ 0, not {n}")
    if seed is not None and seed < 0:
        raise UserError(f"--seed must be ≥ 0, not {seed}")
    want = test_per_class + val_per_class
    if want == 0:
        return records
    by_class: dict[int, list[str]] = {r.label: [] for r in records}  # also a class without training videos
    for r in records:
        if r.split == "train":
            by_class[r.label].append(r.id)
    by_id = {r.id: r for r in records}
    names = {r.label: r.label_name for r in records}
    rng = None if seed is None else np.random.default_rng(seed)
    moved: dict[str, str] = {}
    for label, ids in sorted(by_class.items()):
        name = names[label]
        if len(ids) <= want:
            whose = f"class '{name}' has" if label >= 0 else "the unlabelled videos have"
            raise UserError(
                f"{whose} {plural(len(ids), 'training video')}: too few to hold out "
                f"{_held(val_per_class, test_per_class)} and still train on one"
            )
        ids = sorted(ids)
        order = ids[::-1] if rng is None else [ids[i] for i in rng.permutation(len(ids))]
        if check is not None:
            order, refused = _usable(order, want, lambda i: check(by_id[i]))
            if len(order) < want:
                path, why = by_id[refused[0][0]].path, refused[0][1]
                whose = f"class '{name}'" if label >= 0 else "the unlabelled videos"
                raise UserError(
                    f"{whose}: only {len(order)} of its {plural(len(ids), 'training video')} "
                    f"{'reads' if len(order) == 1 else 'read'}, too few to hold out "
                    f"{_held(val_per_class, test_per_class)} (e.g. {path}: {why})"
                )
        moved.update(dict.fromkeys(order[:test_per_class], "test"))
        moved.update(dict.fromkeys(order[test_per_class:want], "val"))
    return [replace(r, split=moved[r.id]) if r.id in moved else r for r in records]


def _usable(
    order: list[str], want: int, check: Callable[[str], str | None]
) -> tuple[list[str], list[tuple[str, str]]]:
    """The first ``want`` ids of ``order`` that ``check`` passes (fewer when too few do), and those it refused
    on the way, with why."""
    taken: list[str] = []
    refused: list[tuple[str, str]] = []
    for vid in order:
        if len(taken) == want:
            break
        why = check(vid)
        if why is None:
            taken.append(vid)
        else:
            refused.append((vid, why))
    return taken, refused


def _held(val: int, test: int) -> str:
    parts = [f"{test} for test"] * bool(test) + [f"{val} for validation"] * bool(val)
    return " and ".join(parts)


def summary(records: list[VideoRecord]) -> dict[str, Counter]:
    """Per-split counts of videos per class name."""
    out: dict[str, Counter] = {}
    for r in records:
        out.setdefault(r.split, Counter())[r.label_name] += 1
    return out
