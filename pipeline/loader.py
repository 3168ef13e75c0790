"""``make_loader``: pick a backend (DALI or the torch reference loader), check the shards, build the loader.

Every check runs before the first batch: a manifest of another stream or clip shape, a missing shard or
index, an empty shard list, fewer shards than ranks — each is a :class:`UserError` naming the
file and the problem.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.backends import BACKENDS
from memdpc.pipeline.clip import EVAL_CROPS, ClipSpec
from memdpc.pipeline.dali_loader import DaliLoader
from memdpc.pipeline.plan import LoaderPlan
from memdpc.pipeline.shard_set import open_split
from memdpc.pipeline.torch_loader import TorchLoader

__all__ = ["backend_words", "dali_available", "make_loader", "plan_loader"]


def dali_available() -> bool:
    """Whether NVIDIA DALI can be imported here (the ``auto`` loader then takes it)."""
    return importlib.util.find_spec("nvidia.dali") is not None


def backend_words(backend: str) -> str:
    """The loader ``backend`` resolves to, in words for a log: ``torch``, or for ``auto`` why it is that one."""
    name = resolve_backend(backend)
    if backend != "auto":
        return name
    why = "nvidia-dali is installed" if name == "dali" else "nvidia-dali is not installed"
    return f"{name} (auto: {why})"


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise UserError(f"loader backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend == "auto":
        return "dali" if dali_available() else "torch"
    if backend == "dali" and not dali_available():
        raise UserError(
            "loader backend 'dali' requested but nvidia-dali is not installed (use --backend torch)"
        )
    return backend


def make_loader(
    shard_dir: str | os.PathLike,
    stream: str,
    split: str,
    *,
    train: bool,
    batch_size: int,
    backend: str = "auto",
    size: int = 128,
    crops: int = 1,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    num_workers: int | None = None,
    device: str = "cpu",
    spec: AugmentSpec | None = None,
    clip: ClipSpec | None = None,
    drop_last: bool = False,
    clips_per_video: int = 0,
):
    """A loader over ``<shard_dir>/<stream>/<split>-*.tar`` for one rank of ``world_size``.

    Returns an iterable of :class:`Batch` with ``len()`` (batches per epoch on this rank),
    ``samples_per_epoch`` (over all ranks) and ``set_epoch(epoch)``. An epoch gives each sample exactly once
    across all ranks (``drop_last`` instead cuts every rank to the same number of full batches, as DDP training
    wants). ``num_workers`` is the
    DataLoader worker count (torch) or the DALI thread count; ``device`` is where normalised clips land
    (``cuda`` also switches DALI to GPU decoding and augmentation). ``clips_per_video`` k ≥ 1 makes every epoch
    take k windows of each video, drawn anew every epoch (:mod:`memdpc.pipeline.epoch_draw`); 0 takes them all.
    ``clip``: the clip geometry the caller expects (shards of another are refused); None: the shards' own.
    """
    backend = resolve_backend(backend)
    plan = plan_loader(
        shard_dir,
        stream,
        split,
        train=train,
        batch_size=batch_size,
        backend=backend,
        size=size,
        crops=crops,
        rank=rank,
        world_size=world_size,
        seed=seed,
        num_workers=num_workers,
        device=device,
        spec=spec,
        clip=clip,
        drop_last=drop_last,
        clips_per_video=clips_per_video,
    )
    if backend == "dali":
        return DaliLoader(plan)
    return TorchLoader(plan)


def plan_loader(
    shard_dir,
    stream: str,
    split: str,
    *,
    train: bool,
    batch_size: int,
    backend: str,
    size: int,
    crops: int,
    rank: int,
    world_size: int,
    seed: int,
    num_workers: int | None,
    device: str,
    spec: AugmentSpec | None,
    clip: ClipSpec | None,
    drop_last: bool,
    clips_per_video: int = 0,
) -> LoaderPlan:
    """Read the manifest and check the request against it (see the module docstring)."""
    _check_request(batch_size, size, crops, rank, world_size, device)
    found = open_split(shard_dir, stream, split)
    where = found.path
    clip = clip or found.clip  # None: the shards' own geometry
    if found.manifest.get("clip") != clip.to_dict():
        raise UserError(
            f"{where}: shards hold clips {found.manifest.get('clip')}, the loader expects {clip.to_dict()}"
        )
    shards = found.shards
    if not shards or found.num_samples == 0:
        raise UserError(f"{where}: the shard list is empty")
    for tar, idx in shards:
        if not tar.is_file():
            raise UserError(f"{tar}: shard listed in {where.name} is missing")
        if not idx.is_file():
            raise UserError(f"{idx}: DALI index of shard {tar.name} is missing")
    if clips_per_video < 0:
        raise UserError(f"clips per video must be ≥ 0 (0: every window of the shards), not {clips_per_video}")
    if len(shards) < world_size and not clips_per_video:  # drawn samples are divided one by one, not by shard
        raise UserError(
            f"{where}: {len(shards)} shard(s) for {world_size} rank(s); every rank needs at least one shard "
            "(shard again with a smaller --max-count, or use fewer ranks)"
        )
    if num_workers is None:
        num_workers = 2 if backend == "torch" else (os.cpu_count() or 1)
    if (
        backend == "torch" and num_workers > 0 and not clips_per_video
    ):  # each DataLoader worker reads shards of
        num_workers = min(
            num_workers, len(shards) // world_size
        )  # its own: no more workers than a rank has shards
    return LoaderPlan(
        shards=shards,
        shard_samples=found.shard_samples,
        stream=stream,
        frame_sizes=tuple(found.frame_sizes),
        encoding=found.encoding,
        num_frames=clip.num_frames,
        num_blocks=clip.num_blocks,
        train=train,
        batch_size=batch_size,
        size=size,
        crops=crops,
        rank=rank,
        world_size=world_size,
        seed=seed,
        num_workers=num_workers,
        device=device,
        spec=spec or AugmentSpec(),
        drop_last=drop_last,
        clips_per_video=clips_per_video,
        third_channel=found.third_channel,
    )


def _check_request(batch_size: int, size: int, crops: int, rank: int, world_size: int, device: str) -> None:
    if batch_size < 1 or size < 1:
        raise UserError(f"batch size and clip size must be positive, got {batch_size} and {size}")
    if crops not in EVAL_CROPS:
        raise UserError(f"crops must be one of {', '.join(map(str, EVAL_CROPS))}, not {crops}")
    if not 0 <= rank < world_size:
        raise UserError(f"rank {rank} is outside world size {world_size}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but no CUDA device is available")
