"""The eval fits' optimiser: Adam at the configured rate, one drop to lr_min after a plateau."""

from __future__ import annotations

import torch

from memdpc.eval.fit import FitConfig
from memdpc.eval.optim import adam_with_plateau


def test_the_rate_drops_once_to_lr_min_after_patience_epochs_without_improvement():
    param = torch.nn.Parameter(torch.zeros(3))
    fit = FitConfig(lr=2e-3, weight_decay=1e-4, patience=2)
    opt, sched = adam_with_plateau([param], fit)
    assert opt.param_groups[0]["lr"] == 2e-3 and opt.param_groups[0]["weight_decay"] == 1e-4
    rates = []
    for loss in [1.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]:  # improves once, then a long plateau
        sched.step(loss)
        rates.append(opt.param_groups[0]["lr"])
    assert rates[:4] == [2e-3] * 4  # the plateau must last more than `patience` epochs
    assert rates[4] == fit.lr_min == 2e-4 and set(rates[4:]) == {2e-4}  # one drop, never below lr_min
