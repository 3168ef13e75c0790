"""Video-level predictions from window-level outputs (ARCHITECTURE.md §3.6).

The test protocol: softmax per window and crop, averaged over all windows of a video (per crop), then
over the 1, 5 or 10 crops; :mod:`memdpc.eval.scores` scores the per-video probabilities. Windows are
identified by their shard key, so a window seen twice (a padded last batch, a sample repeated across ranks)
counts once. The windows come from :func:`memdpc.eval.features.run_windows`, which refuses a split evaluated
with windows missing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from memdpc.common.errors import UserError

__all__ = ["VideoAccumulator"]


class VideoAccumulator:
    """Collects per-window, per-crop class probabilities and averages them per video."""

    def __init__(self) -> None:
        self._windows: dict[str, tuple[str, int, np.ndarray]] = {}

    def add(
        self,
        keys: Sequence[str],
        video_ids: Sequence[str],
        labels: Sequence[int],
        logits: torch.Tensor | np.ndarray,
    ) -> None:
        """Add a batch. ``logits``: (B, C) for one crop or (B, K, C) for K crops; softmax is taken here."""
        logits = torch.as_tensor(logits, dtype=torch.float32)
        if logits.dim() == 2:
            logits = logits[:, None]  # (B, C) -> (B, 1, C)
        probs = torch.softmax(logits, dim=-1).numpy()
        for key, vid, label, p in zip(keys, video_ids, labels, probs, strict=True):
            if key not in self._windows:  # a repeat (padding) is the same window: count it once
                self._windows[key] = (vid, int(label), p)

    def video_probs(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(video ids sorted, labels (V,), probabilities (V, C), windows per video (V,)).

        Softmax is averaged over the windows of each video for every crop, then over the crops.
        """
        if not self._windows:
            raise UserError("no windows were evaluated (is the split empty?)")
        per_video: dict[str, list[tuple[int, np.ndarray]]] = {}
        for vid, label, p in self._windows.values():
            per_video.setdefault(vid, []).append((label, p))
        ids = sorted(per_video)
        labels, probs, counts = [], [], []
        for vid in ids:
            entries = per_video[vid]
            if len({lab for lab, _ in entries}) != 1:
                raise UserError(f"video {vid}: its windows carry different labels")
            stack = np.stack([p for _, p in entries])  # (W, K, C)
            probs.append(stack.mean(axis=0).mean(axis=0))  # windows, then crops
            labels.append(entries[0][0])
            counts.append(len(entries))
        return ids, np.asarray(labels, dtype=np.int64), np.stack(probs), np.asarray(counts, dtype=np.int64)
