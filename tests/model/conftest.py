"""Shared fixtures for the model tests: tiny networks and clips that run in a second on 2 CPU cores."""

from __future__ import annotations

import pytest
import torch

TINY = (16, 32, 64, 64)


@pytest.fixture(autouse=True)
def _few_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: threads only add contention on the shared 2-core machine
    yield
    torch.set_num_threads(old)


@pytest.fixture
def clips() -> torch.Tensor:
    """A batch of 2 clips of 8 blocks × 5 frames at 64² (feature map 2×2)."""
    return torch.randn(2, 8, 3, 5, 64, 64, generator=torch.Generator().manual_seed(0))
