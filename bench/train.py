"""Benchmark: training speed at the card's pace — throughput per variant and batch size, where a step's time
goes (``--profile``), whether the fast variants learn as eager does, and the loaders against the in-memory ceiling.

Variants (:data:`VARIANTS`, ``--variants``) are ways of running the very step of ``memdpc train``
(:class:`memdpc.train.step.Stepper`): eager fp32 (``--no-fast``), the CUDA fast defaults, bf16 autocast,
``--compile``, ``--cuda-graphs`` and their combinations. Each variant runs in a process of its own (cuDNN chooses
its algorithms afresh, peak memory is the variant's own), which in turn

1. trains ``--curve-steps`` steps from seed 0 on fresh seeded batches: the loss curve, compared with eager's
   (eager runs twice, in two processes: its run-to-run spread);
2. with ``--profile``, profiles ``--profile-steps`` steps at the first batch size after warm-up
   (:mod:`bench.step_profile`: device busy and idle time, kernel launches, host issue time, time by kind
   of work and by model part, layout copies);
3. measures the in-memory ceiling at each of ``--batch-sizes`` (one batch on the device, no loader): ``WINDOW``
   untimed steps, then the rest of ``--steps`` timed with one wait for the device at the end; clips/s, model
   FLOP/s (forward + backward FLOPs counted once per batch size by torch's FLOP counter, on the meta device),
   their share of the card's peak (:data:`PEAK_TFLOPS`) and peak memory. A batch that does not fit is a one-line
   error naming the batch size and the memory asked for; larger ones are not tried.

The real training loop (``memdpc.train.loop.train`` at the fast defaults) runs with each of ``--backends`` at the
first batch size, against the fast fp32 ceiling. Results are written to ``--out`` after every variant, so a run
stopped by a time limit keeps what it measured.

Defaults: on CUDA the paper's setting (bidirectional MemDPC R18, 128², batch 16, k = 1024, 256² frames); on CPU a
small one that finishes in minutes (the CUDA graphs variants then run without, with the step's warning).

    python -m bench.train --device cuda --variants eager,fast,bf16,graphs-bf16 --batch-sizes 16,32,64 --profile
    python -m bench.train --device cpu [--steps 10 --curve-steps 50 --backends torch]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

from bench import step_profile
from bench.shard import make_archives
from memdpc.common.atomic import write_json_atomic
from memdpc.common.wording import error_line
from memdpc.model import create_model
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import dali_available
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.train.config import TrainConfig, config_from_dict
from memdpc.train.loop import train
from memdpc.train.seeding import seed_everything, set_determinism
from memdpc.train.step import (
    COMPILE_BACKEND,
    Stepper,
    make_optimizer,
    out_of_memory,
    place_clips,
    place_model,
)

WINDOW = (
    5  # steps per record of a loader run (the loop reads its metrics once per window); the first is warm-up
)
PAPER = {
    "size": 128,
    "widths": [64, 128, 256, 256],
    "mem_size": 1024,
    "batch_sizes": [16],
    "frame_size": 256,
    "steps": 30,
    "videos": 64,
    "frames": 200,
    "num_workers": 12,
}
SMALL = {
    "size": 64,
    "widths": [8, 16, 32, 32],
    "mem_size": 64,
    "batch_sizes": [4],
    "frame_size": 80,
    "steps": 10,
    "videos": 8,
    "frames": 130,
    "num_workers": 2,
}
# name: the config settings of the variant; the name says them ("eager" is --no-fast; the others are --fast)
VARIANTS = {
    "eager": {"fast": False},
    "fast": {"fast": True},
    "bf16": {"fast": True, "amp": "bf16"},
    "graphs": {"fast": True, "cuda_graphs": True},
    "graphs-bf16": {"fast": True, "cuda_graphs": True, "amp": "bf16"},
    "compile": {"fast": True, "compile": True},
    "compile-bf16": {"fast": True, "compile": True, "amp": "bf16"},
    "compile-graphs": {"fast": True, "compile": True, "cuda_graphs": True},
    "compile-graphs-bf16": {"fast": True, "compile": True, "cuda_graphs": True, "amp": "bf16"},
}
# Dense (no sparsity) peak TFLOP/s of the cards' tensor cores by the name torch reports (the first entry whose
# key the name holds): the vendor's data-sheet figures, not measured here. fp32 convolutions run as TF32 (cuDNN's
# default), so fp32 variants are held against the TF32 peak. Cards not listed get no share of peak.
PEAK_TFLOPS = (
    ("H100 NVL", "H100 NVL", {"bf16": 835.0, "tf32": 418.0}),
    ("H100 PCIe", "H100 PCIe", {"bf16": 756.0, "tf32": 378.0}),
    ("H100", "H100 SXM", {"bf16": 989.0, "tf32": 495.0}),  # torch names it "NVIDIA H100 80GB HBM3"
    ("H200 NVL", "H200 NVL", {"bf16": 835.0, "tf32": 418.0}),
    ("H200", "H200 SXM", {"bf16": 989.0, "tf32": 495.0}),
)


def label(name: str) -> str:
    """A variant's name in the tables, with the options that give it."""
    s = VARIANTS[name]
    if not s["fast"]:
        return "eager fp32 (--no-fast)"
    parts = ["fast " + ("bf16" if s.get("amp") == "bf16" else "fp32")]
    parts += [what for key, what in (("compile", "compile"), ("cuda_graphs", "CUDA graphs")) if s.get(key)]
    return " + ".join(parts)


