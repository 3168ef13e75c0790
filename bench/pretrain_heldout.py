"""Benchmark (scientific): does pretraining beat random init with one recipe, on data it was not tuned on?

Runs ``memdpc quickstart`` (its one recipe, unchanged) for every data family (the built-in ``synthetic``
and the held-out ``photos``), every seed (a seed draws other videos and other initial weights) and every
CPU kernel set (``default``: what torch picks for this CPU; ``avx2``: ``ATEN_CPU_CAPABILITY=avx2``, the
kernels of an older CPU, whose floating-point results differ), each in its own process and folder, so a
killed run resumes where it stopped. Then, per family, the mean and range over all runs of R@1 and
linear-probe top-1 for random init and MemDPC, RGB, flow and fused, and the checks the recipe must pass:

- pretraining ≥ random init on flow R@1 and on the flow probe (means), against the untrained encoder with its
  initial BatchNorm statistics and against the same encoder with the data's (``--bn-from-data``);
- the fused probe ≥ the better single stream's probe (means);
- the kNN monitor (train → val R@1, on held-out training videos) never below its value at initialisation,
  per stream and run.

    python -m bench.pretrain_heldout [--work runs/heldout] [--seeds 0 1 2] [--families synthetic photos]
        [--kernels default avx2] [--out bench/results/pretrain_heldout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from memdpc.common.atomic import atomic_path, write_json_atomic
from memdpc.common.streams import STREAMS
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.quickstart import COLUMNS, MODEL_NAMES, column

KERNELS = {"default": None, "avx2": "avx2"}  # name -> ATEN_CPU_CAPABILITY
METRICS = tuple(column(kind, metric) for kind, metric in COLUMNS)


def run_quickstart(work: Path, family: str, seed: int, kernel: str) -> list[dict]:
    """One quickstart run in its own process (the kernel set is chosen when torch starts); its table rows."""
    out = work / f"{family}-{kernel}-seed{seed}"
    if not (out / "quickstart.json").exists():
        env = dict(os.environ)
        if KERNELS[kernel]:
            env["ATEN_CPU_CAPABILITY"] = KERNELS[kernel]
        cmd = [
            sys.executable,
            "-m",
            "memdpc.cli",
            "quickstart",
            "--out",
            str(out),
            "--seed",
            str(seed),
            "--data",
            family,
        ]
        subprocess.run(cmd, env=env, check=True)
    return json.loads((out / "quickstart.json").read_text())


def knn_readings(run: Path) -> list[float]:
    """The kNN monitor's R@1 readings of one training run, the first at initialisation."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["r1"] for r in map(json.loads, lines) if r["kind"] == "knn"]


def summarise(rows_per_run: list[list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """{"<model> / <stream>": {metric: {mean, min, max}}} over the runs."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for i, row in enumerate(rows_per_run[0]):
        name = f"{row['model']} / {row['stream']}"
        out[name] = {}
        for metric in METRICS:
            values = [rows[i][metric] for rows in rows_per_run]
            out[name][metric] = {
                "mean": round(statistics.fmean(values), 1),
                "min": min(values),
                "max": max(values),
            }
    return out


def checks(summary: dict, knn: dict[str, list[float]]) -> dict[str, bool]:
    def mean(model: str, stream: str, metric: str) -> float:
        return summary[f"{MODEL_NAMES[model]} / {stream}"][metric]["mean"]

    probe = "probe top-1"
    out = {}
    for baseline in ("random", "random_bn"):
        for metric in ("R@1", probe):
            out[f"flow {metric}: MemDPC ≥ {MODEL_NAMES[baseline]}"] = mean("memdpc", "flow", metric) >= mean(
                baseline, "flow", metric
            )
    out["MemDPC fused probe ≥ better stream"] = mean("memdpc", "fused", probe) >= max(
        mean("memdpc", s, probe) for s in STREAMS
    )
    out["kNN monitor never below its initial value"] = all(
        min(r[1:], default=r[0]) >= r[0] for r in knn.values()
    )
    return out


def markdown(results: dict) -> str:
    lines = []
    for family, res in results.items():
        runs = res["runs"]
        lines += [
            f"**{family}** ({len(runs)} runs: seeds × kernel sets; mean, range in brackets)",
            "",
            "| model | stream | " + " | ".join(METRICS) + " |",
            "|---|---|" + "---|" * len(METRICS),
        ]
        for name, metrics in res["summary"].items():
            model, stream = name.split(" / ")
            cells = [f"{m['mean']} [{m['min']}–{m['max']}]" for m in metrics.values()]
            lines.append(f"| {model} | {stream} | " + " | ".join(cells) + " |")
        lines += [""] + [f"- {'✓' if ok else '✗'} {what}" for what, ok in res["checks"].items()] + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("runs/heldout"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--families", nargs="+", choices=list(EXAMPLE_FAMILIES), default=list(EXAMPLE_FAMILIES))
    ap.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=list(KERNELS))
    ap.add_argument("--out", type=Path, default=Path("bench/results/pretrain_heldout.json"))
    args = ap.parse_args()
    results = {}
    for family in args.families:
        runs, knn = {}, {}
        for kernel in args.kernels:
            for seed in args.seeds:
                name = f"{family}-{kernel}-seed{seed}"
                runs[name] = run_quickstart(args.work, family, seed, kernel)
                for stream in STREAMS:
                    knn[f"{name}/{stream}"] = knn_readings(args.work / name / "runs" / stream)
        summary = summarise(list(runs.values()))
        results[family] = {"runs": runs, "knn": knn, "summary": summary, "checks": checks(summary, knn)}
    write_json_atomic(args.out, results)
    with atomic_path(args.out.with_suffix(".md")) as tmp:
        tmp.write_text(markdown(results))
    console = Console()
    for family, res in results.items():
        table = Table(title=f"{family}: mean [min–max] over {len(res['runs'])} runs (percent)")
        for col in ("model", "stream", *METRICS):
            table.add_column(col, justify="left" if col in ("model", "stream") else "right")
        for name, metrics in res["summary"].items():
            table.add_row(
                *name.split(" / "), *(f"{m['mean']} [{m['min']}–{m['max']}]" for m in metrics.values())
            )
        console.print(table)
        for what, ok in res["checks"].items():
            console.print(f"{'[green]✓' if ok else '[red]✗'}[/] {what}")
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
