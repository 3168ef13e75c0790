"""``memdpc shard``: per-video frame archives → WebDataset tar shards of 40-frame samples, DALI indexes and a
manifest, atomically and resumably.

Layout: ``<out>/<stream>/<split>-NNNNNN.tar`` + ``<split>-NNNNNN.idx`` (the text DALI's ``wds2idx`` writes)
+ ``<split>-NNNNNN.sha256`` + ``plan-<split>.json`` (written first: configuration and every shard's keys) + ``manifest-<split>.json``
(written last, with the ``provenance`` of the shards: the index, the frame archive folder, each video's label and
archive identity). Members per sample: ``<key>.f00.jpg … <key>.f39.jpg`` (JPEG bytes copied from the archives,
never re-encoded), ``<key>.cls`` (int32 little-endian label), ``<key>.json``; key ``<video_id>_<start:05d>``
(all named in :mod:`memdpc.pipeline.sample`).
Tars are plain USTAR with fixed owner, mode and mtime, so the same inputs and seed give identical bytes.

Resuming: the plan (see :mod:`memdpc.pipeline.shard_plan`) fixes which samples go to which shard; a shard is
written to a temporary name and renamed when complete (its index and checksum first), so on a re-run every shard already
in place is checked against the plan and kept, and only the missing ones are written; SIGINT and SIGTERM stop a
run between two samples (the shard in progress removed) and say how many shards are in place. An output folder
whose plan differs (other options, other videos or labels, or archives rewritten, written or lost since) is
refused, or with ``overwrite`` the split's shards are deleted and written anew. An index whose record
names another file than the one an archive was made from (its ``meta.json`` ``source``) is refused before
anything is written.

Faults: the run has no worker processes (one process reads the archives and writes the shards), so a killed
shard run is killed whole, and the same command resumes it to the same bytes. A fault of the output (its disk
full, a quota, read-only or forbidden: :class:`~memdpc.common.errors.ResourceFault`) stops the run at once: the
shard in progress is removed with its index and checksum, the shards in place are kept, and the fault goes on
saying how many and that the same command resumes. The plan knows every shard's size, so the run warns at its
start when the shards still to write will not fit in the free space.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from memdpc.common import interrupts
from memdpc.common.atomic import atomic_path, remove_stale_tmp, write_bytes_atomic, write_json_atomic
from memdpc.common.console import rich_console
from memdpc.common.digest import file_sha256
from memdpc.common.errors import ResourceFault, UserError, free_bytes
from memdpc.common.progress import progress_bar
from memdpc.common.streams import STREAMS
from memdpc.common.wording import name_list, plural, size_text
from memdpc.pipeline import ustar
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import (
    checksum_path,
    manifest_path,
    shard_pattern,
    stream_dir,
    write_manifest,
)
from memdpc.pipeline.provenance import records_digest
from memdpc.pipeline.sample import FRAME_PATTERN, INFO, LABEL, encode_label, frame_member, member_name
from memdpc.pipeline.shard_plan import (
    DEFAULT_SETTINGS,
    FORMAT,
    NOT_WRITTEN,
    SKIP_KINDS,
    TRAIN_SPLITS,
    FrameSource,
    Plan,
    Sample,
    ShardPlan,
    ShardSettings,
    make_plan,
    usable_frames,
)
from memdpc.pipeline.wds_index import format_index, index_path, split_name
from memdpc.preprocess.reuse import DECODE_SETTINGS
from memdpc.preprocess.video_index import VideoRecord, add_dependant, read_index

__all__ = ["run_shard", "shard_stream", "write_shard", "ShardReport", "THROTTLE_ENV"]

SHORT_DROPPED = "shorter than one window (--short drop)"
THROTTLE_ENV = "MEMDPC_SHARD_THROTTLE"
"""Seconds to sleep after each sample written: limits I/O on shared storage, and lets tests interrupt a run."""


@dataclass
class ShardReport:
    """What a run wrote (rendered by :func:`memdpc.report.stage_tables.print_shard_report`): counts, the videos
    skipped and why (``kind``: ``shard_plan.SKIP_KINDS``), warnings a user should read, and the next step."""

    manifest: Path
    samples: int
    shards: int
    videos: int = 0
    bytes: int = 0
    seconds: float = 0.0
    written: int = 0
    kept: int = 0
    rewritten: int = 0
    short: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    next_step: str = ""


class _HashWriter:
    """A file writer that hashes and counts what passes through it."""

    def __init__(self, f) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.f.write(data)
        self.h.update(data)
        self.n += len(data)


def _read_frames(samples: list[Sample], sources: dict[str, FrameSource]) -> dict[tuple[str, int], bytes]:
    """The encoded frames the samples need, each read once by seeking into its archive."""
    need: dict[str, set[int]] = defaultdict(set)
    for s in samples:
        need[s.video_id].update(s.indices)
    out = {}
    for vid, indices in need.items():
        src = sources[vid]
        with open(src.path, "rb") as f:
            for i in sorted(indices):
                offset, size = int(src.offsets[i]), int(src.sizes[i])
                f.seek(offset)
                data = f.read(size)
                if len(data) != size:
                    raise UserError(f"{src.path}: archive changed or truncated while sharding (frame {i})")
                out[vid, i] = data
    return out


def _members(s: Sample, frames: dict[tuple[str, int], bytes]) -> list[tuple[str, bytes]]:
    key, vid = s.key, s.video_id
    out = [(member_name(key, frame_member(j)), frames[vid, i]) for j, i in enumerate(s.indices)]
    return out + [(member_name(key, LABEL), encode_label(s.label)), (member_name(key, INFO), s.json_bytes)]


def write_shard(tar_path: Path, shard: ShardPlan, sources: dict[str, FrameSource], on_sample=None) -> dict:
    """Write one shard and its index atomically; return its manifest entry. Leaving early (an error, a full disk,
    an interrupt) leaves no index or checksum of it either."""
    try:
        return _write_shard(tar_path, shard, sources, on_sample)
    except BaseException:
        for p in (index_path(tar_path), checksum_path(tar_path)):
            p.unlink(missing_ok=True)
        raise


def _write_shard(tar_path: Path, shard: ShardPlan, sources: dict[str, FrameSource], on_sample) -> dict:
    frames = _read_frames(shard.samples, sources)
    entries = []
    throttle = float(os.environ.get(THROTTLE_ENV, 0) or 0)
    with atomic_path(tar_path) as tmp:
        with open(tmp, "wb", buffering=1 << 20) as f:
            w = _HashWriter(f)
            for s in shard.samples:
                for name, data in _members(s, frames):
                    w.write(ustar.header(name, len(data)))
                    entries.append((name, w.n, len(data)))
                    w.write(data)
                    w.write(bytes(ustar.padding(len(data))))
                if on_sample:
                    on_sample()
                if throttle:
                    time.sleep(throttle)
                interrupts.check()
            w.write(bytes(2 * ustar.BLOCK))
            w.write(bytes(ustar.padding_to_record(w.n)))
        if w.n != shard.bytes:
            raise RuntimeError(f"{tar_path}: wrote {w.n} bytes, planned {shard.bytes}")
        write_bytes_atomic(index_path(tar_path), format_index(entries).encode())
        write_bytes_atomic(checksum_path(tar_path), f"{w.h.hexdigest()}  {tar_path.name}\n".encode())
    return _entry(tar_path, shard, w.h.hexdigest())


def _entry(tar_path: Path, shard: ShardPlan, sha256: str) -> dict[str, Any]:
    return {
        "name": tar_path.name,
        "index": index_path(tar_path).name,
        "num_samples": len(shard.samples),
        "bytes": shard.bytes,
        "sha256": sha256,
    }


def _check_existing(tar_path: Path, shard: ShardPlan) -> dict | None:
    """The manifest entry of a shard already in place if it is exactly the planned one, else None."""
    idx, checksum = index_path(tar_path), checksum_path(tar_path)
    if tar_path.stat().st_size != shard.bytes or not idx.is_file() or not checksum.is_file():
        return None
    try:
        with open(tar_path, "rb") as f:
            entries = list(ustar.list_members(f, shard.bytes))
    except ValueError:  # also NotPlainUstar: not a shard this module wrote
        return None
    keys = list(dict.fromkeys(split_name(name)[0] for name, _, _ in entries))
    if keys != [s.key for s in shard.samples] or idx.read_text() != format_index(entries):
        return None
    sha256 = file_sha256(tar_path)
    if checksum.read_text().split(" ", 1)[0] != sha256:
        return None
    return _entry(tar_path, shard, sha256)


PLAN = "plan-{split}.json"  # in a stream's folder, beside the shards


def plan_path(folder: Path, split: str) -> Path:
    return folder / PLAN.format(split=split)


def _claim(folder: Path, split: str, plan: Plan, overwrite: bool) -> None:
    """Write the plan file, or check that the one in place (from an interrupted run) is the same plan; with
    ``overwrite``, discard the split's shards of another plan first."""
    path = plan_path(folder, split)
    new = json.loads(json.dumps(plan.fingerprint()))
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        if old == new:
            return
        if "labels_sha256" not in old and old == {k: v for k, v in new.items() if k != "labels_sha256"}:
            write_json_atomic(path, new)  # planned alike before plans recorded the labels: taken as this plan
            return
        if not overwrite:
            raise UserError(_difference(folder, split, old, new))
        _discard(folder, split, old)
    elif any(folder.glob(shard_pattern(split))) or manifest_path(folder.parent, folder.name, split).exists():
        raise UserError(f"{folder}: holds {split} shards without a memdpc plan file; use another --out")
    write_json_atomic(path, new)


