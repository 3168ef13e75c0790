"""Benchmark: memory over a long run. Does any process's resident memory creep as a run goes on?

Renders short synthetic videos, then runs the real command line on them, one stage at a time, while this
process samples the resident memory (RSS) of the stage's whole process tree ten times a second:

1. ``memdpc preprocess flow --streams rgb,flow --workers W`` over every video (progress: archives written);
2. ``memdpc shard`` of the rgb train split, every window of every video (progress: shards written, of those
   there are at the end); training reads another, unmeasured, of two windows a video;
3. ``memdpc train`` for ``--epochs`` epochs with the torch loader (``--workers`` DataLoader workers, made anew
   every epoch) and with the DALI CPU loader (its threads live in the main process) (progress: the epoch of
   the last metrics record).

Per stage and process role (the main process; the workers, as their largest member at each sample) it reports
the memory at the start (when progress first moves: the first archive, shard or epoch done), after warm-up
(at ``--warm-up`` of the progress) and at the end (the last tenth), and the growth after warm-up:
(end − warm-up) / warm-up, the figure of merit (target ≤ 5 %). Writes a table and ``bench/results/soak.json``
(every fifth sample).

    python -m bench.soak [--videos 500 --frames 24 --size 32 --epochs 30 --workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

from memdpc.common.atomic import write_json_atomic
from memdpc.pipeline.loader import dali_available
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic

SAMPLE_EVERY = 0.1  # seconds; the JSON keeps every fifth sample
GEOMETRY = ["--blocks", "4", "--block-len", "3", "--clip-stride", "1"]  # short videos: 12-frame samples


def run_sampled(cmd: list[str], progress, log: Path, relative: bool = False) -> list[dict]:
    """Run ``cmd`` (stdout and stderr to ``log``), sampling its process tree's RSS; ``progress()`` → 0..1, or
    a count whose value at the end is 1 where ``relative``."""
    samples = []
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        main = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                main_rss = main.memory_info().rss
                workers = [c.memory_info().rss for c in main.children(recursive=True) if c.is_running()]
            except psutil.Error:  # the process ended between poll and read
                break
            samples.append(
                {
                    "t": time.monotonic(),
                    "progress": progress(),
                    "main": main_rss,
                    "workers": max(workers, default=0),
                }
            )
            time.sleep(SAMPLE_EVERY)
    if relative:
        total = progress() or 1
        for s in samples:
            s["progress"] /= total
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-5:]
        raise SystemExit(
            f"{' '.join(map(str, cmd[2:5]))} … failed (exit {proc.returncode}):\n" + "\n".join(tail)
        )
    return samples


def summarise(samples: list[dict], warm_up: float) -> dict:
    """Per role, the median RSS (MB) in each progress window, and the growth after warm-up. The windows are
    half-open and begin at the first progress reached at or past their start (progress moves in steps: an
    epoch, an archive): ``start`` holds the samples at the first progress above 0 (past the imports and first
    loads), ``warm-up`` a tenth from ``warm_up`` on, ``end`` the last tenth before the work is done (the samples
    at progress 1, while the process shuts its workers down, count in none)."""
    steps = sorted({s["progress"] for s in samples if 0 < s["progress"] < 1})
    if not steps:
        return {}

    def window(lo: float, width: float) -> tuple[float, float]:
        first = next((p for p in steps if p >= lo), steps[-1])
        return first, first + max(width, 1e-9)

    windows = {
        "start": window(0.0, 0.0),
        "warm-up": window(warm_up, 0.1),
        "end": window(min(1 - 0.1, steps[-1]), 0.1),
    }
    out = {}
    for role in ("main", "workers"):
        row = {}
        for name, (lo, hi) in windows.items():
            vals = sorted(s[role] for s in samples if lo <= s["progress"] < min(hi, 1) and s[role] > 0)
            row[name] = round(vals[len(vals) // 2] / 2**20, 1) if vals else None
        if row["warm-up"] and row["end"]:
            row["growth"] = round((row["end"] - row["warm-up"]) / row["warm-up"], 4)
            row["peak"] = round(max(s[role] for s in samples) / 2**20, 1)
            out[role] = row
    return out


def count_files(folder: Path, total: int = 1):
    return lambda: len(list(folder.glob("*.tar"))) / total if folder.is_dir() else 0.0


def epoch_of(run: Path, epochs: int):
    def progress() -> float:
        metrics = run / "metrics.jsonl"
        if not metrics.is_file():
            return 0.0
        lines = metrics.read_text().splitlines()
        seen = [json.loads(line)["epoch"] for line in lines[-5:] if line.strip().endswith("}")]
        return max(seen, default=0) / epochs  # the epoch in progress: the last one ends below 1

    return progress


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--videos", type=int, default=500)
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument(
        "--warm-up", type=float, default=0.2, help="Progress (0..1) after which memory should hold."
    )
    ap.add_argument("--backends", default="torch,dali", help="Loaders to train with.")
    ap.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = ap.parse_args()
    memdpc = [sys.executable, "-m", "memdpc.cli"]
    classes = 10
    stages: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        root = Path(tmp)
        cfg = SyntheticConfig(
            videos_per_class=-(-args.videos // classes),
            frames=args.frames,
            size=args.size,
            num_classes=classes,
        )
        make_synthetic(root / "data", cfg)
        subprocess.run(
            [*memdpc, "index", root / "data", "--layout", "ucf101", "--out", root / "index.jsonl"],
            check=True,
            capture_output=True,
        )
        videos = sum(1 for _ in open(root / "index.jsonl"))
        stages["preprocess"] = run_sampled(
            [
                *memdpc,
                "preprocess",
                "flow",
                root / "index.jsonl",
                "--out",
                root / "frames",
                "--streams",
                "rgb,flow",
                "--size",
                str(args.size),
                "--workers",
                str(args.workers),
                "--scales",
                "2",
                "--warps",
                "1",
            ],
            count_files(root / "frames" / "flow", videos),
            root / "preprocess.log",
        )

        def shard(out: Path, step: int) -> list[str]:
            return [
                *memdpc,
                "shard",
                root / "frames",
                "--index",
                root / "index.jsonl",
                "--stream",
                "rgb",
                "--out",
                out,
                "--split",
                "train",
                "--window-step",
                str(step),
                "--max-count",
                "64",
                *GEOMETRY,
            ]

        # measured: every window of every video (step 1), enough shards to watch; trained on: two windows a video
        stages["shard"] = run_sampled(
            shard(root / "shards-dense", 1),
            count_files(root / "shards-dense" / "rgb"),
            root / "shard.log",
            relative=True,
        )
        subprocess.run(shard(root / "shards", 12), check=True, capture_output=True)
        backends = [b for b in args.backends.split(",") if b and (b != "dali" or dali_available())]
        for backend in backends:
            run = root / f"run-{backend}"
            stages[f"train ({backend})"] = run_sampled(
                [
                    *memdpc,
                    "train",
                    "--stream",
                    "rgb",
                    "--shards",
                    root / "shards",
                    "--out",
                    run,
                    "--backend",
                    backend,
                    "--workers",
                    str(args.workers),
                    "--epochs",
                    str(args.epochs),
                    "--widths",
                    "4,8,16,16",
                    "--size",
                    str(args.size),
                    "--crop-size",
                    "0",
                    "--blocks",
                    "4",
                    "--block-len",
                    "3",
                    "--pred-steps",
                    "2",
                    "--mem-size",
                    "64",
                    "--batch-size",
                    str(args.batch_size),
                    "--val-split",
                    "none",
                    "--log-every",
                    "5",
                    "--no-progress",
                ],
                epoch_of(run, args.epochs),
                root / f"train-{backend}.log",
            )
    summary = {name: summarise(samples, args.warm_up) for name, samples in stages.items()}
    table = Table(
        title=f"resident memory (MB, median in each window of the progress), {args.videos} videos of "
        f"{args.frames} frames at {args.size}², {args.epochs} epochs, {args.workers} workers"
    )
    for col in (
        "stage",
        "process",
        "start",
        f"after warm-up ({args.warm_up:.0%})",
        "end",
        "peak",
        "growth after warm-up",
    ):
        table.add_column(col, justify="left" if col in ("stage", "process") else "right")
    for stage, roles in summary.items():
        for role, r in roles.items():
            table.add_row(
                stage,
                role,
                str(r["start"]),
                str(r["warm-up"]),
                str(r["end"]),
                str(r["peak"]),
                f"{100 * r['growth']:+.1f} %",
            )
    Console(width=160).print(table)
    growths = [(abs(r["growth"]), f"{s} {role}") for s, roles in summary.items() for role, r in roles.items()]
    if growths:
        worst = max(growths)
        Console().print(
            f"largest growth after warm-up: {100 * worst[0]:.1f} % ({worst[1]}); target ≤ 5 %: "
            f"{'[green]met' if worst[0] <= 0.05 else '[red]missed'}"
        )
    else:
        Console().print("no stage ran long enough to measure: give more --videos or --epochs")
    write_json_atomic(
        args.out,
        {
            "bench": "soak",
            "args": {k: str(v) for k, v in vars(args).items()},
            "videos": videos,
            "summary": summary,
            # each role's largest RSS (MB) over every sample, the thinned ones below and those left out
            "peaks": {
                k: {role: round(max(s[role] for s in v) / 2**20, 1) for role in ("main", "workers")}
                for k, v in stages.items()
                if v
            },
            "samples": {
                k: [{**s, "t": round(s["t"] - v[0]["t"], 2)} for s in v[::5]] for k, v in stages.items() if v
            },
        },
    )


if __name__ == "__main__":
    main()
