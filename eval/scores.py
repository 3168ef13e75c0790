"""A result's scores, from its per-video arrays (ARCHITECTURE.md §2.5): every metric's value, what it counts,
its 95 % interval and how that was computed, the metrics that cannot mean anything, and a small test set.

:func:`memdpc.eval.results.save_result` writes them into every results file (fused ones too), so each kind's
metrics are defined here once; ``memdpc eval compare`` pairs two results' :func:`statistics` video by video.

* classifiers (probes, finetuning, a scored classifier, their fusion): per test video, the rank of its label
  among the video-level probabilities (ties: :func:`memdpc.model.loss.label_rank`); top-k is a proportion of
  the videos, undefined for k ≥ the number of classes (every class is in the top k); the mean per-class top-1
  is a weighted proportion (its interval: Wilson with the effective number of videos, ``stats``).
* retrieval (and its fusion): per test video (query), the rank of its first gallery video of its class
  (:func:`memdpc.model.retrieval.first_hits`); R@k is a proportion of the queries, undefined for k ≥ the
  gallery (every gallery video is among the first k).
* Oops: scored per time step, but the steps of a video are not independent draws: the unit is the test video
  (its steps and its correct steps, per class), the metrics are ratios of sums over videos and their intervals
  a bootstrap over videos (Wilson with the effective number of videos where every video is all right or all
  wrong; none where the bootstrap shows no spread).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from memdpc.common.errors import UserError
from memdpc.common.wording import plural
from memdpc.eval.stats import (
    BOOTSTRAP,
    CONFIDENCE,
    RESAMPLES,
    SEED,
    Statistic,
    class_mean,
    interval,
    proportion,
    ratio,
    ratio_class_mean,
)
from memdpc.model.loss import label_rank
from memdpc.model.retrieval import RECALL_KS, first_hits

__all__ = [
    "CLASSIFIER_KINDS",
    "CLASSIFY_KINDS",
    "OOPS_KINDS",
    "RETRIEVAL_KINDS",
    "SCORE_KEYS",
    "SMALL_CLASS",
    "TOP_KS",
    "counts",
    "family",
    "score",
    "statistics",
    "units",
]

CLASSIFY_KINDS = ("probe-linear", "probe-mlp", "finetune", "classify")  # a classifier's, of one stream
CLASSIFIER_KINDS = (*CLASSIFY_KINDS, "fusion-classify")
RETRIEVAL_KINDS = ("retrieval", "fusion-retrieval")
OOPS_KINDS = ("oops-frozen", "oops-finetune")
TOP_KS = (1, 5)
SMALL_CLASS = 5  # fewer test videos than this in a class: the test set is flagged as small
SCORE_KEYS = (
    "metrics",
    "counts",
    "intervals",
    "methods",
    "no_interval",
    "undefined",
    "small_test_set",
    "interval_settings",
)


def family(kind: str) -> str:
    """What a result of ``kind`` scores: "classifier", "retrieval" or "oops"."""
    if kind in CLASSIFIER_KINDS:
        return "classifier"
    if kind in RETRIEVAL_KINDS:
        return "retrieval"
    if kind in OOPS_KINDS:
        return "oops"
    raise ValueError(f"unknown kind of result {kind!r}")


def _oops_units(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The test videos (sorted) and, per window, the index of its video."""
    return np.unique(arrays["video_ids"].astype(str), return_inverse=True)