def _difference(folder: Path, split: str, old: dict, new: dict) -> str:
    """One line: how the plan of the shards in ``folder`` differs from the new one, and what to do."""
    fix = f"add --overwrite to rewrite the {split} shards, or use another --out"
    if not isinstance(old.get("config"), dict):
        return f"{plan_path(folder, split)}: unreadable plan of the {split} shards in {folder}; {fix}"
    diff = sorted(k for k in new["config"] if old["config"].get(k) != new["config"][k])
    if diff:
        options = ", ".join(diff)
        return (
            f"{folder}: holds {split} shards of another configuration (differs in options {options}); {fix}"
        )
    was, now = old.get("archives"), new["archives"]
    if was is None:
        return f"{folder}: holds {split} shards of an older plan (without its archives); {fix}"
    if was.keys() != now.keys():
        added, removed = sorted(now.keys() - was.keys()), sorted(was.keys() - now.keys())
        return (
            f"{folder}: holds {split} shards of another configuration (the input videos differ: {len(added)} "
            f"added, {len(removed)} removed, e.g. {(added or removed)[0]}); {fix}"
        )
    changed = [vid for vid in now if now[vid] != was[vid]]
    if changed:
        vid = changed[0]
        what = "written" if was[vid] is None else "lost or unusable" if now[vid] is None else "rewritten"
        return (
            f"{folder}: {len(changed)} of the {len(now)} archives of its {split} shards changed since they "
            f"were planned (e.g. {vid}: its archive was {what} since); {fix}"
        )
    if old.get("labels_sha256") not in (None, new["labels_sha256"]):
        return f"{folder}: holds {split} shards planned when the index gave some of their videos other classes; {fix}"
    return f"{folder}: holds {split} shards of another configuration (the input videos or frames); {fix}"


