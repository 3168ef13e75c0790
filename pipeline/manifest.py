"""Shard manifests: ``<out>/<stream>/manifest-<split>.json``, read, written and checked against the shards.

The manifest is written last (atomically), so its presence means every shard it lists is complete. It
holds the configuration (stream, split, clip geometry, window rule, seed, shard limits), the frame
encoding, the frame sizes (``frame_sizes``: each size with its video and sample counts; ``frame_size``:
the one size, or None where the videos have several), class names (index = label), sample and video
counts, per shard its tar name, index name, sample count, size and SHA-256, and ``provenance``: what the shards
were made from (the index, the frame archive folder, each video's label and archive; :mod:`memdpc.pipeline.shard`
writes it, :mod:`memdpc.pipeline.provenance` reads it). The names of the files
in a stream's folder are spelled here (:func:`manifest_path`, :func:`shard_name`, :func:`checksum_path`;
the index: ``wds_index.index_path``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memdpc.common.atomic import write_json_atomic
from memdpc.common.digest import file_sha256
from memdpc.common.errors import UserError
from memdpc.pipeline.sample import INFO, LABEL, LABEL_BYTES, decode_label, sample_key, sample_members
from memdpc.pipeline.wds_index import format_index, scan_tar, split_name

__all__ = [
    "VerifyResult",
    "checksum_path",
    "find_manifests",
    "frame_sizes",
    "manifest_path",
    "read_manifest",
    "shard_name",
    "shard_paths",
    "shard_pattern",
    "stream_dir",
    "verify_shards",
    "write_manifest",
]


def stream_dir(shard_dir: str | os.PathLike, stream: str) -> Path:
    """A stream's folder in a shard folder: ``<shard_dir>/<stream>``."""
    return Path(shard_dir) / stream


def manifest_path(shard_dir: str | os.PathLike, stream: str, split: str) -> Path:
    """The manifest of a stream's split in a shard folder: ``<shard_dir>/<stream>/manifest-<split>.json``."""
    return stream_dir(shard_dir, stream) / f"manifest-{split}.json"


def shard_name(split: str, k: int) -> str:
    """The file name of the ``k``-th shard of ``split``: ``<split>-NNNNNN.tar``."""
    return f"{split}-{k:06d}.tar"


def shard_pattern(split: str) -> str:
    """A glob pattern that matches every shard of ``split`` in a stream's folder."""
    return f"{split}-*.tar"


def checksum_path(tar_path: Path) -> Path:
    """``<shard>.sha256`` in ``sha256sum`` format, written before the shard is renamed into place: on resume
    it tells whether a shard in place is intact."""
    return tar_path.with_suffix(".sha256")