def precision(name: str) -> str:
    return "bf16" if VARIANTS[name].get("amp") == "bf16" else "tf32"


def card_peak(card: str) -> tuple[str, dict[str, float]] | None:
    """(the card's name in :data:`PEAK_TFLOPS`, its peaks) for the device name torch reports; None if unlisted."""
    return next(((short, peaks) for key, short, peaks in PEAK_TFLOPS if key in card), None)


# ------------------------------------------------------------------------------------------------ set-up
def make_shards(root: Path, videos: int, frames: int, frame_size: int) -> Path:
    records = make_archives(root / "archives", videos, frames, frame_size)
    shard_stream(
        root / "archives",
        records,
        "rgb",
        root / "shards",
        "train",
        ShardSettings(clip=ClipSpec(), window_step=5, max_count=4, seed=0),
    )  # small shards: every loader worker gets some
    return root / "shards"


def config(
    args: argparse.Namespace,
    batch: int,
    shards: Path = Path("."),
    out: Path = Path("."),
    backend: str = "torch",
    **over,
) -> TrainConfig:
    return config_from_dict(
        dict(
            stream="rgb",
            shards=str(shards),
            out=str(out),
            val_split="none",
            backend=backend,
            num_workers=args.num_workers,
            arch=args.arch,
            widths=args.widths,
            size=args.size,
            mem_size=args.mem_size,
            bidirectional=args.bidirectional,
            batch_size=batch,
            epochs=10_000,
            max_steps=args.steps,
            log_every=WINDOW,
            progress=False,
            device=args.device.type,
            **over,
        )
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clips(args: argparse.Namespace, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randn((batch, 8, 3, 5, args.size, args.size), generator=generator, device=args.device)


def _peak_memory(device: torch.device) -> int:
    """Bytes: the most the device's allocator held since the last reset (CUDA); the process's largest resident
    set so far (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------------- one variant's process
class _Variant:
    """A variant's model, optimiser and step, as ``memdpc train`` builds them, every generator seeded."""

    def __init__(self, args: argparse.Namespace, name: str) -> None:
        self.args, self.device = args, args.device
        self.cfg = config(args, args.batch_sizes[0], **VARIANTS[name])
        set_determinism(self.cfg.deterministic)
        seed_everything(self.cfg.seed)
        model = place_model(create_model(**self.cfg.model_kwargs(), seed=0), self.cfg, self.device).train()
        self.warnings: list[str] = []
        self.step = Stepper(
            model,
            make_optimizer(model, self.cfg, self.device),
            torch.amp.GradScaler(self.device.type, enabled=False),
            self.cfg,
            self.device,
            self.warnings.append,
            backend=args.compile_backend,
        )

    def placed(self, clips: torch.Tensor) -> torch.Tensor:
        return place_clips(clips, self.cfg, self.device)

    def curve(self) -> list[float]:
        """The losses of ``--curve-steps`` steps from seed 0, on fresh seeded batches; read once at the end."""
        g = torch.Generator(device=self.device).manual_seed(0)
        batch = self.args.batch_sizes[0]
        losses = [
            self.step(self.placed(_clips(self.args, batch, g)))["loss"].detach().clone()
            for _ in range(self.args.curve_steps)
        ]
        return torch.stack(losses).tolist()

    def ceiling(self, batch: int) -> dict[str, Any]:
        """The steps on one in-memory batch: the throughput with free data, and the peak memory."""
        clips = self.placed(_clips(self.args, batch))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        for _ in range(WINDOW):
            self.step(clips)
        _sync(self.device)
        timed = self.args.steps - WINDOW
        t0 = time.perf_counter()
        for _ in range(timed):
            self.step(clips)
        _sync(self.device)
        seconds = time.perf_counter() - t0
        return {
            "steps": timed,
            "clips_per_s": batch * timed / seconds,
            "peak_memory": _peak_memory(self.device),
        }

    def profiled(self) -> dict[str, Any]:
        """The profile of ``--profile-steps`` steps at the first batch size. The warm-up runs under a profiler
        too, so that compiled code sees a running profiler (its part ranges) before the steps that are kept."""
        clips = self.placed(_clips(self.args, self.args.batch_sizes[0]))
        with profile():
            for _ in range(WINDOW):
                self.step(clips)
            _sync(self.device)
        trace = step_profile.record(lambda: self.step(clips), self.args.profile_steps, self.device)
        return step_profile.analyse(trace, self.device.type)


def run_variant(args: argparse.Namespace, name: str, curve: bool, measure: bool) -> dict[str, Any]:
    """In a fresh process: the loss curve (``curve``), then (``measure``) the profile (``--profile``) and the
    ceiling at each batch size, until one does not fit. An error ends the variant as a one-line record."""
    out: dict[str, Any] = {}
    try:
        v = _Variant(args, name)
        out["warnings"] = v.warnings
        if curve:
            out["curve"] = v.curve()
        if measure and args.profile:
            try:
                out["profile"] = v.profiled()
            except Exception as e:  # noqa: BLE001 — a profile that fails leaves the throughput to measure
                traceback.print_exc()
                out["profile_error"] = error_line(e, 300)
        if measure:
            out["batches"] = {}
            for batch in args.batch_sizes:
                try:
                    out["batches"][batch] = v.ceiling(batch)
                except RuntimeError as e:
                    too_big = out_of_memory(e, batch, args.device)
                    if too_big is None:
                        raise
                    out["batches"][batch] = {"error": str(too_big)}
                    break
    except Exception as e:  # noqa: BLE001 — a variant that cannot run here is reported, not fatal
        traceback.print_exc()
        out["error"] = error_line(e, 300)
    return out


def in_fresh_process(fn: Callable, *args) -> dict[str, Any]:
    """``fn(*args)`` in a new process, where cuDNN chooses its algorithms afresh as a new run does (a second
    run in the same process reuses the first one's choices, and would show no run-to-run spread). A process that
    dies (a crash in a kernel) gives an error record."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        try:
            return pool.submit(fn, *args).result()
        except BrokenProcessPool as e:
            return {"error": f"the variant's process died ({e})"}


# ------------------------------------------------------------------------------------------------ loaders
def summarise(records: list[dict], batch: int) -> dict:
    windows = [r for r in records if r["kind"] == "train"][1:]
    seconds = [batch * WINDOW / r["clips_per_s"] for r in windows]
    waits = [r["data_wait"] * s for r, s in zip(windows, seconds, strict=True)]
    return {
        "steps": WINDOW * len(windows),
        "clips_per_s": batch * WINDOW * len(windows) / sum(seconds),
        "data_wait": sum(waits) / sum(seconds),
    }


def run_loader(args: argparse.Namespace, shards: Path, work: Path, backend: str) -> dict:
    out = work / f"run-{backend}"
    batch = args.batch_sizes[0]
    train(config(args, batch, shards, out, backend))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return summarise([json.loads(ln) for ln in lines], batch)


# ------------------------------------------------------------------------------------------------ numbers
def flops_per_clip(args: argparse.Namespace, batch: int) -> float:
    """Forward + backward FLOPs of one clip at ``batch`` (the loss's matrix grows with the batch), counted by
    torch's FLOP counter on one eager step on the meta device (shapes only: no memory, no time)."""
    cfg = config(args, batch, fast=False)
    model = create_model(**cfg.model_kwargs(), seed=0).to("meta").train()
    with FlopCounterMode(display=False) as counter:
        model(torch.zeros((batch, 8, 3, 5, args.size, args.size), device="meta"))["loss"].backward()
    return counter.get_total_flops() / batch


def add_rates(
    results: dict[str, dict], flops: dict[int, float], peak: dict[str, float] | None, eager_batch: int
) -> None:
    """Per variant and batch: the ratio to eager fp32 at the first batch size (per clip), model FLOP/s and their
    share of the card's peak."""
    eager = results.get("eager", {}).get("batches", {}).get(eager_batch, {}).get("clips_per_s")
    for name, r in results.items():
        for batch, row in r.get("batches", {}).items():
            if "clips_per_s" not in row:
                continue
            row["ratio_to_eager"] = row["clips_per_s"] / eager if eager else None
            row["tflop_per_s"] = flops[batch] * row["clips_per_s"] / 1e12
            row["share_of_peak"] = row["tflop_per_s"] / peak[precision(name)] if peak else None


def earlier_eager(path: Path, steps: int, console: Console) -> dict[str, list[float]]:
    """The eager curves ("eager", "eager 2") of an earlier run's JSON; none, with a warning, where it has none of
    ``steps`` steps (that run stopped before them, or had other settings)."""
    earlier = json.loads(path.read_text()).get("loss_curves", {}) if path.is_file() else {}
    found = {n: earlier[n] for n in ("eager", "eager 2") if len(earlier.get(n, ())) == steps}
    if "eager" not in found:
        console.print(
            f"[yellow]warning:[/] {escape(str(path))} holds no eager loss curve of {steps} steps; the "
            "curves are not compared"
        )
        return {}
    return found


def curve_spread(curves: dict[str, list[float]]) -> dict[str, float]:
    """Largest absolute loss difference from eager's first run, of every other curve (eager's second run is the
    run-to-run spread)."""
    base = curves["eager"]
    return {
        name: max(abs(a - b) for a, b in zip(c, base, strict=True))
        for name, c in curves.items()
        if name != "eager"
    }


# ------------------------------------------------------------------------------------------------ tables
def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def throughput_table(results: dict[str, dict], title: str, eager_batch: int, cpu: bool) -> Table:
    table = Table(title=title)
    memory = "peak RSS GiB (process)" if cpu else "peak memory GiB"
    for col in (
        "variant",
        "batch",
        "clips/s",
        f"× eager (batch {eager_batch})",
        "TFLOP/s",
        "of peak",
        memory,
    ):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, r in results.items():
        if "batches" not in r:
            table.add_row(label(name), "", escape(r.get("error", "—")), "", "", "", "")
            continue
        for batch, row in r["batches"].items():
            if "error" in row:
                table.add_row(label(name), str(batch), escape(row["error"]), "", "", "", "")
                continue
            ratio = "—" if row["ratio_to_eager"] is None else f"{row['ratio_to_eager']:.2f}"
            share = "—" if row["share_of_peak"] is None else f"{row['share_of_peak']:.1%}"
            table.add_row(
                label(name),
                str(batch),
                f"{row['clips_per_s']:.2f}",
                ratio,
                f"{row['tflop_per_s']:.3g}",
                share,
                _gib(row["peak_memory"]),
            )
    return table


def loader_table(loaders: dict[str, dict], fast: float | None) -> Table:
    table = Table(title="the training loop with each loader (fast fp32), against the fast fp32 ceiling")
    for col in ("loader", "clips/s", "data wait", "× fast ceiling"):
        table.add_column(col, justify="left" if col == "loader" else "right")
    for backend, r in loaders.items():
        table.add_row(
            backend,
            f"{r['clips_per_s']:.2f}",
            f"{r['data_wait']:.0%}",
            f"{r['clips_per_s'] / fast:.2f}" if fast else "—",
        )
    return table


def spread_table(diffs: dict[str, float], steps: int) -> Table:
    table = Table(title=f"loss curve, {steps} steps from one seed: largest |loss − eager run 1|")
    for col in ("run", "max abs difference", "within eager's run-to-run spread"):
        table.add_column(col, justify="left" if col == "run" else "right")
    spread = diffs.get("eager 2")
    for name, d in diffs.items():
        if name == "eager 2":
            table.add_row("eager fp32, run 2 (the spread)", f"{d:.3g}", "")
        else:
            within = "—" if spread is None else ("yes" if d <= spread else "no")
            table.add_row(label(name), f"{d:.3g}", within)
    return table


def profile_summary(profiles: dict[str, dict], cuda: bool) -> Table:
    table = Table(title="profile, one step at the first batch size (before: eager; after: the others)")
    cols = (
        ["variant", "host issue ms", "GPU busy ms", "GPU idle", "kernels", "launches", "layout copies"]
        if cuda
        else [
            "variant",
            "host ms (the CPU is the device)",
            "in ops ms",
            "outside ops",
            "ops",
            "layout copies",
        ]
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "variant" else "right")
    for name, p in profiles.items():
        idle = f"{p['idle_ms']:.2f} ({p['idle_share']:.1%})"
        counts = (
            [f"{p['kernels_per_step']:.0f}", f"{p['launches_per_step']:.0f}"]
            if cuda
            else [f"{p['ops_per_step']:.0f}"]
        )
        table.add_row(
            label(name),
            f"{p['host_issue_ms']:.2f}",
            f"{p['busy_ms']:.2f}",
            idle,
            *counts,
            f"{p['layout_copies_per_step']:g}",
        )
    return table


# ------------------------------------------------------------------------------------------------ the run
def _names(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}"
        )
    return names


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument(
        "--variants",
        type=_names,
        default=["eager", "fast", "bf16"],
        help=f"Comma-separated, of: {', '.join(VARIANTS)} (default eager,fast,bf16).",
    )
    ap.add_argument(
        "--batch-sizes",
        type=_ints,
        help="Comma-separated; the first is the curves', the profile's and the loaders'. CUDA 16, CPU 4.",
    )
    ap.add_argument("--profile", action="store_true", help="Also profile each variant (module docstring).")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument(
        "--compile-backend",
        default=COMPILE_BACKEND,
        help="torch.compile's backend for the compile variants (aot_eager: no codegen; eager: tracing).",
    )
    ap.add_argument("--videos", type=int, help="Videos rendered; CUDA 64, CPU 8.")
    ap.add_argument("--frames", type=int, help="Frames per video; CUDA 200 (16 clips each), CPU 130 (2).")
    ap.add_argument(
        "--frame-size", type=int, help="Rendered frame size (the shards' frames); CUDA 256, CPU 80."
    )
    ap.add_argument("--size", type=int, help="Training input size; CUDA 128, CPU 64.")
    ap.add_argument("--arch", default="memdpc_r18")
    ap.add_argument("--widths", type=_ints, help="CUDA 64,128,256,256; CPU 8,16,32,32.")
    ap.add_argument("--mem-size", type=int, help="CUDA 1024, CPU 64.")
    ap.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument(
        "--steps", type=int, help=f"Steps per throughput run, the first {WINDOW} untimed; CUDA 30, CPU 10."
    )
    ap.add_argument("--curve-steps", type=int, default=50, help="0: no loss curves.")
    ap.add_argument(
        "--eager-curves",
        type=Path,
        help="A JSON of an earlier run (same settings) whose eager loss "
        "curves the variants are compared with, instead of running "
        "eager again.",
    )
    ap.add_argument("--num-workers", type=int, help="Loader workers; CUDA 12, CPU 2.")
    ap.add_argument(
        "--backends", default="torch,dali", help="Loaders to run the training loop with ('': none)."
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/train.json"))
    args = ap.parse_args(argv)
    args.device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    for k, v in (PAPER if args.device.type == "cuda" else SMALL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.steps < 2 * WINDOW:
        ap.error(f"--steps must be at least {2 * WINDOW} (one warm-up window and one timed)")
    if not args.batch_sizes:
        ap.error("--batch-sizes needs at least one batch size")
    args.batch_sizes = sorted(set(args.batch_sizes))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    console = Console(width=160)
    card = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    peak = card_peak(card)
    first = args.batch_sizes[0]
    record: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path | torch.device) else v for k, v in vars(args).items()},
        "card": card,
        "peak": {"card": peak[0], **peak[1]} if peak else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "flops_per_clip": {b: flops_per_clip(args, b) for b in args.batch_sizes},
        "variants": {},
        "loss_curves": {},
    }
    results = record["variants"]
    curves: dict[str, list[float]] = record["loss_curves"]
    if args.eager_curves and "eager" not in args.variants and args.curve_steps:
        curves.update(earlier_eager(args.eager_curves, args.curve_steps, console))
    for name in args.variants:
        console.print(f"{label(name)}: …")
        results[name] = in_fresh_process(run_variant, args, name, args.curve_steps > 0, True)
        if "curve" in results[name]:
            curves[name] = results[name]["curve"]
        if name == "eager" and "eager" in curves:  # a second eager run: the run-to-run spread
            second = in_fresh_process(run_variant, args, "eager", True, False)
            if "curve" in second:
                curves["eager 2"] = second["curve"]
        for warning in results[name].get("warnings", []):
            console.print(f"[yellow]warning:[/] {escape(warning)}")
        for what in ("error", "profile_error"):
            if what in results[name]:
                console.print(
                    f"[red]{label(name)}: {what.replace('_', ' ')}:[/] {escape(results[name][what])}"
                )
        write_json_atomic(args.out, record)
    add_rates(results, record["flops_per_clip"], peak[1] if peak else None, first)
    backends = [b for b in args.backends.split(",") if b and (b != "dali" or dali_available())]
    if backends:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            shards = make_shards(work, args.videos, args.frames, args.frame_size)
            record["loaders"] = {b: run_loader(args, shards, work, b) for b in backends}
    record["loss_curve_max_abs_diff"] = curve_spread(curves) if "eager" in curves else {}
    write_json_atomic(args.out, record)

    where = (
        f"{card}{f' ({peak[0]})' if peak else ''}"
        if args.device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    flops = ", ".join(f"{record['flops_per_clip'][b] / 1e9:.3g}" for b in args.batch_sizes)
    console.print(
        throughput_table(
            results,
            f"training throughput on {where} — {args.arch} widths {args.widths}"
            f"{' bidirectional' if args.bidirectional else ''}, {args.size}², one "
            f"batch in memory; GFLOP per clip (fwd + bwd) at batch "
            f"{','.join(map(str, args.batch_sizes))}: {flops}",
            first,
            args.device.type == "cpu",
        )
    )
    if "loaders" in record:
        fast = results.get("fast", {}).get("batches", {}).get(first, {}).get("clips_per_s")
        console.print(loader_table(record["loaders"], fast))
    if record["loss_curve_max_abs_diff"]:
        console.print(spread_table(record["loss_curve_max_abs_diff"], args.curve_steps))
    profiles = {n: r["profile"] for n, r in results.items() if "profile" in r}
    if profiles:
        cuda = args.device.type == "cuda"
        console.print(profile_summary(profiles, cuda))
        for name, p in profiles.items():
            for table in step_profile.tables(p, label(name)):
                console.print(table)
            if p["other_names"]:
                console.print(
                    f"{label(name)}: largest work no rule names: "
                    + "; ".join(f"{escape(n[:90])} {ms:.3f} ms" for n, ms in p["other_names"].items())
                )
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
