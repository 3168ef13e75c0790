"""Benchmark (scientific): an example recipe, run as README writes it, on the held-out draws of both families.

Runs the commands ``memdpc recipes NAME`` prints (``memdpc quickstart --recipe NAME --data FAMILY --seed S``,
one per family and held-out seed, each in its own folder under ``--work``; a killed run resumes), times each
from videos to table, and gathers their tables: per family, seed and metric (retrieval R@1, linear-probe top-1),
MemDPC and both random-init baselines with their 95 % intervals over the same test videos, and MemDPC's paired
difference from each baseline with McNemar's exact p (``memdpc eval compare``).

    python -m bench.recipe [NAME] [--work runs/recipe] [--out bench/results/recipe-NAME] [--only SUBSTRING]
        [--report]

Writes ``<out>.json`` (every run's rows, comparisons and minutes) and ``<out>.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.scale import machine
from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path, write_json_atomic
from memdpc.quickstart import BASELINES, COMPARED, MODEL_NAMES, column
from memdpc.recipes.recipe import commands, load

MEMDPC = str(Path(sys.executable).parent / "memdpc")
METRICS = tuple(column(kind, metric) for kind, metric in COMPARED)
MINUTES = "minutes.json"  # in a run's folder: how long its command took, written once it succeeded


def runs(name: str, work: Path) -> list[dict[str, Any]]:
    """The recipe's runs: family, seed, the folder and the command line (as ``memdpc recipes`` prints it)."""
    out = []
    for line in commands(load(name), work=str(work)):
        if line.startswith("memdpc quickstart "):
            args = shlex.split(line)
            folder = Path(args[args.index("--out") + 1])
            family, seed = args[args.index("--data") + 1], int(args[args.index("--seed") + 1])
            out.append({"family": family, "seed": seed, "folder": folder, "command": line})
    return out


def run(r: dict[str, Any], console: Console) -> None:
    """One run's command, through the real command line; its wall time is kept beside its table (a resumed run
    says the time of its last, finishing attempt only, so such a run's time is not reported)."""
    if (r["folder"] / MINUTES).is_file():
        return
    console.print(f"$ {r['command']}", markup=False)
    fresh = not r["folder"].exists()
    t0 = time.perf_counter()
    subprocess.run([MEMDPC, *shlex.split(r["command"])[1:]], check=True)
    minutes = round((time.perf_counter() - t0) / 60, 1) if fresh else None
    write_json_atomic(r["folder"] / MINUTES, {"minutes": minutes})


def gather(r: dict[str, Any]) -> dict[str, Any]:
    """A finished run's rows: per metric, each model's figure and interval, and MemDPC's comparisons."""
    rows = json.loads((r["folder"] / file_kinds.QUICKSTART_TABLE).read_text())
    compared = json.loads((r["folder"] / file_kinds.QUICKSTART_COMPARE).read_text())["comparisons"]
    (stream,) = {row["stream"] for row in rows}  # an example recipe trains one stream
    out = {
        "family": r["family"],
        "seed": r["seed"],
        "stream": stream,
        "n": rows[0]["n"],
        "minutes": json.loads((r["folder"] / MINUTES).read_text())["minutes"],
        "command": r["command"],
        "metrics": {},
    }
    for metric in METRICS:
        out["metrics"][metric] = {
            "models": {row["model"]: [row[metric], row[metric + " 95%"]] for row in rows},
            "paired": {
                c["baseline"]: {
                    k: c[k] for k in ("difference", "difference 95%", "p", "discordant", "better")
                }
                for c in compared
                if c["metric"] == metric
            },
        }
    return out


def _figure(value: list) -> str:
    v, (lo, hi) = value
    return f"{v:.1f} ({lo:.1f}–{hi:.1f})"


def _paired(p: dict[str, Any]) -> str:
    if p["p"] is None:  # right on the same videos: no interval and no test
        return f"{p['difference']:+.1f} (no discordant videos)"
    lo, hi = p["difference 95%"]
    return f"{p['difference']:+.1f} ({lo:+.1f} to {hi:+.1f}), p {p['p']:.2g}"


def markdown(name: str, results: list[dict[str, Any]]) -> str:
    """The table: a row per family, seed and metric."""
    memdpc, baselines = MODEL_NAMES["memdpc"], [MODEL_NAMES[b] for b in BASELINES]
    head = ["family", "seed", "n", "metric", memdpc, *baselines]
    head += [f"{memdpc} − {b}" for b in baselines] + ["minutes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for metric, m in r["metrics"].items():
            cells = [r["family"], str(r["seed"]), str(r["n"]), f"{r['stream']} {metric}"]
            cells += [_figure(m["models"][k]) for k in (memdpc, *baselines)]
            cells += [_paired(m["paired"][b]) for b in baselines]
            cells.append("" if r["minutes"] is None else f"{r['minutes']:.1f}")
            lines.append("| " + " | ".join(cells) + " |")
    return (
        "\n".join(
            [
                f"`memdpc quickstart --recipe {name}` on the held-out draws of both example families "
                f"({platform.machine()}, {machine()}, {len(os.sched_getaffinity(0))} cores): percent with 95 % intervals (Wilson) over the n test "
                "videos; differences in points, paired on the same videos (McNemar's exact test); minutes "
                "from videos to table.",
                "",
                *lines,
            ]
        )
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="example-flow-pool", help="The example recipe.")
    ap.add_argument("--work", type=Path, default=Path("runs/recipe"))
    ap.add_argument("--out", type=Path, default=None, help="Default: bench/results/recipe-NAME.")
    ap.add_argument("--only", default="", help="Run only the runs whose folder's name contains this.")
    ap.add_argument("--report", action="store_true", help="Gather the finished runs only; run nothing.")
    args = ap.parse_args()
    console = Console()
    todo = runs(args.name, args.work)
    if not args.report:
        for r in todo:
            if args.only in r["folder"].name:
                run(r, console)
    results = [gather(r) for r in todo if (r["folder"] / MINUTES).is_file()]
    out = args.out or Path("bench/results") / f"recipe-{args.name}"
    table = markdown(args.name, results)
    write_json_atomic(out.with_suffix(".json"), results)
    with atomic_path(out.with_suffix(".md")) as tmp:
        tmp.write_text(table)
    print(table)
    console.print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
