"""Late fusion of two streams (ARCHITECTURE.md §3.6): weighted mean of per-video softmax probabilities for
classifiers, the weighted sum of the two cosine-similarity matrices for retrieval.

The weights are given (equal: the paper's mean), or for retrieval chosen on the training videos (the gallery):
a stream that tells nothing of the classes adds noise to the other's similarities, and an equal sum then ranks
worse than the better stream alone. Each share of the grid :data:`SHARES` is scored among the gallery's videos
alone (each ranks all the others: the share of its nearest that are of its class), so no test video's label is
read.

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
from memdpc.eval.results import align, load_result
from memdpc.eval.scores import CLASSIFY_KINDS
from memdpc.model.retrieval import RECALL_KS, topk_neighbours

__all__ = ["SHARES", "choose_weights", "fuse_results"]

SHARES = tuple(i / 10 for i in range(11))  # the second result's share of the weight, where weights are chosen
CHOSEN_AT = 10  # the nearest other training videos whose classes score a share


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


def _checkpoint(result: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint a stream's result was made of (its path and SHA-256) and the training run that wrote it
    (its folder; None for a checkpoint outside a run's ``checkpoints/``): a fused result names both streams', so
    that a fusion of a pretrained and an untrained stream cannot pass for another."""
    source = dict(result.get("source") or {})
    path = Path(source["checkpoint"]) if source.get("checkpoint") else None
    run = path.parent.parent if path is not None and path.parent.name == "checkpoints" else None
    return {**source, "run": str(run) if run is not None else None}


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


def _leave_one_out_precision(
    galleries: list[np.ndarray], weights: np.ndarray, labels: np.ndarray, k: int, chunk: int
) -> float:
    """The mean share of each gallery video's ``k`` nearest other videos (by the weighted sum of the streams'
    similarities) that are of its class."""
    neighbours, _ = topk_neighbours(
        [(w * g, g) for w, g in zip(weights, galleries, strict=True)], k + 1, chunk
    )
    # the video itself is among its k + 1 nearest or not: each row keeps its first k others
    others = neighbours != np.arange(len(labels))[:, None]
    keep = others & (np.cumsum(others, axis=1) <= k)
    return float(np.sum((labels[neighbours] == labels[:, None]) & keep) / np.sum(keep))


def choose_weights(
    gallery_a: np.ndarray, gallery_b: np.ndarray, labels: np.ndarray, chunk: int = 1024
) -> tuple[tuple[float, float], dict[str, Any]]:
    """The weights (1 − s, s), s in :data:`SHARES`, whose leave-one-out precision among the gallery videos is
    highest (of equals, the nearest to the equal weights), and what they were chosen on: the videos, ``k`` and
    each share's precision. The galleries are the two streams' stored (centred, normalised) features of the same
    videos, in one order. Precision at :data:`CHOSEN_AT` nearest, not R@1: on a gallery of a few hundred
    videos R@1 moves with a few videos and picks weights by chance where a stream tells nothing."""
    labels = np.asarray(labels)
    if len(labels) < 2:
        raise UserError("choosing fusion weights needs at least two gallery (training) videos")
    k = min(CHOSEN_AT, len(labels) - 1)
    galleries = [gallery_a, gallery_b]
    scores = [_leave_one_out_precision(galleries, np.array([1 - s, s]), labels, k, chunk) for s in SHARES]
    best = min(range(len(SHARES)), key=lambda i: (-scores[i], abs(SHARES[i] - 0.5), SHARES[i]))
    share = SHARES[best]
    return (round(1 - share, 1), share), {
        "videos": len(labels),
        "k": k,
        "shares": list(SHARES),
        "precision": [round(x, 4) for x in scores],
    }


def fuse_results(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    weights: tuple[float, float] = (1, 1),
    chunk: int = 1024,
    choose: bool = False,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Fuse two results files; return (result, arrays) ready for :func:`~memdpc.eval.results.save_result`,
    which scores them. ``choose``: retrieval results only, the weights chosen on the gallery
    (:func:`choose_weights`) instead of ``weights``."""
    pa, pb = Path(path_a), Path(path_b)
    (a, arr_a), (b, arr_b) = load_result(pa), load_result(pb)
    _check_two_streams(a, b, pa, pb)
    _check_same(a, b, pa, pb)
    if choose and a["kind"] != "retrieval":
        raise UserError(
            f"{pa}, {pb}: weights are chosen on the training videos of retrieval results only (a "
            f"{a['kind']} result holds no scores of them); give --weights instead"
        )
    order = align(arr_a["video_ids"], arr_b["video_ids"], "test", pa, pb)
    labels = arr_a["labels"]
    if not np.array_equal(labels, arr_b["labels"][order]):
        raise UserError(f"{pa} and {pb}: the same videos carry different labels")
    common = {
        "stream": f"{a['stream']}+{b['stream']}",
        "dataset": a["dataset"],
        "split": a["split"],
        "classes": a["classes"],
        "config": {"inputs": [str(pa), str(pb)], "weights": list(weights)},
        "checkpoints": {r["stream"]: _checkpoint(r) for r in (a, b)},
    }
    if a["kind"] == "retrieval":
        g_order = align(arr_a["gallery_ids"], arr_b["gallery_ids"], "gallery", pa, pb)
        if choose:
            weights, chosen_on = choose_weights(
                arr_a["gallery"], arr_b["gallery"][g_order], arr_a["gallery_labels"], chunk
            )
            common["config"] |= {"weights": list(weights), "chosen_on": chosen_on}
        wa, wb = _weights(weights)
        pairs = [
            (wa * arr_a["query"], arr_a["gallery"]),
            (wb * arr_b["query"][order], arr_b["gallery"][g_order]),
        ]
        neighbours, _ = topk_neighbours(pairs, max(RECALL_KS), chunk)
        arrays = {
            "video_ids": arr_a["video_ids"],
            "labels": labels,
            "neighbours": neighbours,
            "gallery_ids": arr_a["gallery_ids"],
            "gallery_labels": arr_a["gallery_labels"],
        }
        return {"kind": "fusion-retrieval", **common}, arrays
    probs = fuse_probs([arr_a["probs"], arr_b["probs"][order]], list(weights))
    arrays = {"video_ids": arr_a["video_ids"], "labels": labels, "probs": probs.astype(np.float32)}
    return {"kind": "fusion-classify", **common}, arrays
