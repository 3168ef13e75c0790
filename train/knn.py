"""A kNN retrieval monitor: nearest-neighbour recall@1 of held-out videos among training videos.

Per window the model's pooled context feature; averaged per video; each set centred by its own mean and
L2-normalised; cosine similarity; a hit when the nearest training video has the query's class (ARCHITECTURE.md §3.6).
"""

from __future__ import annotations

import torch
from torch import nn

from memdpc.common import interrupts
from memdpc.model.retrieval import retrieve

__all__ = ["knn_recall", "video_features"]


@torch.no_grad()
def video_features(
    model: nn.Module, loader, device: torch.device, max_batches: int
) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """The video ids (sorted), (videos, D) mean features and (videos,) labels of up to ``max_batches`` batches;
    fewer when a signal has arrived (the training loop then stops and discards them)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    labels: dict[str, int] = {}
    for i, batch in enumerate(loader):
        if i >= max_batches or interrupts.received():
            break
        feats = model.features(batch.clips.to(device)).float().cpu()  # (B, D)
        for vid, f, y in zip(batch.video_ids, feats, batch.labels.tolist(), strict=True):
            sums[vid] = sums.get(vid, 0) + f
            counts[vid] = counts.get(vid, 0) + 1
            labels[vid] = y
    ids = sorted(sums)
    feats = torch.stack([sums[v] / counts[v] for v in ids]) if ids else torch.zeros(0, 1)
    return ids, feats, torch.tensor([labels[v] for v in ids], dtype=torch.long)


def recall_at_1(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor
) -> float:
    """R@1 of the test videos querying the training videos (:func:`memdpc.model.retrieval.retrieve`); NaN when
    either set is empty."""
    if len(train_x) == 0 or len(test_x) == 0:
        return float("nan")
    metrics, _ = retrieve([test_x.numpy()], [train_x.numpy()], test_y.numpy(), train_y.numpy(), ks=(1,))
    return metrics["R@1"]


def knn_recall(model: nn.Module, train_loader, test_loader, device: torch.device, max_batches: int) -> float:
    """R@1 of ``test_loader``'s videos against ``train_loader``'s (both unaugmented); leaves the model in train mode."""
    model.eval()
    try:
        _, train_x, train_y = video_features(model, train_loader, device, max_batches)
        _, test_x, test_y = video_features(model, test_loader, device, max_batches)
        return recall_at_1(train_x, train_y, test_x, test_y)
    finally:
        model.train()
