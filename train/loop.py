"""The self-supervised training loop: ``train(config) -> run_dir`` (ARCHITECTURE.md §3.3).

One code path for one CPU process, one GPU, and ``torchrun``/``srun`` with DistributedDataParallel.
Exact resume: a checkpoint records the epoch, the number of batches of that epoch already consumed and
every rank's RNG states (now and at the start of the epoch). Resuming restores the epoch-start RNG, sets the
loader's epoch (its shuffle and augmentation are seeded by seed and epoch), draws and discards the consumed
batches, then restores the current RNG — so the run continues with the very batches and dropout masks an
uninterrupted run would have used.

No host synchronisation per step: the step's metrics stay on the device (:class:`~memdpc.train.metrics.StepValues`)
and are read, in one transfer, every ``--log-every`` steps, before every checkpoint and at the end of the epoch.
A non-finite loss is noticed at those reads, so up to ``--log-every`` − 1 more steps may run after it; the read
before each save, and a check of the weights themselves, keep checkpoints from ever holding non-finite weights.
The step itself, and how ``--fast``, ``--compile`` and ``--cuda-graphs`` run it, is :mod:`memdpc.train.step`'s;
a batch that does not fit in the device's memory stops the run with a one-line error naming the batch size.

One writer per run folder: a run holds ``train.lock`` there while it trains (:func:`memdpc.train.prepare.hold_run_dir`);
a second run on the folder is refused, naming the holder's process and host, and a lock that a killed run left
is taken over. A fault of the run's resources (:class:`~memdpc.common.errors.ResourceFault`) stops it between two
steps: a checkpoint that could not be written (a full disk) leaves the previous one as it was, and the resume from
it is bit-identical; a torch-loader worker killed (the out-of-memory killer) gets ``checkpoints/last.pt`` saved
where the run stopped, as a signal does.

SIGINT and SIGTERM stop a run between two steps, at the same step on every rank (:func:`_stop_point`, one host
all-reduce per step under torchrun): ``checkpoints/last.pt`` is saved there, the exact-resume state above, and
:class:`~memdpc.common.interrupts.Interrupted` says what was kept. Until then a signal is only remembered
(:func:`memdpc.common.interrupts.deferred`), so that it never lands in a loader's shutdown, a TensorBoard write, a
collective or half an optimiser step. A validation or kNN pass in progress is abandoned (its results are not
recorded, so the resumed run repeats it). Saving costs what a per-epoch save costs, so SIGINT saves too.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.markup import escape
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memdpc.common import distenv as dd
from memdpc.common import interrupts
from memdpc.common.atomic import remove_stale_tmp
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.model import checkpoint as mc
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import backend_words
from memdpc.train import checkpoint as ck
from memdpc.train.bn_stats import data_batchnorm_stats
from memdpc.train.config import TrainConfig, write_config
from memdpc.train.knn import knn_recall
from memdpc.train.metrics import (
    DATA_BN,
    KNN_BASELINE,
    Meter,
    MetricsLogger,
    StepValues,
    at_chance,
    chance_note,
    chance_summary,
    monitor_summary,
    read_metrics,
    truncate_jsonl,
)
from memdpc.train.prepare import (
    CONFIG_NAME,
    check_run_dir,
    check_shards,
    clear_run,
    hold_run_dir,
    monitor_on_labels,
    monitored,
    resolve_motion_invariance,
    resolve_val_split,
    shard_records,
    split_loader,
    val_split_warnings,
)
from memdpc.train.seeding import seed_everything, set_determinism
from memdpc.train.step import (
    Stepper,
    fused_adam,
    make_optimizer,
    out_of_memory,
    place_clips,
    place_model,
    uses_graphs,
)

__all__ = ["train"]


@dataclass
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


@dataclass
class Parts:
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
    saved: tuple[int, int, int] | None = None  # (epoch, step, epoch_step) that checkpoints/last.pt holds


def train(config: TrainConfig, overwrite: bool = False) -> Path:
    """Train (or resume) the run ``config.out``; return the run directory. Rank 0 ends by naming what it wrote.

    A run resumes only on the shards it was trained on (:func:`memdpc.train.checkpoint.check_same_shards` names
    what changed); ``overwrite`` starts it afresh instead, removing its checkpoints, metrics and TensorBoard logs
    (:func:`memdpc.train.prepare.clear_run`) after saying so. Raises :class:`~memdpc.common.interrupts.Interrupted`
    on SIGINT or SIGTERM, after saving where the run stopped (module docstring)."""
    config = resolve_val_split(config, fresh=overwrite)
    config, decided = resolve_motion_invariance(config, fresh=overwrite)
    if decided and dd.read_env()[0] == 0:
        rich_console(stderr=True).print(decided, markup=False, soft_wrap=True)
    env = dd.setup(config.loader.device)
    finished = False
    run_dir = None
    try:
        with interrupts.deferred():
            run_dir = _train(config, env, overwrite)
        finished = True
        return run_dir
    except interrupts.Interrupted as stop:
        finished = True  # every rank stopped at the same step, its collectives done: they leave together
        if run_dir is not None:  # the signal came after the last step
            stop.keep(f"training had finished; {run_dir} holds it")
        raise
    finally:
        dd.cleanup(env, finished)


def _train(config: TrainConfig, env: dd.DistEnv, overwrite: bool) -> Path:
    resume_from = check_run_dir(config, overwrite)
    lock, refused = None, None
    if env.is_main:  # one writer per run folder: rank 0 holds the lock for every rank
        try:
            lock = hold_run_dir(config)
        except (UserError, ResourceFault) as e:
            refused = e
    refused = dd.from_main(env, refused)
    if refused is not None:
        raise refused
    try:
        if lock is not None and lock.note:
            rich_console(stderr=True).print("[yellow]note:[/]", escape(lock.note), soft_wrap=True)
        return _train_held(config, env, resume_from, overwrite)
    finally:
        if lock is not None:
            lock.release()


def _train_held(config: TrainConfig, env: dd.DistEnv, resume_from: Path | None, overwrite: bool) -> Path:
    ckpt = ck.read_resume(resume_from, config, env.world_size) if resume_from else None
    init = _read_init(config, env) if ckpt is None and config.init else None
    manifests = check_shards(config)
    config, note = monitor_on_labels(config, manifests)
    shards = shard_records(config)
    if ckpt is not None:
        ck.check_same_shards(ckpt, resume_from, shards)
    if env.is_main:
        for warning in [*([note] if note else []), *val_split_warnings(config)]:
            rich_console(stderr=True).print("[yellow]warning:[/]", escape(warning), soft_wrap=True)
    dd.barrier(env)
    run_dir = Path(config.out)
    if env.is_main:
        if overwrite:
            clear_run(
                run_dir, lambda text: rich_console(stderr=True).print(text, markup=False, soft_wrap=True)
            )
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        remove_stale_tmp(run_dir / "checkpoints")
        write_config(config, run_dir / CONFIG_NAME)
        # Records after the checkpoint will be written again; without one (a run killed before its first
        # checkpoint), all of them will
        truncate_jsonl(run_dir / "metrics.jsonl", ckpt["step"] if ckpt is not None else -1)
    dd.barrier(env)
    set_determinism(config.deterministic)
    parts = _build(config, env, run_dir, ClipSpec(**manifests["train"]["clip"]), init, shards)
    if config.loader.backend == "auto":  # which one it is depends on the machine: say so
        parts.logger.message(f"loader: {backend_words(config.loader.backend)}", markup=False)
    state = State()
    if ckpt is not None:
        state = _restore(parts, ckpt, resume_from)
        if resume_from == _last(parts):
            parts.saved = _position(state)
    else:
        seed_everything(config.seed + env.rank)
    try:
        _loop(parts, state)
        parts.logger.message(_finished(parts, state), markup=False)
    except interrupts.Interrupted as stop:
        raise _kept(parts, state, stop) from None
    except ResourceFault as fault:
        raise _fault_kept(parts, state, fault) from None
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        too_big = out_of_memory(e, config.loader.batch_size, env.device)
        if too_big is None:
            raise
        raise too_big from None
    finally:
        try:
            parts.logger.close()
        except ResourceFault:
            if sys.exc_info()[1] is None:  # else the error on its way out says more
                raise
    return run_dir


def _read_init(config: TrainConfig, env: dd.DistEnv) -> dict[str, Any]:
    """The ``--init`` checkpoint of a new run (checked before the run directory is made)."""
    init, warning = ck.read_init(config.init, config)
    if warning and env.is_main:
        rich_console(stderr=True).print("[yellow]warning:[/]", escape(warning), soft_wrap=True)
    return init


# ---------------------------------------------------------------------------------------------- building
def _build(
    config: TrainConfig,
    env: dd.DistEnv,
    run_dir: Path,
    clip: ClipSpec,
    init: dict[str, Any] | None,
    shards: dict[str, dict[str, Any]],
) -> Parts:
    train_loader = _loader(config, env, config.loader.train_split, clip, train=True)
    if len(train_loader) == 0:
        raise UserError(
            f"{config.loader.shards}: the {config.loader.train_split} split has fewer clips per rank than one "
            f"batch ({config.loader.batch_size}); lower --batch-size"
        )
    val_loader = (
        _loader(config, env, config.val_split, clip, train=False) if config.val_split != "none" else None
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
        config,
        env,
        run_dir,
        clip,
        wrapped,
        optimizer,
        _scheduler(config, optimizer),
        torch.amp.GradScaler(env.device.type, enabled=config.amp == "fp16"),
        train_loader,
        val_loader,
        MetricsLogger(run_dir, env.is_main, config.progress),
        StepValues(config.log_every),
        Meter(),
        shards,
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


def _scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer):
    factor = config.lr_min / config.lr
    if config.schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=factor, patience=config.patience, min_lr=config.lr_min
        )
    if config.schedule == "milestones":
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, config.milestones, gamma=factor)
    return None


def _loader(
    config: TrainConfig,
    env: dd.DistEnv,
    split: str,
    clip: ClipSpec,
    train: bool,
    rank: int | None = None,
    world_size: int | None = None,
):
    return split_loader(
        config,
        split,
        clip,
        train,
        env.rank if rank is None else rank,
        env.world_size if world_size is None else world_size,
        str(env.device),
    )


# ------------------------------------------------------------------------------------------- checkpoints
def _gather(env: dd.DistEnv, model: nn.Module, epoch_rng: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every rank's RNG states and weight digest (DDP keeps the weights of all ranks equal: recorded)."""
    mine = {"now": ck.rng_state(), "epoch_start": epoch_rng, "digest": ck.param_digest(model)}
    if not env.distributed:
        return [mine]
    every: list[Any] = [None] * env.world_size
    dist.all_gather_object(every, mine)
    return every


