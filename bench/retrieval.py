"""Benchmark: nearest-neighbour retrieval, full similarity matrix vs the chunked top-k of memdpc.eval.

Variants, each in a fresh process so its peak resident memory is its own:
  full      numpy: the whole (Q, G) cosine matrix, then argsort per row (what a naive script does)
  chunk-N   memdpc.model.retrieval.topk_neighbours with N queries per block (memory O(N·G))
Features are random (D = 512, the bidirectional context feature); Q and G default to UCF101 split 1
(3783 test, 9537 train videos); ``--kinetics`` adds a gallery of 240k videos (Kinetics-400 train) for
the chunked variant only, where the full matrix would need Q·G·4 bytes.

    python -m bench.retrieval [--queries 3783] [--gallery 9537] [--kinetics] [--out bench/results/retrieval.json]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from memdpc.common.atomic import write_json_atomic
from memdpc.model.retrieval import topk_neighbours


def _features(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _run(variant: str, q: int, g: int, dim: int, k: int, threads: int, queue) -> None:
    torch.set_num_threads(threads)
    query, gallery = _features(q, dim, 0), _features(g, dim, 1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if variant == "full":
        sim = query @ gallery.T
        idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    else:
        idx, _ = topk_neighbours([(query, gallery)], k, chunk=int(variant.split("-")[1]))
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put(
        {
            "variant": variant,
            "queries": q,
            "gallery": g,
            "seconds": seconds,
            "extra_peak_mib": (peak - base) / 1024,
            "checksum": int(idx[:, 0].sum()),
        }
    )


def measure(variant: str, q: int, g: int, dim: int, k: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_run, args=(variant, q, g, dim, k, threads, queue))
    p.start()
    out = queue.get()
    p.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=3783)
    ap.add_argument("--gallery", type=int, default=9537)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--kinetics", action="store_true", help="Also a 240k gallery (1000 queries), chunked only."
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/retrieval.json"))
    args = ap.parse_args()
    runs = [
        measure(v, args.queries, args.gallery, args.dim, args.k, args.threads)
        for v in ("full", "chunk-256", "chunk-1024", "chunk-4096")
    ]
    if args.kinetics:
        runs.append(measure("chunk-256", 1000, 240_000, args.dim, args.k, args.threads))
    same = len({r["checksum"] for r in runs[:4]}) == 1
    full = runs[0]
    table = Table(
        title=f"retrieval top-{args.k}, D={args.dim}, {args.threads} threads "
        f"(top-1 identical across variants: {same})"
    )
    for col in ("variant", "queries × gallery", "seconds", "vs full", "extra peak MiB", "vs full "):
        table.add_column(col, justify="right")
    for r in runs:
        comparable = r["queries"] == full["queries"] and r["gallery"] == full["gallery"]
        table.add_row(
            r["variant"],
            f"{r['queries']} × {r['gallery']}",
            f"{r['seconds']:.2f}",
            f"{r['seconds'] / full['seconds']:.2f}×" if comparable else "-",
            f"{r['extra_peak_mib']:.0f}",
            f"{r['extra_peak_mib'] / max(full['extra_peak_mib'], 1):.2f}×" if comparable else "-",
        )
    Console().print(table)
    write_json_atomic(
        args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "same_top1": same}
    )


if __name__ == "__main__":
    main()
