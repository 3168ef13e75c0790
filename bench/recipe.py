"""Benchmark (scientific): an example recipe, run as README writes it, on the held-out draws of every family.

Runs the recipe's commands (``memdpc quickstart --recipe NAME --data FAMILY --seed S``, as ``memdpc recipes
NAME`` prints them, one per example family and held-out seed, each in its own folder under ``--work``; a killed
run resumes), times each from videos to table, and gathers their tables: per family, seed, stream (and fused,
for a recipe of both streams) and metric (retrieval R@1, linear-probe top-1), MemDPC and both random-init
baselines with their 95 % intervals over the same test videos, and MemDPC's paired difference from each
baseline with McNemar's exact p (``memdpc eval compare``); for a recipe of both streams also the fused MemDPC
paired with each stream's MemDPC, and each result's checkpoints, so that no row passes for another.

    python -m bench.recipe [NAME] [--work runs/recipe] [--out bench/results/recipe-NAME] [--only SUBSTRING]
        [--report] [--validation]

``--validation`` runs it on the validation draws of the families whose class is a kind of motion instead (seed
100: where settings are chosen, never reported as results) and writes ``<out>-validation``.

Writes ``<out>.json`` (every run's rows, comparisons and minutes) and ``<out>.md`` (the table); a run whose folder
is not under ``--work`` keeps the rows ``<out>.json`` had of it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.learn import KINDS, VALIDATION_SEEDS
from bench.scale import machine
from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path, write_json_atomic
from memdpc.common.streams import STREAMS
from memdpc.eval.compare import compare_results, winner
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.quickstart import BASELINES, COMPARED, MODEL_NAMES, VERDICTS, column
from memdpc.recipes.recipe import EXAMPLE_SEEDS, commands, load

MEMDPC = str(Path(sys.executable).parent / "memdpc")
METRICS = tuple(column(kind, metric) for kind, metric in COMPARED)
MINUTES = "minutes.json"  # in a run's folder: how long its command took, written once it succeeded


def runs(name: str, work: Path, validation: bool = False) -> list[dict[str, Any]]:
    """The recipe's runs on every example family: family, seed, the folder and the command line (as ``memdpc
    recipes`` prints it for the families the recipe has figures of); ``validation``: on the validation draws of
    :data:`bench.learn.KINDS` instead."""
    recipe = load(name)
    families = KINDS if validation else EXAMPLE_FAMILIES
    measured = {f: recipe.expect.get(f, {}) for f in families}
    seeds = VALIDATION_SEEDS[:1] if validation else EXAMPLE_SEEDS
    out = []
    for line in commands(replace(recipe, expect=measured), work=str(work), seeds=seeds):
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
    write_json_atomic(r["folder"] / MINUTES, {"minutes": minutes, "machine": machine()})


def gather(r: dict[str, Any]) -> dict[str, Any]:
    """A finished run's rows: per stream (and fused) and metric, each model's figure and interval, and MemDPC's
    comparisons; the fused MemDPC paired with each stream's, and the checkpoints each of its results was made of."""
    rows = json.loads((r["folder"] / file_kinds.QUICKSTART_TABLE).read_text())
    timed = json.loads((r["folder"] / MINUTES).read_text())
    compared = json.loads((r["folder"] / file_kinds.QUICKSTART_COMPARE).read_text())["comparisons"]
    streams = list(dict.fromkeys(row["stream"] for row in rows))
    out = {
        "family": r["family"],
        "seed": r["seed"],
        "streams": streams,
        "n": rows[0]["n"],
        **{k: timed.get(k) for k in ("minutes", "machine")},
        "command": r["command"],
        "metrics": {},
    }
    for stream in streams:
        for metric in METRICS:
            out["metrics"][f"{stream} {metric}"] = {
                "models": {
                    row["model"]: [row[metric], row[metric + " 95%"]]
                    for row in rows
                    if row["stream"] == stream
                },
                "paired": {
                    c["baseline"]: {
                        k: c[k] for k in ("difference", "difference 95%", "p", "discordant", "better")
                    }
                    for c in compared
                    if c["metric"] == metric and c["stream"] == stream
                },
            }
    if "fused" in streams:
        out["fused_vs_streams"] = _fused_vs_streams(r["folder"])
        out["checkpoints"] = _fused_sources(r["folder"])
    return out


def kept(todo: list[dict[str, Any]], previous: Path) -> list[dict[str, Any]]:
    """Each run's rows, in the order of the recipe's runs: gathered from its folder where it finished there, else
    as ``previous`` (the JSON this benchmark wrote before) has them, so that a family's runs can be added in
    another work folder without running the others again."""
    before = json.loads(previous.read_text()) if previous.is_file() else []
    by_run = {(r["family"], r["seed"]): r for r in before}
    out = []
    for r in todo:
        if (r["folder"] / MINUTES).is_file():
            out.append(gather(r))
        elif (r["family"], r["seed"]) in by_run:
            out.append(by_run[r["family"], r["seed"]])
    return out


