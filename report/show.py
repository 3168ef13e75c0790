"""``memdpc show PATH --out DIR``: pictures of what a stage wrote, told from what PATH is.

* a frame archive (``<root>/<stream>/<id>.tar``; the other stream's archive of the video beside it is found):
  a contact sheet of RGB frames over their flow in colour, and an animated GIF of both side by side; a folder
  of archives: the first ``samples`` videos;
* a shard (``<shards>/<stream>/<split>-NNNNNN.tar``) or a shard folder (with ``split``): the first ``samples``
  samples, each as the blocks × frames the model reads, with key and label; ``augment`` draws them after
  the training augmentation, by the torch loader's own transform;
* a run folder (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``): the curves of its metrics, best.pt marked;
* an eval folder or one of its results files: retrieval strips (per stream whose shards are there, flow in
  colour) and the confusion matrix of each classifier's result.

Flow is drawn by :mod:`memdpc.viz.flow_colours` everywhere, with its scale in the picture. Anything else is refused
with what it looks like (:mod:`memdpc.common.file_kinds`) and what ``show`` takes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError
from memdpc.common.streams import FLOW, RGB, STREAMS
from memdpc.eval.data import EvalData
from memdpc.eval.plots import confusion_matrix, retrieval_examples
from memdpc.eval.results import load_result
from memdpc.eval.scores import CLASSIFIER_KINDS, RETRIEVAL_KINDS
from memdpc.model.checkpoint import read_checkpoint
from memdpc.pipeline.backends import LoaderSettings
from memdpc.pipeline.loader import plan_loader
from memdpc.pipeline.manifest import manifest_path
from memdpc.pipeline.sample import INFO, LABEL, decode_label, is_frame_member, parse_key, sample_key
from memdpc.pipeline.shard_set import ShardSplit, open_split
from memdpc.pipeline.torch_loader import ClipTransform
from memdpc.pipeline.wds_index import index_path, read_index, split_name
from memdpc.preprocess.archive import META, archive_path, frame_index, read_meta
from memdpc.report.show_options import TAKES, ShowOptions
from memdpc.train.config import TrainConfig, config_from_dict
from memdpc.train.metrics import DATA_BN, KNN_BASELINE, METRICS_NAME, monitor_summary, read_metrics
from memdpc.train.prepare import CONFIG_NAME, augment_spec
from memdpc.viz.flow_colours import codes_colours
from memdpc.viz.pictures import (
    PNG_OPTIONS,
    caption,
    clip_picture,
    decode_frames,
    enlarge,
    grid,
    legend_picture,
    side_by_side,
    write_gif,
    write_png,
)

__all__ = [
    "archive_candidates",
    "archives_in",
    "draw_archive",
    "draw_result",
    "draw_samples",
    "flow_legend",
    "has_archives",
    "is_archive",
    "is_run",
    "is_shard_folder",
    "results_in",
    "run_curves",
    "show",
]

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 — after choosing the backend

GIF_FRAMES = 200  # a longer video's GIF takes every k-th frame


Warn = Callable[[str], None]
"""Where ``show`` tells what is wrong with what it was asked to draw (a line each)."""


def _ignore(text: str) -> None:
    """A :data:`Warn` that drops the line."""


def show(
    path: str | Path, out: str | Path, options: ShowOptions | None = None, warn: Warn = _ignore
) -> list[Path]:
    """Draw what ``path`` holds into the folder ``out``; return the files written, in order. Settings that hide
    what is drawn (a crop larger than the frames) are told to ``warn``."""
    path, out = Path(path), Path(out)
    written = DRAW[recognise(path)](path, out, options or ShowOptions(), warn)
    return list(dict.fromkeys(written))  # the legend once


LEGEND = "flow-colours.png"


def flow_legend(out: Path) -> Path:
    """The colour wheel's legend (``flow-colours.png``), written beside the pictures of flow (``legend``)."""
    return write_png(out / LEGEND, legend_picture())


