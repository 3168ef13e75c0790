"""The shard plan: which samples exist and which shard holds each, decided up front and deterministically.

Planning reads only the ``meta.json`` of every per-video frame archive, which records each frame's size (and the
tar headers of an archive an earlier version wrote). From the frame counts it applies the window rule
(:class:`~memdpc.pipeline.clip.ClipSpec`), orders the samples (train: shuffled across videos with a seeded RNG;
eval: index order) and cuts them into shards by count and exact byte size. Because the plan is a pure function
of the inputs and the options, shard k always holds the same samples, which is what makes a killed run
resumable without duplicates or losses.

Window rule, shared by both streams so that RGB and flow shards of a split hold the same keys: windows are
computed on the frames that have a flow partner, ``n − 1`` for an RGB archive of ``n`` frames and all
``n − 1`` frames of the flow archive. Frame ``i`` of a sample is RGB frame ``i`` or the flow ``i → i+1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common.errors import UserError
from memdpc.common.settings import Checked, setting
from memdpc.common.streams import STREAMS
from memdpc.common.wording import plural
from memdpc.pipeline import ustar
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import shard_name
from memdpc.pipeline.sample import LABEL_BYTES, frame_member, member_name, sample_key
from memdpc.preprocess.archive import (
    FRAME_BYTES,
    META,
    archive_path,
    frame_index,
    frame_name,
    recorded_frames,
)
from memdpc.preprocess.report import failed_videos
from memdpc.preprocess.reuse import remake_command, setting_options
from memdpc.preprocess.source import same_bytes, source_changes
from memdpc.preprocess.video_index import VideoRecord

__all__ = [
    "DEFAULT_SETTINGS",
    "FORMAT",
    "FrameSource",
    "NOT_WRITTEN",
    "Plan",
    "SKIP_KINDS",
    "SPLITS",
    "ShardJob",
    "Sample",
    "ShardPlan",
    "ShardSettings",
    "TRAIN_SPLITS",
    "UNUSABLE",
    "make_plan",
    "usable_frames",
]

FORMAT = "memdpc-shards-v1"
TRAIN_SPLITS = ("train", "all")  # shuffled, train windows; any other split: index order, eval windows
SPLITS = ("train", "test", "val", "all")  # the splits a shard set can be cut for
SHORT_POLICIES = ("pad", "drop")  # a video shorter than one window: padded with its last frame, or dropped


@dataclass(frozen=True)
class ShardSettings(Checked):
    """How a split is cut into samples and shards (``memdpc shard``'s options; :func:`make_plan`'s and
    :func:`~memdpc.pipeline.shard.run_shard`'s): the samples' geometry, the window rule and the shards' sizes."""

    clip: ClipSpec = setting(ClipSpec(), nested=True)
    # UCF101 (~180 frames at 25 fps): starts 0, 20, 40 (, 60) → 3–4 windows per video
    window_step: int = setting(
        20, "Train windows start every N source frames (UCF101-length videos give 3–4 windows).", min=1
    )
    short: str = setting(
        "pad",
        "Videos shorter than one window: pad with the last frame, or drop them (as the reference code).",
        choices=SHORT_POLICIES,
    )
    max_count: int = setting(1000, "Most samples per shard.", min=1)
    max_size: int = setting(
        128 * 2**20, "Most bytes per shard (a larger single sample gets a shard of its own).", min=1
    )
    seed: int = setting(0, "Seed of the train shuffle.")


DEFAULT_SETTINGS = ShardSettings()


@dataclass(frozen=True)
class ShardJob(Checked):
    """What ``memdpc shard`` cuts and how it treats what it finds (:func:`~memdpc.pipeline.shard.run_shard`'s
    arguments besides the archives and the :class:`ShardSettings`), or, with ``verify``, the folder it checks."""

    index: Path | None = setting(None, "Video index (JSONL) of the videos.")
    stream: str | None = setting(None, "Which archives to shard.", choices=STREAMS)
    out: Path | None = setting(None, "Shard folder (gets <stream>/ inside).", path={"file_okay": False})
    split: str = setting(
        "train",
        "Videos to shard; train/all: train windows, shuffled; test/val: eval windows (0, 59, 118, …).",
        choices=SPLITS,
    )
    strict: bool = setting(False, "Stop at the first bad video (default: skip and report it).")
    allow_missing_classes: bool = setting(
        False,
        "Shard a split although classes with videos in it have no samples (failed in preprocess, or not written "
        "yet), leaving them out (default: refuse, before writing).",
    )
    overwrite: bool = setting(
        False,
        "Rewrite the split's shards in --out made with other options or from archives changed since (default: "
        "refuse).",
    )
    verify: Path | None = setting(
        None, "Instead of sharding: re-read every shard in DIR and check it against its manifest and index."
    )


# why a video of the split has no samples: its kind in ``Plan.skipped`` and how the summary names it
FAILED, NOT_WRITTEN, UNUSABLE = "failed", "not-written", "unusable"
SKIP_KINDS = {
    FAILED: "failed in preprocess",
    NOT_WRITTEN: "not written yet (preprocess not run on them, or still running)",
    UNUSABLE: "with an unusable archive",
}


@dataclass(frozen=True, eq=False)
class FrameSource:
    """One scanned frame archive: its metadata and the data offset and size of every frame, in order
    (numpy arrays: a Kinetics-size plan holds tens of millions of frames)."""

    path: Path
    meta: dict[str, Any]
    offsets: np.ndarray
    sizes: np.ndarray

    @property
    def num_frames(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True, eq=False, slots=True)
class Sample:
    """One window of one video; frame indices and JSON are derived on demand to keep plans small."""

    rec: VideoRecord
    start: int
    usable: int  # frames the window rule may use (see usable_frames)
    fps: Any
    stream: str
    clip: ClipSpec
    frame_size: tuple[int, int]  # (height, width) of the video's frames, from its archive's meta.json

    @property
    def video_id(self) -> str:
        return self.rec.id

    @property
    def label(self) -> int:
        return self.rec.label

    @property
    def key(self) -> str:
        return sample_key(self.rec.id, self.start)

    @property
    def indices(self) -> list[int]:
        return self.clip.frame_indices(self.start, self.usable)

    @property
    def json_bytes(self) -> bytes:
        return sample_json(self.rec, self.start, self.fps, self.stream, self.frame_size)


@dataclass
class ShardPlan:
    name: str
    samples: list[Sample]
    bytes: int


@dataclass
class Plan:
    config: dict[str, Any]
    classes: list[str]
    sources: dict[str, FrameSource]
    shards: list[ShardPlan]
    skipped: list[dict[str, str]] = field(default_factory=list)
    short: int = 0
    archives: dict[str, str | None] = field(default_factory=dict)  # video id → archive_digest, None: skipped
    settings: dict[str, Any] = field(default_factory=dict)  # the archives' archive_settings (all alike)

    @property
    def num_samples(self) -> int:
        return sum(len(s.samples) for s in self.shards)

    def fingerprint(self) -> dict[str, Any]:
        """What a finished output directory must match to be resumed: config, the archives' settings and
        identities (so archives rewritten since are noticed), every shard's keys and the videos' labels (so an
        index that gives a video another class is noticed: the samples hold it)."""
        keys = [[s.key for s in sh.samples] for sh in self.shards]
        digest = hashlib.sha256(json.dumps(keys).encode()).hexdigest()
        labels = sorted({s.video_id: s.label for sh in self.shards for s in sh.samples}.items())
        shards = [{"name": sh.name, "num_samples": len(sh.samples), "bytes": sh.bytes} for sh in self.shards]
        return {
            "format": FORMAT,
            "config": self.config,
            "settings": self.settings,
            "archives": self.archives,
            "samples_sha256": digest,
            "labels_sha256": hashlib.sha256(json.dumps(labels).encode()).hexdigest(),
            "shards": shards,
        }


def usable_frames(stream: str, num_frames: int) -> int:
    """Frames the window rule may use: those with a flow partner (see the module docstring)."""
    return num_frames - 1 if stream == "rgb" else num_frames


def _members(path: Path) -> list[tuple[str, int, int]]:
    """(name, data offset, size) of the archive's members: fast for plain USTAR, else via :mod:`tarfile`."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            return list(ustar.list_members(f, size))
        except ustar.NotPlainUstar:
            pass
    with tarfile.open(path, "r:") as tar:
        members = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
    if any(off + n > size for _, off, n in members):
        raise ValueError("truncated: the last member runs past the end")
    return members


def scan_archive(path: Path) -> FrameSource:
    """The ``meta.json`` of a frame archive and where its frames are: from ``meta.json`` alone where it records
    the frames' sizes (:func:`memdpc.preprocess.archive.recorded_frames`), else from the tar's headers; UserError
    if missing, corrupt or incomplete."""
    if not path.is_file():
        raise UserError(f"{path}: frame archive not found")
    try:
        recorded = recorded_frames(path)
    except OSError as e:
        raise UserError(f"{path}: unreadable frame archive ({e})") from None
    if recorded is not None:
        return FrameSource(path, *recorded)
    frames: dict[int, tuple[int, int]] = {}
    meta = None
    try:
        for name, offset, size in _members(path):
            if name == META:
                with open(path, "rb") as f:
                    f.seek(offset)
                    meta = json.loads(f.read(size))
                if isinstance(meta, dict):  # as recorded_frames gives it: the sizes are the FrameSource's
                    meta.pop(FRAME_BYTES, None)
            elif (i := frame_index(name)) is not None:
                frames[i] = (offset, size)
            else:
                raise UserError(f"{path}: unexpected member '{name}' (need {frame_name(0)} … and {META})")
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path}: unreadable frame archive ({e})") from None
    if meta is None:
        raise UserError(f"{path}: frame archive has no {META} (incomplete or not a memdpc archive)")
    n = len(frames)
    if sorted(frames) != list(range(n)) or meta.get("num_frames") != n:
        raise UserError(
            f"{path}: {n} frames (not numbered 0…{n - 1}), but {META} says {meta.get('num_frames')}"
        )
    table = np.array([frames[i] for i in range(n)], dtype=np.int64).reshape(n, 2)
    return FrameSource(path, meta, table[:, 0].copy(), table[:, 1].copy())


def archive_digest(src: FrameSource) -> str:
    """An archive's identity as far as its shards depend on it: its ``meta.json`` and every frame's size (from
    the headers planning reads anyway). Rewritten with other settings or from another source, it differs;
    copied elsewhere, it does not."""
    h = hashlib.sha256(json.dumps(src.meta, sort_keys=True).encode())
    h.update(src.sizes.astype("<i8").tobytes())
    return h.hexdigest()[:16]


def archive_settings(meta: dict[str, Any]) -> dict[str, str]:
    """The preprocess settings an archive's ``meta.json`` records that change its frames, each as the options
    that give it (``{"frame size": "--size 256", "tvl1 warps": "--warps 5", …}``,
    :func:`memdpc.preprocess.reuse.setting_options`). The flow backend is not one: the backends give the same
    codes (docs/flow.md), so parts preprocessed on CPUs and on GPUs may be mixed."""
    return {name: options for name, (_, options) in setting_options(meta).items()}


def _check_settings(metas: dict[str, dict[str, Any]], folder: Path) -> dict[str, str]:
    """The settings all archives (video id → ``meta.json``) share; UserError naming how many differ from the
    most common, one of them and the setting, when they do not all share them (e.g. a preprocess
    ``--overwrite`` with other options stopped halfway)."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for vid, meta in metas.items():
        groups[tuple(sorted(archive_settings(meta).items()))].append(vid)
    ranked = sorted(groups.values(), key=len, reverse=True)
    common = archive_settings(metas[ranked[0][0]]) if ranked else {}
    if len(ranked) <= 1:
        return common
    odd = [vid for group in ranked[1:] for vid in group]
    theirs = archive_settings(metas[odd[0]])
    key = sorted(k for k in common.keys() | theirs.keys() if common.get(k) != theirs.get(k))[0]
    raise UserError(
        f"{folder}: {len(odd)} of {len(metas)} archives were made with other preprocess settings than the "
        f"rest (e.g. {odd[0]}.tar with {theirs.get(key, f'no {key}')}, the rest with "
        f"{common.get(key, f'no {key}')}); run `memdpc preprocess` again with one set of options and --overwrite"
    )


def _missing(path: Path, failure: str | None) -> dict[str, str]:
    """The skip entry of a video without an archive: failed in preprocess (``failure``: the reason its report
    gives), or not written yet."""
    if failure is not None:
        return {"kind": FAILED, "reason": f"failed in preprocess: {failure}"}
    return {
        "kind": NOT_WRITTEN,
        "reason": f"{path}: not written yet (preprocess not run on it, or still running)",
    }


def _check_root(root: Path, stream: str) -> None:
    if not root.is_dir():
        raise UserError(
            f"{root}: frame archive folder not found; give the --out folder of `memdpc preprocess`"
        )
    if (root / stream).is_dir():
        return
    if root.name in STREAMS and any(root.glob("*.tar")):
        raise UserError(
            f"{root}: is a folder of {root.name} archives; give the folder that holds it ({root.parent})"
        )
    raise UserError(
        f"{root}: holds no {stream}/ folder of frame archives; run `memdpc preprocess` with --out "
        f"{root} and --streams including {stream} first"
    )


def sample_json(rec: VideoRecord, start: int, fps: Any, stream: str, frame_size: tuple[int, int]) -> bytes:
    """The sample's info member (fields named in :mod:`memdpc.pipeline.sample`)."""
    info = {
        "video_id": rec.id,
        "start": start,
        "fps": fps,
        "height": frame_size[0],
        "width": frame_size[1],
        "label": rec.label,
        "label_name": rec.label_name,
        "split": rec.split,
        "stream": stream,
    }
    return json.dumps(info, sort_keys=True).encode()


def class_names(records: list[VideoRecord], source: str) -> list[str]:
    """Class names indexed by label, from all records; UserError for a missing or inconsistent label."""
    names: dict[int, str] = {}
    labelled = [r for r in records if isinstance(r.label, int) and r.label >= 0]
    if labelled and len(labelled) != len(records):
        bad = next(r for r in records if r not in labelled)
        raise UserError(f"{source}: video '{bad.id}' has no label ({bad.label!r}) while others do")
    for r in labelled:
        if names.setdefault(r.label, r.label_name) != r.label_name:
            raise UserError(
                f"{source}: label {r.label} is both '{names[r.label]}' and '{r.label_name}' ({r.id})"
            )
    return [names.get(i, "") for i in range(max(names, default=-1) + 1)]


def _expected_frames(rec: VideoRecord, stream: str) -> int | None:
    if rec.num_frames is None:
        return None
    return rec.num_frames - 1 if stream == "flow" else rec.num_frames


def _video_samples(
    rec: VideoRecord, src: FrameSource, stream: str, clip: ClipSpec, train: bool, window_step: int
) -> list[Sample]:
    usable = usable_frames(stream, src.num_frames)
    starts = clip.train_starts(usable, window_step) if train else clip.eval_starts(usable)
    size = (src.meta.get("height"), src.meta.get("width"))
    return [Sample(rec, s, usable, src.meta.get("fps"), stream, clip, size) for s in starts]


def sample_bytes(sample: Sample, src: FrameSource) -> int:
    """Bytes the sample's members take in a tar (headers, data, padding): frames, ``cls``, ``json``."""
    sizes = np.append(src.sizes[sample.indices], [LABEL_BYTES, len(sample.json_bytes)])
    return int(ustar.member_bytes(sizes).sum())


def _cut(
    samples: list[Sample], sources: dict[str, FrameSource], split: str, max_count: int, max_size: int
) -> list[ShardPlan]:
    shards: list[ShardPlan] = []
    cur: list[Sample] = []
    body = 0  # bytes of the current shard's members, headers and padding
    for s in samples:
        members = sample_bytes(s, sources[s.video_id])
        if cur and (len(cur) >= max_count or ustar.tar_size(body + members) > max_size):
            shards.append(ShardPlan(shard_name(split, len(shards)), cur, ustar.tar_size(body)))
            cur, body = [], 0
        cur.append(s)
        body += members
    if cur:
        shards.append(ShardPlan(shard_name(split, len(shards)), cur, ustar.tar_size(body)))
    return shards


def _usable_archive(path: Path, rec: VideoRecord, stream: str) -> FrameSource:
    """The scanned archive of ``rec``; UserError if it is unreadable or has too few frames."""
    src = scan_archive(path)
    expected = _expected_frames(rec, stream)
    if expected is not None and src.num_frames < expected:
        raise UserError(f"{src.path}: {src.num_frames} frames, but the index says {expected}")
    if usable_frames(stream, src.num_frames) < 1:
        raise UserError(f"{src.path}: too few frames ({src.num_frames}) for a {stream} sample")
    return src


def _check_key(rec: VideoRecord, clip: ClipSpec, source: str) -> None:
    longest = member_name(sample_key(rec.id, 0), frame_member(clip.num_frames - 1))
    if "." in rec.id or "/" in rec.id or len(longest) > ustar.MAX_NAME:
        raise UserError(
            f"{source}: video id '{rec.id}' is not usable as a WebDataset key "
            f"(no dots or slashes; at most {ustar.MAX_NAME - len(longest) + len(rec.id)} characters)"
        )


def _stale_message(stale: list[tuple[VideoRecord, list[str]]], stream: str, root: Path, source: str) -> str:
    """One line: the (first) video whose file changed since its archive was made, and the command that remakes
    its archives."""
    rec, changes = stale[0]
    more = f" (and {plural(len(stale) - 1, 'other video')})" if len(stale) > 1 else ""
    index = source if Path(source).is_file() else "INDEX"  # records given as a list name no file
    return (
        f"{rec.id}: {rec.path} changed since its {stream} archive was made ({', '.join(changes)}){more}; the shards "
        f"would hold the old video: remake its archives with `{remake_command(index, root, rec.id)}`, then run "
        "this command again"
    )


def make_plan(
    archive_root: str | os.PathLike,
    records: list[VideoRecord],
    stream: str,
    split: str,
    settings: ShardSettings = DEFAULT_SETTINGS,
    *,
    strict: bool = False,
    source: str = "video index",
    on_video: Callable[[int, int], None] | None = None,
) -> Plan:
    """Scan the archives of ``split`` and plan every shard as ``settings`` say. Bad videos are skipped and
    reported (UserError instead with ``strict``); a bad stream, labels or ids raise UserError.
    ``on_video(i, total)`` is called before scanning the i-th video (progress)."""
    if stream not in STREAMS:
        raise UserError(f"unknown stream '{stream}' (choose from {', '.join(STREAMS)})")
    clip, train = settings.clip, split in TRAIN_SPLITS
    classes = class_names(records, source)
    chosen = [r for r in records if split == "all" or r.split == split]
    if not chosen:
        have = ", ".join(f"{k}: {n}" for k, n in sorted(Counter(r.split for r in records).items()))
        hint = f"; `memdpc index … --{split}-per-class N` holds some out" if split in ("test", "val") else ""
        raise UserError(f"{source}: no videos in split '{split}' (it has {have}){hint}")
    root = Path(archive_root)
    _check_root(root, stream)
    scan = _scan(root, chosen, stream, settings, train, strict, source, on_video)
    if scan.foreign:
        rec, path, recorded = scan.foreign[0]
        raise UserError(
            f"{source}: the archives of {len(scan.foreign)} of its {plural(len(chosen), split + ' video')} were "
            f"made from other files than it names (e.g. {path} from {recorded}, but the index names {rec.path} "
            f"for {rec.id}); give the index those archives were made with, or preprocess this one into another "
            "frames folder"
        )
    if scan.stale:
        raise UserError(_stale_message(scan.stale, stream, root, source))
    sources, samples, metas = scan.sources, scan.samples, scan.metas
    made_with = _check_settings(metas, root / stream)
    if train:
        samples = [samples[i] for i in np.random.default_rng(settings.seed).permutation(len(samples))]
    config = {
        "stream": stream,
        "split": split,
        "clip": clip.to_dict(),
        "windows": {
            "mode": "train" if train else "eval",
            "window_step": settings.window_step if train else None,
            "short": settings.short,
            "rule": "starts on the n-1 frames that have a flow partner",
        },
        "max_count": settings.max_count,
        "max_size": settings.max_size,
        "seed": settings.seed,
    }
    shards = _cut(samples, sources, split, settings.max_count, settings.max_size)
    return Plan(config, classes, sources, shards, scan.skipped, scan.num_short, scan.archives, made_with)


@dataclass
class _Scan:
    """What the archives of a split's videos hold: each usable one's frame source, samples and meta, its digest
    (None: not usable), the videos skipped (with why) or too short, and those made from another file than the
    index names (``foreign``) or from a file changed since (``stale``)."""

    sources: dict[str, FrameSource] = field(default_factory=dict)
    archives: dict[str, str | None] = field(default_factory=dict)
    metas: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    num_short: int = 0
    foreign: list[tuple[VideoRecord, Path, str]] = field(default_factory=list)
    stale: list[tuple[VideoRecord, list[str]]] = field(default_factory=list)


def _scan(
    root: Path,
    chosen: list[VideoRecord],
    stream: str,
    settings: ShardSettings,
    train: bool,
    strict: bool,
    source: str,
    on_video: Callable[[int, int], None] | None,
) -> _Scan:
    """Read each video's archive header once (:class:`_Scan`), its windows as ``train`` says; a bad one is
    skipped with why, or raised with ``strict``."""
    clip = settings.clip
    failures = failed_videos(root, stream)
    scan = _Scan()
    for i, rec in enumerate(chosen):
        if on_video:
            on_video(i, len(chosen))
        _check_key(rec, clip, source)
        scan.archives[rec.id] = None
        path = archive_path(root, stream, rec.id)
        if path.is_file():
            try:
                src, skip = _usable_archive(path, rec, stream), None
            except UserError as e:
                skip = {"kind": UNUSABLE, "reason": str(e)}
        else:
            skip = _missing(path, failures.get(rec.id))
        if skip is not None:
            if strict:
                raise UserError(f"{rec.id}: {skip['reason']}")
            scan.skipped.append({"video_id": rec.id, **skip})
            continue
        recorded = src.meta.get("source")
        if recorded is not None and recorded != rec.path and not same_bytes(src.meta, rec.path):
            # an archive of another video with this id (not of this one moved elsewhere: its bytes differ)
            scan.foreign.append((rec, src.path, recorded))
        elif changes := source_changes(src.meta, rec.path):  # the video replaced or changed since
            scan.stale.append((rec, changes))
        scan.archives[rec.id], scan.metas[rec.id] = archive_digest(src), src.meta
        if usable_frames(stream, src.num_frames) < clip.span:
            scan.num_short += 1
            if settings.short == "drop":
                continue
        scan.sources[rec.id] = src
        scan.samples.extend(_video_samples(rec, src, stream, clip, train, settings.window_step))
    return scan