def _discard(folder: Path, split: str, old: dict) -> None:
    """Delete the split's manifest (first: without it nothing reads the shards), then its shards with their
    indexes and checksums: those the old plan names and any other in place."""
    manifest_path(folder.parent, folder.name, split).unlink(missing_ok=True)
    names = {sh["name"] for sh in old.get("shards", [])} | {p.name for p in folder.glob(shard_pattern(split))}
    for tar in sorted(folder / n for n in names):
        for p in (tar, index_path(tar), checksum_path(tar)):
            p.unlink(missing_ok=True)


def _uniform(values: set, what: str, folder: Path):
    if len(values) > 1:
        raise UserError(
            f"{folder}: the frame archives mix {what}s {sorted(map(str, values))}; re-run preprocess"
        )
    return next(iter(values))


def _third_channel(metas: list[dict[str, Any]], folder: Path) -> dict[str, int]:
    """``{"third_channel": its value}`` of flow archives, which a planes encoding does not store (the loaders put
    it back); empty for RGB."""
    third = _uniform({(m.get("flow") or {}).get("third_channel") for m in metas}, "third channel", folder)
    return {} if third is None else {"third_channel": third}


def _frame_sizes(plan: Plan) -> list[dict[str, Any]]:
    """Each frame size of the plan's samples with its video and sample counts, most samples first."""
    videos: dict[tuple, set[str]] = defaultdict(set)
    samples: Counter[tuple] = Counter()
    for s in (s for sh in plan.shards for s in sh.samples):
        videos[s.frame_size].add(s.video_id)
        samples[s.frame_size] += 1
    order = sorted(samples, key=lambda hw: (-samples[hw], hw))
    return [
        {"height": h, "width": w, "videos": len(videos[h, w]), "samples": samples[h, w]} for h, w in order
    ]


