"""Nearest-neighbour video retrieval (DESIGN 2.7): test videos query train videos by cosine similarity.

Each set is centred by its own mean and L2-normalised; the similarity of a query and a gallery video is
their dot product (the cosine), or, for late fusion of streams, the sum of the per-stream cosines. The
(Q, G) similarity matrix is never held whole: queries are processed in chunks and only the top ``k``
neighbours of each are kept, so a Kinetics-size gallery fits in memory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from memdpc.errors import UserError

if TYPE_CHECKING:
    from memdpc.distenv import DistEnv
    from memdpc.eval.features import EvalData

RECALL_KS = (1, 5, 10, 20, 50)


def center_normalize(x: np.ndarray) -> np.ndarray:
    """Subtract the set's own mean, then scale every row to unit L2 norm (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(axis=0, keepdims=True)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def topk_neighbours(pairs: Sequence[tuple[np.ndarray, np.ndarray]], k: int, chunk: int = 1024
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
        sim = sum(torch.from_numpy(np.ascontiguousarray(q[lo:hi], dtype=np.float32)) @ g.T
                  for (q, _), g in zip(pairs, gallery, strict=True))  # (chunk, G)
        vals, idx = torch.topk(sim, k, dim=1)  # O(G) per query, no full sort
        # topk leaves ties in any order: sort the k by gallery index, then stably by similarity
        by_index = torch.argsort(idx, dim=1)
        idx, vals = idx.gather(1, by_index), vals.gather(1, by_index)
        by_sim = torch.sort(vals, dim=1, descending=True, stable=True).indices
        idx_out[lo:hi] = idx.gather(1, by_sim).numpy()
        sim_out[lo:hi] = vals.gather(1, by_sim).numpy()
    return idx_out, sim_out


def recall_at_k(neighbours: np.ndarray, query_labels: np.ndarray, gallery_labels: np.ndarray,
                ks: Sequence[int] = RECALL_KS) -> dict[str, float]:
    """R@k: the fraction of queries with at least one gallery video of their class among the top k."""
    if len(query_labels) == 0:
        raise UserError("retrieval needs at least one query video")
    hits = gallery_labels[neighbours] == np.asarray(query_labels)[:, None]  # (Q, kmax)
    first = np.where(hits.any(axis=1), hits.argmax(axis=1), np.iinfo(np.int64).max)
    return {f"R@{k}": float(np.mean(first < k)) for k in ks}


def retrieve(query: Sequence[np.ndarray], gallery: Sequence[np.ndarray], query_labels: np.ndarray,
             gallery_labels: np.ndarray, ks: Sequence[int] = RECALL_KS, chunk: int = 1024
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


# ------------------------------------------------------------------------------------------ the command
def run_retrieval(checkpoint: str | os.PathLike, data: EvalData, out: str | os.PathLike, env: DistEnv, *,
                  chunk: int = 1024, plot: bool = False) -> Path | None:
    """``memdpc eval retrieve``: features of every window of both splits (cached under ``out``), averaged
    per video; test videos query train videos. Writes ``retrieval-<stream>.json`` (+ npz); returns its path
    on rank 0, None elsewhere."""
    from memdpc.eval.features import cached_windows, fingerprint, same_classes, video_mean
    from memdpc.eval.pretrained import load_encoder
    from memdpc.eval.results import save_result

    out = Path(out)
    model, _, stream = load_encoder(checkpoint, data, env)
    data = replace(data, stream=stream)
    classes = same_classes(data)
    sets = {}
    for split in (data.train_split, data.test_split):
        stamp = fingerprint(checkpoint, kind="features", stream=stream, split=split, size=data.size, crops=1)
        sets[split] = cached_windows(model.features, data, split, env, stamp=stamp,
                                     cache=out / f"features-{stream}-{split}.npz", desc="features")
    if not env.is_main:
        return None
    g_ids, g_labels, g_feats = video_mean(sets[data.train_split])
    q_ids, q_labels, q_feats = video_mean(sets[data.test_split])
    metrics, neighbours = retrieve([q_feats], [g_feats], q_labels, g_labels, chunk=chunk)
    arrays = {"video_ids": np.array(q_ids), "labels": q_labels, "query": center_normalize(q_feats),
              "gallery": center_normalize(g_feats), "gallery_ids": np.array(g_ids), "gallery_labels": g_labels,
              "neighbours": neighbours}
    result = {"kind": "retrieval", "stream": stream, "dataset": data.dataset_name, "split": data.test_split,
              "classes": classes, "metrics": {**metrics, "queries": len(q_ids), "gallery": len(g_ids)},
              "config": {"checkpoint": str(checkpoint), "train_split": data.train_split, "size": data.size}}
    path = save_result(out / f"retrieval-{stream}.json", result, arrays)
    if plot:
        from memdpc.eval.plots import memory_norms, retrieval_examples

        retrieval_examples(out / f"retrieval-{stream}.png", data, q_ids, q_labels, g_ids, g_labels, neighbours,
                           classes)
        if getattr(model, "memory", None) is not None:
            memory_norms(out / f"memory-norms-{stream}.png", model.memory.detach().cpu().numpy())
    return path
