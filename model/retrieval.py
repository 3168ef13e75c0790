"""The retrieval score of video features: R@k of query videos ranking gallery videos by cosine similarity.

One implementation for the training monitor (:mod:`memdpc.train.knn`, R@1) and for ``memdpc eval
retrieve`` and late fusion (:mod:`memdpc.eval.retrieval`, :mod:`memdpc.eval.fusion`): each set centred by
its own mean and L2-normalised, similarities summed over streams, ranked in chunks of queries so that the
whole (Q, G) matrix is never held.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from memdpc.common.errors import UserError

__all__ = ["RECALL_KS", "center_normalize", "first_hits", "recall_at_k", "retrieve", "topk_neighbours"]

RECALL_KS = (1, 5, 10, 20, 50)


def center_normalize(x: np.ndarray) -> np.ndarray:
    """Subtract the set's own mean, then scale every row to unit L2 norm (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def topk_neighbours(
    pairs: Sequence[tuple[np.ndarray, np.ndarray]], k: int, chunk: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` gallery indices (and similarities) per query, for similarity = Σ_i query_i · gallery_iᵀ.

    Args:
        pairs: one (query (Q, D_i), gallery (G, D_i)) pair per stream, already centred and normalised.
        k: neighbours to keep (capped at G).
        chunk: queries per block; memory is O(chunk · G), never O(Q · G).

    Returns:
        (indices (Q, k) int64, similarities (Q, k) float32), most similar first; ties keep gallery order.
    """
    num_q, num_g = pairs[0][0].shape[0], pairs[0][1].shape[0]
    for q, g in pairs:
        if q.shape[0] != num_q or g.shape[0] != num_g:
            raise ValueError("every stream must have the same query and gallery videos")
    k = min(k, num_g)
    gallery = [torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32)) for _, g in pairs]
    idx_out = np.empty((num_q, k), dtype=np.int64)
    sim_out = np.empty((num_q, k), dtype=np.float32)
    for lo in range(0, num_q, chunk):
        hi = min(lo + chunk, num_q)
        sim = sum(
            torch.from_numpy(np.ascontiguousarray(q[lo:hi], dtype=np.float32)) @ g.T
            for (q, _), g in zip(pairs, gallery, strict=True)
        )  # (chunk, G)
        vals, idx = torch.topk(sim, k, dim=1)  # O(G) per query, no full sort
        # topk leaves ties in any order: sort the k by gallery index, then stably by similarity
        by_index = torch.argsort(idx, dim=1)
        idx, vals = idx.gather(1, by_index), vals.gather(1, by_index)
        by_sim = torch.sort(vals, dim=1, descending=True, stable=True).indices
        idx_out[lo:hi] = idx.gather(1, by_sim).numpy()
        sim_out[lo:hi] = vals.gather(1, by_sim).numpy()
    return idx_out, sim_out


def first_hits(neighbours: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray) -> np.ndarray:
    """Each query's rank of its first gallery video of the same class among its neighbours (0: the nearest),
    or the int64 maximum where none of them is: a query counts for R@k when its rank is below k. (Q,)"""
    hits = np.asarray(gallery_labels)[neighbours] == np.asarray(query_labels)[:, None]  # (Q, kmax)
    return np.where(hits.any(axis=1), hits.argmax(axis=1), np.iinfo(np.int64).max)


def recall_at_k(
    neighbours: np.ndarray,
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    ks: Sequence[int] = RECALL_KS,
) -> dict[str, float]:
    """R@k: the fraction of queries with at least one gallery video of their class among the top k."""
    if len(query_labels) == 0:
        raise UserError("retrieval needs at least one query video")
    first = first_hits(neighbours, query_labels, gallery_labels)
    return {f"R@{k}": float(np.mean(first < k)) for k in ks}


def retrieve(
    query: Sequence[np.ndarray],
    gallery: Sequence[np.ndarray],
    query_labels: np.ndarray,
    gallery_labels: np.ndarray,
    ks: Sequence[int] = RECALL_KS,
    chunk: int = 1024,
) -> tuple[dict[str, float], np.ndarray]:
    """Centre + normalise each stream's sets, rank the gallery for every query, and score R@k.

    ``query``/``gallery`` hold one feature matrix per stream (one for RGB or flow, two for fusion, where
    the similarity is the sum of the per-stream cosines). Returns (metrics, top-max(ks) neighbour indices).
    """
    if len(gallery_labels) == 0:
        raise UserError("retrieval needs at least one gallery (train) video")
    pairs = [(center_normalize(q), center_normalize(g)) for q, g in zip(query, gallery, strict=True)]
    neighbours, _ = topk_neighbours(pairs, max(ks), chunk)
    return recall_at_k(neighbours, np.asarray(query_labels), np.asarray(gallery_labels), ks), neighbours
