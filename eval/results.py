"""Evaluation results: one JSON file (what a person reads) plus one ``.npz`` beside it (per-video arrays).

Schema of the JSON (``schema`` = 2)::

    kind      "retrieval" | "probe-linear" | "probe-mlp" | "finetune" | "classify" | "oops-frozen"
              | "oops-finetune" | "fusion-classify" | "fusion-retrieval"
    stream    "rgb" | "flow" | "rgb+flow"
    dataset   a name for the evaluation data (default: the shard folder's name)
    split     the evaluated (test) split, e.g. "test"
    classes   class names, index = label
    metrics   {name: value or null}, e.g. {"top1": 0.68, "top5": 0.9} or {"R@1": 0.2, …}; null where the metric
              cannot mean anything (R@10 of a 9-video gallery, top-5 of 3 classes), with the reason in
              ``undefined``
    counts    what the metrics count: {"videos", "classes", "smallest_class"} and "gallery" (retrieval) or
              "windows", "steps" (Oops)
    intervals {name: [lo, hi]}, the 95 % interval of every metric that is a number and has one that holds;
              ``methods`` {name: "wilson" | "wilson, effective n" | "bootstrap"} says how, ``no_interval``
              {name: why} names the others (a bootstrap that shows no spread), ``interval_settings`` the
              confidence and the bootstrap's resamples and seed
    undefined {name: why it is null}
    small_test_set  a sentence when a class has fewer than 5 test videos, else null
    config    the settings that produced it (checkpoint, crops, label fraction, seed, …)
    arrays    the name of the ``.npz`` beside it
    source    the checkpoint evaluated: {"checkpoint": its resolved path, "sha256": of its bytes} (not in fusion
              results); results of another checkpoint are not replaced without ``--overwrite``
    shards    each split the task read: {split: {"manifest": its resolved path, "sha256": of its bytes}} (not in
              fusion results, which name their ``inputs`` in ``config``)
    files     {role: names relative to the JSON's folder} of the other files the task wrote or kept, roles
              as in :data:`FILE_ROLES` (absent when none)

``metrics`` to ``small_test_set`` are computed here from the arrays (:func:`memdpc.eval.scores.score`), for
every kind, so a task gives none of them; a results file of schema 1 (metrics only) gets them when read.
The ``.npz`` holds ``video_ids`` (str), ``labels`` (int64), and per kind ``probs`` (V, C) for classifiers,
the centred, L2-normalised ``query``/``gallery`` features plus ``gallery_ids``/``gallery_labels`` and the
top-50 ``neighbours`` of each query for retrieval (only the last three for a fused one), or per test window
``keys``, ``labels`` and ``pred`` (windows, steps) for Oops (``video_ids``: each window's video). Both files
are written in full under temporary names before either is renamed into place (the npz first, so a JSON never
points at a missing array file): a full disk leaves the results there were, whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError
from memdpc.eval.scores import SCORE_KEYS, score

__all__ = ["FILE_ROLES", "align", "load_result", "save_result"]

SCHEMA = 2
REQUIRED = (
    "kind",
    "stream",
    "dataset",
    "split",
    "classes",
)  # a task gives these; the scores come from the arrays
FILE_ROLES = {  # the roles of ``files``, and how the command line names them
    "features": "feature caches",
    "classifier": "finetuned classifier (`memdpc eval classify` scores it)",
    "state": "finetune state (a rerun resumes from it, more --epochs too)",
    "plots": "plots",
}


def arrays_path(path: str | os.PathLike) -> Path:
    """The ``.npz`` that belongs to the results JSON ``path``."""
    path = Path(path)
    return path.with_name(path.stem + ".npz")


def save_result(path: str | os.PathLike, result: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """Write ``result`` (JSON) with its scores computed from ``arrays`` (:func:`memdpc.eval.scores.score`),
    and ``arrays`` (npz beside it), atomically; return the JSON path."""
    path = Path(path)
    missing = [k for k in REQUIRED if k not in result]
    given = [k for k in SCORE_KEYS if k in result]
    if missing or given:
        raise ValueError(f"result lacks {missing} or gives what is computed from its arrays: {given}")
    scores = score(result, arrays)
    npz = arrays_path(path)
    text = (
        json.dumps({"schema": SCHEMA, **result, **scores, "arrays": npz.name}, indent=2, sort_keys=False)
        + "\n"
    )
    with atomic_path(path) as tmp_json:  # both written before either is renamed; the npz renamed first
        with atomic_path(npz) as tmp_npz:
            with open(tmp_npz, "wb") as f:
                np.savez(f, **arrays)
            tmp_json.write_text(text)
    return path


def load_result(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a results JSON and its arrays, with a clear error for anything missing or malformed (a folder, a
    checkpoint or an ``.npz`` given instead: what it looks like, and which ``.json`` to give)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.json"))
        example = f", e.g. {found[0]}" if found else ""
        raise UserError(f"{path} is a folder: give the .json results files eval wrote{example}")
    if not path.is_file():
        raise UserError(f"{path}: results file not found")
    try:
        result = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        result = None
    if not isinstance(result, dict) or any(k not in result for k in (*REQUIRED, "metrics", "arrays")):
        beside = path.with_suffix(".json")
        hint = (
            f"its results file is {beside}"
            if path.suffix == ".npz" and beside.is_file()
            else "give the .json files eval wrote, e.g. eval/rgb/retrieval-rgb.json"
        )
        raise UserError(f"{path}: not a results file (it looks like {file_kinds.describe(path)}); {hint}")
    npz = path.with_name(result["arrays"])
    if not npz.is_file():
        raise UserError(f"{path}: its array file {npz} is missing")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    if result.get("schema", 1) < 2:  # written before the scores: computed from its arrays now
        result = {**result, **score(result, arrays)}
    return result, arrays


def align(ids_a: np.ndarray, ids_b: np.ndarray, what: str, pa: Path, pb: Path) -> np.ndarray:
    """Index into b that puts b's rows in a's order; refuses different video sets in one line (``what``
    names the set, e.g. "test" or "gallery")."""
    ids_a, ids_b = [str(i) for i in ids_a], [str(i) for i in ids_b]
    if set(ids_a) != set(ids_b) or len(ids_a) != len(ids_b):
        only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
        raise UserError(
            f"{pa} and {pb}: the {what} video sets differ ({len(only_a)} only in the first, "
            f"{len(only_b)} only in the second, e.g. {(only_a or only_b)[:3]})"
        )
    pos = {v: i for i, v in enumerate(ids_b)}
    return np.array([pos[v] for v in ids_a], dtype=np.int64)
