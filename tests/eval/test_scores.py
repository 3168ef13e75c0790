"""eval/scores.py: each kind's metrics from its per-video arrays, counted by hand: values, counts, intervals,
the metrics that cannot mean anything, a small test set, and Oops counted per video."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memdpc.eval.scores import counts, score, statistics, units
from memdpc.eval.stats import wilson
from memdpc.model.loss import topk_accuracy

CLASSES = [f"c{i}" for i in range(6)]


def _result(kind: str, classes=CLASSES) -> dict:
    return {"kind": kind, "stream": "rgb", "dataset": "d", "split": "test", "classes": classes}


def test_classifier_top_k_by_hand_and_ties_as_training_counts_them():
    probs = np.array(
        [
            [0.5, 0.1, 0.1, 0.1, 0.1, 0.1],  # label 0: rank 0
            [0.3, 0.2, 0.2, 0.1, 0.1, 0.1],  # label 2: rank 2 (0.3 above, 0.2 equal in a lower column)
            [0.1, 0.1, 0.1, 0.1, 0.1, 0.5],  # label 4: rank 5 (the 0.5, and four equal ones before it)
            [1 / 6] * 6,  # label 0: rank 0 (all equal, the lowest column first)
        ]
    )
    labels = np.array([0, 2, 4, 0])
    arrays = {"video_ids": np.array(["a", "b", "c", "d"]), "labels": labels, "probs": probs}
    out = score(_result("finetune"), arrays)
    top1, top5 = topk_accuracy(torch.from_numpy(probs), torch.from_numpy(labels), (1, 5), dtype=torch.float64)
    assert out["metrics"] == {"top1": 0.5, "top5": 0.75, "mean_class_top1": pytest.approx((1 + 0 + 0) / 3)}
    assert (out["metrics"]["top1"], out["metrics"]["top5"]) == (top1.item(), top5.item())  # training's rule
    assert out["intervals"]["top1"] == list(wilson(2, 4)) and out["intervals"]["top5"] == list(wilson(3, 4))
    assert out["counts"] == {"videos": 4, "classes": 6, "smallest_class": 0}  # c1, c3, c5: no test video
    assert out["small_test_set"] == "small test set: 0 test videos in its smallest class, fewer than 5"
    assert out["undefined"] == {} and units(_result("finetune"), arrays).tolist() == ["a", "b", "c", "d"]


@pytest.mark.parametrize("num_classes", [3, 5])
def test_top_k_of_k_classes_or_fewer_is_not_a_number(num_classes):
    """top-5 100 % with 3 classes was shown as a result."""
    probs = np.eye(num_classes)[[1, 0, 2]]
    arrays = {"video_ids": np.array(["a", "b", "c"]), "labels": np.array([0, 0, 2]), "probs": probs}
    out = score(_result("fusion-classify", CLASSES[:num_classes]), arrays)
    assert out["metrics"]["top5"] is None and "top5" not in out["intervals"]
    assert out["undefined"]["top5"] == f"top-5 of {num_classes} classes: every class is among the first 5"
    assert out["metrics"]["top1"] == pytest.approx(2 / 3) and out["methods"]["top1"] == "wilson"


def test_retrieval_r_at_k_by_hand_and_na_from_the_gallery_size():
    gallery_labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])  # 10 videos
    neighbours = np.array(
        [
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],  # label 0: first hit at rank 0
            [0, 2, 3, 6, 9, 1, 4, 5, 7, 8],  # label 1: rank 5
            [0, 1, 3, 4, 6, 7, 9, 2, 5, 8],  # label 2: rank 7
        ]
    )
    arrays = {
        "video_ids": np.array(["q0", "q1", "q2"]),
        "labels": np.array([0, 1, 2]),
        "gallery_ids": np.array([f"g{i}" for i in range(10)]),
        "gallery_labels": gallery_labels,
        "neighbours": neighbours,
    }
    out = score(_result("retrieval", CLASSES[:3]), arrays)
    assert out["metrics"] == {"R@1": 1 / 3, "R@5": 1 / 3, "R@10": None, "R@20": None, "R@50": None}
    assert out["intervals"] == {"R@1": list(wilson(1, 3)), "R@5": list(wilson(1, 3))}
    assert (
        out["undefined"]["R@10"]
        == "R@10 with a gallery of 10 videos: every gallery video is among the first 10"
    )
    assert out["counts"] == {"videos": 3, "classes": 3, "smallest_class": 1, "gallery": 10}
    bigger = {
        **arrays,
        "gallery_labels": np.tile(gallery_labels, 2),
        "gallery_ids": np.arange(20).astype(str),
    }
    assert score(_result("fusion-retrieval", CLASSES[:3]), bigger)["metrics"]["R@10"] == 1.0  # ranks 0, 5, 7


def test_oops_counts_videos_as_units_and_steps_as_what_is_scored():
    # three windows of two steps: v1 has two windows, v2 one
    labels = np.array([[0, 1], [1, 2], [2, 2]])
    pred = np.array([[0, 0], [1, 2], [2, 0]])
    arrays = {
        "video_ids": np.array(["v1", "v1", "v2"]),
        "keys": np.array(["v1_00000", "v1_00006", "v2_00000"]),
        "labels": labels,
        "pred": pred,
    }
    result = _result("oops-frozen", ["intentional", "transitional", "unintentional"])
    out = score(result, arrays)
    assert out["metrics"] == {
        "accuracy": pytest.approx(4 / 6),
        "recall_intentional": 1.0,
        "recall_transitional": 0.5,
        "recall_unintentional": pytest.approx(2 / 3),
        "mean_class_accuracy": pytest.approx((1 + 0.5 + 2 / 3) / 3),
    }
    # a video's steps are not independent draws: a bootstrap over videos, or, where each video is all right or all
    # wrong (intentional: v1's one step), Wilson with the videos' effective number (1 here); where one video holds
    # all there is (transitional: v1) the bootstrap shows no spread, and there is no interval
    assert out["methods"] == {
        "accuracy": "bootstrap",
        "recall_intentional": "wilson, effective n",
        "recall_unintentional": "bootstrap",
        "mean_class_accuracy": "bootstrap",
    }
    assert out["no_interval"] == {
        "recall_transitional": "1 test video holds all there is to count: a bootstrap over videos shows no spread"
    }
    assert out["intervals"]["recall_intentional"] == pytest.approx([0.2065, 1.0], abs=1e-4)
    lo, hi = out["intervals"]["accuracy"]
    # two videos: a resample holds v1 twice (3/4 right), v2 twice (1/2) or both (4/6)
    assert 0.5 <= lo <= 4 / 6 <= hi <= 0.75
    assert counts(result, arrays) == {
        "videos": 2,
        "windows": 3,
        "steps": 6,
        "classes": 3,
        "smallest_class": 1,
    }
    assert units(result, arrays).tolist() == ["v1", "v2"]
    assert statistics(result, arrays)["accuracy"].units == 2
