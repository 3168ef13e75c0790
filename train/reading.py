"""The steps' values, brought from the device in one transfer every few steps: the logging window, the epoch's
loss, and the checks that stop a run whose loss or weights are not finite."""

from __future__ import annotations

import math

import torch
from torch import nn

from memdpc.common import distenv as dd
from memdpc.common.errors import UserError
from memdpc.train.parts import Parts, State

__all__ = ["check_weights", "current_lr", "log_train", "read_steps", "stopped"]


def read_steps(p: Parts, s: State) -> dict[str, float] | None:
    """Bring the steps not read yet to the host (one transfer) and add them, in step order, to the logging
    window and the epoch's loss sum: the same float64 sums as reading every step. Returns the last step's values.

    A non-finite loss among them stops training with a one-line error. All ranks read at the same steps, so
    they decide together."""
    done = p.steps.read()
    bad = next((i for i, (values, _, _) in enumerate(done) if not math.isfinite(values["loss"])), None)
    if not dd.all_true(p.env, bad is None):
        i = len(done) - 1 if bad is None else bad
        raise stopped(
            p,
            f"loss is not finite ({done[i][0]['loss']}) at epoch {s.epoch}, "
            f"step {s.step - len(done) + i + 1}",
        )
    for values, clips, wait in done:
        s.epoch_loss = [s.epoch_loss[0] + values["loss"], s.epoch_loss[1] + 1]
        p.meter.add(values, clips, wait)
    return done[-1][0] if done else None


def check_weights(p: Parts, s: State, model: nn.Module) -> None:
    """Stop training when a weight or BatchNorm statistic is not finite (a finite loss can be followed by an
    update that is not); one wait for the device, before each save."""
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    finite = bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
    if not dd.all_true(p.env, finite):
        raise stopped(p, f"the weights are not finite after epoch {s.epoch}, step {s.step}")


def stopped(p: Parts, what: str) -> UserError:
    """The error that stops a run whose loss or weights are not finite, naming the last good checkpoint."""
    last = p.run_dir / "checkpoints" / "last.pt"
    kept = f"the last good checkpoint is {last}" if last.exists() else "no checkpoint had been written yet"
    return UserError(f"{what}: training stopped; {kept} (try a lower --lr, or --amp none)")


def current_lr(p: Parts) -> float:
    """The optimiser's learning rate now."""
    return p.optimizer.param_groups[0]["lr"]


def log_train(p: Parts, s: State) -> None:
    """Record the logging window's means (over the ranks) and rates as a ``train`` record, and start a new one."""
    values = dd.all_mean(p.env, p.meter.means())
    p.logger.log(
        {
            "kind": "train",
            "epoch": s.epoch,
            "step": s.step,
            **values,
            "lr": current_lr(p),
            **p.meter.rates(p.env.world_size),
        }
    )
    p.meter.reset()