def _last(p: Parts) -> Path:
    return p.run_dir / "checkpoints" / "last.pt"


def _position(s: State) -> tuple[int, int, int]:
    return s.epoch, s.step, s.epoch_step


def _save(p: Parts, s: State, names: list[str]) -> None:
    """Write the checkpoint (rank 0) under each of ``names`` in ``checkpoints/``; all ranks take part, and
    all raise rank 0's :class:`~memdpc.common.errors.ResourceFault` when it could not write (a full disk), so that
    no rank waits for the others forever. ``last.pt`` is written last: until it is, a resumed run starts from the
    previous one and writes the others again, as they were.
    The steps not read yet are read first (their losses checked, the epoch's loss sum complete), and non-finite
    weights stop training instead of replacing the last good checkpoint."""
    _read(p, s)
    model = ck.unwrap(p.model)
    _check_weights(p, s, model)
    ranks = _gather(p.env, model, s.epoch_rng)
    error = None
    if p.env.is_main:
        digests = [r.pop("digest") for r in ranks]
        if len(set(digests)) > 1:
            p.logger.message(f"[red]warning: the ranks' weights differ at step {s.step}")
        data = mc.serialize(
            mc.build_checkpoint(
                model,
                p.config.loader.stream,
                "train",
                input_size=p.config.size,
                **ck.training_entries(
                    optimizer=p.optimizer.state_dict(),
                    scheduler=p.scheduler.state_dict() if p.scheduler is not None else None,
                    scaler=p.scaler.state_dict(),
                    epoch=s.epoch,
                    step=s.step,
                    epoch_step=s.epoch_step,
                    epoch_loss=list(s.epoch_loss),
                    rng=ranks,
                    rank_digests=digests,
                    config=p.config.to_dict(),
                    world_size=p.env.world_size,
                    best_val=s.best_val,
                    best_epoch=s.best_epoch,
                    stale=s.stale,
                    shards=p.shards,
                    first_val=s.first_val,
                ),
            )
        )
        try:
            for name in sorted(names, key=lambda n: n == "last.pt"):  # last.pt last: see the docstring
                mc.write_checkpoint(data, p.run_dir / "checkpoints" / name)
        except ResourceFault as e:
            error = e
    error = dd.from_main(p.env, error)
    if error is not None:
        raise error
    if "last.pt" in names:
        p.saved = _position(s)


