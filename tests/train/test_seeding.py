"""One seed gives the same draws from Python's, NumPy's and torch's generators; determinism is switched both ways."""

from __future__ import annotations

import random

import numpy as np
import torch

from memdpc.train.seeding import seed_everything, set_determinism


def draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_the_same_seed_gives_the_same_draws_and_another_seed_others():
    seed_everything(5)
    a = draws()
    seed_everything(5)
    assert draws() == a
    seed_everything(6)
    assert all(x != y for x, y in zip(draws(), a, strict=True))


def test_determinism_on_and_off():
    was = torch.are_deterministic_algorithms_enabled()
    try:
        set_determinism(True)
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        set_determinism(False)
        assert torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(was)
