"""Which memory layout a feature map is in, so that a step keeps the layout it was given (ARCHITECTURE.md §3.3):
the encoder runs in channels_last_3d with the CUDA fast defaults, and the aggregator, the memory read and the
loss then work on features with their channels innermost instead of converting them."""

from __future__ import annotations

import math

import torch

__all__ = ["channels_innermost"]


def channels_innermost(x: torch.Tensor) -> bool:
    """Whether a (B, C, ...) feature map, a view maybe (a block of a sequence), holds its channels innermost
    (channels_last / channels_last_3d), with more than one channel and more than one position (else both
    layouts are alike)."""
    return x.shape[1] > 1 and math.prod(x.shape[2:]) > 1 and x.stride(1) == 1