def _provenance(
    plan: Plan, records: list[VideoRecord], index: str | None, archive_root: str | os.PathLike
) -> dict[str, Any]:
    """What the shards were made from (:mod:`memdpc.pipeline.provenance`): the index (its resolved path, None
    for records given as a list, and the digest of its records), the frame archive folder, and per video of the
    split its label and its archive's identity (None: skipped)."""
    labels = {r.id: r.label for r in records}
    return {
        "index": {
            "path": str(Path(index).resolve()) if index is not None else None,
            "sha256": records_digest(records),
        },
        "frames": str(Path(archive_root).resolve()),
        "videos": {vid: [labels[vid], digest] for vid, digest in plan.archives.items()},
    }


def _manifest(plan: Plan, entries: list[dict], folder: Path, provenance: dict[str, Any]) -> dict[str, Any]:
    metas = [plan.sources[vid].meta for vid in {s.video_id for sh in plan.shards for s in sh.samples}]
    sizes = _frame_sizes(plan)
    size = [sizes[0]["height"], sizes[0]["width"]] if len(sizes) == 1 else None  # None: see frame_sizes
    cfg = plan.config
    return {
        "format": FORMAT,
        "stream": cfg["stream"],
        "split": cfg["split"],
        "clip": cfg["clip"],
        "frame_size": size,
        "frame_sizes": sizes,
        "encoding": _uniform({m.get("encoding") for m in metas}, "encoding", folder),
        **_third_channel(metas, folder),
        "num_samples": plan.num_samples,
        "num_videos": len(metas),
        "classes": plan.classes,
        "windows": cfg["windows"],
        "max_count": cfg["max_count"],
        "max_size": cfg["max_size"],
        "seed": cfg["seed"],
        "index_format": "wds2idx v1.2",
        "members": {"frames": FRAME_PATTERN, "label": f"{LABEL} (int32 little-endian)", "info": INFO},
        "num_short": plan.short,
        "skipped": plan.skipped,
        "shards": entries,
        "provenance": provenance,
    }


def _prepare(out_dir: str | os.PathLike, plan: Plan, overwrite: bool) -> Path:
    """The stream folder, claimed for this plan and cleared of temporary files of killed runs."""
    cfg = plan.config
    if plan.num_samples == 0:
        kinds = Counter(s["kind"] for s in plan.skipped)
        why = ", ".join(f"{n} {SKIP_KINDS[k]}" for k, n in sorted(kinds.items()))
        raise UserError(
            f"no {cfg['stream']} samples for split '{cfg['split']}' ({len(plan.skipped)} videos skipped"
            f"{': ' + why if why else ''}; {plan.short} short with --short {cfg['windows']['short']})"
        )
    folder = stream_dir(out_dir, cfg["stream"])
    folder.mkdir(parents=True, exist_ok=True)
    _claim(folder, cfg["split"], plan, overwrite)
    remove_stale_tmp(folder)
    return folder


