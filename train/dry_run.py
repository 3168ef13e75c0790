"""``memdpc train --dry-run``: what a run will do, before it starts, and nothing written.

The counts come from the run's own loaders (their ``len()`` is an epoch's steps, their ``samples_per_epoch``
its clips, from the shards' manifests and indexes), the starting point from the checkpoint a run would resume
from (refused as the run refuses it, e.g. on shards changed since; with ``--overwrite``, what the run would
remove), and the time from a short warm-up on this device: real training steps on real batches (loading
included) and validation batches, timed. On a CPU, where a step's time grows with its clips, the steps and
batches timed hold :data:`CPU_TIMED_BATCH` clips and their times are scaled to the batch size, and no more steps
are timed once :data:`WARMUP_BUDGET_S` is spent: a dry run costs seconds, not minutes of full steps, which on a
small data set are most of the run it estimates. Disk is the size of one checkpoint, serialised in memory with
its optimiser state, times the checkpoints a run keeps. No run directory, checkpoint or log is written.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

from memdpc.common import distenv as dd
from memdpc.common.console import rich_console
from memdpc.common.errors import UserError
from memdpc.common.wording import duration_text, name_list, plural, size_text
from memdpc.model import checkpoint as mc
from memdpc.model.loss import RELATION_MIN_BATCH
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import manifest_path
from memdpc.train import checkpoint as ck
from memdpc.train.config import RESTART_FREE, TrainConfig
from memdpc.train.invariance import resolve_motion_invariance
from memdpc.train.prepare import (
    check_run_dir,
    check_shards,
    monitor_on_labels,
    monitored,
    overwritten,
    resolve_val_split,
    shard_records,
    split_loader,
)
from memdpc.train.seeding import seed_everything
from memdpc.train.step import GRAPH_WARMUP, Stepper, make_optimizer, place_clips, place_model, uses_graphs
from memdpc.train.teacher import TeacherModel, read_teacher, teacher_loader

__all__ = ["plan_run"]

WARMUP_STEPS = 3  # timed training steps, after one untimed (the loader's start, kernel selection)
VAL_BATCHES = 2  # validation batches run to time one
CPU_TIMED_BATCH = 2  # clips of the steps and batches timed on a CPU (scaled to the batch size)
WARMUP_BUDGET_S = 5.0  # no more steps are timed once the timed ones took this long


@dataclass(frozen=True)
class RunPlan:
    """What ``memdpc train`` will do with a config, counted as the run counts and timed on ``device``."""

    out: str
    manifest: str
    device: str
    world_size: int
    batch_size: int
    videos: int
    windows: int
    clips_per_video: int
    clips_per_epoch: int  # all ranks
    steps_per_epoch: int
    epochs: int
    start: tuple[int, int]  # (epoch, step) where the run starts: 0, 0, or the checkpoint it resumes
    removes: list[str]  # what --overwrite removes from the run directory first (train.prepare.overwritten)
    steps: int  # steps it takes from there
    settings: str  # the experiment's settings that are not the paper's (:func:`_settings`)
    decided: str | None  # what --motion-invariance auto decided, in words
    schedule: str
    validation: str
    val_batches: int  # per rank and epoch (0: none)
    knn_batches: int  # per kNN pass
    knn_every: int  # epochs between kNN passes (0: off)
    checkpoint_bytes: int
    checkpoints: int  # the most files checkpoints/ holds
    timed_steps: int
    timed_batch: int  # clips per step and validation batch timed (the batch size, or fewer on a CPU)
    first_step_s: float  # scaled to the batch size
    step_s: float
    val_batch_s: float
    teacher: str | None  # --teacher in words (None without one)
    teacher_s: float  # its table pass before the first step (0.0 without one)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def epochs_run(self) -> int:
        """Epochs whose end (validation, kNN, checkpoint) the run reaches."""
        return min(self.epochs, (self.start[1] + self.steps) // max(self.steps_per_epoch, 1)) - self.start[0]

    @property
    def knn_passes(self) -> int:
        """kNN passes: one on the initial weights of a new run, then every ``knn_every`` epochs."""
        if not self.knn_every:
            return 0
        return (
            (self.start == (0, 0))
            + (self.start[0] + self.epochs_run) // self.knn_every
            - self.start[0] // self.knn_every
        )

    @property
    def wall_s(self) -> float:
        steps = self.first_step_s + (self.steps - 1) * self.step_s if self.steps else 0.0
        return (
            self.teacher_s
            + steps
            + self.val_batch_s * (self.epochs_run * self.val_batches + self.knn_passes * self.knn_batches)
        )

    def lines(self) -> list[str]:
        per_video = (
            f"{plural(self.clips_per_video, 'window')} per video, drawn anew every epoch"
            if self.clips_per_video
            else "every window"
        )
        dropped = self.clips_per_epoch - self.steps_per_epoch * self.global_batch
        started = (
            f"from epoch {self.start[0]}, step {self.start[1]} (the checkpoint it resumes, on the shards it "
            "was trained on): "
            if self.start != (0, 0)
            else f"afresh (--overwrite removes {name_list(self.removes)} first): "
            if self.removes
            else ""
        )
        scaled = (
            f" of {plural(self.timed_batch, 'clip')}, scaled to {self.batch_size}"
            if self.timed_batch != self.batch_size
            else ""
        )
        timed = (
            f"{self.step_s:.3g} s per step over {plural(self.timed_steps, 'timed step')}{scaled} (the first "
            f"{self.first_step_s:.3g} s)"
            + (
                f", {self.val_batch_s:.3g} s per validation batch"
                if self.val_batches or self.knn_batches
                else ""
            )
        )
        return [
            f"plan of {self.out} (a dry run: nothing written)",
            f"data: {self.videos:,} videos, {self.windows:,} windows in {self.manifest}; an epoch takes "
            f"{per_video}: {self.clips_per_epoch:,} clips",
            f"world: {self.world_size} × batch {self.batch_size} = global batch {self.global_batch}; "
            f"{plural(self.steps_per_epoch, 'step')} per epoch"
            + (
                f" ({plural(dropped, 'clip')} of each epoch left out: the last partial batch)"
                if dropped
                else ""
            ),
            f"steps: {started}{self.steps:,} in all ({self.epochs} epochs)",
            f"settings: {self.settings}",
            *([self.decided] if self.decided else []),
            f"schedule: {self.schedule}",
            f"validation: {self.validation}",
            *(
                [
                    f"teacher: {self.teacher} embeds every training video before the first step (about "
                    f"{duration_text(self.teacher_s)}); each step adds the relation loss"
                ]
                if self.teacher
                else []
            ),
            f"disk: {plural(self.checkpoints, 'checkpoint')} at most in {self.out}/checkpoints, "
            f"{size_text(self.checkpoint_bytes)} each: {size_text(self.checkpoints * self.checkpoint_bytes)} "
            f"(one more while a checkpoint is saved)",
            f"time: about {duration_text(self.wall_s)} — an estimate on {self.device} from {timed}"
            + (
                f"; each of the {self.world_size} processes taken to be as fast, without communication"
                if self.world_size > 1
                else ""
            ),
            "next: the same command without --dry-run",
        ]


def _settings(c: TrainConfig) -> str:
    """The model's, the loss's, the augmentation's and the optimisation's settings that differ from the paper's
    (the defaults), as ``name value`` (where a run goes and how it is executed left out: those free to change on
    a restart, the stream, the epochs and the schedule, which lines of their own say)."""
    left_out = {*RESTART_FREE, "stream", "epochs", "schedule", "lr", "weight_decay", "lr_min", "patience"}
    paper = TrainConfig().to_dict()
    given = {k: v for k, v in c.to_dict().items() if k not in left_out and v != paper[k]}
    words = [f"{k} {','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in given.items()]
    return ", ".join(words) + " (the paper's otherwise)" if words else "the paper's"


def _schedule(c: TrainConfig) -> str:
    adam = f"Adam, lr {c.lr:g}, weight decay {c.weight_decay:g}"
    if c.schedule == "plateau":
        watched = "validation loss" if c.val_split != "none" else "training loss"
        how = f"decayed once to {c.lr_min:g} after {c.patience} epochs without a lower {watched}"
    elif c.schedule == "milestones":
        how = f"× {c.lr_min / c.lr:g} at epoch{'s' * (len(c.milestones) > 1)} {', '.join(map(str, c.milestones))}"
    else:
        how = "constant"
    stop = f"; stops after {c.early_stop} epochs without a new best ({c.best_by})" if c.early_stop else ""
    return f"{adam}, {how}{stop}"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({plural(torch.get_num_threads(), 'thread')})"


def _sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _time_steps(
    config: TrainConfig,
    loader,
    device: torch.device,
    init: dict[str, Any] | None,
    features: torch.Tensor | None = None,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[float]]:
    """The model after up to 1 + WARMUP_STEPS real training steps (each clip given a row of a teacher's
    ``features``, where there are some), its optimiser, and each step's seconds (waiting for its batch included).
    With --cuda-graphs the eager steps before the capture, and the capture, count as part of the first."""
    seed_everything(config.seed)
    model = place_model(ck.initial_model(config, init), config, device)
    model.global_negatives = False  # one process: the batch's own negatives (the same work per rank)
    optimizer = make_optimizer(model, config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")
    step = Stepper(
        model,
        optimizer,
        scaler,
        config,
        device,
        lambda text: rich_console(stderr=True).print("[yellow]warning:[/]", escape(text), soft_wrap=True),
    )
    loader.set_epoch(0)
    seconds = []
    batches = iter(loader)
    first = 1 + (GRAPH_WARMUP if uses_graphs(config, device) else 0)  # steps timed together as the first
    t0 = _sync(device)
    for i in range(first + WARMUP_STEPS):
        batch = next(batches, None)
        if batch is None:
            break
        clips = place_clips(batch.clips, config, device)
        teacher = (
            None if features is None else features[torch.arange(len(clips), device=device) % len(features)]
        )
        step(clips, teacher)
        if i + 1 >= first:
            t1 = _sync(device)
            seconds.append(t1 - t0)
            t0 = t1
            if len(seconds) > 1 and sum(seconds[1:]) >= WARMUP_BUDGET_S:
                break
    del batches
    return model, optimizer, seconds


@torch.no_grad()
def _time_batches(run, loader, device: torch.device) -> tuple[float, Any]:
    """Seconds per batch of ``run(clips)`` over up to :data:`VAL_BATCHES` of ``loader`` (the first, which starts
    the loader, counts only when it is the only one), and the first batch's output; (0.0, None) for no batch."""
    seconds, first = [], None
    t0 = _sync(device)
    for i, batch in enumerate(loader):
        if i >= VAL_BATCHES:
            break
        out = run(batch.clips.to(device))
        if i == 0:
            first = out
        t1 = _sync(device)
        seconds.append(t1 - t0)
        t0 = t1
    if not seconds:
        return 0.0, None
    return (sum(seconds[1:]) / len(seconds[1:]) if len(seconds) > 1 else seconds[0]), first


