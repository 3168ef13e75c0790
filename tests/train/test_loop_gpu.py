"""Training on a CUDA device: bf16 with DALI, the fast defaults against eager, deterministic CUDA graphs
(skipped without a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memdpc.model.checkpoint import read_checkpoint

from .conftest import (
    assert_same_training,
    cli,
    records,
    tiny,
)


def train_on_cuda(shards: Path, out: Path, **settings):
    """``memdpc train`` of the tiny network on ``shards`` into ``out`` with ``--device cuda`` (in this process)."""
    return cli(*tiny(shards=str(shards), out=str(out), device="cuda", **settings))


@pytest.mark.gpu
def test_gpu_run_with_bf16_and_dali(train_shards, tmp_path):
    """One GPU: DALI mixed decoding, bf16 autocast, deterministic algorithms; weights stay finite."""
    out = tmp_path / "gpu"
    res = train_on_cuda(train_shards, out, backend="auto", amp="bf16", deterministic=True, epochs=2)
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["step"] == 8 and all(
        torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point()
    )
    assert records(out, "val")


@pytest.mark.gpu
def test_gpu_fast_defaults_follow_the_eager_losses(train_shards, tmp_path):
    """channels_last_3d, fused Adam and cuDNN autotuning change the summation order only: over 8 steps the
    losses stay within a small tolerance of the eager reference (--no-fast)."""
    losses = {}
    for name, extra in (("fast", {}), ("eager", {"fast": False})):
        out = tmp_path / name
        res = train_on_cuda(train_shards, out, epochs=2, val_split="none", **extra)
        assert res.exit_code == 0, res.output
        losses[name] = [r["loss"] for r in records(out, "train")]
    assert len(losses["fast"]) == 8
    assert losses["fast"] == pytest.approx(losses["eager"], rel=1e-3, abs=1e-4)


@pytest.mark.gpu
def test_gpu_deterministic_reruns_with_cuda_graphs_are_bit_identical(train_shards, tmp_path):
    """--deterministic with the step in a CUDA graph (bf16): two runs of one command, the same weights."""
    for name in ("a", "b"):
        res = train_on_cuda(
            train_shards,
            tmp_path / name,
            epochs=3,
            val_split="none",
            deterministic=True,
            cuda_graphs=True,
            amp="bf16",
        )
        assert res.exit_code == 0, res.output
    assert_same_training(tmp_path / "a", tmp_path / "b")


@pytest.mark.gpu
def test_gpu_bf16_training_at_the_fast_defaults_stays_finite(train_shards, tmp_path):
    out = tmp_path / "bf16"
    res = train_on_cuda(train_shards, out, amp="bf16", epochs=3, val_split="none")
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["step"] == 12 and ckpt["config"]["fast"] is True
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert all(r["loss"] == r["loss"] for r in records(out, "train"))  # no NaN
