"""train/knn.py: the kNN monitor's feature pass (per-video mean of the windows' features) and its R@1."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memdpc.train.knn import recall_at_1, video_features


class _MeanFeatures(nn.Module):
    def features(self, clips: torch.Tensor) -> torch.Tensor:
        return clips.flatten(1).mean(dim=1, keepdim=True)  # (B, 1): the clip's mean value


def _batch(values: list[float], video_ids: list[str], labels: list[int]) -> SimpleNamespace:
    clips = torch.tensor(values).view(-1, 1, 1, 1, 1, 1).expand(-1, 2, 3, 1, 2, 2)
    return SimpleNamespace(clips=clips, video_ids=video_ids, labels=torch.tensor(labels))


def test_video_features_average_the_windows_of_each_video_and_stop_after_max_batches():
    loader = [
        _batch([1.0, 3.0], ["b", "a"], [1, 0]),
        _batch([5.0, 7.0], ["b", "c"], [1, 2]),
        _batch([100.0], ["d"], [3]),
    ]
    ids, feats, labels = video_features(_MeanFeatures(), loader, torch.device("cpu"), max_batches=2)
    assert feats.squeeze(1).tolist() == [3.0, 3.0, 7.0]  # a; b = (1 + 5) / 2; c; d is past max_batches
    assert labels.tolist() == [0, 1, 2]
    assert ids == ["a", "b", "c"]


def test_recall_at_1():
    train_x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    train_y = torch.tensor([0, 1, 2])
    test_x = torch.tensor([[0.9, 0.1], [0.1, 0.9], [-1.0, 0.1]])
    assert recall_at_1(train_x, train_y, test_x, torch.tensor([0, 1, 2])) == 1.0
    assert recall_at_1(train_x, train_y, test_x, torch.tensor([1, 1, 1])) == pytest.approx(1 / 3)
    assert math.isnan(
        recall_at_1(train_x[:0], train_y[:0], test_x, torch.tensor([0, 1, 2]))
    )  # nothing to query
