"""Linear and non-linear (MLP) probes on frozen, cached features (ARCHITECTURE.md §3.6).

Features are the pooled context of every window (train split: centre crop; test split: 1, 5 or 10 crops),
extracted once and cached. The head (:class:`~memdpc.model.LinearHead`: BatchNorm → Dropout 0.5 → Linear,
or :class:`~memdpc.model.MLPHead`) is trained on the train windows with their video's label (Adam 1e-3,
weight decay 1e-3, decayed once ×0.1 when the training loss plateaus); the test is the softmax averaged over
all windows and then all crops of a video.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.features import Windows, same_classes, task_features
from memdpc.eval.fit import PROBE_DROPOUT, PROBE_FIT, FitConfig
from memdpc.eval.multicrop import VideoAccumulator
from memdpc.eval.optim import adam_with_plateau
from memdpc.eval.outputs import Outputs
from memdpc.eval.plots import confusion_matrix
from memdpc.eval.pretrained import load_encoder
from memdpc.eval.results import save_result
from memdpc.model import LinearHead, MLPHead

__all__ = ["fit_head", "run_probe"]


def fit_head(
    head: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: FitConfig, order: np.ndarray | None = None
) -> list[float]:
    """Train ``head`` on (x, y) with cross-entropy; returns the mean loss of every epoch.

    ``order`` (indices into x, e.g. with oversampled rows) replaces the plain sample list; it is reshuffled
    every epoch by a generator seeded with ``cfg.seed``.
    """
    if len(x) == 0:
        raise UserError("no training samples for the classifier head")
    gen = torch.Generator().manual_seed(cfg.seed)
    opt, sched = adam_with_plateau(head.parameters(), cfg)
    rows = torch.as_tensor(order if order is not None else np.arange(len(x)))
    losses = []
    head.train()
    for _ in range(cfg.epochs):
        perm = rows[torch.randperm(len(rows), generator=gen)]
        total = 0.0
        for lo in range(0, len(perm), cfg.batch_size):
            idx = perm[lo : lo + cfg.batch_size]
            if len(idx) < 2 and len(perm) >= 2:  # BatchNorm needs two samples: a lone tail waits an epoch
                continue
            loss = nn.functional.cross_entropy(head(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(perm))
        sched.step(losses[-1])
    return losses


def predict_windows(head: nn.Module, windows: Windows, batch_size: int = 1024) -> VideoAccumulator:
    """Per-window, per-crop logits of a trained head, collected per video."""
    head.eval()
    acc = VideoAccumulator()
    values = torch.from_numpy(windows.values).float()  # (W, K, D)
    with torch.inference_mode():
        for lo in range(0, len(values), batch_size):
            chunk = values[lo : lo + batch_size]
            logits = head(chunk.flatten(0, 1)).view(*chunk.shape[:2], -1)  # (B, K, C)
            hi = lo + len(chunk)
            acc.add(windows.keys[lo:hi], windows.video_ids[lo:hi], windows.labels[lo:hi].tolist(), logits)
    return acc


def make_head(kind: str, dim: int, num_classes: int, dropout: float) -> nn.Module:
    if kind == "linear":
        return LinearHead(dim, num_classes, dropout)
    if kind == "mlp":
        return MLPHead(dim, num_classes, dropout=dropout)
    raise UserError(f"probe head must be 'linear' or 'mlp', not {kind!r}")


def run_probe(
    checkpoint: str | os.PathLike,
    data: EvalData,
    out: Outputs,
    env: DistEnv,
    *,
    head: str = "linear",
    crops: int = 1,
    dropout: float = PROBE_DROPOUT,
    fit: FitConfig = PROBE_FIT,
    plot: bool = False,
) -> Path | None:
    """``memdpc eval probe``: writes ``probe-<head>-<stream>.json`` (+ npz with per-video probabilities)."""
    model, _, stream = load_encoder(checkpoint, data, env)
    data = data.with_loader(stream=stream)
    classes = same_classes(data)
    path = out.claim(f"probe-{head}-{stream}.json")
    sets = {}
    for split, k in ((data.loader.train_split, 1), (data.test_split, crops)):
        suffix = "" if k == 1 else f"-crops{k}"
        sets[split] = task_features(
            model.features, data, split, env, out, f"features-{stream}-{split}{suffix}.npz", crops=k
        )
    if not env.is_main:
        return None
    train = sets[data.loader.train_split]
    torch.manual_seed(fit.seed)
    probe = make_head(head, train.values.shape[-1], len(classes), dropout)
    losses = fit_head(
        probe, torch.from_numpy(train.values[:, 0]).float(), torch.from_numpy(train.labels), fit
    )
    ids, labels, probs, _ = predict_windows(probe, sets[data.test_split]).video_probs()
    if plot:
        out.add(
            "plots",
            confusion_matrix(out.folder / f"probe-{head}-{stream}-confusion.png", probs, labels, classes),
        )
    result = {
        "kind": f"probe-{head}",
        "stream": stream,
        "dataset": data.dataset_name,
        "split": data.test_split,
        "classes": classes,
        "train_loss": losses,
        "config": {"checkpoint": str(checkpoint), "crops": crops, "dropout": dropout, **fit.__dict__},
        **out.record(data, (data.loader.train_split, data.test_split)),
    }
    return save_result(
        path, result, {"video_ids": np.array(ids), "labels": labels, "probs": probs.astype(np.float32)}
    )
