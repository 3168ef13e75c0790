"""Shared fixtures: tiny real data generated once per session (real video files, real OpenCV)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from memdpc.preprocess.synthetic import SyntheticConfig, make_synthetic

if not torch.cuda.is_available():  # before anything imports Triton: its kernels then run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TINY = SyntheticConfig(videos_per_class=3, frames=30, size=32, num_classes=3, seed=0)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A 3-class × 3-video synthetic dataset (30 frames of 32×32) in the UCF101 layout."""
    return make_synthetic(tmp_path_factory.mktemp("tiny") / "syn", TINY)
