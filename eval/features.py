"""Per-window model outputs over an evaluation split, gathered on rank 0, and their per-video averages.

Every evaluation runs a function over all windows of a split (features for retrieval and probes, logits
for finetuning, per-step features for Oops). Under ``torchrun`` each rank reads its own shards (every
window is seen by one rank), the outputs are gathered on rank 0, de-duplicated by shard key (padded last
batches repeat a window) and checked against the manifest's sample count, so no window is lost or counted
twice. Features can be cached in an ``.npz`` keyed by a fingerprint of the checkpoint's bytes, the split's
manifest and the settings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from memdpc.common import interrupts
from memdpc.common.atomic import atomic_path
from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.common.progress import progress_bar
from memdpc.eval.data import EvalData
from memdpc.eval.outputs import Outputs
from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.manifest import manifest_path
from memdpc.pipeline.provenance import manifest_identity, sources_changed
from memdpc.pipeline.sample import parse_key
from memdpc.pipeline.shard_set import ShardSplit, open_split

__all__ = [
    "Windows",
    "loader_batches",
    "run_windows",
    "same_classes",
    "eval_split",
    "task_features",
    "video_mean",
]

T = TypeVar("T")
_END = object()


@dataclass
class Windows:
    """Outputs for every window of a split, sorted by key: ``values`` is (W, K, ...) for K crops."""

    keys: list[str]
    video_ids: list[str]
    labels: np.ndarray
    values: np.ndarray

    def starts(self) -> np.ndarray:
        """Window start frames, read from the keys (:func:`~memdpc.pipeline.sample.parse_key`)."""
        return np.array([parse_key(k)[1] for k in self.keys], dtype=np.int64)


def eval_split(data: EvalData, split: str) -> ShardSplit:
    """The shards of a split to evaluate on; refuses an empty split, and one whose shards hold videos changed since
    their archives were made (features of them, cached or new, would be of the old videos)."""
    shards = open_split(data.loader.shards, data.loader.stream, split)
    if shards.num_samples == 0:
        raise UserError(f"{shards.path}: the {split} split is empty")
    stale = sources_changed(shards.manifest, shards.path)
    if stale:
        raise UserError(stale)
    return shards


def same_classes(data: EvalData) -> list[str]:
    """The class list shared by the train and test splits; refuses an unlabelled split (nothing to score) and
    label sets that differ."""
    train = eval_split(data, data.loader.train_split).classes
    test = eval_split(data, data.test_split).classes
    for split, classes in ((data.loader.train_split, train), (data.test_split, test)):
        if not classes:
            raise UserError(
                f"{manifest_path(data.loader.shards, data.loader.stream, split)}: the {split} split is unlabelled "
                "(its videos have no classes), and retrieval, probes and finetuning score classes: evaluate on "
                "shards of labelled videos (an unlabelled folder is for pretraining: memdpc train)"
            )
    if train != test:
        raise UserError(
            f"{manifest_path(data.loader.shards, data.loader.stream, data.test_split)}: its classes differ from "
            f"those of the {data.loader.train_split} split ({len(test)} vs {len(train)} classes, first "
            f"difference: {_first_difference(train, test)})"
        )
    return train


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"#{i} {x!r} vs {y!r}"
    return f"#{min(len(a), len(b))} only in one"


def loader_batches(loader: Iterable[T]) -> Iterator[T]:
    """The batches of ``loader``, with SIGINT/SIGTERM raised between them, never inside the loader: there a
    raise can land in a finaliser or a fork hook (a DALI pipeline torn down, a DataLoader worker started),
    where Python prints it as "Exception ignored" and goes on. The wait for one batch delays the stop."""
    it = iter(loader)
    while True:
        with interrupts.deferred():
            batch = next(it, _END)
        if batch is _END:
            return
        yield batch


def run_windows(
    fn: Callable[[torch.Tensor], torch.Tensor],
    data: EvalData,
    split: str,
    env: DistEnv,
    *,
    crops: int = 1,
    desc: str = "windows",
) -> Windows | None:
    """Apply ``fn`` (clips (B, N, 3, SL, H, W) -> (B, ...)) to every window of ``split``, each crop.

    Returns the gathered :class:`Windows` on rank 0, None on the other ranks.
    """
    shards = open_split(data.loader.shards, data.loader.stream, split)
    loader = make_loader(
        data.loader.shards,
        data.loader.stream,
        split,
        train=False,
        batch_size=data.loader.batch_size,
        backend=data.loader.backend,
        size=data.size,
        crops=crops,
        rank=env.rank,
        world_size=env.world_size,
        num_workers=data.loader.num_workers,
        device=str(env.device),
    )
    found: dict[str, tuple[str, int, np.ndarray]] = {}
    with progress_bar(elapsed=False, transient=True) as bar, torch.inference_mode():
        task = bar.add_task(f"{desc} ({split})", total=len(loader), visible=env.is_main)
        for batch in loader_batches(loader):
            clips = batch.clips.to(env.device)
            if clips.dim() == 6:
                clips = clips.unsqueeze(1)  # (B, N, ...) -> (B, 1, N, ...)
            b, k = clips.shape[:2]
            out = fn(clips.flatten(0, 1)).float().cpu().numpy()  # (B*K, ...)
            out = out.reshape(b, k, *out.shape[1:])
            for key, vid, label, value in zip(
                batch.keys, batch.video_ids, batch.labels.tolist(), out, strict=True
            ):
                found.setdefault(key, (vid, int(label), value))
            bar.advance(task)
    found = _gather(found, env)
    if found is None:
        return None
    if len(found) != shards.num_samples:
        raise UserError(
            f"{shards.path}: evaluated {len(found)} distinct windows, but the shards hold {shards.num_samples}"
        )
    keys = sorted(found)
    return Windows(
        keys,
        [found[k][0] for k in keys],
        np.array([found[k][1] for k in keys], dtype=np.int64),
        np.stack([found[k][2] for k in keys]),
    )


def _gather(found: dict, env: DistEnv) -> dict | None:
    """Merge every rank's windows on rank 0 (first occurrence of a key wins)."""
    if not env.distributed:
        return found
    parts = [None] * env.world_size if env.is_main else None
    dist.gather_object(found, parts, dst=0)
    if not env.is_main:
        return None
    merged: dict = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, value)
    return merged