def _write(folder: Path, plan: Plan, report: ShardReport, bar) -> list[dict]:
    """Keep every shard in place that is exactly the planned one (checked first, so the rate and the time
    left count only the frames written), then write the others; return the manifest entries."""
    stream, split = plan.config["stream"], plan.config["split"]
    present = [sh for sh in plan.shards if (folder / sh.name).exists()]
    entries: dict[str, dict] = {}
    if present:
        check = bar.add_task(f"{stream}/{split}: check shards in place", total=len(present), unit="shards")
        for sh in present:
            if (entry := _check_existing(folder / sh.name, sh)) is not None:
                entries[sh.name] = entry
                report.kept += 1
            bar.advance(check)
    per_sample = ClipSpec(**plan.config["clip"]).num_frames
    done = sum(len(sh.samples) for sh in plan.shards if sh.name in entries) * per_sample
    need, free = sum(sh.bytes for sh in plan.shards if sh.name not in entries), free_bytes(folder)
    if free is not None and need > free:
        text = (
            f"the {stream}/{split} shards still to write take {size_text(need)} in {folder}, but only "
            f"{size_text(free)} is free there: the run will stop when the disk is full; the same command then "
            "resumes once space is freed"
        )
        rich_console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)
    task = bar.add_task(
        f"{stream}/{split}: write shards",
        total=plan.num_samples * per_sample,
        completed=done,
        unit="frames · 0 frames/s",
    )
    t0, written = time.perf_counter(), [0]

    def advance() -> None:
        written[0] += per_sample
        rate = written[0] / max(time.perf_counter() - t0, 1e-9)
        bar.update(task, advance=per_sample, unit=f"frames · {rate:.0f} frames/s")

    for sh in plan.shards:
        if sh.name not in entries:
            rewrite = (folder / sh.name).exists()
            # a signal stops the write between two samples, never between the shard's rename and its count
            with interrupts.deferred():
                entries[sh.name] = write_shard(folder / sh.name, sh, plan.sources, on_sample=advance)
                report.written += 1
                report.rewritten += rewrite
    return [entries[sh.name] for sh in plan.shards]


def _warnings(plan: Plan, records: list[VideoRecord], out_dir: str | os.PathLike) -> list[str]:
    """What a user should know about the shards written: videos whose archives are not written yet, classes
    without samples (in an eval split: those with training videos in the index), and sibling shards of other
    settings."""
    stream, split = plan.config["stream"], plan.config["split"]
    out = []
    pending = [s["video_id"] for s in plan.skipped if s["kind"] == NOT_WRITTEN]
    if pending:
        verb = "has" if len(pending) == 1 else "have"
        out.append(
            f"{len(pending)} of the {plural(len(plan.archives), split + ' video')} {verb} no {stream} archive "
            f"yet (preprocess not run on them, or still running; e.g. {pending[0]}): these shards leave them "
            "out; once preprocess has finished, run the same command with --overwrite"
        )
    have = {s.label for sh in plan.shards for s in sh.samples}
    empty = [label for label, name in enumerate(plan.classes) if name and label not in have]
    trained = set() if split in TRAIN_SPLITS else {r.label for r in records if r.split == "train"}
    missed = [plan.classes[label] for label in empty if label in trained]
    rest = [plan.classes[label] for label in empty if label not in trained]
    if missed:
        out.append(
            f"{stream}/{split} has no samples of {plural(len(missed), 'class')} with training videos: "
            f"{name_list(missed)} (retrieval and the kNN monitor on this split leave them out)"
        )
    if rest:
        verb = "has" if len(rest) == 1 else "have"
        out.append(f"{plural(len(rest), 'class')} {verb} no samples in {stream}/{split}: {name_list(rest)}")
    return out + _short_warnings(plan) + _sibling_warnings(out_dir, plan)


def _short_warnings(plan: Plan) -> list[str]:
    """Videos shorter than one window (padded, or with ``--short drop`` left out), with the ``--clip-stride`` that
    would fit them: short clips under the paper's stride 3 are all padding otherwise."""
    if not plan.short:
        return []
    clip, stream = ClipSpec(**plan.config["clip"]), plan.config["stream"]
    videos = len([v for v in plan.archives.values() if v is not None])
    if plan.short == videos:
        who = "the video is" if videos == 1 else f"all {videos} videos are"
    else:
        who = f"{plan.short} of the {videos} videos {'is' if plan.short == 1 else 'are'}"
    what = (
        f"{who} shorter than one window ({clip.span} frames: {clip.num_blocks} blocks × {clip.block_len} frames, "
        f"--clip-stride {clip.stride})"
    )
    if plan.config["windows"]["short"] == "drop":
        return [f"{what}: left out (--short drop); a smaller --clip-stride keeps them"]
    shortest = min(
        usable_frames(stream, src.num_frames)
        for src in plan.sources.values()
        if usable_frames(stream, src.num_frames) < clip.span
    )
    fits = shortest // clip.num_frames
    hint = (
        f"--clip-stride {fits} fits every one of them"
        if 1 <= fits < clip.stride
        else f"the shortest has {shortest} frames, fewer than one window's {clip.num_frames} frames even at --clip-stride 1"
    )
    return [
        f"{what}: their windows repeat their last frame (--short pad); {hint}, or --short drop leaves them out"
    ]


