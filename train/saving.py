"""Saving and restoring a training run: every rank's RNG gathered, one checkpoint written by rank 0 under
several names (``last.pt`` last), and a run's state read back from one for an exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from memdpc.common import distenv as dd
from memdpc.common.errors import ResourceFault
from memdpc.model import checkpoint as mc
from memdpc.train import checkpoint as ck
from memdpc.train.parts import Parts, State, position
from memdpc.train.reading import check_weights, read_steps
from memdpc.train.step import fused_adam, uses_graphs

__all__ = ["gather_ranks", "restore", "save", "this_runs_kernel"]


def gather_ranks(env: dd.DistEnv, model: nn.Module, epoch_rng: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every rank's RNG states and weight digest (DDP keeps the weights of all ranks equal: recorded)."""
    mine = {"now": ck.rng_state(), "epoch_start": epoch_rng, "digest": ck.param_digest(model)}
    if not env.distributed:
        return [mine]
    every: list[Any] = [None] * env.world_size
    dist.all_gather_object(every, mine)
    return every


def save(p: Parts, s: State, names: list[str]) -> None:
    """Write the checkpoint (rank 0) under each of ``names`` in ``checkpoints/``; all ranks take part, and
    all raise rank 0's :class:`~memdpc.common.errors.ResourceFault` when it could not write (a full disk), so that
    no rank waits for the others forever. ``last.pt`` is written last: until it is, a resumed run starts from the
    previous one and writes the others again, as they were.
    The steps not read yet are read first (their losses checked, the epoch's loss sum complete), and non-finite
    weights stop training instead of replacing the last good checkpoint."""
    read_steps(p, s)
    model = ck.unwrap(p.model)
    check_weights(p, s, model)
    ranks = gather_ranks(p.env, model, s.epoch_rng)
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
        p.saved = position(s)


def restore(p: Parts, ckpt: dict[str, Any], path: Path) -> State:
    """Load a training checkpoint into the run's model, optimiser, schedule and scaler, and this rank's RNG;
    returns where it stood."""
    model = ck.unwrap(p.model)
    mc.check_compatible(ckpt, path, model.config)
    model.load_state_dict(ckpt["model"])
    t = ck.read_training_entries(ckpt)
    p.optimizer.load_state_dict(
        this_runs_kernel(
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
        epoch=t["epoch"],
        step=t["step"],
        epoch_step=t["epoch_step"],
        best_val=t["best_val"],
        best_epoch=t["best_epoch"],
        stale=t["stale"],
        first_val=t["first_val"],
        epoch_loss=list(t["epoch_loss"]),
        epoch_rng=rng["epoch_start"],
    )


def this_runs_kernel(state: dict[str, Any], fused: bool | None, capturable: bool) -> dict[str, Any]:
    """The optimiser state with this run's Adam kernel: torch would restore the one the checkpoint was written
    with (fused or not, capturable or not), and only for a fused or capturable kernel does it place the step
    counters on the weights' device — a run may resume on another device (fused on CUDA, torch's default on
    CPU), or with or without --cuda-graphs."""
    return {
        **state,
        "param_groups": [{**g, "fused": fused, "capturable": capturable} for g in state["param_groups"]],
    }
