"""The optimiser of every fit in evaluation (probes, finetuning, Oops): Adam with one plateau decay, as
:class:`~memdpc.eval.fit.FitConfig` describes it. The fit loops differ (features in memory for the probes;
clips from a loader, with resumption and DDP, for finetuning), the optimiser does not."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from memdpc.eval.fit import FitConfig

__all__ = ["adam_with_plateau"]


def adam_with_plateau(
    params: Iterable[torch.nn.Parameter], fit: FitConfig
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.ReduceLROnPlateau]:
    """Adam at ``fit.lr`` (weight decay ``fit.weight_decay``) and a scheduler that, stepped with each epoch's
    training loss, drops the rate to ``fit.lr_min`` after ``fit.patience`` epochs without improvement."""
    opt = torch.optim.Adam(params, lr=fit.lr, weight_decay=fit.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, factor=fit.lr_min / fit.lr, patience=fit.patience, min_lr=fit.lr_min
    )
    return opt, sched