def _restore(p: Parts, ckpt: dict[str, Any], path: Path) -> State:
    model = ck.unwrap(p.model)
    mc.check_compatible(ckpt, path, model.config)
    model.load_state_dict(ckpt["model"])
    t = ck.read_training_entries(ckpt)
    p.optimizer.load_state_dict(
        _this_runs_kernel(
            t["optimizer"], fused_adam(p.config, p.env.device), uses_graphs(p.config, p.env.device)
        )
    )
    if p.scheduler is not None:
        p.scheduler.load_state_dict(t["scheduler"])
    p.scaler.load_state_dict(t["scaler"])
    rng = t["rng"][p.env.rank]
    ck.set_rng_state(rng["now"])
    p.logger.message(f"resuming {path} at epoch {t['epoch']}, step {t['step']}", markup=False)
    return State(
        t["epoch"],
        t["step"],
        t["epoch_step"],
        t["best_val"],
        t["best_epoch"],
        t["stale"],
        t["first_val"],
        list(t["epoch_loss"]),
        rng["epoch_start"],
    )


def _this_runs_kernel(state: dict[str, Any], fused: bool | None, capturable: bool) -> dict[str, Any]:
    """The optimiser state with this run's Adam kernel: torch would restore the one the checkpoint was written
    with (fused or not, capturable or not), and only for a fused or capturable kernel does it place the step
    counters on the weights' device — a run may resume on another device (fused on CUDA, torch's default on
    CPU), or with or without --cuda-graphs."""
    return {
        **state,
        "param_groups": [{**g, "fused": fused, "capturable": capturable} for g in state["param_groups"]],
    }


