"""Benchmark: training throughput (clips/s) and the fraction of wall time spent waiting for data, per loader.

Renders RGB videos, shards them (paper geometry: 8 blocks × 5 frames, stride 3), then runs the real training
loop (``memdpc.train.loop.train``) for a few steps with each loader backend (torch reference loader, DALI),
and, as the ceiling, the same model steps on one batch already in memory (no loader). Reports clips/s, the
data-wait fraction and each loader's ratio to the ceiling, all from one run.

    python bench/train.py [--steps 12 --batch-size 4 --size 64 --backends torch,dali --out bench/results/train.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from memdpc.atomic import write_json_atomic
from memdpc.bench.shard import make_archives
from memdpc.model import create_model
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import dali_available
from memdpc.pipeline.shard import shard_stream
from memdpc.train.config import TrainConfig
from memdpc.train.loop import train

WARMUP = 2  # steps left out of the averages (worker start-up, first allocations)


def make_shards(root: Path, videos: int, frames: int, frame_size: int) -> Path:
    records = make_archives(root / "archives", videos, frames, frame_size)
    shard_stream(root / "archives", records, "rgb", root / "shards", "train", clip=ClipSpec(), window_step=5,
                 max_count=8, seed=0)
    return root / "shards"


def config(args: argparse.Namespace, shards: Path, out: Path, backend: str) -> TrainConfig:
    return TrainConfig(stream="rgb", shards=str(shards), out=str(out), val_split="none", backend=backend,
                       num_workers=args.num_workers, arch=args.arch, widths=args.widths, size=args.size,
                       mem_size=args.mem_size, batch_size=args.batch_size, epochs=10_000, max_steps=args.steps,
                       log_every=1, progress=False, device=args.device)


def summarise(records: list[dict], batch: int) -> dict:
    steps = [r for r in records if r["kind"] == "train"][WARMUP:]
    seconds = [batch / r["clips_per_s"] for r in steps]
    waits = [r["data_wait"] * s for r, s in zip(steps, seconds, strict=True)]
    return {"steps": len(steps), "clips_per_s": batch * len(steps) / sum(seconds),
            "data_wait": sum(waits) / sum(seconds)}


def run_loader(args: argparse.Namespace, shards: Path, work: Path, backend: str) -> dict:
    out = work / f"run-{backend}"
    train(config(args, shards, out, backend))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return summarise([json.loads(ln) for ln in lines], args.batch_size)


def run_ceiling(args: argparse.Namespace) -> dict:
    """The same model and optimiser steps on one in-memory batch: the throughput with free data."""

    cfg = config(args, Path("."), Path("."), "torch")
    device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    model = create_model(**cfg.model_kwargs(), seed=0).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    clips = torch.randn(args.batch_size, 8, 3, 5, args.size, args.size, device=device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = model(clips)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        float(loss.detach())  # wait for the device
        times.append(time.perf_counter() - t0)
    kept = times[WARMUP:]
    return {"steps": len(kept), "clips_per_s": args.batch_size * len(kept) / sum(kept), "data_wait": 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=int, default=8)
    ap.add_argument("--frames", type=int, default=130)
    ap.add_argument("--frame-size", type=int, default=80, help="Rendered frame size (the shards' frames).")
    ap.add_argument("--size", type=int, default=64, help="Training input size.")
    ap.add_argument("--arch", default="memdpc_r18")
    ap.add_argument("--widths", type=lambda s: [int(v) for v in s.split(",")], default=[8, 16, 32, 32])
    ap.add_argument("--mem-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--backends", default="torch,dali")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train.json"))
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b != "dali" or dali_available()]
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards = make_shards(work, args.videos, args.frames, args.frame_size)
        results = {"in-memory batch (ceiling)": run_ceiling(args)}
        for backend in backends:
            results[f"loader: {backend}"] = run_loader(args, shards, work, backend)
    ceiling = results["in-memory batch (ceiling)"]["clips_per_s"]
    table = Table(title=f"training throughput — {args.arch} widths {args.widths}, {args.size}², batch "
                        f"{args.batch_size}, {args.steps - WARMUP} timed steps, {torch.get_num_threads()} threads")
    for col in ("data", "clips/s", "data wait", "× ceiling"):
        table.add_column(col, justify="left" if col == "data" else "right")
    for name, r in results.items():
        r["ratio_to_ceiling"] = r["clips_per_s"] / ceiling
        table.add_row(name, f"{r['clips_per_s']:.2f}", f"{r['data_wait']:.0%}", f"{r['ratio_to_ceiling']:.2f}")
    console.print(table)
    write_json_atomic(args.out, {"args": {k: v for k, v in vars(args).items() if k != "out"},
                                 "threads": torch.get_num_threads(), "results": results})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