def write_manifest(path: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write a manifest atomically (temporary name, then rename); returns its path."""
    write_json_atomic(path, manifest)
    return Path(path)


# resolved path -> (the file's identity, its SHA-256, its content): what this process has read of each manifest
_READ: dict[Path, tuple[tuple[int, int, int, int], str, dict[str, Any]]] = {}


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    """A manifest's SHA-256 and content, read once per process while the file stays the one read: training and
    evaluation consult a split's manifest from several places (its clips, classes, shards, provenance), and a
    manifest of a large dataset lists every video. A manifest is replaced only by a rename (:func:`write_manifest`),
    which gives the path another file, so its device, inode, size and modification time tell a new one."""
    st = path.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    seen = _READ.get(path)
    if seen is not None and seen[0] == identity:
        return seen[1], seen[2]
    data = path.read_bytes()
    manifest = json.loads(data)
    _READ[path] = (identity, hashlib.sha256(data).hexdigest(), manifest)
    return _READ[path][1], manifest


def read_manifest(shard_dir: str | os.PathLike, stream: str, split: str) -> tuple[dict[str, Any], str]:
    """The manifest of one stream and split and the SHA-256 of its bytes (as ``sha256sum`` gives it), read once per
    process (callers read it, never change it; :class:`memdpc.pipeline.shard_set.ShardSplit` types it); UserError
    if it is missing, unreadable or another split's."""
    path = manifest_path(shard_dir, stream, split)
    if not path.is_file():
        raise UserError(
            f"{path}: shard manifest not found (run `memdpc shard … --stream {stream} "
            f"--split {split}` first, or check the directory)"
        )
    try:
        sha256, manifest = _read(path.resolve())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{path}: unreadable shard manifest ({e})") from None
    if manifest.get("stream") != stream or manifest.get("split") != split or "shards" not in manifest:
        raise UserError(f"{path}: not a {stream}/{split} shard manifest")
    return manifest, sha256


def frame_sizes(manifest: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The (height, width) of the frames of a loaded manifest's samples, most samples first; empty for
    shards of several sizes written before the manifest listed them."""
    if "frame_sizes" in manifest:
        return [(int(s["height"]), int(s["width"])) for s in manifest["frame_sizes"]]
    size = manifest.get("frame_size")
    return [(int(size[0]), int(size[1]))] if size else []


def shard_paths(shard_dir: str | os.PathLike, manifest: Mapping[str, Any]) -> list[tuple[Path, Path]]:
    """(tar, idx) paths of every shard of a loaded manifest."""
    folder = stream_dir(shard_dir, manifest["stream"])
    return [(folder / s["name"], folder / s["index"]) for s in manifest["shards"]]


@dataclass
class VerifyResult:
    manifest: Path
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


def _check_samples(tar: Path, num_frames: int, stream: str, problems: list[str]) -> tuple[int, set[str]]:
    """Group the members by key and check each sample's members, label and JSON; return (count, videos)."""
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(tar, "r:") as t:
        for m in t:
            if m.isfile():
                base, ext = split_name(m.name)
                if ext in (LABEL, INFO):
                    members.setdefault(base, {})[ext] = t.extractfile(m).read()
                else:
                    members.setdefault(base, {})[ext] = b""
    videos = set()
    want = set(sample_members(num_frames))
    for key, parts in members.items():
        if set(parts) != want:
            problems.append(f"{tar.name}: sample {key} has members {sorted(set(parts) ^ want)} wrong")
            continue
        info = json.loads(parts[INFO])
        videos.add(info["video_id"])
        if key != sample_key(info["video_id"], info["start"]) or info["stream"] != stream:
            problems.append(f"{tar.name}: sample {key} has JSON {info}")
        if len(parts[LABEL]) != LABEL_BYTES or decode_label(parts[LABEL]) != info["label"]:
            problems.append(
                f"{tar.name}: sample {key} has label bytes {parts[LABEL]!r}, JSON says {info['label']}"
            )
    return len(members), videos


def verify_manifest(path: Path) -> VerifyResult:
    """Re-read every shard of one manifest: size, SHA-256, index text, members and counts."""
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError) as e:
        return VerifyResult(path, problems=[f"{path.name}: unreadable manifest ({e})"])
    folder = path.parent
    res = VerifyResult(path)
    videos: set[str] = set()
    for s in manifest["shards"]:
        tar, idx = folder / s["name"], folder / s["index"]
        if not tar.is_file() or not idx.is_file():
            res.problems.append(f"{s['name']}: shard or its index is missing")
            continue
        res.shards += 1
        res.bytes += tar.stat().st_size
        if tar.stat().st_size != s["bytes"] or file_sha256(tar) != s["sha256"]:
            res.problems.append(f"{s['name']}: size or SHA-256 differs from the manifest")
            continue
        if idx.read_text() != format_index(scan_tar(tar)):
            res.problems.append(f"{s['index']}: index does not match its shard")
        checksum = checksum_path(tar)
        if checksum.is_file() and checksum.read_text().split(" ", 1)[0] != s["sha256"]:
            res.problems.append(f"{checksum.name}: differs from the manifest's SHA-256")
        count, vids = _check_samples(
            tar,
            manifest["clip"]["num_blocks"] * manifest["clip"]["block_len"],
            manifest["stream"],
            res.problems,
        )
        videos |= vids
        res.samples += count
        if count != s["num_samples"]:
            res.problems.append(f"{s['name']}: {count} samples, manifest says {s['num_samples']}")
    if res.samples != manifest["num_samples"] or len(videos) != manifest["num_videos"]:
        res.problems.append(
            f"{path.name}: {res.samples} samples of {len(videos)} videos, manifest says "
            f"{manifest['num_samples']} of {manifest['num_videos']}"
        )
    listed = {s["name"] for s in manifest["shards"]}
    extra = sorted(p.name for p in folder.glob(shard_pattern(manifest["split"])) if p.name not in listed)
    if extra:
        res.problems.append(f"shards not in the manifest: {', '.join(extra)}")
    return res


def find_manifests(shard_dir: str | os.PathLike) -> Iterator[Path]:
    """Manifests in a shard directory (``<dir>/<stream>/manifest-*.json``) or a stream directory."""
    root = Path(shard_dir)
    found = sorted(root.glob("manifest-*.json")) + sorted(root.glob("*/manifest-*.json"))
    if not found:
        raise UserError(f"{root}: no shard manifests (manifest-<split>.json) here or in its stream folders")
    yield from found


def verify_shards(shard_dir: str | os.PathLike) -> list[VerifyResult]:
    """Verify every manifest found under ``shard_dir``."""
    return [verify_manifest(p) for p in find_manifests(shard_dir)]
