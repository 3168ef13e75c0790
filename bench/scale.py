"""Benchmark: every stage's bookkeeping at Kinetics scale, by simulation. Does the cost of a video stay the same as
the number of videos grows?

Tiny videos (16×16 px, 9 frames; ``memdpc data synthetic``) make the per-pixel work negligible, so what is
measured is each stage's overhead per video. At each size N (default 2,000, 8,000 and 32,000 videos) it runs the
real command line, one stage after the other, and measures each stage's process: CPU seconds (user + system; of
the stage's own process, and apart those of its worker processes), peak resident memory (the stage's own
process: the parent, where it has workers) and the bytes it wrote:

- ``index`` (the UCF101 layout);
- ``preprocess frames`` (one process) and its rerun (every video skipped), ``preprocess flow`` of the same
  videos into the same folder and its rerun, ``preprocess frames --workers 2`` into another folder (the parent's
  share: its progress, its report);
- ``shard`` (``--split all``) and its rerun (every shard kept);
- ``report`` of the frames folder (finding the archives among tens of thousands, drawing three).

Before the preprocess stages, an untimed run on 20 of the videos compiles and loads what a fresh checkout's first
run would (numba's TV-L1 kernels). Cheap stages (an index, a rerun, the report) run ``--reps`` times and keep the
least CPU: the machine is shared, and another process's load adds to a run's CPU seconds, never takes from them.
Per stage it prints the CPU per video at each N, the marginal CPU per video between consecutive sizes and the
ratio of the last two (the figure of merit: 1 for a stage linear in the videos, ≤ 1.25 to pass), the same for
the parent's peak memory, the bytes per video, and the CPU, memory and bytes extrapolated to 240,000
(Kinetics-400) and 650,000 videos (Kinetics-700) from the largest size and the last marginal cost.

Each size has its own folder under ``--work``; each stage's figures are recorded there (``stages.json``) as soon
as it is done, so a killed run resumes with the first stage not done (whose output is removed first).
``--dry-run`` prints the plan (what is done, what is left, the time left as the recorded stages of the next
smaller size scale) and runs nothing. Run with ``OMP_NUM_THREADS=1``. Writes ``bench/results/scale.json`` and
the table as Markdown (``bench/results/scale.md``).

    python -m bench.scale [--sizes 2000,8000,32000] [--work /tmp/memdpc-scale] [--reps 3] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

CLASSES = 10  # the synthetic family's classes; N videos are N / 10 per class
TINY = ["--frames", "9", "--size", "16"]
SIZE = ["--size", "16"]
TARGETS = {"Kinetics-400": 240_000, "Kinetics-700": 650_000}
PASS = 1.25  # the largest ratio of the last marginal cost per video (CPU, memory) to the one before
# how far a process's peak resident memory is off, in MB: it varies from run to run by a few hundred kB, and the
# first allocations of a stage reuse memory its imports freed (so a small size's peak reads low)
RSS_NOISE_MB = 1.0

# Runs the memdpc command line in this process and, as it exits, writes the process's own resource use and its
# waited-for children's (worker processes) as JSON to argv[1].
CHILD = """
import atexit, json, resource, sys
out = sys.argv[1]
def usage():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        json.dump({"cpu_s": me.ru_utime + me.ru_stime, "children_cpu_s": kids.ru_utime + kids.ru_stime,
                   "peak_mb": me.ru_maxrss / 1024}, f)