# ------------------------------------------------------------------------------------------ what PATH is
ARCHIVE, ARCHIVES, SHARD, SHARDS, RUN, EVAL = "archive", "archives", "shard", "shards", "run", "eval"


def _first_member(path: Path) -> str | None:
    try:
        with tarfile.open(path, "r:") as tar:
            member = tar.next()
    except (tarfile.TarError, OSError):
        return None
    return member.name if member is not None else None


def is_run(folder: Path) -> bool:
    """A training run's folder: ``config.yaml`` beside ``metrics.jsonl`` or ``checkpoints/``."""
    return (folder / CONFIG_NAME).is_file() and (
        (folder / METRICS_NAME).is_file() or (folder / "checkpoints").is_dir()
    )


def is_shard_folder(folder: Path) -> bool:
    """A shard folder (``<stream>/manifest-<split>.json``) or one stream's folder of it."""
    return any(folder.glob("manifest-*.json")) or any(folder.glob("*/manifest-*.json"))


def results_in(folder: Path) -> list[Path]:
    """The results files of ``memdpc eval`` in ``folder`` (not below it)."""
    return [p for p in sorted(folder.glob("*.json")) if file_kinds.describe(p) == file_kinds.RESULTS]


def _tars(folder: Path) -> Iterator[Path]:
    """The tars of a folder of archives (``FRAMES/<stream>/``) and of its stream folders (``FRAMES/``), listed and
    not opened, in the order the file system lists them (hidden ones, a run's temporary archives, left out)."""
    for stream_dir in [folder, *(folder / s for s in STREAMS)]:
        with contextlib.suppress(OSError), os.scandir(stream_dir) as entries:
            for entry in entries:
                if entry.name.endswith(".tar") and not entry.name.startswith(".") and entry.is_file():
                    yield Path(entry.path)


def archive_candidates(folder: Path) -> list[Path]:
    """The tars that may be frame archives in a folder of them (``FRAMES/<stream>/``) or in its stream folders
    (``FRAMES/``), one per video (the first stream's where a video has both), by video id: listed, none opened
    (:func:`is_archive` tells)."""
    found: dict[str, Path] = {}
    for tar in _tars(folder):  # the folder's own, then each stream's in turn
        found.setdefault(tar.stem, tar)
    return [found[k] for k in sorted(found)]


def is_archive(path: Path) -> bool:
    """Whether the tar ``path`` is a frame archive: its first member a frame or ``meta.json``."""
    first = _first_member(path)
    return first is not None and (first == META or frame_index(first) is not None)


def archives_in(folder: Path, limit: int | None = None) -> list[Path]:
    """The first ``limit`` frame archives (all: None) of :func:`archive_candidates`, by video id; only those
    looked at are opened, each for its first header."""
    found = []
    for tar in archive_candidates(folder):
        if limit is not None and len(found) >= limit:
            break
        if is_archive(tar):
            found.append(tar)
    return found


def has_archives(folder: Path) -> bool:
    """Whether the folder (or its stream folders) holds a frame archive: the first tar that is one answers."""
    return any(is_archive(tar) for tar in _tars(folder))


def recognise(path: Path) -> str:
    """What ``path`` is, of the kinds ``show`` draws; UserError naming what it is otherwise."""
    if not path.exists():
        raise UserError(f"{path}: not found; memdpc show takes {TAKES}")
    if path.is_dir():
        return _folder_kind(path)
    if path.suffix == ".tar":
        first = _first_member(path)
        if first is not None and (first == META or frame_index(first) is not None):
            return ARCHIVE
        if first is not None and is_frame_member(split_name(first)[1]):
            return SHARD
    kind = file_kinds.describe(path)
    if kind == file_kinds.RESULTS:
        return EVAL
    hint = (
        f"; give its run folder, {path.parent}"
        if path.name in (METRICS_NAME, CONFIG_NAME) and is_run(path.parent)
        else ""
    )
    raise UserError(f"{path}: {kind}{hint}; memdpc show takes {TAKES}")