FUSED_KINDS = {"R@1": "retrieval", "probe top-1": "probe-linear"}  # a metric's results file


def _fused_vs_streams(folder: Path) -> dict[str, dict[str, Any]]:
    """The fused MemDPC paired with each stream's MemDPC on the same test videos, per metric."""
    out: dict[str, dict[str, Any]] = {}
    for metric, kind in FUSED_KINDS.items():
        name = "R@1" if kind == "retrieval" else "top1"
        fused = folder / "eval" / "memdpc-fused" / f"{kind}.json"
        for stream in STREAMS:
            single = folder / "eval" / f"memdpc-{stream}" / f"{kind}-{stream}.json"
            m = compare_results(fused, single)["metrics"][name]
            out.setdefault(metric, {})[stream] = {
                "difference": round(100 * m["difference"], 1),
                "difference 95%": m["interval"] and [round(100 * x, 1) for x in m["interval"]],
                "p": m["p"],
                "better": VERDICTS[winner(m)],
            }
    return out


def _fused_sources(folder: Path) -> dict[str, dict[str, str]]:
    """Per model, the checkpoint of each stream its fused results were made of (as the fused result records)."""
    out = {}
    for model in MODEL_NAMES:
        fused = json.loads((folder / "eval" / f"{model}-fused" / "probe-linear.json").read_text())
        out[model] = fused["checkpoints"]
    return out


def _figure(value: list) -> str:
    v, (lo, hi) = value
    return f"{v:.1f} ({lo:.1f}–{hi:.1f})"


def _paired(p: dict[str, Any]) -> str:
    if p["p"] is None:  # right on the same videos: no interval and no test
        return f"{p['difference']:+.1f} (no discordant videos)"
    lo, hi = p["difference 95%"]
    return f"{p['difference']:+.1f} ({lo:+.1f} to {hi:+.1f}), p {p['p']:.2g}"


def markdown(
    name: str, results: list[dict[str, Any]], where: str = "on the held-out draws of every example family"
) -> str:
    """The table: a row per family, seed, stream and metric; for a recipe of both streams, then a row per family,
    seed and metric of the fused MemDPC against each stream's. ``where``: what the runs ran on, in words."""
    memdpc, baselines = MODEL_NAMES["memdpc"], [MODEL_NAMES[b] for b in BASELINES]
    head = ["family", "seed", "n", "metric", memdpc, *baselines]
    head += [f"{memdpc} − {b}" for b in baselines] + ["minutes", "machine"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for metric, m in r["metrics"].items():
            cells = [r["family"], str(r["seed"]), str(r["n"]), metric]
            cells += [_figure(m["models"][k]) for k in (memdpc, *baselines)]
            cells += [_paired(m["paired"][b]) for b in baselines]
            cells.append("" if r["minutes"] is None else f"{r['minutes']:.1f}")
            cells.append(r.get("machine") or "")
            lines.append("| " + " | ".join(cells) + " |")
    fused = [r for r in results if "fused_vs_streams" in r]
    if fused:
        lines += [
            "",
            f"{memdpc} fused against each of its streams alone, paired on the same test videos:",
            "",
        ]
        lines += ["| family | seed | metric | fused − rgb | fused − flow |", "|---|---|---|---|---|"]
        for r in fused:
            for metric, by_stream in r["fused_vs_streams"].items():
                cells = [r["family"], str(r["seed"]), metric, *(_paired(by_stream[s]) for s in STREAMS)]
                lines.append("| " + " | ".join(cells) + " |")
    return (
        "\n".join(
            [
                f"`memdpc quickstart --recipe {name}` {where}: percent with 95 % intervals (Wilson) over the "
                "n test videos; differences in points, paired on the same videos (McNemar's exact test); "
                "minutes from videos to table, and the CPU of the machine that ran it.",
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
    ap.add_argument(
        "--validation",
        action="store_true",
        help="On the validation draws (seed 100) instead of the held-out ones.",
    )
    args = ap.parse_args()
    console = Console()
    todo = runs(args.name, args.work, args.validation)
    if not args.report:
        for r in todo:
            if args.only in r["folder"].name:
                run(r, console)
    out = args.out or Path("bench/results") / f"recipe-{Path(args.name).stem}"
    if args.validation:
        out = out.with_name(f"{out.name}-validation")
    results = kept(todo, out.with_suffix(".json"))
    where = "on the validation draws (seed 100) of the families whose class is a kind of motion"
    table = markdown(args.name, results, where) if args.validation else markdown(args.name, results)
    write_json_atomic(out.with_suffix(".json"), results)
    with atomic_path(out.with_suffix(".md")) as tmp:
        tmp.write_text(table)
    print(table)
    console.print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    main()