atexit.register(usage)
sys.argv = ["memdpc", *sys.argv[2:]]
from memdpc.cli import main
main()
"""


@dataclass(frozen=True)
class Stage:
    """One measured command: its arguments after ``memdpc`` (``{…}`` filled in from the size's folder), the
    folders it writes (removed before a first try that was not recorded), the outputs whose bytes count, and how
    many times it runs (the least CPU kept)."""

    name: str
    args: tuple[str, ...]
    writes: tuple[str, ...] = ()
    sizes: tuple[str, ...] = ()
    reps: int = 1


STAGES = (
    Stage("data", ("data", "synthetic", "{data}", "--videos-per-class", "{per_class}", *TINY)),
    Stage("index", ("index", "{data}", "--layout", "ucf101", "--out", "{work}/index-{rep}.jsonl"), reps=3),
    # untimed: compiles and loads what the first timed run of a fresh checkout would (numba's TV-L1 kernels)
    Stage(
        "warm-up",
        ("preprocess", "flow", "{warm_index}", "--out", "{warm}", "--streams", "rgb,flow", *SIZE),
        writes=("{warm}",),
    ),
    Stage(
        "preprocess frames",
        ("preprocess", "frames", "{index}", "--out", "{frames}", *SIZE),
        writes=("{frames}",),
        sizes=("{frames}/rgb", "{frames}/preprocess-report.jsonl", "{frames}/preprocess-report.json"),
    ),
    Stage(
        "preprocess frames (rerun)", ("preprocess", "frames", "{index}", "--out", "{frames}", *SIZE), reps=3
    ),
    Stage(
        "preprocess flow",
        ("preprocess", "flow", "{index}", "--out", "{frames}", "--streams", "flow", *SIZE),
        writes=("{frames}/flow",),
        sizes=("{frames}/flow",),
    ),
    Stage(
        "preprocess flow (rerun)",
        ("preprocess", "flow", "{index}", "--out", "{frames}", "--streams", "flow", *SIZE),
        reps=3,
    ),
    Stage(
        "preprocess frames, 2 workers",
        ("preprocess", "frames", "{index}", "--out", "{frames2}", *SIZE, "--workers", "2"),
        writes=("{frames2}",),
    ),
    Stage(
        "shard",
        ("shard", "{frames}", "--index", "{index}", "--stream", "rgb", "--out", "{shards}", "--split", "all"),
        writes=("{shards}",),
        sizes=("{shards}",),
    ),
    Stage(
        "shard (rerun)",
        ("shard", "{frames}", "--index", "{index}", "--stream", "rgb", "--out", "{shards}", "--split", "all"),
        reps=3,
    ),
    Stage("report", ("report", "{frames}", "--out", "{report}"), writes=("{report}",), reps=3),
)
MEASURED = [
    s.name for s in STAGES if s.name not in ("data", "warm-up")
]  # the stages the figure of merit covers
WARM_UP_VIDEOS = 20


def folders(work: Path, n: int) -> dict[str, str]:
    root = work / f"n{n}"
    return {
        "work": str(root),
        "data": str(root / "data"),
        "index": str(root / "index-0.jsonl"),
        "warm_index": str(root / "warm-up.jsonl"),
        "warm": str(root / "warm-up"),
        "frames": str(root / "frames"),
        "frames2": str(root / "frames-2-workers"),
        "shards": str(root / "shards"),
        "report": str(root / "report"),
        "per_class": str(n // CLASSES),
    }


def bytes_in(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def run_stage(stage: Stage, where: dict[str, str], log: Path) -> dict:
    """Run ``stage`` ``reps`` times; its least CPU (and the memory and wall time of that run), children's CPU,
    and the bytes of its outputs."""
    for w in stage.writes:
        shutil.rmtree(w.format(**where), ignore_errors=True)
    runs = []
    for rep in range(stage.reps):
        usage = Path(where["work"]) / "usage.json"
        usage.unlink(missing_ok=True)
        args = [a.format(rep=rep, **where) for a in stage.args]
        t = time.perf_counter()
        with open(log, "a") as out:
            out.write(f"\n$ memdpc {' '.join(args)}\n")
            out.flush()
            done = subprocess.run(
                [sys.executable, "-c", CHILD, str(usage), *args], stdout=out, stderr=out, env=os.environ
            )
        if done.returncode != 0 or not usage.is_file():
            tail = "\n".join(log.read_text().splitlines()[-8:])
            raise SystemExit(
                f"{stage.name}: memdpc {' '.join(args)} failed (exit {done.returncode}):\n{tail}"
            )
        runs.append({**json.loads(usage.read_text()), "wall_s": time.perf_counter() - t})
    best = min(runs, key=lambda r: r["cpu_s"])
    out = {k: round(v, 4) for k, v in best.items()}
    out["cpu_s_runs"] = [round(r["cpu_s"], 4) for r in runs]
    outputs = [Path(s.format(**where)) for s in stage.sizes]
    out["bytes"] = {str(p.relative_to(where["work"])): bytes_in(p) for p in outputs}
    return out


def recorded(work: Path, n: int) -> dict[str, dict]:
    path = work / f"n{n}" / "stages.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def record(work: Path, n: int, results: dict[str, dict]) -> None:
    path = work / f"n{n}" / "stages.json"
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ figures
def figures(sizes: list[int], results: dict[int, dict[str, dict]]) -> dict[str, dict]:
    """Per stage: CPU per video and peak memory at each size, the marginal costs between consecutive sizes, the
    ratio of the last two, bytes per video, and the extrapolation to each target size."""
    out = {}
    for name in MEASURED:
        have = [n for n in sizes if name in results.get(n, {})]
        if not have:
            continue
        r = {n: results[n][name] for n in have}
        row: dict = {
            "cpu_ms_per_video": {n: round(1e3 * r[n]["cpu_s"] / n, 3) for n in have},
            "children_cpu_ms_per_video": {n: round(1e3 * r[n]["children_cpu_s"] / n, 3) for n in have},
            "peak_mb": {n: round(r[n]["peak_mb"], 1) for n in have},
            "bytes_per_video": {n: round(sum(r[n]["bytes"].values()) / n) for n in have},
        }
        steps = list(zip(have, have[1:], strict=False))
        row["marginal_cpu_ms"] = {
            f"{a}-{b}": round(1e3 * (r[b]["cpu_s"] - r[a]["cpu_s"]) / (b - a), 3) for a, b in steps
        }
        # how far a marginal may be off: the spread of the runs of a cheap stage at both ends, per video added
        spread = {n: max(r[n].get("cpu_s_runs", [0])) - min(r[n].get("cpu_s_runs", [0])) for n in have}
        row["noise_cpu_ms"] = {
            f"{a}-{b}": round(1e3 * (spread[a] + spread[b]) / (b - a), 3) for a, b in steps
        }
        row["marginal_peak_kb"] = {
            f"{a}-{b}": round(1024 * (r[b]["peak_mb"] - r[a]["peak_mb"]) / (b - a), 3) for a, b in steps
        }
        row["noise_peak_kb"] = {f"{a}-{b}": round(1024 * 2 * RSS_NOISE_MB / (b - a), 3) for a, b in steps}
        for key in ("marginal_cpu_ms", "marginal_peak_kb"):
            m = list(row[key].values())
            row[key.replace("marginal", "ratio")] = (
                round(m[-1] / m[-2], 3) if len(m) > 1 and m[-2] > 0 else None
            )
        big = have[-1]
        if steps:  # seconds and MB per video added beyond the largest size
            last_cpu = max(list(row["marginal_cpu_ms"].values())[-1], 0.0) / 1e3
            last_mem = max(list(row["marginal_peak_kb"].values())[-1], 0.0) / 1024
        else:
            last_cpu, last_mem = r[big]["cpu_s"] / big, 0.0
        row["extrapolated"] = {
            target: {
                "cpu_h": round((r[big]["cpu_s"] + last_cpu * (n - big)) / 3600, 3),
                "peak_gb": round((r[big]["peak_mb"] + last_mem * (n - big)) / 1024, 3),
                "bytes_gb": round(row["bytes_per_video"][big] * n / 1e9, 3),
            }
            for target, n in TARGETS.items()
        }
        out[name] = row
    return out


def _within(row: dict, what: str) -> bool:
    """Whether a stage's last marginal cost per video (``what``: ``cpu_ms`` or ``peak_kb``) is within :data:`PASS`
    of the one before, or above it by no more than the two marginals' noise (CPU: the spread of a cheap stage's
    runs; memory: :data:`RSS_NOISE_MB` at each end)."""
    ratio = row[f"ratio_{what}"]
    if ratio is not None and ratio <= PASS:
        return True
    (*_, before, last), (*_, u_before, u_last) = (
        row[f"marginal_{what}"].values(),
        row[f"noise_{what}"].values(),
    )
    return last - PASS * before <= u_last + PASS * u_before


def verdict(rows: dict[str, dict]) -> dict:
    """Whether every stage's last marginal CPU per video is within :data:`PASS` of the one before (or of its
    noise), and so is the parent's peak memory per video."""
    timed = {k: r for k, r in rows.items() if len(r["marginal_cpu_ms"]) > 1}

    def worst(what: str):
        ratios = ((k, r[f"ratio_{what}"]) for k, r in timed.items() if r[f"ratio_{what}"] is not None)
        return max(ratios, key=lambda kv: kv[1], default=None)

    return {
        "cpu_linear": all(_within(r, "cpu_ms") for r in timed.values()) and len(timed) == len(rows),
        "memory_flat": all(_within(r, "peak_kb") for r in timed.values()) and len(timed) == len(rows),
        "outside": sorted(
            {
                f"{k} ({what})"
                for k, r in timed.items()
                for what in ("cpu_ms", "peak_kb")
                if not _within(r, what)
            }
        ),
        "worst_cpu_ratio": worst("cpu_ms"),
        "worst_memory_ratio": worst("peak_kb"),
    }