def _folder_kind(folder: Path) -> str:
    if file_kinds.describe(folder) == file_kinds.QUICKSTART:
        raise UserError(
            f"{folder}: {file_kinds.QUICKSTART}; `memdpc report {folder}` shows all of it on one page; "
            f"memdpc show takes its parts, e.g. {folder / 'runs' / RGB}"
        )
    for kind, test in (
        (RUN, is_run),
        (SHARDS, is_shard_folder),
        (EVAL, results_in),
        (ARCHIVES, has_archives),
    ):
        if test(folder):
            return kind
    inside = [
        p
        for p in sorted(folder.iterdir())
        if p.is_dir() and (is_run(p) or is_shard_folder(p) or results_in(p))
    ]
    hint = (
        f" (it holds {', '.join(p.name for p in inside[:3])}: give one of them, or `memdpc report {folder}`)"
        if inside
        else ""
    )
    raise UserError(f"{folder}: a folder of nothing memdpc show knows{hint}; memdpc show takes {TAKES}")


# --------------------------------------------------------------------------------------------- archives
def _other_stream(stream: str) -> str:
    return FLOW if stream == RGB else RGB


def _archive_frames(archive: Path, wanted: set[int]) -> dict[int, np.ndarray]:
    """The frames numbered ``wanted`` of a frame archive, decoded: one pass over its headers, the other frames
    neither read nor decoded."""
    frames = {}
    try:
        with tarfile.open(archive, "r:") as tar:
            for m in tar:
                if (k := frame_index(m.name)) in wanted:
                    frames[k] = decode_frames([tar.extractfile(m).read()])[0]
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UserError(f"{archive}: unreadable frame archive ({e})") from None
    return frames


