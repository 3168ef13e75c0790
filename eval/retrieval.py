"""Nearest-neighbour video retrieval (ARCHITECTURE.md §3.6): test videos query train videos by cosine similarity.

Each set is centred by its own mean and L2-normalised; the similarity of a query and a gallery video is
their dot product (the cosine), or, for late fusion of streams, the sum of the per-stream cosines. The
(Q, G) similarity matrix is never held whole: queries are processed in chunks and only the top ``k``
neighbours of each are kept, so a Kinetics-size gallery fits in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from memdpc.common.distenv import DistEnv
from memdpc.eval.data import EvalData
from memdpc.eval.features import same_classes, task_features, video_mean
from memdpc.eval.fit import RETRIEVAL_CHUNK
from memdpc.eval.outputs import Outputs
from memdpc.eval.plots import memory_norms, retrieval_examples
from memdpc.eval.pretrained import load_encoder
from memdpc.eval.results import save_result
from memdpc.model.retrieval import center_normalize, retrieve

__all__ = ["run_retrieval"]


def run_retrieval(
    checkpoint: str | os.PathLike,
    data: EvalData,
    out: Outputs,
    env: DistEnv,
    *,
    chunk: int = RETRIEVAL_CHUNK,
    plot: bool = False,
) -> Path | None:
    """``memdpc eval retrieve``: features of every window of both splits (cached under ``out``), averaged
    per video; test videos query train videos. Writes ``retrieval-<stream>.json`` (+ npz); returns its path
    on rank 0, None elsewhere."""
    model, _, stream = load_encoder(checkpoint, data, env)
    data = data.with_loader(stream=stream)
    classes = same_classes(data)
    path = out.claim(f"retrieval-{stream}.json")
    sets = {
        split: task_features(model.features, data, split, env, out, f"features-{stream}-{split}.npz")
        for split in (data.loader.train_split, data.test_split)
    }
    if not env.is_main:
        return None
    g_ids, g_labels, g_feats = video_mean(sets[data.loader.train_split])
    q_ids, q_labels, q_feats = video_mean(sets[data.test_split])
    _, neighbours = retrieve([q_feats], [g_feats], q_labels, g_labels, chunk=chunk)
    arrays = {
        "video_ids": np.array(q_ids),
        "labels": q_labels,
        "query": center_normalize(q_feats),
        "gallery": center_normalize(g_feats),
        "gallery_ids": np.array(g_ids),
        "gallery_labels": g_labels,
        "neighbours": neighbours,
    }
    if plot:
        out.add(
            "plots",
            retrieval_examples(
                out.folder / f"retrieval-{stream}.png",
                data,
                q_ids,
                q_labels,
                g_ids,
                g_labels,
                neighbours,
                classes,
            ),
        )
        if getattr(model, "memory", None) is not None:
            out.add(
                "plots",
                memory_norms(out.folder / f"memory-norms-{stream}.png", model.memory.detach().cpu().numpy()),
            )
    result = {
        "kind": "retrieval",
        "stream": stream,
        "dataset": data.dataset_name,
        "split": data.test_split,
        "classes": classes,
        "config": {
            "checkpoint": str(checkpoint),
            "shards": str(Path(data.loader.shards).resolve()),
            "train_split": data.loader.train_split,
            "size": data.size,
        },
        **out.record(data, (data.loader.train_split, data.test_split)),
    }
    return save_result(path, result, arrays)