def _missing_classes(plan: Plan, records: list[VideoRecord], source: str) -> str | None:
    """Why the split would lose classes: those with videos of the split in the index but no samples (their videos
    failed in preprocess, are not written yet, unusable, or too short to keep), with what became of their
    videos; None when every class of the split keeps samples."""
    stream, split = plan.config["stream"], plan.config["split"]
    have = {s.label for sh in plan.shards for s in sh.samples}
    chosen = [r for r in records if (split == "all" or r.split == split) and r.label >= 0]
    lost = sorted({r.label for r in chosen} - have)
    if not lost:
        return None
    skipped = {s["video_id"]: s for s in plan.skipped}
    videos = [r for r in chosen if r.label in lost]
    fates = Counter(SKIP_KINDS[skipped[r.id]["kind"]] if r.id in skipped else SHORT_DROPPED for r in videos)
    example = next((r for r in videos if r.id in skipped), None)
    e_g = f"; e.g. {example.id}: {skipped[example.id]['reason']}" if example is not None else ""
    return (
        f"{source}: {stream}/{split} would have no samples of {plural(len(lost), 'class')}: "
        f"{name_list([plan.classes[label] for label in lost])} (their {plural(len(videos), 'video')}: "
        f"{'; '.join(f'{n} {fate}' for fate, n in sorted(fates.items()))}{e_g}); shard once preprocess has "
        "written them (a held-out split: see preprocess's summary to draw it again), or add "
        "--allow-missing-classes to shard without them"
    )


def _sibling_warnings(out_dir: str | os.PathLike, plan: Plan) -> list[str]:
    """Shards of other splits or streams in ``out_dir`` cut from archives of other settings (the same stream:
    any setting; the other stream: the decoding, which the two streams share)."""
    stream, split = plan.config["stream"], plan.config["split"]
    out = []
    for s in STREAMS:
        for path in sorted(stream_dir(out_dir, s).glob(PLAN.format(split="*"))):
            if path == plan_path(stream_dir(out_dir, stream), split):
                continue
            try:
                theirs = json.loads(path.read_text())
                other, settings = f"{s}/{theirs['config']['split']}", theirs.get("settings") or {}
            except (OSError, ValueError, KeyError, TypeError):
                continue
            keys = [k for k in plan.settings if s == stream or k in DECODE_SETTINGS]
            diff = [k for k in keys if k in settings and settings[k] != plan.settings[k]]
            if diff:
                out.append(
                    f"the {other} shards in {out_dir} were cut from archives of other settings ({settings[diff[0]]}, "
                    f"these {plan.settings[diff[0]]}): shard {other} again with --overwrite"
                )
    return out


def _next_step(out_dir: str | os.PathLike, stream: str, split: str, index_splits: set[str]) -> str:
    """The command that goes on from here: a split of the index not sharded yet (train, val, test), or training."""
    train = f"memdpc train --stream {stream} --shards {out_dir} --out runs/{stream}"
    if split == "all":
        return f"{train} --train-split all --val-split none"
    uses = {
        "train": "",
        "val": " (train validates on it)",
        "test": " (evaluation tests on it" + (")" if "val" in index_splits else "; train validates on it)"),
    }
    for s, use in uses.items():
        if s in index_splits and not manifest_path(out_dir, stream, s).is_file():
            return f"the same command with --split {s}{use}" + (f", then {train}" if s != "train" else "")
    return train


def _interrupted(
    e: KeyboardInterrupt, plan: Plan | None, report: ShardReport | None
) -> interrupts.Interrupted:
    """``e`` as :class:`~memdpc.common.interrupts.Interrupted`, with how many shards are in place."""
    stop = interrupts.as_interrupted(e)
    if report is None:
        return stop.keep("stopped while planning: nothing written; the same command starts again")
    return stop.keep(f"{_in_place(plan, report)}; the same command resumes")


