"""A training run's parts and state: what it trains with (:class:`Parts`, built by :func:`build_parts`) and
where it stands (:class:`State`, what a checkpoint holds)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memdpc.common import distenv as dd
from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec
from memdpc.train import checkpoint as ck
from memdpc.train.config import TrainConfig
from memdpc.train.metrics import Meter, MetricsLogger, StepValues
from memdpc.train.prepare import split_loader
from memdpc.train.step import Stepper, make_optimizer, place_model, uses_graphs
from memdpc.train.teacher import Teacher, TeacherModel, load_teacher

__all__ = ["Parts", "State", "build_parts", "last_checkpoint", "position", "run_loader", "scheduler_for"]


@dataclass(kw_only=True)
class State:
    """Where training stands; everything here goes into the checkpoint (``train.checkpoint.TRAINING_KEYS``)."""

    epoch: int = 0
    step: int = 0
    epoch_step: int = 0
    best_val: float = math.inf  # the best watched value so far (--best-by: loss, or -R@1); lower is better
    best_epoch: int | None = None  # the epoch of best_val (None: no epoch finished yet)
    stale: int = 0  # epochs since best_val last improved (--early-stop)
    first_val: float | None = None  # the watched value after epoch 0 (None: not finished yet)
    epoch_loss: list[float] = field(
        default_factory=lambda: [0.0, 0.0]
    )  # sum, count of this epoch's train loss
    epoch_rng: dict[str, Any] | None = None


@dataclass(kw_only=True)
class Parts:
    """What a run trains with, built once (:func:`build_parts`)."""

    config: TrainConfig
    env: dd.DistEnv
    run_dir: Path
    clip: ClipSpec
    model: nn.Module  # possibly DDP-wrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    train_loader: Any
    val_loader: Any
    logger: MetricsLogger
    steps: StepValues  # the steps' metrics not read yet (on the device)
    meter: Meter  # the logging window (host)
    shards: dict[str, dict[str, Any]]  # what the run records of its shards (train.prepare.shard_records)
    stepper: Stepper | None = None  # runs each optimiser step (eager, compiled or as a CUDA graph)
    teacher: Teacher | None = None  # --teacher's features of the training videos
    saved: tuple[int, int, int] | None = None  # (epoch, step, epoch_step) that checkpoints/last.pt holds


def build_parts(
    config: TrainConfig,
    env: dd.DistEnv,
    run_dir: Path,
    clip: ClipSpec,
    init: dict[str, Any] | None,
    shards: dict[str, dict[str, Any]],
    teacher: TeacherModel | None = None,
) -> Parts:
    """What a run trains with: its loaders (the training split refused where it holds less than a batch per
    rank), the model (DDP-wrapped under torchrun) from ``init`` or seeded weights, optimiser, schedule, scaler,
    metrics logger, step runner and ``teacher``'s features of the training videos (``--teacher``)."""
    train_loader = run_loader(config, env, config.loader.train_split, clip, train=True)
    if len(train_loader) == 0:
        raise UserError(
            f"{config.loader.shards}: the {config.loader.train_split} split has fewer clips per rank than one "
            f"batch ({config.loader.batch_size}); lower --batch-size"
        )
    val_loader = (
        run_loader(config, env, config.val_split, clip, train=False) if config.val_split != "none" else None
    )

    if env.distributed and uses_graphs(config, env.device):
        raise UserError("--cuda-graphs runs in one process; leave it out under torchrun or srun")
    model = place_model(ck.initial_model(config, init), config, env.device)
    optimizer = make_optimizer(model, config, env.device)
    wrapped: nn.Module = model
    if env.distributed:
        wrapped = DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None
        )
    parts = Parts(
        config=config,
        env=env,
        run_dir=run_dir,
        clip=clip,
        model=wrapped,
        optimizer=optimizer,
        scheduler=scheduler_for(config, optimizer),
        scaler=torch.amp.GradScaler(env.device.type, enabled=config.amp == "fp16"),
        train_loader=train_loader,
        val_loader=val_loader,
        logger=MetricsLogger(run_dir, env.is_main, config.progress),
        steps=StepValues(config.log_every),
        meter=Meter(),
        shards=shards,
        teacher=load_teacher(config, teacher, env.device),
    )
    parts.stepper = Stepper(
        wrapped,
        optimizer,
        parts.scaler,
        config,
        env.device,
        lambda text: parts.logger.message(f"[yellow]warning:[/] {escape(text)}"),
    )
    return parts


def scheduler_for(config: TrainConfig, optimizer: torch.optim.Optimizer):
    """The learning-rate schedule of ``--schedule``: a plateau decay, milestones, or None (constant)."""
    factor = config.lr_min / config.lr
    if config.schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=factor, patience=config.patience, min_lr=config.lr_min
        )
    if config.schedule == "milestones":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, config.milestones, gamma=factor)
    return None


def run_loader(
    config: TrainConfig,
    env: dd.DistEnv,
    split: str,
    clip: ClipSpec,
    train: bool,
    rank: int | None = None,
    world_size: int | None = None,
):
    """A loader of one split of ``config``'s shards for this rank (or the ``rank`` and ``world_size`` given)."""
    return split_loader(
        config,
        split,
        clip,
        train,
        env.rank if rank is None else rank,
        env.world_size if world_size is None else world_size,
        str(env.device),
    )


def last_checkpoint(p: Parts) -> Path:
    """The run's ``checkpoints/last.pt``."""
    return p.run_dir / "checkpoints" / "last.pt"


def position(s: State) -> tuple[int, int, int]:
    """(epoch, step, epoch_step): where a checkpoint saved at ``s`` stands."""
    return s.epoch, s.step, s.epoch_step
