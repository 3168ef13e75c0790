"""The chain that made each result, from what its files record (the page's provenance section, ARCHITECTURE.md
§2.7): video index → frame archives → shards → run → checkpoint → results.

Every link is read from the record of the next one: a result's ``source`` (the checkpoint's path and SHA-256) and
``shards`` (each split it read: the manifest's path and SHA-256); the checkpoint's ``config`` (its run) and
``shards`` (the splits the run trained and validated on); a manifest's ``provenance`` (the index and the frame
archive folder) and ``skipped`` videos; the frame archive folder's preprocess reports (the videos that failed).
A link with a recorded digest says whether the file there now is still what was recorded; a checkpoint or a
manifest changed since is not followed further (it tells of other shards or another run state), but the index
and the frame archives that the reader of the shards recorded with them still are. The frame archive folder is
:data:`CHANGED` where a video's source file changed since its archives were made. Results of one checkpoint share
a chain; a fused result joins the chain of each of its inputs.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memdpc.common.digest import file_sha256
from memdpc.common.errors import UserError
from memdpc.common.streams import STREAMS
from memdpc.common.wording import name_list, plural
from memdpc.model.checkpoint import read_checkpoint
from memdpc.pipeline.provenance import changed_sources, records_digest
from memdpc.preprocess.report import failed_videos
from memdpc.preprocess.video_index import read_index

__all__ = ["AS_RECORDED", "CHANGED", "GONE", "Chain", "Link", "chains"]

AS_RECORDED, CHANGED, GONE = "as recorded", "changed since", "not there"
FAILED_NAMED = 5  # failed videos named per archive folder (then how many more)
SHOWN_METRICS = ("R@1", "top1")  # the metric a result's link names, the first it has


@dataclass
class Link:
    """One link of a chain: its stage, the file or folder, what it holds, the recorded digest (shortened; empty
    where none is recorded) and what the file there is now (:data:`AS_RECORDED`, :data:`CHANGED`, :data:`GONE`;
    empty where nothing was recorded to compare)."""

    stage: str
    path: Path | None
    what: str
    digest: str = ""
    now: str = ""


@dataclass
class Chain:
    """The links that made the results of one checkpoint (``checkpoint`` None: results that record none), and
    the folders they name (resolved: frame archives, shards, the run), which the page shows and no others;
    ``complete``: every result records the shards it read (one written before results recorded them leaves its
    shard and archive folders unknown)."""

    checkpoint: Path | None
    links: list[Link] = field(default_factory=list)
    results: list[Path] = field(default_factory=list)
    folders: set[Path] = field(default_factory=set)
    complete: bool = True

    def not_as_recorded(self) -> list[str]:
        """The links whose file is no longer what was recorded, e.g. ``shards manifest-test.json changed since``."""
        return [
            f"{link.stage} {link.path.name if link.path else ''} {link.now}"
            for link in self.links
            if link.now in (CHANGED, GONE)
        ]


def _now(path: Path, digest: str | None, actual) -> str:
    """What ``path`` is now against the recorded ``digest``; ``actual(path)`` computes its digest."""
    if not path.exists():
        return GONE
    try:
        return AS_RECORDED if actual(path) == digest else CHANGED
    except UserError:
        return CHANGED  # no longer readable as what it was


def _checkpoint(path: Path | None, digest: str | None) -> tuple[str, dict[str, Any] | None]:
    """What the checkpoint at ``path`` is now against the recorded ``digest``, and its contents where it is the
    one recorded (a checkpoint changed since, e.g. best.pt after more training, tells of another run state)."""
    if path is None:
        return "", None
    now = _now(path, digest, file_sha256)
    try:
        return now, read_checkpoint(path) if now == AS_RECORDED else None
    except UserError:
        return now, None


def _index_link(index: dict[str, Any]) -> Link:
    if index.get("path") is None:
        return Link("index", None, "records given as a list (Python), not a file", index["sha256"][:12])
    path = Path(index["path"])
    now = _now(path, index["sha256"], lambda p: records_digest(read_index(p)))
    what = "the video index"
    if now == AS_RECORDED:
        splits = Counter(r.split for r in read_index(path))
        what = f"{plural(sum(splits.values()), 'video')}: " + ", ".join(f"{n} {s}" for s, n in splits.items())
    return Link("index", path, what, index["sha256"][:12], now)


def _archives_link(root: Path, changed: dict[str, tuple[str, list[str]]]) -> Link:
    """The frame archive folder: its counts, the videos that failed in preprocess, and those whose source file
    changed since their archives were made (``changed``: video id → (the file, how); the folder is then
    :data:`CHANGED`)."""
    counts = [f"{s} {len(list((root / s).glob('*.tar')))}" for s in STREAMS if (root / s).is_dir()]
    what = f"frame archives: {', '.join(counts) or 'none'}"
    try:
        failed = list(failed_videos(root).items())
    except UserError as e:
        failed, what = [], f"{what}; {e}"
    if failed:
        named = "; ".join(f"{vid} ({reason})" for vid, reason in failed[:FAILED_NAMED])
        more = f" and {len(failed) - FAILED_NAMED} more" if len(failed) > FAILED_NAMED else ""
        what += f"; {plural(len(failed), 'video')} failed in preprocess: {named}{more}"
    if changed:
        named = "; ".join(
            f"{vid} ({path}: {', '.join(how)})" for vid, (path, how) in list(changed.items())[:FAILED_NAMED]
        )
        more = f" and {len(changed) - FAILED_NAMED} more" if len(changed) > FAILED_NAMED else ""
        what += f"; the source of {plural(len(changed), 'video')} changed since its archives were made: {named}{more}"
    now = GONE if not root.is_dir() else CHANGED if changed else ""
    return Link("archives", root, what, now=now)


def _manifest_now(path: Path) -> dict[str, Any] | None:
    """The manifest there now, or None where it is gone or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _shards_link(manifest: Path, digest: str, roles: list[str]) -> tuple[Link, dict[str, Any] | None]:
    """The link of one manifest, and the manifest (None: not what was recorded any more): a manifest changed
    since tells what the new shards hold, not what the recorded ones did."""
    now = _now(manifest, digest, file_sha256)
    what = ", ".join(roles)
    if now != AS_RECORDED:
        return Link("shards", manifest, what, digest[:12], now), None
    m = json.loads(manifest.read_text())
    what += (
        f": {m['stream']}/{m['split']}, {plural(m['num_videos'], 'video')}, {plural(m['num_samples'], 'sample')} in "
        f"{plural(len(m['shards']), 'shard')}"
    )
    left = Counter(s["kind"] for s in m.get("skipped", []))
    if left:
        ids = name_list([s["video_id"] for s in m["skipped"]], 5)
        what += f"; left out: {', '.join(f'{n} {k}' for k, n in sorted(left.items()))} ({ids})"
    return Link("shards", manifest, what, digest[:12], now), m