def video_mean(windows: Windows) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(sorted video ids, labels (V,), values averaged over each video's windows and crops (V, ...))."""
    index: dict[str, list[int]] = {}
    for i, vid in enumerate(windows.video_ids):
        index.setdefault(vid, []).append(i)
    ids = sorted(index)
    feats = np.stack([windows.values[index[v]].mean(axis=(0, 1)) for v in ids])
    labels = np.array([windows.labels[index[v][0]] for v in ids], dtype=np.int64)
    return ids, labels, feats


# ------------------------------------------------------------------------------------------------ cache
def fingerprint(source: dict[str, str], data: EvalData, split: str, **settings: Any) -> str:
    """Identifies what a checkpoint gives on a split: the checkpoint's bytes (``source``, see
    :func:`~memdpc.eval.outputs.checkpoint_source`: never another checkpoint's features), the split's manifest
    (which lists its shards' checksums), the input size, the loader backend and ``settings``."""
    return json.dumps(
        {
            "checkpoint_sha256": source["sha256"],
            "manifest_sha256": manifest_identity(data.loader.shards, data.loader.stream, split)["sha256"],
            "stream": data.loader.stream,
            "split": split,
            "size": data.size,
            "backend": data.loader.backend,
            **settings,
        },
        sort_keys=True,
        default=str,
    )


def save_windows(path: str | os.PathLike, windows: Windows, stamp: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(
            f,
            keys=np.array(windows.keys),
            video_ids=np.array(windows.video_ids),
            labels=windows.labels,
            values=windows.values,
            fingerprint=np.array(stamp),
        )


def load_windows(path: str | os.PathLike, stamp: str) -> Windows | None:
    """The cached windows at ``path`` if they were made with the same fingerprint, else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["fingerprint"]) != stamp:
                return None
            return Windows(
                [str(k) for k in z["keys"]], [str(v) for v in z["video_ids"]], z["labels"], z["values"]
            )
    except (OSError, ValueError, KeyError):
        return None  # an unreadable cache is recomputed


def cached_windows(
    fn: Callable[[torch.Tensor], torch.Tensor],
    data: EvalData,
    split: str,
    env: DistEnv,
    *,
    cache: Path | None,
    stamp: str,
    crops: int = 1,
    desc: str = "features",
) -> Windows | None:
    """:func:`run_windows`, reusing ``cache`` when its fingerprint matches (all ranks agree on the reuse)."""
    hit = load_windows(cache, stamp) if cache is not None and env.is_main else None
    if env.distributed:
        box = [hit is not None]
        dist.broadcast_object_list(box, src=0)
        if box[0]:
            return hit if env.is_main else None
    elif hit is not None:
        return hit
    windows = run_windows(fn, data, split, env, crops=crops, desc=desc)
    if windows is not None and cache is not None:
        save_windows(cache, windows, stamp)
    return windows


def task_features(
    fn: Callable[[torch.Tensor], torch.Tensor],
    data: EvalData,
    split: str,
    env: DistEnv,
    out: Outputs,
    name: str,
    *,
    crops: int = 1,
    desc: str = "features",
    **settings: Any,
) -> Windows | None:
    """:func:`cached_windows` of a task, cached as ``name`` in its ``--out`` folder and keyed by
    :func:`fingerprint`; the cache is added to the task's outputs."""
    cache = out.folder / name
    stamp = fingerprint(out.source, data, split, crops=crops, **settings)
    windows = cached_windows(fn, data, split, env, cache=cache, stamp=stamp, crops=crops, desc=desc)
    out.add("features", cache, f"{desc} of {split} cached in {cache}")
    return windows
