"""The model's parts as profiler ranges: ``with part("encoder"): ...`` names the work inside it in a
``torch.profiler`` trace, so that a profile can say which part of the model the step's time goes to
(bench/train.py --profile). Free when no profiler runs (one flag read), and invisible to ``torch.compile``.

The backward pass of a part is found through the autograd sequence numbers that link each backward op to the
forward op that made it; the optimiser's own ranges (``Optimizer.step#…``) name its part.
"""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function

__all__ = ["PARTS", "PREFIX", "part"]

PARTS = ("encoder", "aggregation", "memory read", "predictor", "loss")
"""The parts of MemDPC (DPC has no memory read), in the order a step runs them."""
PREFIX = "memdpc: "  # a part's range is named PREFIX + part


def part(name: str) -> contextlib.AbstractContextManager:
    """A profiler range named after ``name`` (one of :data:`PARTS`) while a profiler runs; else nothing."""
    if name not in PARTS:
        raise ValueError(f"unknown model part {name!r}; one of {', '.join(PARTS)}")
    # torch's own flag of a running profiler: a Python global, which torch.compile reads without a graph break
    if torch.autograd.profiler._is_profiler_enabled:
        return record_function(PREFIX + name)
    return contextlib.nullcontext()
