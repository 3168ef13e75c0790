"""Late fusion of two streams (ARCHITECTURE.md §3.6): weighted mean of per-video softmax probabilities for
classifiers, the sum of the two cosine-similarity matrices for retrieval.

Two results are fused only when they are of two streams (never one file twice, or two results of one stream)
and describe the same evaluation: same dataset, split, class list and the same set of videos (gallery videos
too, for retrieval); rows are matched by video id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common.errors import UserError
from memdpc.eval.multicrop import classification_metrics
from memdpc.eval.results import load_result
from memdpc.model.retrieval import RECALL_KS, recall_at_k, topk_neighbours

__all__ = ["CLASSIFY_KINDS", "fuse_results"]

CLASSIFY_KINDS = ("probe-linear", "probe-mlp", "finetune", "classify")


def _check_two_streams(a: dict, b: dict, pa: Path, pb: Path) -> None:
    """Refuse fusing a stream with itself: one file twice, or two results of one stream."""
    if pa.resolve() == pb.resolve():
        raise UserError(
            f"{pa} is given twice; fusion combines the results of two streams, e.g. "
            "eval/rgb/retrieval-rgb.json eval/flow/retrieval-flow.json"
        )
    both = sorted(set(a["stream"].split("+")) & set(b["stream"].split("+")))
    if both:
        raise UserError(
            f"{pa} and {pb} are both results of the {'+'.join(both)} stream; fusion combines the "
            "results of two streams (rgb and flow)"
        )


def _check_same(a: dict, b: dict, pa: Path, pb: Path) -> None:
    for field in ("dataset", "split", "classes"):
        if a[field] != b[field]:
            raise UserError(
                f"{pb}: {field} {b[field]!r} differs from {pa}'s {a[field]!r}; "
                "fusion needs results of the same evaluation"
            )
    kinds = {a["kind"], b["kind"]}
    if not (kinds <= set(CLASSIFY_KINDS) or kinds == {"retrieval"}):
        raise UserError(f"{pa}, {pb}: cannot fuse a {a['kind']} result with a {b['kind']} result")


def _align(ids_a: np.ndarray, ids_b: np.ndarray, what: str, pa: Path, pb: Path) -> np.ndarray:
    """Index into b that puts b's rows in a's order; refuses different video sets."""
    ids_a, ids_b = [str(i) for i in ids_a], [str(i) for i in ids_b]
    if set(ids_a) != set(ids_b) or len(ids_a) != len(ids_b):
        only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
        raise UserError(
            f"{pa} and {pb}: the {what} video sets differ ({len(only_a)} only in the first, "
            f"{len(only_b)} only in the second, e.g. {(only_a or only_b)[:3]})"
        )
    pos = {v: i for i, v in enumerate(ids_b)}
    return np.array([pos[v] for v in ids_a], dtype=np.int64)


def _weights(weights) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or np.any(w < 0) or w.sum() <= 0:
        raise UserError(f"fusion weights must be non-negative numbers, not all zero, not {weights}")
    return w


def fuse_probs(probs: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """The weighted mean of aligned (V, C) probability arrays (weights are normalised to sum 1)."""
    w = _weights(weights)
    if len(w) != len(probs):
        raise UserError(f"fusion needs one weight per result, got {len(w)} for {len(probs)}")
    w = w / w.sum()
    return sum(wi * p.astype(np.float64) for wi, p in zip(w, probs, strict=True))


def fuse_results(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    weights: tuple[float, float] = (1, 1),
    chunk: int = 1024,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Fuse two results files; return (result, arrays) ready for :func:`save_result`."""
    pa, pb = Path(path_a), Path(path_b)
    (a, arr_a), (b, arr_b) = load_result(pa), load_result(pb)
    _check_two_streams(a, b, pa, pb)
    _check_same(a, b, pa, pb)
    order = _align(
        arr_a["video_ids"], arr_b["video_ids"], "query" if a["kind"] == "retrieval" else "", pa, pb
    )
    labels = arr_a["labels"]
    if not np.array_equal(labels, arr_b["labels"][order]):
        raise UserError(f"{pa} and {pb}: the same videos carry different labels")
    common = {
        "stream": f"{a['stream']}+{b['stream']}",
        "dataset": a["dataset"],
        "split": a["split"],
        "classes": a["classes"],
        "config": {"inputs": [str(pa), str(pb)], "weights": list(weights)},
    }
    if a["kind"] == "retrieval":
        g_order = _align(arr_a["gallery_ids"], arr_b["gallery_ids"], "gallery", pa, pb)
        wa, wb = _weights(weights)
        pairs = [
            (wa * arr_a["query"], arr_a["gallery"]),
            (wb * arr_b["query"][order], arr_b["gallery"][g_order]),
        ]
        neighbours, _ = topk_neighbours(pairs, max(RECALL_KS), chunk)
        metrics = recall_at_k(neighbours, labels, arr_a["gallery_labels"])
        arrays = {
            "video_ids": arr_a["video_ids"],
            "labels": labels,
            "neighbours": neighbours,
            "gallery_ids": arr_a["gallery_ids"],
            "gallery_labels": arr_a["gallery_labels"],
        }
        return {"kind": "fusion-retrieval", **common, "metrics": metrics}, arrays
    probs = fuse_probs([arr_a["probs"], arr_b["probs"][order]], list(weights))
    arrays = {"video_ids": arr_a["video_ids"], "labels": labels, "probs": probs.astype(np.float32)}
    return {"kind": "fusion-classify", **common, "metrics": classification_metrics(probs, labels)}, arrays
