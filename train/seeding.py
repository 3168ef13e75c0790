"""A run's random state and kernel determinism: the seeds every stage starts from, and whether kernels must be
deterministic (``--deterministic``) or may be chosen for speed."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "set_determinism"]


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device) from one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_determinism(deterministic: bool) -> None:
    """Deterministic kernels (bit-exact reruns and resumes on a GPU, slower); otherwise cuDNN times its
    algorithms and keeps the fastest."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = not deterministic