def _in_place(plan: Plan, report: ShardReport) -> str:
    return (
        f"{report.kept + report.written} of {plural(report.shards, 'shard')} of "
        f"{plan.config['stream']}/{plan.config['split']} written"
    )


def _stopped(fault: ResourceFault, plan: Plan | None, report: ShardReport | None) -> ResourceFault:
    """``fault`` with how many shards are in place and the way on."""
    if report is None:
        return fault.keep(f"nothing written but the plan; {fault.resumes}")
    return fault.keep(f"{_in_place(plan, report)}, kept; {fault.resumes}")


def run_shard(
    archive_root: str | os.PathLike,
    index_records: list[VideoRecord] | str | os.PathLike,
    stream: str,
    out_dir: str | os.PathLike,
    split: str,
    settings: ShardSettings = DEFAULT_SETTINGS,
    *,
    strict: bool = False,
    overwrite: bool = False,
    allow_missing_classes: bool = False,
    console: Console | None = None,
) -> ShardReport:
    """Shard one stream and split (see the module docstring); with ``console``, show progress there.

    ``settings``: the samples' geometry, the window rule and the shards' sizes (:class:`ShardSettings`; their
    help says what each does); ``strict``: stop at the first bad video (default: skip it and report it). ``overwrite``: an output folder holding the split's shards of another
    plan (other options, videos or archives) gets them deleted and written anew instead of refused. A class with
    videos in the split but no samples (its videos failed in preprocess, or are not written yet) is refused before
    anything is written (UserError), unless ``allow_missing_classes``: the shards then leave it out, with a
    warning. On SIGINT/SIGTERM (``KeyboardInterrupt``) it re-raises :class:`memdpc.common.interrupts.Interrupted`
    saying how many shards are in place, and on a fault of the output (a full disk) the
    :class:`~memdpc.common.errors.ResourceFault` the same way.
    Returns the :class:`ShardReport` (rendered by :func:`memdpc.report.stage_tables.print_shard_report`)."""
    t0 = time.perf_counter()
    index = None if isinstance(index_records, list) else str(index_records)  # None: records given as a list
    if index is not None:
        index_records = read_index(index)
    source = index or "video index"
    plan = report = None
    try:
        with progress_bar("{task.fields[unit]}", console=console, disable=console is None) as bar:
            scan = bar.add_task(f"{stream}/{split}: scan archives", total=None, unit="videos")
            plan = make_plan(
                archive_root,
                index_records,
                stream,
                split,
                settings,
                strict=strict,
                source=source,
                on_video=lambda i, n: bar.update(scan, completed=i + 1, total=n),
            )
            missing = None if allow_missing_classes else _missing_classes(plan, index_records, source)
            if missing:
                raise UserError(missing)
            folder = _prepare(out_dir, plan, overwrite)
            report = ShardReport(manifest_path(out_dir, stream, split), plan.num_samples, len(plan.shards))
            report.short, report.skipped = plan.short, plan.skipped
            entries = _write(folder, plan, report, bar)
        manifest = _manifest(plan, entries, folder, _provenance(plan, index_records, index, archive_root))
        write_manifest(report.manifest, manifest)
        if index is not None:
            add_dependant(index, report.manifest)
    except KeyboardInterrupt as e:
        raise _interrupted(e, plan, report) from None
    except ResourceFault as fault:
        raise _stopped(fault, plan, report) from None
    report.videos, report.bytes = manifest["num_videos"], sum(e["bytes"] for e in entries)
    report.warnings = _warnings(plan, index_records, out_dir)
    report.next_step = _next_step(out_dir, stream, split, {r.split for r in index_records})
    report.seconds = time.perf_counter() - t0
    return report


def shard_stream(
    archive_root: str | os.PathLike,
    index_records: list[VideoRecord] | str | os.PathLike,
    stream: str,
    out_dir: str | os.PathLike,
    split: str,
    settings: ShardSettings = DEFAULT_SETTINGS,
    **kw: Any,
) -> Path:
    """Shard one stream and split as :func:`run_shard` does; return the manifest path
    (``<out>/<stream>/manifest-<split>.json``)."""
    return run_shard(archive_root, index_records, stream, out_dir, split, settings, **kw).manifest
