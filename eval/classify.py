"""Scoring a finetuned classifier as it is (e.g. the reference's LC checkpoints, converted): no training.

Every window of the test split in 1, 5 or 10 crops goes through the classifier; the softmax is averaged
per video, as after finetuning. The classifier's class ``i`` is taken to be label ``i`` of the shards.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from torch import nn

from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.features import Windows, eval_split, run_windows
from memdpc.eval.multicrop import VideoAccumulator
from memdpc.eval.outputs import Outputs
from memdpc.eval.plots import confusion_matrix
from memdpc.eval.pretrained import load_classifier
from memdpc.eval.results import save_result

__all__ = ["run_classify", "score_videos"]


def score_videos(
    clf: nn.Module, data: EvalData, env: DistEnv, crops: int
) -> tuple[Windows, list[str], np.ndarray, np.ndarray] | None:
    """The classifier's outputs for every window of the test split (crops averaged), and its softmax
    averaged per video: (windows, video ids, labels, probabilities); None on ranks other than 0."""
    windows = run_windows(clf, data, data.test_split, env, crops=crops, desc="test")
    if windows is None:
        return None
    acc = VideoAccumulator()
    acc.add(windows.keys, windows.video_ids, windows.labels.tolist(), windows.values)
    ids, labels, probs, _ = acc.video_probs()
    return windows, ids, labels, probs


def run_classify(
    checkpoint: str | os.PathLike,
    data: EvalData,
    out: Outputs,
    env: DistEnv,
    *,
    crops: int = 1,
    plot: bool = False,
) -> Path | None:
    """``memdpc eval classify``: writes ``classify-<stream>.json`` (+ npz with per-video probabilities and
    the per-window logits)."""
    clf, ckpt, stream = load_classifier(checkpoint, data, env)
    data = data.with_loader(stream=stream)
    classes = eval_split(data, data.test_split).classes
    if ckpt["model_config"]["num_classes"] != len(classes):
        raise UserError(
            f"{checkpoint}: a classifier of {ckpt['model_config']['num_classes']} classes, but the "
            f"{data.test_split} shards have {len(classes)}"
        )
    path = out.claim(f"classify-{stream}.json")
    scored = score_videos(clf, data, env, crops)
    if scored is None:
        return None
    windows, ids, labels, probs = scored
    if plot:
        out.add(
            "plots", confusion_matrix(out.folder / f"classify-{stream}-confusion.png", probs, labels, classes)
        )
    result = {
        "kind": "classify",
        "stream": stream,
        "dataset": data.dataset_name,
        "split": data.test_split,
        "classes": classes,
        "config": {"checkpoint": str(checkpoint), "crops": crops, "size": data.size},
        **out.record(data, (data.test_split,)),
    }
    return save_result(
        path,
        result,
        {
            "video_ids": np.array(ids),
            "labels": labels,
            "probs": probs.astype(np.float32),
            "keys": np.array(windows.keys),
            "logits": windows.values.astype(np.float32),
        },
    )