def _worst(item) -> str:
    return "none" if item is None else f"{item[0]}, {item[1]:.2f}"


def _ms(values) -> str:
    return " · ".join(f"{v:.3f}" if abs(v) < 0.1 else f"{v:.2f}" for v in values)


def markdown(sizes: list[int], rows: dict[str, dict], meta: dict, before: dict | None) -> str:
    lines = [
        f"# Scale: each stage's cost per video at {', '.join(f'{n:,}' for n in sizes)} tiny videos",
        "",
        f"`python -m bench.scale` on {meta['machine']} ({meta['cores']} cores, shared), `OMP_NUM_THREADS=1`, "
        f"{meta['commit']}. Videos of 16×16 px, 9 frames: the per-pixel work is negligible, what is measured is "
        "each stage's overhead per video. CPU: user + system seconds of the stage's own process (the parent, "
        "where it has workers), the least of the runs of a cheap stage; memory: that process's peak resident "
        "set. Marginal: the cost of each video added between two sizes; ratio: the last marginal over the one "
        f"before (1: linear; the target is ≤ {PASS}, or above it by no more than the noise, shown after ±: for CPU "
        f"the spread of a cheap stage's runs, for memory {RSS_NOISE_MB:g} MB at each size, per video added). "
        "Extrapolated from the largest size by the last marginal.",
        "",
        "| stage | CPU ms/video " + " · ".join(f"{n:,}" for n in sizes) + " | marginal ms/video | ratio "
        "| parent peak MB | marginal kB/video | ratio | bytes/video | CPU h at 240k · 650k | peak GB at 650k |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        cpu = _ms(r["cpu_ms_per_video"][n] for n in sizes if n in r["cpu_ms_per_video"])
        marg = " · ".join(
            f"{_ms([m])} ± {_ms([u])}" if u else _ms([m])
            for m, u in zip(r["marginal_cpu_ms"].values(), r["noise_cpu_ms"].values(), strict=True)
        )
        peak = " · ".join(f"{r['peak_mb'][n]:.0f}" for n in sizes if n in r["peak_mb"])
        mem = " · ".join(
            f"{m:.2f} ± {u:.2f}"
            for m, u in zip(r["marginal_peak_kb"].values(), r["noise_peak_kb"].values(), strict=True)
        )
        ratio = r["ratio_cpu_ms"]
        mratio = r["ratio_peak_kb"]
        ext = r["extrapolated"]
        big = max(r["bytes_per_video"])
        lines.append(
            f"| {name} | {cpu} | {marg} | {'' if ratio is None else f'{ratio:.2f}'} | {peak} | {mem} | "
            f"{'' if mratio is None else f'{mratio:.2f}'} | {r['bytes_per_video'][big]:,} | "
            f"{ext['Kinetics-400']['cpu_h']:.2f} · {ext['Kinetics-700']['cpu_h']:.2f} | "
            f"{ext['Kinetics-700']['peak_gb']:.2f} |"
        )
    v = meta["verdict"]
    lines += [
        "",
        f"Every stage's marginal CPU per video within {PASS}× of the one before (or of its noise): "
        f"**{'yes' if v['cpu_linear'] else 'no'}** (highest ratio: {_worst(v['worst_cpu_ratio'])}); the parent's "
        f"peak memory per video not growing (the same test, its noise {RSS_NOISE_MB:g} MB at each size): "
        f"**{'yes' if v['memory_flat'] else 'no'}** (highest ratio: {_worst(v['worst_memory_ratio'])})"
        + (f"; outside: {', '.join(v['outside'])}" if v["outside"] else "")
        + ".",
        "",
    ]
    if before:
        shared = [n for n in sizes if n in before["sizes"]]
        lines += [
            f"Before ({before['commit']}; the same benchmark, the same machine, `{before['path']}`), CPU ms per "
            "video and the parent's peak MB:",
            "",
            "| stage | "
            + " | ".join(f"CPU {n:,} before · now" for n in shared)
            + " | "
            + " | ".join(f"peak MB {n:,} before · now" for n in shared)
            + " |",
            "|---|" + "---|" * 2 * len(shared),
        ]
        for name, r in rows.items():
            old = before["stages"].get(name)
            if old is None:
                continue
            cells = [
                f"{_ms([old['cpu_ms_per_video'][str(n)]])} · {_ms([r['cpu_ms_per_video'][n]])}"
                for n in shared
            ]
            cells += [f"{old['peak_mb'][str(n)]:.0f} · {r['peak_mb'][n]:.0f}" for n in shared]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def table(sizes: list[int], rows: dict[str, dict]) -> Table:
    t = Table(title="per video: CPU ms (marginal, ratio) and parent peak memory")
    for col in (
        "stage",
        *(f"CPU {n:,}" for n in sizes),
        "marginal",
        "ratio",
        "peak MB",
        "kB/video",
        "B/video",
    ):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for name, r in rows.items():
        t.add_row(
            name,
            *(f"{r['cpu_ms_per_video'][n]:.2f}" if n in r["cpu_ms_per_video"] else "" for n in sizes),
            " · ".join(f"{v:.2f}" for v in r["marginal_cpu_ms"].values()),
            "" if r["ratio_cpu_ms"] is None else f"{r['ratio_cpu_ms']:.2f}",
            " · ".join(f"{v:.0f}" for v in r["peak_mb"].values()),
            " · ".join(f"{v:.2f}" for v in r["marginal_peak_kb"].values()),
            f"{r['bytes_per_video'][max(r['bytes_per_video'])]:,}",
        )
    return t


# ------------------------------------------------------------------------------------------------ plan
def plan_lines(sizes: list[int], work: Path) -> list[str]:
    lines = [f"plan of bench.scale in {work} (a dry run: nothing run)"]
    before: dict[str, dict] = {}
    left_s = 0.0
    for n in sizes:
        done = recorded(work, n)
        todo = [s.name for s in STAGES if s.name not in done]
        guess = sum(before[s]["cpu_s"] * n / before[s]["n"] for s in todo if s in before)
        unknown = [s for s in todo if s not in before]
        left_s += guess
        lines.append(
            f"{n:,} videos in {work / f'n{n}'}: {len(done)} of {len(STAGES)} stages done"
            + (f"; to do: {', '.join(todo)}" if todo else "")
            + (
                f" (about {guess / 60:.0f} min of CPU"
                + (f", {len(unknown)} not yet timed)" if unknown else ")")
            )
            * bool(todo)
        )
        before = {name: {**r, "n": n} for name, r in done.items()} or before
    lines.append(
        f"time left: about {left_s / 60:.0f} min of CPU where known (the stages of a smaller size scaled)"
    )
    lines.append("next: the same command without --dry-run")
    return lines


def commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    return f"commit {sha.stdout.strip()}" + (" (with changes)" if dirty.stdout.strip() else "")


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", default="2000,8000,32000", help="Numbers of videos, ascending (multiples of 10)."
    )
    ap.add_argument("--work", type=Path, default=Path("/tmp/memdpc-scale"), help="Folder of the runs (kept).")
    ap.add_argument("--reps", type=int, default=3, help="Runs of each cheap stage (the least CPU kept).")
    ap.add_argument("--out", type=Path, default=Path("bench/results/scale.json"))
    ap.add_argument("--dry-run", action="store_true", help="Print the plan and run nothing.")
    ap.add_argument(
        "--compare", type=Path, help="A scale.json of other code (e.g. before a change) to set beside."
    )
    ap.add_argument("--label", help="What code ran (default: this checkout's commit).")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if any(n % CLASSES for n in sizes):
        raise SystemExit(f"--sizes: each must be a multiple of {CLASSES}, not {args.sizes}")
    console = Console()
    if args.dry_run:
        console.print("\n".join(plan_lines(sizes, args.work)), markup=False, soft_wrap=True)
        return
    results: dict[int, dict[str, dict]] = {}
    for n in sizes:
        where = folders(args.work, n)
        Path(where["work"]).mkdir(parents=True, exist_ok=True)
        results[n] = recorded(args.work, n)
        for stage in STAGES:
            if stage.name in results[n]:
                continue
            stage = Stage(stage.name, stage.args, stage.writes, stage.sizes, min(stage.reps, args.reps))
            if stage.name == "warm-up":  # the index's first videos
                lines = Path(where["index"]).read_text().splitlines(keepends=True)[:WARM_UP_VIDEOS]
                Path(where["warm_index"]).write_text("".join(lines))
            console.print(f"{n:,} videos: {stage.name} …", soft_wrap=True)
            results[n][stage.name] = run_stage(stage, where, Path(where["work"]) / "log.txt")
            record(args.work, n, results[n])
            r = results[n][stage.name]
            console.print(
                f"  {r['cpu_s']:.2f} s CPU ({1e3 * r['cpu_s'] / n:.3f} ms a video), {r['peak_mb']:.0f} MB peak, "
                f"{r['wall_s']:.1f} s",
                soft_wrap=True,
            )
    rows = figures(sizes, results)
    meta = {"machine": machine(), "cores": os.cpu_count(), "commit": args.label or commit(), "sizes": sizes}
    meta["verdict"] = verdict(rows)
    console.print(table(sizes, rows))
    console.print(meta["verdict"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "stages": rows, "runs": {str(n): results[n] for n in sizes}}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    before = {**json.loads(args.compare.read_text()), "path": str(args.compare)} if args.compare else None
    args.out.with_suffix(".md").write_text(markdown(sizes, rows, meta, before))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
