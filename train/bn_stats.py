"""BatchNorm statistics of the data for an untrained encoder: the fair random-init baseline of frozen features.

Evaluation runs the encoder in eval mode, where BatchNorm normalises with its running statistics. An untrained
encoder still holds the initial ones (mean 0, variance 1), so its features are not normalised at all, while any
training run, even one whose weights have hardly moved, has replaced them by the data's. Part of what
pretraining appears to win over random init in frozen evaluations (retrieval, linear probes) can be just that.
:func:`data_batchnorm_stats` gives the untrained encoder the data's statistics without changing a weight.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from memdpc.common import interrupts

__all__ = ["data_batchnorm_stats"]


@torch.no_grad()
def data_batchnorm_stats(
    model: nn.Module, batches: Iterable, device: torch.device, max_batches: int
) -> nn.Module:
    """Set every BatchNorm's running mean and variance of ``model``'s encoder to their averages over up to
    ``max_batches`` batches (clips as evaluation sees them); returns ``model`` in eval mode, weights unchanged.
    Stops between batches when a signal has arrived (:func:`memdpc.common.interrupts.check`)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches, not an exponential one
    model.train()
    try:
        for i, batch in enumerate(batches):
            if i >= max_batches:
                break
            model.backbone_features(batch.clips.to(device))
            interrupts.check()
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.eval()
    return model
