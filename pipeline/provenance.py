"""What a shard set was made from, what a later stage records of the shards it read, and the change between two
such records in words (ARCHITECTURE.md §2.3).

A manifest's ``provenance`` (written by :mod:`memdpc.pipeline.shard`): the video index (its path and
:func:`records_digest`), the frame archive folder, and per video of the split its label and its archive's
identity (:func:`memdpc.pipeline.shard_plan.archive_digest`; None: the video was skipped). A stage that reads
shards records each split it read as :func:`split_record`; training keeps those of its checkpoint's run and
refuses to resume on shards that differ, naming the change (:func:`shard_changes`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from typing import Any

from memdpc.common.errors import UserError
from memdpc.common.wording import plural
from memdpc.pipeline.shard_set import open_split
from memdpc.preprocess.archive import archive_path, read_meta
from memdpc.preprocess.reuse import remake_command
from memdpc.preprocess.source import source_changes
from memdpc.preprocess.video_index import VideoRecord

__all__ = [
    "OPTIONS",
    "changed_sources",
    "manifest_identity",
    "records_digest",
    "shard_changes",
    "sources_changed",
    "split_record",
]

OPTIONS = (
    "clip",
    "windows",
    "seed",
    "max_count",
    "max_size",
)  # a manifest's entries that shard's options set


def records_digest(records: list[VideoRecord]) -> str:
    """SHA-256 of a video index's records as JSON lines, as :func:`memdpc.preprocess.video_index.write_index`
    writes them: an index file memdpc wrote has this ``sha256sum``, and one given as a list has a digest too."""
    return hashlib.sha256("".join(r.to_json() + "\n" for r in records).encode()).hexdigest()


def changed_sources(manifest: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """The videos of a manifest's shards whose source file changed since their archives were made, as (video id,
    the file, how: :func:`~memdpc.preprocess.source.source_changes`), read from its ``provenance`` (the frame
    archive folder, the videos) and each archive's ``meta.json``. An archive gone or unreadable since, a source
    gone since and a manifest written before it recorded its provenance give nothing to compare."""
    provenance = manifest.get("provenance") or {}
    out = []
    for vid, (_, digest) in (provenance.get("videos") or {}).items():
        if digest is None or provenance.get("frames") is None:
            continue
        try:
            meta = read_meta(archive_path(provenance["frames"], manifest["stream"], vid))
        except UserError:
            continue
        if changes := source_changes(meta):
            out.append((vid, str(meta["source"]), changes))
    return out


def sources_changed(manifest: dict[str, Any], where: str | os.PathLike) -> str | None:
    """One line where videos of the shards of ``manifest`` (the file ``where``) changed since their archives were
    made (:func:`changed_sources`): the first of them, and the commands that remake its archives and the shards;
    None where none did."""
    changed = changed_sources(manifest)
    if not changed:
        return None
    vid, path, changes = changed[0]
    provenance = manifest["provenance"]
    index = (provenance.get("index") or {}).get("path") or "INDEX"
    more = f" (and {plural(len(changed) - 1, 'other video')})" if len(changed) > 1 else ""
    return (
        f"{where}: its shards hold {vid}, whose video {path} changed since its "
        f"archive was made ({', '.join(changes)}){more}; remake its archives with `"
        f"{remake_command(index, provenance['frames'], vid)}` and the {manifest['split']} shards with the same `memdpc shard` "
        "command and --overwrite"
    )


def manifest_identity(shard_dir: str | os.PathLike, stream: str, split: str) -> dict[str, Any]:
    """``{"manifest": its resolved path, "sha256": of its bytes}`` (``sha256sum`` checks it) and, from its
    ``provenance``, the ``index`` and ``frames`` the shards were made from (so that a result's chain names them
    after the shards are cut again): what results record of each split they read, and what keys the feature
    caches."""
    shards = open_split(shard_dir, stream, split)
    out: dict[str, Any] = {"manifest": str(shards.path.resolve()), "sha256": shards.sha256}
    provenance = shards.provenance
    if provenance:
        out |= {"index": provenance.get("index"), "frames": provenance.get("frames")}
    return out


def split_record(shard_dir: str | os.PathLike, stream: str, split: str) -> dict[str, Any]:
    """What training records of one split it reads: :func:`manifest_identity`, the digest of its shards'
    checksums (the data itself: equal even where the manifest was rewritten with another index path), the shard
    options and, to name a change, its videos (``{id: [label, archive digest]}``; None in a manifest written
    before it recorded them)."""
    manifest = open_split(shard_dir, stream, split).manifest
    shards = "".join(f"{s['name']} {s['sha256']}\n" for s in manifest["shards"])
    return {
        "split": split,
        **manifest_identity(shard_dir, stream, split),
        "shards_sha256": hashlib.sha256(shards.encode()).hexdigest(),
        "options": {k: manifest.get(k) for k in OPTIONS},
        "videos": (manifest.get("provenance") or {}).get("videos"),
    }


def _places(records: dict[str, dict[str, Any]]) -> dict[str, tuple[str, Any, Any]]:
    """Video id → (the splits holding it, its label, its archive digest) over the records of one run."""
    splits: dict[str, list[str]] = defaultdict(list)
    facts: dict[str, tuple[Any, Any]] = {}
    for record in records.values():
        for vid, (label, archive) in (record["videos"] or {}).items():
            splits[vid].append(record["split"])
            facts[vid] = (label, archive)
    return {vid: ("+".join(sorted(set(s))), *facts[vid]) for vid, s in splits.items()}


def _video_changes(before: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """The videos' changes between two runs' records, counted by kind (moved, added, removed, relabelled,
    archives rewritten, written or lost)."""
    old, new = _places(before), _places(now)
    moved = Counter((old[v][0], new[v][0]) for v in old.keys() & new.keys() if old[v][0] != new[v][0])
    out = [f"{plural(n, 'video')} moved from {a} to {b}" for (a, b), n in sorted(moved.items())]
    added = Counter(new[v][0] for v in new.keys() - old.keys())
    out += [f"{plural(n, 'video')} added to {s}" for s, n in sorted(added.items())]
    removed = Counter(old[v][0] for v in old.keys() - new.keys())
    out += [f"{plural(n, 'video')} removed from {s}" for s, n in sorted(removed.items())]
    kept = [v for v in old.keys() & new.keys() if old[v][0] == new[v][0]]
    relabelled = sum(old[v][1] != new[v][1] for v in kept)
    if relabelled:
        out.append(f"{plural(relabelled, 'video')} changed class")
    archives = Counter(
        "written" if old[v][2] is None else "lost" if new[v][2] is None else "rewritten"
        for v in kept
        if old[v][2] != new[v][2]
    )
    for what, n in sorted(archives.items()):
        out.append(f"the archive{'s' * (n > 1)} of {plural(n, 'video')} {'was' if n == 1 else 'were'} {what}")
    return out


def _options_changes(split: str, before: dict[str, Any], now: dict[str, Any]) -> str:
    """How the options of one split's records differ, or that its shards were rewritten."""
    then, options = before["options"], now["options"]
    diff = [k for k in OPTIONS if then.get(k) != options.get(k)]
    if diff:
        shown = "; ".join(f"{k} {json.dumps(then.get(k))} → {json.dumps(options.get(k))}" for k in diff)
        return f"the {split} shards were cut again with other options ({shown})"
    return (
        f"the {split} shards were rewritten (manifest sha256 {before['sha256'][:12]} → {now['sha256'][:12]})"
    )


def shard_changes(before: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """How the shards of ``now`` (role → :func:`split_record`, e.g. ``{"train": …, "val": …}``) differ from
    those ``before`` recorded, each change in words ("2 videos moved from train to val", "the archives of 4
    videos were rewritten"); empty when every split holds the same shards (copied elsewhere, or the manifest
    rewritten with the same data, counts as the same)."""
    changed = [r for r in now if r not in before or before[r]["shards_sha256"] != now[r]["shards_sha256"]]
    if not changed:
        return []
    if all(before.get(r, {}).get("videos") is not None and now[r]["videos"] is not None for r in now):
        out = _video_changes({r: before[r] for r in now if r in before}, now)
        if out:
            return out
    return [
        _options_changes(now[r]["split"], before[r], now[r])
        if r in before
        else f"the run read no {now[r]['split']} shards before"
        for r in changed
    ]