# ---------------------------------------------------------------------------------------------- the loop
def _loop(p: Parts, s: State) -> None:
    c = p.config
    if c.knn_every and s.step == 0:
        r1 = _knn(p)  # the value at initialisation, which training should not fall below
        _stop_point(p)
        _log_knn(p, s, r1)
        r1 = _knn(p, data_bn=True)  # and the untrained encoder with the data's BatchNorm statistics
        _stop_point(p)
        p.logger.log({"kind": KNN_BASELINE, "epoch": s.epoch, "step": s.step, "baseline": DATA_BN, "r1": r1})
    while s.epoch < c.epochs and not (c.max_steps and s.step >= c.max_steps):
        if c.early_stop and s.stale >= c.early_stop:
            p.logger.message(f"early stop: no new best {c.best_by} for {s.stale} epochs")
            return
        for _ in _epoch_batches(p, s):
            if c.max_steps and s.step >= c.max_steps:
                _save(p, s, ["last.pt"])
                return
            if c.ckpt_every_steps and s.step % c.ckpt_every_steps == 0:
                _save(p, s, ["last.pt"])
        _end_epoch(p, s)


def _stop_point(p: Parts, rewind: dict[str, Any] | None = None) -> None:
    """Raise :class:`~memdpc.common.interrupts.Interrupted` when any rank has received SIGINT or SIGTERM. Every rank
    calls it at the same points (before each step, after each epoch's validation and kNN pass), so all stop
    at the same step. ``rewind``: the RNG state to restore first, that of the step the run stops at."""
    signum = dd.agree_on_signal(p.env, interrupts.received())
    if signum is not None:
        if rewind is not None:
            ck.set_rng_state(rewind)
        raise interrupts.Interrupted(signum)