def _time_val(model: torch.nn.Module, loader, device: torch.device) -> float:
    """Seconds per validation batch."""
    model.eval()
    try:
        return _time_batches(model, loader, device)[0]
    finally:
        model.train()


def plan_run(config: TrainConfig, overwrite: bool = False) -> RunPlan | None:
    """The plan of ``config``'s run (None on ranks other than 0 under torchrun or srun, which plan nothing):
    the same checks as the run itself (a run directory of another config is refused, and a checkpoint the run
    would not resume from, e.g. of other shards; ``overwrite`` as :func:`memdpc.train.loop.train` takes it), then
    the counts and a timed warm-up on this process's device. Writes nothing."""
    config = resolve_val_split(config, fresh=overwrite)
    rank, world_size, local_rank = dd.read_env()
    if rank != 0:
        return None
    config, decided = resolve_motion_invariance(config, fresh=overwrite)
    resume_from = check_run_dir(config, overwrite)
    resumed = ck.read_resume(resume_from, config, world_size) if resume_from is not None else None
    init = ck.read_init(config.init, config)[0] if config.init and resumed is None else None
    teacher = read_teacher(config)  # refused here as the run would refuse it
    manifests = check_shards(config)
    config, monitor_note = monitor_on_labels(config, manifests)
    if resumed is not None:
        ck.check_same_shards(resumed, resume_from, shard_records(config))
    clip = manifests["train"].clip
    device = dd.pick_device(config.loader.device, local_rank)
    loader = split_loader(config, config.loader.train_split, clip, True, 0, world_size, str(device))
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise UserError(
            f"{config.loader.shards}: the {config.loader.train_split} split has fewer clips per rank than one "
            f"batch ({config.loader.batch_size}); lower --batch-size"
        )
    start = (resumed["epoch"], resumed["step"]) if resumed else (0, 0)
    total = config.epochs * steps_per_epoch
    if config.max_steps:
        total = min(total, config.max_steps)
    val, val_batches, knn_batches, validation = _validation(config, clip, device, world_size, monitor_note)
    timed = _timed(config, device)
    if timed is not config:
        loader = split_loader(timed, config.loader.train_split, clip, True, 0, world_size, str(device))
        val = val and split_loader(timed, config.val_split, clip, False, 0, world_size, str(device))
    teacher_s, features = _time_teacher(timed, teacher, device) if teacher else (0.0, None)
    seconds, val_batch_s, checkpoint_bytes = _time(
        config, timed, loader, val, val_batches, device, init, world_size, features
    )
    return RunPlan(
        out=config.out,
        manifest=str(manifest_path(config.loader.shards, config.loader.stream, config.loader.train_split)),
        device=_device_name(device),
        world_size=world_size,
        batch_size=config.loader.batch_size,
        videos=manifests["train"].num_videos,
        windows=manifests["train"].num_samples,
        clips_per_video=config.clips_per_video,
        clips_per_epoch=loader.samples_per_epoch,
        steps_per_epoch=steps_per_epoch,
        epochs=config.epochs,
        start=start,
        removes=[str(p) for p in overwritten(Path(config.out))] if overwrite else [],
        steps=max(total - start[1], 0),
        settings=_settings(config),
        decided=decided,
        schedule=_schedule(config),
        validation=validation,
        val_batches=val_batches,
        knn_batches=knn_batches,
        knn_every=config.knn_every,
        checkpoint_bytes=checkpoint_bytes,
        checkpoints=2 + (config.epochs // config.keep_every if config.keep_every else 0),
        timed_steps=max(len(seconds) - 1, 0),
        timed_batch=timed.loader.batch_size,
        first_step_s=seconds[0] if seconds else math.nan,
        step_s=sum(seconds[1:]) / len(seconds[1:])
        if len(seconds) > 1
        else (seconds[0] if seconds else math.nan),
        val_batch_s=val_batch_s,
        teacher=f"{teacher.path} ({teacher.stream})" if teacher else None,
        teacher_s=teacher_s,
    )


def _validation(
    config: TrainConfig, clip: ClipSpec, device: torch.device, world_size: int, monitor_note: str | None
):
    """The validation loader (None without a validation split), its batches per epoch, the kNN monitor's
    batches per pass, and the plan's words for them."""
    if config.val_split == "none":
        return None, 0, 0, "none (the plateau watches the training loss)"
    val = split_loader(config, config.val_split, clip, False, 0, world_size, str(device))
    val_batches = min(len(val), config.val_max_batches or len(val))
    words = f"the {config.val_split} split, {plural(val_batches, 'batch')} per process after every epoch"
    knn_batches = 0
    if config.knn_every:
        one = [
            split_loader(monitored(config), s, clip, False, 0, 1, str(device))
            for s in (config.loader.train_split, config.val_split)
        ]
        knn_batches = sum(min(len(x), config.knn_max_batches) for x in one)
        on = f" of {config.knn_shards}" if config.knn_shards else ""
        words += f"; the kNN monitor{on} every {plural(config.knn_every, 'epoch')} ({knn_batches} batches)"
    elif monitor_note:
        words += f"; {monitor_note}"
    return val, val_batches, knn_batches, words


def _timed(config: TrainConfig, device: torch.device) -> TrainConfig:
    """The config the warm-up times: on a CPU, where a step's time grows with its clips, batches of fewer clips
    (:data:`CPU_TIMED_BATCH`), whose times are scaled (no GPU is that linear)."""
    if device.type == "cuda":
        return config
    fewer = min(config.loader.batch_size, max(CPU_TIMED_BATCH, RELATION_MIN_BATCH if config.teacher else 1))
    return replace(config, loader=replace(config.loader, batch_size=fewer))


def _time_teacher(
    timed: TrainConfig, teacher: TeacherModel, device: torch.device
) -> tuple[float, torch.Tensor | None]:
    """The teacher's table pass in seconds (its batches, at the timed batch size, times the seconds of one) and
    its features (B, D) of the first batch, which the timed steps' relation loss is given (None: no windows, which
    the run refuses at its first step, as it refuses the shards)."""
    loader = teacher_loader(timed, teacher, device)
    per_batch, features = _time_batches(teacher.model.to(device).features, loader, device)
    return per_batch * len(loader), features


def _time(
    config, timed, loader, val, val_batches, device, init, world_size, features
) -> tuple[list[float], float, int]:
    """The warm-up: the timed steps' seconds (with the relation loss to the teacher's ``features`` where there is
    one) and a validation batch's, scaled to the run's batch size, and the size of one checkpoint of the
    warmed-up model and optimiser."""
    scale = config.loader.batch_size / timed.loader.batch_size
    model, optimizer, seconds = _time_steps(timed, loader, device, init, features)
    seconds = [t * scale for t in seconds]
    val_batch_s = scale * _time_val(model, val, device) if val is not None and val_batches else 0.0
    data = mc.serialize(
        mc.build_checkpoint(
            model,
            config.loader.stream,
            "train",
            input_size=config.size,
            optimizer=optimizer.state_dict(),
            rng=[ck.rng_state()] * world_size,
            world_size=world_size,
            config=config.to_dict(),
        )
    )
    return seconds, val_batch_s, len(data)
