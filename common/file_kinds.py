"""What a file given on the command line looks like, told from its first bytes and, for text, its content.

For errors that name what was given where something else was expected ("runs/rgb/metrics.jsonl: not a
memdpc checkpoint (it looks like a run's metrics)"), never for deciding how to read a file: each reader
still checks what it reads.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

__all__ = ["INDEX_KIND", "describe", "read_if_torch"]

TORCH = "a PyTorch file, such as a checkpoint"
TORCH_DAMAGED = "a truncated or damaged zip archive, as PyTorch files are"
RESULTS = "a results file of `memdpc eval`"
BINARY = "a binary file"
INDEX_KIND = "a video index"
QUICKSTART = "a quickstart folder"
# what `memdpc quickstart` writes in its folder: its options, its table (JSON and Markdown), the pretext table,
# MemDPC's paired comparison with each baseline
QUICKSTART_RECORD = "quickstart-run.json"
QUICKSTART_TABLE, QUICKSTART_MARKDOWN, QUICKSTART_PRETEXT, QUICKSTART_COMPARE = (
    "quickstart.json",
    "quickstart.md",
    "quickstart-pretext.json",
    "quickstart-compare.json",
)
QUICKSTART_PRETEXT_TITLE = "The pretext task (dense prediction) on the val videos, before and after training"
QUICKSTART_COMPARE_TITLE = "MemDPC against each baseline on the same test videos (memdpc eval compare)"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_TORCH_LEGACY = (
    b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # torch.save's pre-zip magic number
)
_VIDEO = (
    (4, b"ftyp"),
    (0, b"\x1a\x45\xdf\xa3"),
    (0, b"FLV"),
    (0, b"\x00\x00\x01\xba"),
    (0, b"\x00\x00\x01\xb3"),
)
_IMAGE = (b"\xff\xd8\xff", b"\x89PNG")
_JSON_LIMIT = 1 << 24  # a JSON file up to this size is parsed whole
RUN_METRICS, RUN_CONFIG = "metrics.jsonl", "config.yaml"  # what `memdpc train` writes in a run folder
_BY_NAME = {RUN_METRICS: "a run's metrics", RUN_CONFIG: "a run config"}


def read_if_torch(path: str | os.PathLike) -> bytes | None:
    """A file's bytes where it starts as a PyTorch file does (a zip, or the legacy format), in one read; None
    (after 4096 bytes) for any other file, so that a video given as a checkpoint is not read whole."""
    with open(path, "rb") as f:
        head = f.read(4096)
        return head + f.read() if head.startswith((*_ZIP_MAGIC, _TORCH_LEGACY)) else None


def describe(path: str | os.PathLike, data: bytes | None = None) -> str:
    """A short phrase for what ``path`` looks like: :data:`TORCH`, :data:`TORCH_DAMAGED`, :data:`RESULTS`,
    :data:`BINARY`, "a run's metrics", "a video file", :data:`QUICKSTART`, "a folder", … ``data``: the file's
    bytes, where they were read already (the file is then not opened)."""
    path = Path(path)
    if path.is_dir():
        return QUICKSTART if (path / QUICKSTART_RECORD).is_file() else "a folder"
    if data is None:
        with open(path, "rb") as f:
            head = f.read(4096)
    else:
        head = data[:4096]
    if head.startswith(_ZIP_MAGIC):
        return _zip(path if data is None else io.BytesIO(data))
    if head.startswith(_TORCH_LEGACY):
        return TORCH
    if head[:4] == b"RIFF" and head[8:11] == b"AVI" or any(head[at : at + len(m)] == m for at, m in _VIDEO):
        return "a video file"
    if head.startswith(_IMAGE):
        return "an image"
    if head[257:262] == b"ustar":
        return "a tar archive, a shard or a frame archive"
    if b"\x00" in head:
        return BINARY
    try:
        text = head.decode()
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not only a character cut by the 4096-byte read
            return BINARY
        text = head[: e.start].decode()
    if path.name in _BY_NAME:
        return _BY_NAME[path.name]
    if not text.strip():
        return "an empty file"
    if text.lstrip().startswith("{") and path.stat().st_size <= _JSON_LIMIT:
        text = (path.read_bytes() if data is None else data).decode(errors="replace")
    return _text(text)


def _zip(file: Path | io.BytesIO) -> str:
    try:
        with zipfile.ZipFile(file) as z:
            names = z.namelist()
    except zipfile.BadZipFile:
        return TORCH_DAMAGED
    if any(n.endswith("/data.pkl") for n in names):
        return TORCH
    if names and all(n.endswith(".npy") for n in names):
        return "a numpy .npz file, a results file's arrays or a feature cache"
    return "a zip archive"


def _text(text: str) -> str:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        try:  # JSON lines: the first one
            obj = json.loads(text.lstrip().splitlines()[0])
        except json.JSONDecodeError:
            obj = None
    if isinstance(obj, dict):
        if "metrics" in obj and "kind" in obj:
            return RESULTS
        if "clip" in obj and "shards" in obj:
            return "a shard manifest"
        if "step" in obj and "kind" in obj:
            return "a run's metrics"
        if "path" in obj and "label" in obj:
            return INDEX_KIND
        return "a JSON file"
    first = text.lstrip().splitlines()[0]
    if ":" in first and not first.startswith(("{", "[")):
        return "a run config" if "stream:" in text and "shards:" in text else "a YAML file"
    return "a text file"