def _run_link(path: Path, ckpt: dict[str, Any]) -> Link | None:
    """The run a training checkpoint comes from: its folder and the config it records."""
    if ckpt.get("origin") != "train" or not isinstance(ckpt.get("config"), dict):
        return None
    c = ckpt["config"]
    run = path.parent.parent if path.parent.name == "checkpoints" else Path(c.get("out", ""))
    what = (
        f"{c.get('arch')}, {c.get('stream')} stream, {c.get('epochs')} epochs at most, batch {c.get('batch_size')}, "
        f"seed {c.get('seed')} (its config.yaml)"
    )
    return Link("run", run, what)


def _checkpoint_what(ckpt: dict[str, Any]) -> str:
    origin, c = ckpt.get("origin"), ckpt.get("config") or {}
    if origin == "train":
        return f"trained: step {ckpt.get('step')}, {plural(ckpt.get('epoch', 0), 'epoch')} done"
    if origin == "init":
        bn = ", BatchNorm statistics of the training clips" if ckpt.get("bn_from_data") else ""
        return f"untrained {c.get('arch')}, seed {c.get('seed')}{bn}"
    return f"{origin} from {ckpt.get('source')}"


def _result_link(path: Path, result: dict[str, Any]) -> Link:
    metrics = result.get("metrics") or {}
    shown = next((f", {m} {100 * metrics[m]:.1f} %" for m in SHOWN_METRICS if m in metrics), "")
    return Link("result", path, f"{result['kind']}, {result['stream']}, on {result['split']}{shown}")