def units(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The ids of the units every statistic is counted over, in its order: the test videos."""
    if family(result["kind"]) == "oops":
        return _oops_units(arrays)[0]
    return arrays["video_ids"].astype(str)


def statistics(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Statistic | str]:
    """Every metric of the result: its :class:`~memdpc.eval.stats.Statistic` over the test videos, or why it
    cannot mean anything (a sentence). Refuses a result without a test video."""
    if len(arrays["labels"]) == 0:
        raise UserError("no test videos to score")
    kind = family(result["kind"])
    if kind == "classifier":
        return _classifier(arrays)
    if kind == "retrieval":
        return _retrieval(arrays)
    return _oops(result, arrays)


def _classifier(arrays: dict[str, np.ndarray]) -> dict[str, Statistic | str]:
    probs = np.ascontiguousarray(arrays["probs"])
    labels = np.ascontiguousarray(arrays["labels"], dtype=np.int64)
    classes = probs.shape[1]
    rank = label_rank(torch.from_numpy(probs), torch.from_numpy(labels)).numpy()
    out: dict[str, Statistic | str] = {}
    for k in TOP_KS:
        out[f"top{k}"] = (
            f"top-{k} of {classes} classes: every class is among the first {k}"
            if k >= classes
            else proportion(rank < k)
        )
    out["mean_class_top1"] = class_mean(rank < 1, labels)
    return out


def _retrieval(arrays: dict[str, np.ndarray]) -> dict[str, Statistic | str]:
    gallery = len(arrays["gallery_labels"])
    first = first_hits(arrays["neighbours"], arrays["labels"], arrays["gallery_labels"])
    return {
        f"R@{k}": (
            f"R@{k} with a gallery of {gallery} videos: every gallery video is among the first {k}"
            if k >= gallery
            else proportion(first < k)
        )
        for k in RECALL_KS
    }


def _oops_counts(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per test video and class: (its correct steps, its steps), each (videos, classes)."""
    ids, video = _oops_units(arrays)
    labels, pred = np.asarray(arrays["labels"]), np.asarray(arrays["pred"])
    shape = (len(ids), len(result["classes"]))
    steps, correct = np.zeros(shape), np.zeros(shape)
    rows = np.broadcast_to(video[:, None], labels.shape)
    np.add.at(steps, (rows, labels), 1)
    np.add.at(correct, (rows, labels), pred == labels)
    return correct, steps


def _oops(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Statistic | str]:
    correct, steps = _oops_counts(result, arrays)
    out: dict[str, Statistic | str] = {"accuracy": ratio(correct.sum(axis=1), steps.sum(axis=1))}
    for c, name in enumerate(result["classes"]):
        if steps[:, c].sum() > 0:  # a class with no test step has no recall
            out[f"recall_{name}"] = ratio(correct[:, c], steps[:, c])
    out["mean_class_accuracy"] = ratio_class_mean(correct, steps)
    return out


def counts(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, int]:
    """What the metrics are counted over: ``videos`` (test videos: the queries of a retrieval), ``classes``,
    ``smallest_class`` (the fewest test videos of one class; Oops: holding a step of it), and ``gallery``
    (retrieval) or ``windows`` and ``steps`` (Oops)."""
    kind = family(result["kind"])
    num_classes = len(result["classes"])
    if kind == "oops":
        _, steps = _oops_counts(result, arrays)
        return {
            "videos": len(steps),
            "windows": len(arrays["labels"]),
            "steps": int(steps.sum()),
            "classes": num_classes,
            "smallest_class": int((steps > 0).sum(axis=0).min()),
        }
    labels = np.asarray(arrays["labels"], dtype=np.int64)
    out = {
        "videos": len(labels),
        "classes": num_classes,
        "smallest_class": int(np.bincount(labels, minlength=num_classes).min()),
    }
    if kind == "retrieval":
        out["gallery"] = len(arrays["gallery_labels"])
    return out


def score(result: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The entries :func:`memdpc.eval.results.save_result` adds to a result (:data:`SCORE_KEYS`): ``metrics``
    ({name: value, null where it cannot mean anything}), ``counts``, ``intervals`` ({name: [lo, hi]}),
    ``methods`` ({name: "wilson" | "wilson, effective n" | "bootstrap"}), ``no_interval`` ({name: why}, a
    metric with a value but no interval that holds), ``undefined`` ({name: why}), ``small_test_set`` (a
    sentence, or null) and ``interval_settings`` (the confidence; the bootstrap's resamples, seed and unit)."""
    metrics: dict[str, float | None] = {}
    intervals: dict[str, list[float]] = {}
    methods: dict[str, str] = {}
    no_interval: dict[str, str] = {}
    undefined: dict[str, str] = {}
    for name, stat in statistics(result, arrays).items():
        if isinstance(stat, str):
            metrics[name], undefined[name] = None, stat
            continue
        metrics[name] = stat.value
        lo_hi, how = interval(stat)
        if lo_hi is None:
            no_interval[name] = how
        else:
            intervals[name], methods[name] = list(lo_hi), how
    count = counts(result, arrays)
    small = None
    if count["smallest_class"] < SMALL_CLASS:
        held = " holding a step of it" if family(result["kind"]) == "oops" else ""
        small = (
            f"small test set: {plural(count['smallest_class'], 'test video')}{held} in its smallest class, "
            f"fewer than {SMALL_CLASS}"
        )
    return {
        "metrics": metrics,
        "counts": count,
        "intervals": intervals,
        "methods": methods,
        "no_interval": no_interval,
        "undefined": undefined,
        "small_test_set": small,
        "interval_settings": {
            "confidence": CONFIDENCE,
            BOOTSTRAP: {"resamples": RESAMPLES, "seed": SEED, "over": "test videos"},
        },
    }