def _kept(p: Parts, s: State, stop: interrupts.Interrupted) -> interrupts.Interrupted:
    """Save checkpoints/last.pt where the run stopped (all ranks take part; skipped when it already holds that
    step) and add to ``stop`` what was kept and how to go on."""
    last = _last(p)
    if s.step and p.saved != _position(s):
        p.logger.message(f"{stop}: saving {last} (epoch {s.epoch}, step {s.step})", markup=False)
        _save(p, s, ["last.pt"])
    if not p.env.is_main:
        return stop.keep(f"rank {p.env.rank} stopped with rank 0")
    if not s.step:
        return stop.keep("no checkpoint yet; the same command starts again")
    how = (
        f"to go on, run it again without --resume (or with --resume {last})"
        if p.config.resume
        else "the same command resumes"
    )
    return stop.keep(f"kept {last} (epoch {s.epoch}, step {s.step}); {how}")


def _fault_kept(p: Parts, s: State, fault: ResourceFault) -> ResourceFault:
    """Add to ``fault`` what was kept and how to go on. A fault of the disk keeps the last checkpoint as it was
    (its save, or a write after it, failed); any other (a loader worker killed) comes between two steps, and
    checkpoints/last.pt is saved there first, as for a signal."""
    if not fault.disk and s.step and p.saved != _position(s):
        try:
            _save(p, s, ["last.pt"])
        except ResourceFault as again:
            fault.keep(f"and saving {_last(p)} failed: {again}")
    if not p.env.is_main:
        return fault.keep(f"rank {p.env.rank} stopped with rank 0")
    if p.saved is None:
        return fault.keep(f"no checkpoint of this run yet; {fault.resumes}")
    epoch, step, _ = p.saved
    return fault.keep(f"kept {_last(p)} (epoch {epoch}, step {step}); {fault.resumes}")


def _watched(p: Parts, value: float) -> str:
    """The value that chooses best.pt, in words: 'val loss 1.2345' or 'kNN R@1 0.500'."""
    if p.config.best_by == "knn":
        return f"kNN R@1 {-value:.3f}"
    return f"{'val' if p.val_loader is not None else 'train'} loss {value:.4f}"


def _margin(p: Parts, s: State) -> str:
    """How far best.pt's watched value is ahead of epoch 0's: '; 0.3972 below epoch 0's 2.1972'."""
    if s.first_val is None or s.best_epoch is None:
        return ""
    if s.best_epoch == 0:
        return "; no later epoch did better"
    if p.config.best_by == "knn":
        return f"; {s.first_val - s.best_val:.3f} above epoch 0's {-s.first_val:.3f}"
    return f"; {s.first_val - s.best_val:.4f} below epoch 0's {s.first_val:.4f}"


def _finished(p: Parts, s: State) -> str:
    """The end message: what the run wrote, which checkpoint is best and by how much over epoch 0, whether the
    validation loss stayed at chance, and what to run next."""
    ckpts = p.run_dir / "checkpoints"
    done = (
        f"{s.epoch} epochs"
        if not s.epoch_step
        else f"epoch {s.epoch}, {s.epoch_step} of {len(p.train_loader)} batches"
    )
    best = ckpts / "best.pt"
    if not math.isfinite(s.best_val):
        best_line = "no best.pt: no epoch finished"
    else:
        at = f"epoch {s.best_epoch}, " if s.best_epoch is not None else ""
        best_line = f"best: {best} ({at}{_watched(p, s.best_val)}{_margin(p, s)})"
    chosen = best if math.isfinite(s.best_val) else _last(p)
    records = read_metrics(p.run_dir) if p.env.is_main else []  # rank 0 wrote them
    chance = chance_summary(records)
    monitor, worse = monitor_summary(records)
    return "\n".join(
        [
            f"trained {p.run_dir}: {done}, {s.step} steps",
            best_line,
            *([monitor] if monitor else []),
            *([f"warning: {chance}"] if chance else []),
            *([f"warning: {worse}"] if worse else []),
            f"last: {_last(p)}",
            f"metrics: {p.run_dir / 'metrics.jsonl'}; tensorboard --logdir {p.run_dir / 'tb'}",
            f"next: {ck.next_command(chosen, p.config.loader.shards)}",
        ]
    )