def _chain(checkpoint: str | None, digest: str | None, results: list[tuple[Path, dict[str, Any]]]) -> Chain:
    path = Path(checkpoint) if checkpoint else None
    chain = Chain(path, results=[p for p, _ in results])
    now, ckpt = _checkpoint(path, digest)
    roles: dict[tuple[str, str], list[str]] = {}  # (manifest, recorded sha256) → what the chain read it for
    made_from: dict[tuple[str, str], dict[str, Any]] = {}  # → the index and frames recorded with it
    uses = {"train": "trained on", "val": "validated on"}
    records = [(role, record) for role, record in ((ckpt or {}).get("shards") or {}).items()]
    for role, record in records:
        used = uses[role] if ckpt.get("origin") == "train" else "BatchNorm statistics from"
        roles.setdefault((record["manifest"], record["sha256"]), []).append(used)
    unrecorded = []
    for p, result in results:
        if "shards" not in result:
            unrecorded.append(p)
        for split, identity in (result.get("shards") or {}).items():
            roles.setdefault((identity["manifest"], identity["sha256"]), []).append(f"evaluated on ({split})")
            records.append((split, identity))
    for _, record in records:
        if record.get("frames") is not None:
            made_from[record["manifest"], record["sha256"]] = record
    shards, indexes, frames = [], {}, {}
    changed: dict[str, dict[str, tuple[str, list[str]]]] = {}  # frames folder → video id → (file, how)
    for (manifest, sha), used in roles.items():
        link, m = _shards_link(Path(manifest), sha, list(dict.fromkeys(used)))
        shards.append(link)
        chain.folders.add(Path(manifest).resolve().parent.parent)
        provenance = made_from.get((manifest, sha)) or (m or {}).get("provenance")
        if provenance:
            indexes.setdefault(
                (provenance["index"]["path"], provenance["index"]["sha256"]), provenance["index"]
            )
            frames.setdefault(provenance["frames"], Path(provenance["frames"]))
            videos = changed.setdefault(provenance["frames"], {})
            current = m or _manifest_now(
                Path(manifest)
            )  # shards cut again: their videos are those of the folder
            for vid, video, how in changed_sources(current) if current is not None else []:
                videos.setdefault(vid, (video, how))
    chain.links += [_index_link(index) for index in indexes.values()]
    chain.links += [_archives_link(root, changed.get(key, {})) for key, root in frames.items()]
    chain.folders |= {root.resolve() for root in frames.values()}
    chain.links += shards
    if unrecorded:
        chain.complete = False
        names = ", ".join(p.name for p in unrecorded)
        chain.links.append(
            Link("shards", None, f"not recorded by {names} (written before results recorded them)")
        )
    run = _run_link(path, ckpt) if ckpt is not None else None
    if run is not None:
        chain.links.append(run)
        chain.folders.add(run.path.resolve())
    if path is not None:
        what = _checkpoint_what(ckpt) if ckpt is not None else ""
        chain.links.append(Link("checkpoint", path, what, digest[:12], now))
    chain.links += [_result_link(p, result) for p, result in results]
    return chain


def chains(results: list[Path]) -> list[Chain]:
    """The chains of ``results`` (results files of ``memdpc eval``): one per checkpoint evaluated, in the order
    of its first result; a fused result is added to the chain of each of its inputs found among ``results``."""
    loaded = {p: json.loads(p.read_text()) for p in results}
    groups: dict[tuple[str | None, str | None], list[Path]] = {}
    fused = []
    for p, r in loaded.items():
        if "inputs" in (r.get("config") or {}):
            fused.append(p)
            continue
        source = r.get("source") or {}
        groups.setdefault((source.get("checkpoint"), source.get("sha256")), []).append(p)
    out = [_chain(ckpt, sha, [(p, loaded[p]) for p in paths]) for (ckpt, sha), paths in groups.items()]
    by_result = {p.resolve(): c for c in out for p in c.results}
    for p in fused:
        inputs = [Path(i).resolve() for i in loaded[p]["config"]["inputs"]]
        for i in inputs:
            if i in by_result:
                by_result[i].results.append(p)
                link = _result_link(p, loaded[p])
                link.what += f" (fused with {name_list([o.name for o in inputs if o != i])})"
                by_result[i].links.append(link)
    return out
