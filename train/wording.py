"""What a training run says at its end: what it wrote and which checkpoint is best, and, when a signal or a
fault stops it, what it kept and how to go on."""

from __future__ import annotations

import math
from pathlib import Path

from memdpc.common import interrupts
from memdpc.common.errors import ResourceFault
from memdpc.train import checkpoint as ck
from memdpc.train.metrics import chance_summary, monitor_summary, read_metrics
from memdpc.train.parts import Parts, State, last_checkpoint, position
from memdpc.train.saving import save

__all__ = ["fault_kept", "finished", "kept", "margin", "not_started", "watched_words"]


def not_started(stop: interrupts.Interrupted, resume_from: Path | None) -> interrupts.Interrupted:
    """Add to ``stop``, which came before the first step, what was kept and how to go on."""
    if resume_from is None:
        return stop.keep("no checkpoint yet; the same command starts again")
    return stop.keep(f"{resume_from} as it was; the same command resumes from it")


def kept(p: Parts, s: State, stop: interrupts.Interrupted) -> interrupts.Interrupted:
    """Save checkpoints/last.pt where the run stopped (all ranks take part; skipped when it already holds that
    step) and add to ``stop`` what was kept and how to go on."""
    last = last_checkpoint(p)
    if s.step and p.saved != position(s):
        p.logger.message(f"{stop}: saving {last} (epoch {s.epoch}, step {s.step})", markup=False)
        save(p, s, ["last.pt"])
    if not p.env.is_main:
        return stop.keep(f"rank {p.env.rank} stopped with rank 0")
    if not s.step:
        return not_started(stop, None)
    how = (
        f"to go on, run it again without --resume (or with --resume {last})"
        if p.config.resume
        else "the same command resumes"
    )
    return stop.keep(f"kept {last} (epoch {s.epoch}, step {s.step}); {how}")


def fault_kept(p: Parts, s: State, fault: ResourceFault) -> ResourceFault:
    """Add to ``fault`` what was kept and how to go on. A fault of the disk keeps the last checkpoint as it was
    (its save, or a write after it, failed); any other (a loader worker killed) comes between two steps, and
    checkpoints/last.pt is saved there first, as for a signal."""
    if not fault.disk and s.step and p.saved != position(s):
        try:
            save(p, s, ["last.pt"])
        except ResourceFault as again:
            fault.keep(f"and saving {last_checkpoint(p)} failed: {again}")
    if not p.env.is_main:
        return fault.keep(f"rank {p.env.rank} stopped with rank 0")
    if p.saved is None:
        return fault.keep(f"no checkpoint of this run yet; {fault.resumes}")
    epoch, step, _ = p.saved
    return fault.keep(f"kept {last_checkpoint(p)} (epoch {epoch}, step {step}); {fault.resumes}")


def watched_words(p: Parts, value: float) -> str:
    """The value that chooses best.pt, in words: 'val loss 1.2345' or 'kNN R@1 0.500'."""
    if p.config.best_by == "knn":
        return f"kNN R@1 {-value:.3f}"
    return f"{'val' if p.val_loader is not None else 'train'} loss {value:.4f}"


def margin(p: Parts, s: State) -> str:
    """How far best.pt's watched value is ahead of epoch 0's: '; 0.3972 below epoch 0's 2.1972'."""
    if s.first_val is None or s.best_epoch is None:
        return ""
    if s.best_epoch == 0:
        return "; no later epoch did better"
    if p.config.best_by == "knn":
        return f"; {s.first_val - s.best_val:.3f} above epoch 0's {-s.first_val:.3f}"
    return f"; {s.first_val - s.best_val:.4f} below epoch 0's {s.first_val:.4f}"


def finished(p: Parts, s: State) -> str:
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
        best_line = f"best: {best} ({at}{watched_words(p, s.best_val)}{margin(p, s)})"
    chosen = best if math.isfinite(s.best_val) else last_checkpoint(p)
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
            f"last: {last_checkpoint(p)}",
            f"metrics: {p.run_dir / 'metrics.jsonl'}; tensorboard --logdir {p.run_dir / 'tb'}",
            f"next: {ck.next_command(chosen, p.config.loader.shards)}",
        ]
    )