def _epoch_batches(p: Parts, s: State) -> Iterator[None]:
    """Train one epoch (or its rest, on resume); yields after every optimiser step."""
    c = p.config
    now = ck.rng_state()
    if s.epoch_step == 0 or s.epoch_rng is None:
        s.epoch_rng, s.epoch_loss = now, [0.0, 0.0]
    if s.epoch_step >= len(p.train_loader):  # stopped after the epoch's last step: only its end is left
        return
    ck.set_rng_state(s.epoch_rng)
    p.train_loader.set_epoch(s.epoch)
    # closed on the way out, also when a stop passes through: the exception would otherwise keep the loader's
    # workers alive until the interpreter's exit
    with contextlib.closing(iter(p.train_loader)) as batches:
        try:
            for _ in range(s.epoch_step):  # the loader position: skip what the checkpointed run consumed
                _stop_point(p)
                next(batches)
        finally:
            ck.set_rng_state(now)
        p.logger.start_epoch(s.epoch, len(p.train_loader), s.epoch_step)
        p.model.train()
        p.meter.reset()
        info = None  # the progress display's loss: the last one read (reading it every step would wait for the device)
        shown = s.epoch_step > 0  # a run resumed mid-epoch showed its first batch before the stop
        while True:
            _stop_point(p)
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            wait = time.perf_counter() - t0
            out = p.stepper(place_clips(batch.clips, c, p.env.device))
            p.steps.add(out, batch.clips.shape[0], wait)
            s.step, s.epoch_step = s.step + 1, s.epoch_step + 1
            if not shown:  # a few clips of the epoch's first batch, as TensorBoard images (rank 0)
                p.logger.clips(batch.clips, batch.keys, p.train_loader.plan.spec, c.loader.stream, s.step)
                shown = True
            if s.step % c.log_every == 0:
                info = f"loss {_read(p, s)['loss']:.3f}"
                _log_train(p, s)
            p.logger.advance(info)
            yield


def _read(p: Parts, s: State) -> dict[str, float] | None:
    """Bring the steps not read yet to the host (one transfer) and add them, in step order, to the logging
    window and the epoch's loss sum: the same float64 sums as reading every step. Returns the last step's values.

    A non-finite loss among them stops training with a one-line error. All ranks read at the same steps, so
    they decide together."""
    done = p.steps.read()
    bad = next((i for i, (values, _, _) in enumerate(done) if not math.isfinite(values["loss"])), None)
    if not dd.all_true(p.env, bad is None):
        i = len(done) - 1 if bad is None else bad
        raise _stopped(
            p,
            f"loss is not finite ({done[i][0]['loss']}) at epoch {s.epoch}, "
            f"step {s.step - len(done) + i + 1}",
        )
    for values, clips, wait in done:
        s.epoch_loss = [s.epoch_loss[0] + values["loss"], s.epoch_loss[1] + 1]
        p.meter.add(values, clips, wait)
    return done[-1][0] if done else None


def _check_weights(p: Parts, s: State, model: nn.Module) -> None:
    """Stop training when a weight or BatchNorm statistic is not finite (a finite loss can be followed by an
    update that is not); one wait for the device, before each save."""
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    finite = bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
    if not dd.all_true(p.env, finite):
        raise _stopped(p, f"the weights are not finite after epoch {s.epoch}, step {s.step}")


def _stopped(p: Parts, what: str) -> UserError:
    last = p.run_dir / "checkpoints" / "last.pt"
    kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint had been written yet"
    return UserError(f"{what}: training stopped; {kept} (try a lower --lr, or --amp none)")


def _lr(p: Parts) -> float:
    return p.optimizer.param_groups[0]["lr"]


def _log_train(p: Parts, s: State) -> None:
    values = dd.all_mean(p.env, p.meter.means())
    p.logger.log(
        {
            "kind": "train",
            "epoch": s.epoch,
            "step": s.step,
            **values,
            "lr": _lr(p),
            **p.meter.rates(p.env.world_size),
        }
    )
    p.meter.reset()


@contextlib.contextmanager
def _local_negatives(model: nn.Module) -> Iterator[None]:
    """Evaluate with per-rank negatives: ranks may hold different numbers of validation batches."""
    saved = getattr(model, "global_negatives", False)
    model.global_negatives = False
    try:
        yield
    finally:
        model.global_negatives = saved