def _video_archives(archive: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """{stream: (archive, meta)} of a video's archive and, where it is there, the other stream's archive beside
    it (``<root>/<other stream>/<id>.tar``)."""
    meta = read_meta(archive)
    stream = meta.get("stream") or archive.parent.name
    found = {stream: (archive, meta)}
    if stream in STREAMS:
        other = archive_path(archive.parent.parent, _other_stream(stream), archive.stem)
        if other.is_file():
            found[_other_stream(stream)] = (other, read_meta(other))
    return {s: found[s] for s in STREAMS if s in found}


def _picks(counts: list[int], sheet: int) -> tuple[list[int], range]:
    """The frame numbers of the contact sheet (``sheet`` of them, evenly over the longest stream) and of the
    GIF (every k-th frame of what every stream has, at most GIF_FRAMES)."""
    longest, common = max(counts), min(counts)
    on_sheet = sorted(set(np.linspace(0, longest - 1, min(sheet, longest)).round().astype(int).tolist()))
    return on_sheet, range(0, common, max(1, -(-common // GIF_FRAMES)))


def _seen(
    archives: dict[str, tuple[Path, dict[str, Any]]], wanted: list[int], max_flow: float | None
) -> tuple[dict[str, dict[int, np.ndarray]], list[str]]:
    """Each stream's ``wanted`` frames as seen (flow in colour, on one scale over them) and the notes."""
    seen, notes = {}, []
    for stream, (path, _) in archives.items():
        frames = _archive_frames(path, set(wanted))
        if stream == FLOW and frames:
            numbers = sorted(frames)
            colours = codes_colours(np.stack([frames[k] for k in numbers]), max_flow)
            frames = dict(zip(numbers, colours.image, strict=True))
            notes.append(colours.note)
        seen[stream] = frames
    return seen, notes


def _sheet(
    video_id: str,
    archives: dict[str, tuple[Path, dict[str, Any]]],
    seen: dict[str, dict[int, np.ndarray]],
    notes: list[str],
    picks: list[int],
) -> np.ndarray:
    """The ``picks`` frames in rows of 8: an RGB row above the flow row of the same frame numbers (flow k: frame
    k to k + 1)."""
    columns = min(8, len(picks))
    h, w = next(f for frames in seen.values() for f in frames.values()).shape[:2]
    blank = np.full((h, w, 3), 255, np.uint8)
    rows = []
    for start in range(0, len(picks), columns):
        chunk = picks[start : start + columns]
        for frames in seen.values():
            rows += [frames[k] if k in frames and frames[k].shape == blank.shape else blank for k in chunk]
            rows += [blank] * (columns - len(chunk))
    meta = next(iter(archives.values()))[1]
    what = " over ".join(f"{s} ({m.get('num_frames', '?')} frames)" for s, (_, m) in archives.items())
    lines = [
        f"{video_id}: {what}, {w}x{h}, {meta.get('fps', 0):.3g} fps",
        f"frames {', '.join(map(str, picks))}" + ("; flow k: frame k to k+1" if FLOW in seen else ""),
    ]
    return caption(enlarge(grid(rows, columns)), [*lines, *notes])


def _gif_frames(
    video_id: str, seen: dict[str, dict[int, np.ndarray]], notes: list[str], numbers: range
) -> list[np.ndarray]:
    """RGB and flow side by side, for the frames ``numbers``, under their caption."""
    title = [f"{video_id}: {' | '.join(seen)}", *notes]
    return [caption(enlarge(side_by_side([f[k] for f in seen.values()]), 360), title) for k in numbers]


def draw_archive(archive: Path, out: Path, o: ShowOptions, legend: bool = True) -> list[Path]:
    """A video's contact sheet (``<id>-sheet.png``) and GIF (``<id>.gif``), from its archive and the other
    stream's beside it; with ``legend``, the flow legend beside them where they show flow. Only the frames
    shown are decoded; the GIF plays at the video's pace (its fps over the frames it skips)."""
    archives = _video_archives(archive)
    on_sheet, on_gif = _picks([int(m.get("num_frames", 0)) for _, m in archives.values()], o.frames)
    seen, notes = _seen(archives, sorted(set(on_sheet) | set(on_gif)), o.max_flow)
    fps = float(next(iter(archives.values()))[1].get("fps") or 10.0)
    sheet = write_png(
        out / f"{archive.stem}-sheet.png", _sheet(archive.stem, archives, seen, notes, on_sheet)
    )
    gif = write_gif(
        out / f"{archive.stem}.gif", _gif_frames(archive.stem, seen, notes, on_gif), fps / on_gif.step
    )
    return [sheet, gif, *([flow_legend(out)] if legend and FLOW in seen else [])]


def _draw_archives(folder: Path, out: Path, o: ShowOptions, warn: Warn) -> list[Path]:
    return [p for archive in archives_in(folder, o.samples) for p in draw_archive(archive, out, o)]


# ----------------------------------------------------------------------------------------------- shards
SPREAD_SHARDS = 8  # shards of a split whose samples are chosen from, evenly over its shards
CANDIDATES = 4  # videos looked at per sample shown, to find it a class not shown yet


def _windows(tars: list[Path]) -> dict[str, list[tuple[Path, dict[str, tuple[int, int]]]]]:
    """{video id: its windows (shard, {member: (offset, size)})} of up to :data:`SPREAD_SHARDS` of ``tars``,
    spread evenly over them, from their DALI indexes (nothing of the tars read)."""
    spread = np.linspace(0, len(tars) - 1, min(len(tars), SPREAD_SHARDS)).round().astype(int)
    windows: dict[str, list[tuple[Path, dict[str, tuple[int, int]]]]] = {}
    for tar in (tars[i] for i in sorted(set(spread.tolist()))):
        idx = index_path(tar)
        if not idx.is_file():
            raise UserError(f"{idx}: the DALI index of shard {tar.name} is missing; memdpc shard writes it")
        for members in read_index(idx):
            key = split_name(next(iter(members)))[0]
            windows.setdefault(parse_key(key)[0], []).append((tar, members))
    return windows


def _read_members(tar: Path, members: dict[str, tuple[int, int]], names: list[str] | None = None) -> dict:
    """{member (after the key): bytes} of one sample, each read with one seek (all members, or ``names``)."""
    out = {}
    with open(tar, "rb") as f:
        for name, (offset, size) in members.items():
            member = split_name(name)[1]
            if names is None or member in names:
                f.seek(offset)
                out[member] = f.read(size)
    return out


def _spread_samples(tars: list[Path], count: int) -> list[dict[str, bytes]]:
    """``count`` samples of the shards ``tars`` (of one split) that show as much of it as that many can: from
    videos spread over the split (up to :data:`SPREAD_SHARDS` shards of it), one per class in turn while
    classes not shown yet are left, the middle window of each video; where the split has fewer videos than
    ``count``, further windows of them. Each sample is {member (after the key): bytes}."""
    windows = _windows(tars)
    videos = list(windows)
    looked = [
        videos[i] for i in np.linspace(0, len(videos) - 1, min(len(videos), count * CANDIDATES)).astype(int)
    ]
    by_class: dict[int, list[str]] = {}
    for video in dict.fromkeys(looked):
        tar, members = windows[video][len(windows[video]) // 2]
        by_class.setdefault(decode_label(_read_members(tar, members, [LABEL])[LABEL]), []).append(video)
    order: list[str] = []  # one video of each class in turn
    while any(by_class.values()):
        order += [queue.pop(0) for queue in by_class.values() if queue]
    chosen: list[tuple[Path, dict[str, tuple[int, int]]]] = []
    for round_ in range(max(len(w) for w in windows.values())):  # the middle window first, then the others
        for video in order:
            ws = windows[video]
            k = (len(ws) // 2 + round_) % len(ws)
            if round_ < len(ws) and len(chosen) < count:
                chosen.append(ws[k])
    return [_read_members(tar, members) for tar, members in chosen]


def _shard_streams(folder: Path) -> tuple[Path, list[str]]:
    """(shard root, streams) of a shard folder or of one stream's folder."""
    if any(folder.glob("manifest-*.json")):
        return folder.parent, [folder.name]
    return folder, [s for s in STREAMS if any((folder / s).glob("manifest-*.json"))]


def _default_split(root: Path, stream: str, split: str | None) -> str:
    if split is not None:
        return split
    splits = sorted(p.stem.removeprefix("manifest-") for p in (root / stream).glob("manifest-*.json"))
    return "train" if "train" in splits else splits[0]


def _crop_size(shards: ShardSplit, o: ShowOptions, warn: Warn) -> int:
    """The crop ``--augment`` draws with: ``o.crop_size``, or where it is not given the short side of the shards'
    most common frame size (the paper's 224 only enlarges smaller frames); a crop larger than that is warned
    of."""
    sizes = shards.frame_sizes
    if not sizes:  # a manifest written before it listed its frame sizes
        return TrainConfig.crop_size if o.crop_size is None else o.crop_size
    h, w = sizes[0]
    if o.crop_size is None:
        return min(h, w)
    if o.crop_size > min(h, w):
        warn(
            f"--crop-size {o.crop_size} exceeds the {w}×{h} frames of {shards.root / shards.stream} ({shards.split}): each crop is "
            f"enlarged to {o.crop_size}, then resized to --size {o.size}; without --crop-size, show crops to the "
            f"frames' short side ({min(h, w)}), and `memdpc train --crop-size 0` resizes straight to --size"
        )
    return o.crop_size


def draw_samples(
    root: Path,
    stream: str,
    split: str,
    out: Path,
    o: ShowOptions,
    tars: list[Path] | None = None,
    legend: bool = True,
    warn: Warn = _ignore,
) -> list[Path]:
    """``o.samples`` samples of a split (or of the shards ``tars`` of it), spread over its videos and classes
    (:func:`_spread_samples`), one picture each (``<stream>-<split>-<key>[-augmented].png``): the frames as
    stored, or after the training augmentation (what is wrong with its settings told to ``warn``); with
    ``legend``, the flow legend after flow samples."""
    shards = open_split(root, stream, split)
    clip = shards.clip
    tars = tars or [tar for tar, _ in shards.shards]
    transform = rng = None
    if o.augment:
        crop = _crop_size(shards, o, warn)
        config = config_from_dict(
            dict(
                stream=stream,
                shards=str(root),
                size=o.size,
                crop_size=crop,
                jitter_flow=o.jitter_flow,
                seed=o.seed,
            )
        )
        plan = plan_loader(
            root,
            stream,
            split,
            train=True,
            batch_size=1,
            backend="torch",
            size=o.size,
            crops=1,
            rank=0,
            world_size=1,
            seed=o.seed,
            num_workers=0,
            device="cpu",
            spec=augment_spec(config),
            clip=clip,
            drop_last=False,
        )
        transform, rng = (
            ClipTransform(plan),
            np.random.default_rng([o.seed, 0, 0, 0]),
        )  # a loader worker's draws
    written = []
    for sample in _spread_samples(tars, o.samples):
        info = json.loads(sample[INFO])
        key = sample_key(info["video_id"], info["start"])
        if transform is not None:
            frames = transform(sample, rng)["video"]
            how = (
                f"after the training augmentation: size {o.size}, crop {crop or 'none'}, "
                f"flow jitter {'on' if o.jitter_flow else 'off'}, seed {o.seed}"
            )
        else:
            frames = decode_frames([sample[m] for m in sorted(sample) if is_frame_member(m)])
            how = "as stored"
        title = [
            f"{key}: label {decode_label(sample[LABEL])} ({info.get('label_name', '')}), {stream}, {split}",
            f"{clip.num_blocks} blocks (rows) x {clip.block_len} frames, {how}",
        ]
        picture = clip_picture(frames, stream, clip.num_blocks, title, o.max_flow)
        name = f"{stream}-{split}-{key}{'-augmented' if o.augment else ''}.png"
        written.append(write_png(out / name, picture))
    return written + ([flow_legend(out)] if legend and stream == FLOW and written else [])


def _draw_shard(tar: Path, out: Path, o: ShowOptions, warn: Warn) -> list[Path]:
    root, stream, split = tar.parent.parent, tar.parent.name, tar.stem.rsplit("-", 1)[0]
    if not manifest_path(root, stream, split).is_file():
        raise UserError(
            f"{tar}: a shard without its manifest ({manifest_path(root, stream, split)}); show takes "
            "shards in the folder `memdpc shard` wrote"
        )
    return draw_samples(root, stream, split, out, o, tars=[tar], warn=warn)


def _draw_shards(folder: Path, out: Path, o: ShowOptions, warn: Warn) -> list[Path]:
    root, streams = _shard_streams(folder)
    having = [s for s in streams if manifest_path(root, s, _default_split(root, s, o.split)).is_file()]
    if not having:
        splits = sorted(
            {p.stem.removeprefix("manifest-") for s in streams for p in (root / s).glob("manifest-*.json")}
        )
        raise UserError(
            f"{folder}: no {o.split} shards (it holds {', '.join(splits)}); give one of them with --split"
        )
    return [
        p for s in having for p in draw_samples(root, s, _default_split(root, s, o.split), out, o, warn=warn)
    ]


# ------------------------------------------------------------------------------------------------- runs
def chosen_checkpoint(run: Path) -> dict[str, Any] | None:
    """best.pt's ``epoch`` (the epoch that made it) and ``step``, or None without one."""
    path = run / "checkpoints" / "best.pt"
    if not path.is_file():
        return None
    ckpt = read_checkpoint(path)
    epoch = ckpt.get("best_epoch")
    return {"epoch": epoch if epoch is not None else ckpt.get("epoch", 1) - 1, "step": ckpt.get("step", 0)}


_PANELS = (  # (title, [(kind, key, label)], log scale)
    ("loss", [("train", "loss", "train"), ("val", "loss", "validation")], False),
    ("pretext accuracy (top-1)", [("train", "top1", "train"), ("val", "top1", "validation")], False),
    ("kNN R@1 (validation videos)", [("knn", "r1", "kNN monitor")], False),
    ("learning rate", [("train", "lr", "lr")], True),
)
BASELINE_NAMES = {DATA_BN: "untrained, data BN"}  # the kNN monitor's baselines besides the untrained encoder
CHANCE = " chance (a uniform guess)"  # a loss curve's chance level: its label's ending


@dataclass(frozen=True)
class Series:
    """One line of a panel: ``steps`` and ``values``; a ``reference`` is a level to beat, drawn across."""

    label: str
    steps: tuple[int, ...]
    values: tuple[float, ...]
    chance_of: str | None = None  # the label of the curve whose chance level this is
    reference: bool = False


def _points(records: list[dict[str, Any]], kind: str, key: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    pairs = [
        (r["step"], r[key])
        for r in records
        if r["kind"] == kind and isinstance(r.get(key), int | float) and math.isfinite(r[key])
    ]
    return tuple(s for s, _ in pairs), tuple(v for _, v in pairs)


def curve_series(records: list[dict[str, Any]]) -> dict[str, list[Series]]:
    """What :func:`run_curves` draws, per panel title: each logged curve; beside each loss curve its own chance
    level record by record (the loss of a uniform guess among the candidates its batches had, averaged as
    the loss is); beside the kNN monitor the R@1 it must beat: the untrained encoder's (its reading at step 0)
    and the baselines recorded with it (:data:`~memdpc.train.metrics.KNN_BASELINE`)."""
    panels: dict[str, list[Series]] = {}
    for title, series, _ in _PANELS:
        lines = panels.setdefault(title, [])
        for kind, key, label in series:
            steps, values = _points(records, kind, key)
            if not steps:
                continue
            lines.append(Series(label, steps, values))
            if key == "loss":
                chance = _points(records, kind, "chance")
                if chance[0]:
                    lines.append(Series(label + CHANCE, *chance, chance_of=label))
            if kind == "knn" and steps[0] == 0:
                lines.append(Series("untrained", (0,), (values[0],), reference=True))
                for r in records:
                    if r["kind"] == KNN_BASELINE and isinstance(r.get(key), int | float):
                        name = BASELINE_NAMES.get(r.get("baseline"), str(r.get("baseline")))
                        lines.append(Series(name, (r["step"],), (r[key],), reference=True))
    return panels


def run_curves(run: Path, path: Path) -> Path:
    """The curves of a run's metrics (loss, pretext accuracy, kNN R@1, learning rate) against the step, with
    best.pt's step marked, each loss with its own chance level and the kNN monitor with the R@1 it must beat
    (:func:`curve_series`); one PNG."""
    records = read_metrics(run)
    if not records:
        raise UserError(
            f"{run / METRICS_NAME}: no metrics yet (the run has not logged a step); train it first"
        )
    best = chosen_checkpoint(run)
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    references = iter(("grey", "tab:purple", "tab:brown"))
    panels = curve_series(records)
    for ax, (title, _, log) in zip(axes.flat, _PANELS, strict=True):
        series = panels[title]
        colours: dict[str, str] = {}
        for s in series:
            if s.reference:
                ax.axhline(
                    s.values[0],
                    color=next(references),
                    linestyle="-.",
                    linewidth=1,
                    label=f"{s.label}: {s.values[0]:.3f}",
                )
            elif s.chance_of is not None:
                ax.plot(
                    s.steps, s.values, color=colours[s.chance_of], linestyle=":", linewidth=1.2, label=s.label
                )
            else:
                (line,) = ax.plot(
                    s.steps, s.values, marker="o" if len(s.steps) < 30 else None, markersize=3, label=s.label
                )
                colours[s.label] = line.get_color()
        drawn = bool(series)
        if best is not None and drawn:
            ax.axvline(
                best["step"],
                color="tab:green",
                linestyle="--",
                linewidth=1,
                label=f"best.pt (epoch {best['epoch']})",
            )
        if log and drawn:
            ax.set_yscale("log")
        ax.set_title(title if drawn else f"{title}: not logged", fontsize=10)
        ax.set_xlabel("step")
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.set_axis_off()
    chosen = f"best.pt: epoch {best['epoch']}, step {best['step']}" if best else "no best.pt yet"
    monitor = monitor_summary(records)[0]
    fig.suptitle(f"{run.name}: {chosen}" + (f"\n{monitor}" if monitor else ""), fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png", pil_kwargs=PNG_OPTIONS)
    plt.close(fig)
    return path


def _draw_run(run: Path, out: Path, o: ShowOptions, warn: Warn) -> list[Path]:
    """The run's curves; a warning where the kNN monitor ended below the untrained encoder."""
    drawn = [run_curves(run, out / f"{run.name}-curves.png")]
    worse = monitor_summary(read_metrics(run))[1]
    if worse:
        warn(worse)
    return drawn


# ------------------------------------------------------------------------------------------------- eval
def _recorded_shards(result: dict[str, Any]) -> tuple[Path | None, str]:
    """(shard folder, train split) a retrieval result was made from: its own record, or its inputs'."""
    config = result.get("config") or {}
    if config.get("shards"):
        return Path(config["shards"]), config.get("train_split", LoaderSettings.train_split)
    for source in config.get("inputs", []):
        try:
            found = _recorded_shards(json.loads(Path(source).read_text()))
        except (OSError, ValueError):
            continue
        if found[0] is not None:
            return found
    return None, config.get("train_split", LoaderSettings.train_split)


def draw_result(
    path: Path, out: Path, o: ShowOptions, streams: Sequence[str] = STREAMS, legend: bool = True
) -> list[Path]:
    """The pictures of one results file: retrieval strips of each of ``streams`` whose shards are there (with
    ``legend``, the flow legend after flow strips), or the confusion matrix of a classifier's result (other
    kinds: none)."""
    result, arrays = load_result(path)
    kind = result["kind"]
    if kind in CLASSIFIER_KINDS:
        return [
            confusion_matrix(
                out / f"{path.stem}-confusion.png", arrays["probs"], arrays["labels"], result["classes"]
            )
        ]
    if kind not in RETRIEVAL_KINDS:
        return []
    recorded, train_split = _recorded_shards(result)
    shards = Path(o.shards) if o.shards else recorded
    if shards is None or not shards.is_dir():
        where = f"records {recorded}, which is not there" if recorded else "records no shard folder"
        raise UserError(f"{path}: the result {where}; give the shards it was evaluated on with --shards")
    written = []
    for stream in streams:
        if manifest_path(shards, stream, result["split"]).is_file():
            data = EvalData(LoaderSettings(str(shards), stream, train_split), test_split=result["split"])
            written.append(
                retrieval_examples(
                    out / f"{path.stem}-strips-{stream}.png",
                    data,
                    [str(v) for v in arrays["video_ids"]],
                    arrays["labels"],
                    [str(v) for v in arrays["gallery_ids"]],
                    arrays["gallery_labels"],
                    arrays["neighbours"],
                    result["classes"],
                )
            )
    if not written:
        raise UserError(f"{path}: {shards} holds no {result['split']} shards to draw the videos from")
    return written + ([flow_legend(out)] if legend and written[-1].stem.endswith(f"-{FLOW}") else [])


def _draw_eval(path: Path, out: Path, o: ShowOptions, warn: Warn) -> list[Path]:
    return [
        p for result in (results_in(path) if path.is_dir() else [path]) for p in draw_result(result, out, o)
    ]


DRAW: dict[str, Callable[[Path, Path, ShowOptions, Warn], list[Path]]] = {
    ARCHIVE: lambda archive, out, o, warn: draw_archive(archive, out, o),
    ARCHIVES: _draw_archives,
    SHARD: _draw_shard,
    SHARDS: _draw_shards,
    RUN: _draw_run,
    EVAL: _draw_eval,
}
