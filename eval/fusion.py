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
from memdpc.eval.results import align, load_result
from memdpc.eval.scores import CLASSIFY_KINDS
from memdpc.model.retrieval import RECALL_KS, topk_neighbours

__all__ = ["fuse_results"]


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


def fuse_results(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    weights: tuple[float, float] = (1, 1),
    chunk: int = 1024,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Fuse two results files; return (result, arrays) ready for :func:`~memdpc.eval.results.save_result`,
    which scores them."""
    pa, pb = Path(path_a), Path(path_b)
    (a, arr_a), (b, arr_b) = load_result(pa), load_result(pb)
    _check_two_streams(a, b, pa, pb)
    _check_same(a, b, pa, pb)
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
