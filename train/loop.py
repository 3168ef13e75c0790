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
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.markup import escape

from memdpc.common import distenv as dd
from memdpc.common import interrupts
from memdpc.common.atomic import remove_stale_tmp
from memdpc.common.console import rich_console
from memdpc.common.errors import ResourceFault, UserError
from memdpc.pipeline.loader import backend_words
from memdpc.train import checkpoint as ck
from memdpc.train.config import TrainConfig, write_config
from memdpc.train.invariance import resolve_motion_invariance
from memdpc.train.metrics import DATA_BN, KNN_BASELINE, at_chance, chance_note, truncate_jsonl
from memdpc.train.monitor import knn, log_knn, validate
from memdpc.train.parts import Parts, State, build_parts, last_checkpoint, position
from memdpc.train.prepare import (
    CONFIG_NAME,
    check_run_dir,
    check_shards,
    clear_run,
    hold_run_dir,
    monitor_on_labels,
    resolve_val_split,
    shard_records,
    val_split_warnings,
)
from memdpc.train.reading import current_lr, log_train, read_steps
from memdpc.train.saving import restore, save
from memdpc.train.seeding import seed_everything, set_determinism
from memdpc.train.step import out_of_memory, place_clips
from memdpc.train.teacher import read_teacher, teacher_words
from memdpc.train.wording import fault_kept, finished, kept, not_started, watched_words

__all__ = ["train"]


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
    teacher = read_teacher(config)  # checked before the run directory is written
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
    try:  # the teacher's table pass (--teacher) is the long part of this
        parts = build_parts(config, env, run_dir, manifests["train"].clip, init, shards, teacher)
    except interrupts.Interrupted as stop:
        raise not_started(stop, resume_from) from None
    del teacher, init  # the teacher's model and the --init weights: done with once the parts hold theirs
    if config.loader.backend == "auto":  # which one it is depends on the machine: say so
        parts.logger.message(f"loader: {backend_words(config.loader.backend)}", markup=False)
    if parts.teacher is not None:
        parts.logger.message(teacher_words(parts.teacher), markup=False)
    state = State()
    if ckpt is not None:
        state = restore(parts, ckpt, resume_from)
        if resume_from == last_checkpoint(parts):
            parts.saved = position(state)
    else:
        seed_everything(config.seed + env.rank)
    try:
        _loop(parts, state)
        parts.logger.message(finished(parts, state), markup=False)
    except interrupts.Interrupted as stop:
        raise kept(parts, state, stop) from None
    except ResourceFault as fault:
        raise fault_kept(parts, state, fault) from None
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


# ---------------------------------------------------------------------------------------------- the loop
def _loop(p: Parts, s: State) -> None:
    c = p.config
    if c.knn_every and s.step == 0:
        r1 = knn(p)  # the value at initialisation, which training should not fall below
        _stop_point(p)
        log_knn(p, s, r1)
        r1 = knn(p, data_bn=True)  # and the untrained encoder with the data's BatchNorm statistics
        _stop_point(p)
        p.logger.log({"kind": KNN_BASELINE, "epoch": s.epoch, "step": s.step, "baseline": DATA_BN, "r1": r1})
    while s.epoch < c.epochs and not (c.max_steps and s.step >= c.max_steps):
        if c.early_stop and s.stale >= c.early_stop:
            p.logger.message(f"early stop: no new best {c.best_by} for {s.stale} epochs")
            return
        for _ in _epoch_batches(p, s):
            if c.max_steps and s.step >= c.max_steps:
                save(p, s, ["last.pt"])
                return
            if c.ckpt_every_steps and s.step % c.ckpt_every_steps == 0:
                save(p, s, ["last.pt"])
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
            teacher = p.teacher.of(batch.video_ids) if p.teacher is not None else None
            out = p.stepper(place_clips(batch.clips, c, p.env.device), teacher)
            p.steps.add(out, batch.clips.shape[0], wait)
            s.step, s.epoch_step = s.step + 1, s.epoch_step + 1
            if not shown:  # a few clips of the epoch's first batch, as TensorBoard images (rank 0)
                p.logger.clips(batch.clips, batch.keys, p.train_loader.plan.spec, c.loader.stream, s.step)
                shown = True
            if s.step % c.log_every == 0:
                info = f"loss {read_steps(p, s)['loss']:.3f}"
                log_train(p, s)
            p.logger.advance(info)
            yield


def _end_epoch(p: Parts, s: State) -> None:
    c = p.config
    read_steps(p, s)
    rng = ck.rng_state()  # the passes below draw from it (their loaders' seeds); a stop rewinds it
    try:
        val = validate(p) if p.val_loader is not None else None
        r1 = knn(p) if c.knn_every and (s.epoch + 1) % c.knn_every == 0 else None
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
        log_knn(p, s, r1)
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
    save(p, s, names)
    flag = ""
    if val is not None and at_chance(val):
        flag = f" — val loss {val['loss']:.4f} " if c.best_by == "knn" else " — "
        flag += chance_note(val["chance"])
    p.logger.message(
        f"epoch {s.epoch - 1}: {watched_words(p, watched)}, lr {current_lr(p):g}{' (best)' if best else ''}{flag}",
        markup=False,
    )
