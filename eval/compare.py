"""``memdpc eval compare A B``: does result A beat result B on the same test videos?

Two results are compared only when they score the same way (classifiers with classifiers — probes,
finetuning, a scored classifier, a fusion of them —, retrieval with retrieval, Oops with Oops) on the same
dataset, split and classes, the same test videos with the same labels (retrieval: the same gallery too; Oops:
the same test windows). Every metric both define is paired video by video (:func:`memdpc.eval.stats.paired`):
A − B, its interval and a test that agree — McNemar's exact test on the discordant videos and its exact
interval for a proportion (top-k, R@k), the paired bootstrap otherwise — and a one-line verdict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memdpc.common.atomic import write_json_atomic
from memdpc.common.errors import UserError
from memdpc.common.wording import plural
from memdpc.eval.results import align, load_result
from memdpc.eval.scores import family, statistics, units
from memdpc.eval.stats import BOOTSTRAP, CONFIDENCE, RESAMPLES, SEED, Paired, paired

__all__ = ["compare_results", "verdict", "winner", "write_comparison"]


def _check_comparable(a: dict, b: dict, pa: Path, pb: Path) -> None:
    if family(a["kind"]) != family(b["kind"]):
        raise UserError(
            f"{pa} is a {a['kind']} result and {pb} a {b['kind']} result: compare needs results scored "
            "the same way (classifiers, retrieval or Oops) on the same test videos"
        )
    for field in ("dataset", "split", "classes"):
        if a[field] != b[field]:
            raise UserError(
                f"{pb}: {field} {b[field]!r} differs from {pa}'s {a[field]!r}; compare needs results on the "
                "same test videos"
            )


def _order(a: dict, arr_a: dict, b: dict, arr_b: dict, pa: Path, pb: Path) -> np.ndarray:
    """B's units in A's order, after checking that both hold the same test videos, labels (and gallery, or
    windows)."""
    order = align(units(a, arr_a), units(b, arr_b), "test", pa, pb)
    kind = family(a["kind"])
    if kind == "oops":  # the same windows, each with the same step labels
        windows = align(arr_a["keys"], arr_b["keys"], "test window", pa, pb)
        same = np.array_equal(arr_a["labels"], arr_b["labels"][windows])
    else:
        same = np.array_equal(arr_a["labels"], arr_b["labels"][order])
    if kind == "retrieval":
        gallery = align(arr_a["gallery_ids"], arr_b["gallery_ids"], "gallery", pa, pb)
        same = same and np.array_equal(arr_a["gallery_labels"], arr_b["gallery_labels"][gallery])
    if not same:
        raise UserError(
            f"{pa} and {pb}: the same videos carry different labels; compare needs the same test set"
        )
    return order


def _entry(p: Paired) -> dict[str, Any]:
    out = {
        "a": p.a,
        "b": p.b,
        "difference": p.difference,
        "interval": None if p.interval is None else list(p.interval),
        "test": p.test,
        "p": p.p,
    }
    if p.only_a is not None:
        out["discordant"] = {"a_only": p.only_a, "b_only": p.only_b}
    if p.note is not None:
        out["note"] = p.note
    return out


def compare_results(path_a: str | os.PathLike, path_b: str | os.PathLike) -> dict[str, Any]:
    """Compare two results files on their shared test videos; refuses (one line) results that are not on the
    same videos. Returns the comparison: both files and kinds, ``videos`` (the paired test videos), per metric
    either {a, b, difference, interval, test, p[, discordant][, note]} (interval and p null where nothing holds
    beyond the difference, the note saying why) or {undefined: why}, and the settings."""
    pa, pb = Path(path_a), Path(path_b)
    (a, arr_a), (b, arr_b) = load_result(pa), load_result(pb)
    _check_comparable(a, b, pa, pb)
    order = _order(a, arr_a, b, arr_b, pa, pb)
    stats_a, stats_b = statistics(a, arr_a), statistics(b, arr_b)
    metrics: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys([*stats_a, *stats_b]):
        sa, sb = stats_a.get(name), stats_b.get(name)
        if isinstance(sa, str) or isinstance(sb, str) or sa is None or sb is None:
            why = next((s for s in (sa, sb) if isinstance(s, str)), f"{name}: in only one of the two results")
            metrics[name] = {"undefined": why}
        else:
            metrics[name] = _entry(paired(sa, sb.take(order)))
    return {
        "a": {"path": str(pa), "kind": a["kind"], "stream": a["stream"]},
        "b": {"path": str(pb), "kind": b["kind"], "stream": b["stream"]},
        "dataset": a["dataset"],
        "split": a["split"],
        "videos": len(order),
        "metrics": metrics,
        "interval_settings": {
            "confidence": CONFIDENCE,
            BOOTSTRAP: {"resamples": RESAMPLES, "seed": SEED, "over": "test videos, paired"},
        },
    }


def write_comparison(
    path_a: str | os.PathLike, path_b: str | os.PathLike, out: str | os.PathLike | None = None
) -> dict[str, Any]:
    """:func:`compare_results`, also written as JSON to ``out`` (atomically; never over an input)."""
    if out is not None and Path(out).resolve() in {Path(p).resolve() for p in (path_a, path_b)}:
        raise UserError(f"{out}: is one of the results being compared; give another --out")
    comparison = compare_results(path_a, path_b)
    if out is not None:
        write_json_atomic(out, comparison)
    return comparison


def winner(entry: dict[str, Any]) -> str | None:
    """ "a" or "b" where the metric's test tells them apart at the 5 % level (an entry of
    :func:`compare_results`), None where it does not (or the metric is undefined, or has no test)."""
    if "undefined" in entry or entry["p"] is None or entry["p"] >= 1 - CONFIDENCE:
        return None
    return "a" if entry["difference"] > 0 else "b"


def verdict(name: str, entry: dict[str, Any], a: str, b: str, videos: int) -> str:
    """One sentence on whether ``a`` beats ``b`` on the metric ``name`` (an entry of :func:`compare_results`)."""
    if "undefined" in entry:
        return f"{name}: not compared ({entry['undefined']})"
    if entry["interval"] is None:
        return f"{name}: {100 * entry['difference']:+.1f} points; {entry['note']}; {plural(videos, 'test video')}"
    d, (lo, hi), p = 100 * entry["difference"], entry["interval"], entry["p"]
    evidence = (
        f"{d:+.1f} points, 95 % interval {100 * lo:+.1f} to {100 * hi:+.1f}; {entry['test']} p = {p:.2g}; "
        f"{plural(videos, 'test video')}"
    )
    better = winner(entry)
    if better is None:
        return f"{name}: no reliable difference between {a} and {b} ({evidence})"
    beats = f"{a} beats {b}" if better == "a" else f"{b} beats {a}"
    return f"{name}: {beats} ({evidence})"