@torch.no_grad()
def validate(p: Parts) -> dict[str, float]:
    """Mean loss and top-k over the validation split (all ranks; per-rank negatives). Cut short when a signal
    has arrived: the caller then stops (:func:`_stop_point`) and records nothing."""
    model = ck.unwrap(p.model)
    model.eval()
    sums: dict[str, float] = {}
    n = 0
    with _local_negatives(model):
        for i, batch in enumerate(p.val_loader):
            if (p.config.val_max_batches and i >= p.config.val_max_batches) or interrupts.received():
                break
            out = model(batch.clips.to(p.env.device, non_blocking=True))
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
    sums["batches"] = float(n)
    totals = dd.all_mean(p.env, sums)
    count = max(totals.pop("batches"), 1e-9)
    model.train()
    return {k: v / count for k, v in totals.items()}


def _end_epoch(p: Parts, s: State) -> None:
    c = p.config
    _read(p, s)
    rng = ck.rng_state()  # the passes below draw from it (their loaders' seeds); a stop rewinds it
    try:
        val = validate(p) if p.val_loader is not None else None
        r1 = _knn(p) if c.knn_every and (s.epoch + 1) % c.knn_every == 0 else None
    except ResourceFault:  # a loader worker killed: last.pt is saved before the passes, as for a stop
        ck.set_rng_state(rng)
        raise
    _stop_point(p, rewind=rng)  # nothing of the epoch's end recorded yet: a resumed run does it all again
    if val is not None:
        p.logger.log({"kind": "val", "epoch": s.epoch, "step": s.step, **val})
        watched = val["loss"]
    else:
        watched = dd.all_mean(p.env, {"loss": s.epoch_loss[0] / max(s.epoch_loss[1], 1)})["loss"]
    if isinstance(p.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        p.scheduler.step(watched)
    elif p.scheduler is not None:
        p.scheduler.step()
    if r1 is not None:
        _log_knn(p, s, r1)
        if c.best_by == "knn":
            watched = -r1
    best = watched < s.best_val
    if best:
        s.best_val, s.best_epoch = watched, s.epoch
    if s.epoch == 0:
        s.first_val = watched
    s.stale = 0 if best else s.stale + 1
    s.epoch, s.epoch_step, s.epoch_rng = s.epoch + 1, 0, None
    names = ["last.pt"] + (["best.pt"] if best else [])
    if c.keep_every and s.epoch % c.keep_every == 0:
        names.append(f"epoch-{s.epoch:04d}.pt")
    _save(p, s, names)
    flag = ""
    if val is not None and at_chance(val):
        flag = f" — val loss {val['loss']:.4f} " if c.best_by == "knn" else " — "
        flag += chance_note(val["chance"])
    p.logger.message(
        f"epoch {s.epoch - 1}: {_watched(p, watched)}, lr {_lr(p):g}{' (best)' if best else ''}{flag}",
        markup=False,
    )


def _knn(p: Parts, data_bn: bool = False) -> float:
    """The kNN monitor's R@1 (rank 0 computes it; every rank returns it); NaN without a validation split. Cut
    short when a signal has arrived, like :func:`validate`. With ``data_bn``, of a copy of the model whose
    BatchNorm statistics are the training split's (the baseline ``--bn-from-data`` evaluates); the model
    itself is left as it is."""
    r1 = math.nan
    if p.env.is_main and p.config.val_split != "none":
        c = p.config
        loaders = [
            _loader(monitored(c), p.env, split, p.clip, train=False, rank=0, world_size=1)
            for split in (c.loader.train_split, c.val_split)
        ]
        model = ck.unwrap(p.model)
        if data_bn:
            model = copy.deepcopy(model)
            bn_loader = _loader(c, p.env, c.loader.train_split, p.clip, train=False, rank=0, world_size=1)
            data_batchnorm_stats(model, bn_loader, p.env.device, ck.BN_BATCHES)
        r1 = knn_recall(model, *loaders, p.env.device, c.knn_max_batches)
    return dd.from_main(p.env, r1)


def _log_knn(p: Parts, s: State, r1: float) -> None:
    p.logger.log({"kind": "knn", "epoch": s.epoch, "step": s.step, "r1": r1})
