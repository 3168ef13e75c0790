"""Benchmark: training throughput (clips/s), the data-wait fraction per loader, and what the CUDA fast defaults
of ``memdpc train`` are worth, all from one run.

Renders RGB videos, shards them (paper geometry: 8 blocks × 5 frames, stride 3), then measures:

- the in-memory ceiling (one batch already on the device, no loader) for eager fp32 (``--no-fast``), the fast
  defaults in fp32, and the fast defaults with ``--amp bf16`` — each step the loop's own (``train_step``,
  ``place_model``, ``make_optimizer``, ``place_clips``), timed with one wait for the device at the end; clips/s,
  the ratio to eager, model FLOP/s (forward + backward FLOPs counted once by torch's FLOP counter) and their share
  of the card's peak where the card is in :data:`PEAK_TFLOPS`;
- the real training loop (``memdpc.train.loop.train``, at the fast defaults) with each loader backend against
  the fast fp32 ceiling;
- the loss curve over ``--curve-steps`` steps from one seed (fresh seeded batches each step), each run in a
  process of its own: eager twice (the run-to-run spread, from cuDNN's autotuning) and fast fp32, as the largest
  absolute difference from eager.

Defaults: on CUDA the paper's setting (bidirectional MemDPC R18, 128², batch 16, k = 1024, 256² frames); on CPU a
small one that finishes in minutes.

    python bench/train.py --device cuda            # the figures of issue 24 (name the card with them)
    python bench/train.py --device cpu [--steps 10 --curve-steps 50 --backends torch]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

from memdpc.atomic import write_json_atomic
from memdpc.bench.shard import make_archives
from memdpc.model import create_model
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import dali_available
from memdpc.pipeline.shard import shard_stream
from memdpc.train.checkpoint import seed_everything
from memdpc.train.config import TrainConfig
from memdpc.train.loop import make_optimizer, place_clips, place_model, set_determinism, train, train_step

WINDOW = 5  # steps per record of a loader run (the loop reads its metrics once per window); the first is warm-up
PAPER = {"size": 128, "widths": [64, 128, 256, 256], "mem_size": 1024, "batch_size": 16, "frame_size": 256,
         "steps": 30, "videos": 64, "frames": 200, "num_workers": 12}
SMALL = {"size": 64, "widths": [8, 16, 32, 32], "mem_size": 64, "batch_size": 4, "frame_size": 80, "steps": 10,
         "videos": 8, "frames": 130, "num_workers": 2}
# The ceiling's variants: config settings, and the peak they are held against (fp32 convolutions run as TF32).
VARIANTS = {
    "eager fp32 (--no-fast)": ({"fast": False, "amp": "none"}, "tf32"),
    "fast fp32": ({"fast": True, "amp": "none"}, "tf32"),
    "fast bf16 (--amp bf16)": ({"fast": True, "amp": "bf16"}, "bf16"),
}
# Dense (no sparsity) peak TFLOP/s by the card's name as torch reports it: the vendor's data-sheet figures, not
# measured here. Cards not listed get no share of peak.
PEAK_TFLOPS = {"H100 80GB HBM3": {"bf16": 989.0, "tf32": 495.0}}  # H100 SXM


def make_shards(root: Path, videos: int, frames: int, frame_size: int) -> Path:
    records = make_archives(root / "archives", videos, frames, frame_size)
    shard_stream(root / "archives", records, "rgb", root / "shards", "train", clip=ClipSpec(), window_step=5,
                 max_count=4, seed=0)  # small shards: every loader worker gets some
    return root / "shards"


def config(args: argparse.Namespace, shards: Path, out: Path, backend: str, **over) -> TrainConfig:
    return TrainConfig(stream="rgb", shards=str(shards), out=str(out), val_split="none", backend=backend,
                       num_workers=args.num_workers, arch=args.arch, widths=args.widths, size=args.size,
                       mem_size=args.mem_size, bidirectional=args.bidirectional, batch_size=args.batch_size,
                       epochs=10_000, max_steps=args.steps, log_every=WINDOW, progress=False,
                       device=args.device.type, **over)


def summarise(records: list[dict], batch: int) -> dict:
    windows = [r for r in records if r["kind"] == "train"][1:]
    seconds = [batch * WINDOW / r["clips_per_s"] for r in windows]
    waits = [r["data_wait"] * s for r, s in zip(windows, seconds, strict=True)]
    return {"steps": WINDOW * len(windows), "clips_per_s": batch * WINDOW * len(windows) / sum(seconds),
            "data_wait": sum(waits) / sum(seconds)}


def run_loader(args: argparse.Namespace, shards: Path, work: Path, backend: str) -> dict:
    out = work / f"run-{backend}"
    train(config(args, shards, out, backend))
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return summarise([json.loads(ln) for ln in lines], args.batch_size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _setup(cfg: TrainConfig, device: torch.device):
    """The model, optimiser and scaler as ``memdpc train`` builds them for ``cfg``, every generator seeded."""
    set_determinism(cfg)
    seed_everything(cfg.seed)
    model = place_model(create_model(**cfg.model_kwargs(), seed=0), cfg, device).train()
    return model, make_optimizer(model, cfg, device), torch.amp.GradScaler(device.type, enabled=False)


def _clips(args: argparse.Namespace, generator: torch.Generator | None = None) -> torch.Tensor:
    shape = (args.batch_size, 8, 3, 5, args.size, args.size)
    return torch.randn(shape, generator=generator, device=args.device)


def run_ceiling(args: argparse.Namespace, over: dict) -> dict:
    """The loop's steps on one in-memory batch: the throughput with free data. ``WINDOW`` untimed steps, then
    ``--steps`` − ``WINDOW`` timed ones with one wait for the device at the end (as the loop waits per window)."""
    cfg = config(args, Path("."), Path("."), "torch", **over)
    model, opt, scaler = _setup(cfg, args.device)
    clips = place_clips(_clips(args), cfg, args.device)
    for _ in range(WINDOW):
        train_step(model, opt, scaler, clips, cfg)
    _sync(args.device)
    timed = args.steps - WINDOW
    t0 = time.perf_counter()
    for _ in range(timed):
        train_step(model, opt, scaler, clips, cfg)
    _sync(args.device)
    return {"steps": timed, "clips_per_s": args.batch_size * timed / (time.perf_counter() - t0), "data_wait": 0.0}


def loss_curve(args: argparse.Namespace, over: dict) -> list[float]:
    """The losses of ``--curve-steps`` steps from seed 0, on fresh seeded batches; read once at the end."""
    cfg = config(args, Path("."), Path("."), "torch", **over)
    model, opt, scaler = _setup(cfg, args.device)
    g = torch.Generator(device=args.device).manual_seed(0)
    losses = [train_step(model, opt, scaler, place_clips(_clips(args, g), cfg, args.device), cfg)["loss"].detach()
              for _ in range(args.curve_steps)]
    return torch.stack(losses).tolist()


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new process, where cuDNN chooses its algorithms afresh as a new run does (a second
    run in the same process reuses the first one's choices, and would show no run-to-run spread)."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def flops_per_clip(args: argparse.Namespace) -> float:
    """Forward + backward FLOPs of one clip, counted by torch's FLOP counter on one eager fp32 step."""
    cfg = config(args, Path("."), Path("."), "torch", fast=False)
    model = create_model(**cfg.model_kwargs(), seed=0).to(args.device).train()
    with FlopCounterMode(display=False) as counter:
        model(_clips(args))["loss"].backward()
    return counter.get_total_flops() / args.batch_size


def spread(curves: dict[str, list[float]]) -> dict[str, float]:
    """Largest absolute loss difference from the first eager run: of the second eager run, and of fast fp32."""
    base = curves["eager 1"]
    return {name: max(abs(a - b) for a, b in zip(curves[name], base, strict=True)) for name in ("eager 2", "fast fp32")}


def add_rates(results: dict[str, dict], flops: float, card: str) -> None:
    """Ratios to eager and to the fast fp32 ceiling; model FLOP/s and their share of the card's peak."""
    eager, fast = (results[f"in memory, {n}"]["clips_per_s"] for n in ("eager fp32 (--no-fast)", "fast fp32"))
    peaks = next((p for name, p in PEAK_TFLOPS.items() if name in card), None)
    for name, r in results.items():
        precision = next((v[1] for n, v in VARIANTS.items() if name.endswith(n)), "tf32")
        r["ratio_to_eager"], r["ratio_to_fast_ceiling"] = r["clips_per_s"] / eager, r["clips_per_s"] / fast
        r["tflop_per_s"] = flops * r["clips_per_s"] / 1e12
        r["share_of_peak"] = r["tflop_per_s"] / peaks[precision] if peaks else None


def throughput_table(results: dict[str, dict], title: str) -> Table:
    table = Table(title=title)
    for col in ("run", "clips/s", "data wait", "× eager", "× fast ceiling", "TFLOP/s", "of peak"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for name, r in results.items():
        share = "—" if r["share_of_peak"] is None else f"{r['share_of_peak']:.1%}"
        table.add_row(name, f"{r['clips_per_s']:.2f}", f"{r['data_wait']:.0%}", f"{r['ratio_to_eager']:.2f}",
                      f"{r['ratio_to_fast_ceiling']:.2f}", f"{r['tflop_per_s']:.3g}", share)
    return table


def spread_table(diffs: dict[str, float], steps: int) -> Table:
    table = Table(title=f"loss curve, {steps} steps from one seed: largest |loss − eager run 1|")
    table.add_column("run", justify="left")
    table.add_column("max abs difference", justify="right")
    table.add_column("within eager's run-to-run spread", justify="right")
    table.add_row("eager fp32, run 2 (the spread)", f"{diffs['eager 2']:.3g}", "")
    table.add_row("fast fp32", f"{diffs['fast fp32']:.3g}", "yes" if diffs["fast fp32"] <= diffs["eager 2"] else "no")
    return table


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--videos", type=int, help="Videos rendered; CUDA 64, CPU 8.")
    ap.add_argument("--frames", type=int, help="Frames per video; CUDA 200 (16 clips each), CPU 130 (2).")
    ap.add_argument("--frame-size", type=int, help="Rendered frame size (the shards' frames); CUDA 256, CPU 80.")
    ap.add_argument("--size", type=int, help="Training input size; CUDA 128, CPU 64.")
    ap.add_argument("--arch", default="memdpc_r18")
    ap.add_argument("--widths", type=lambda s: [int(v) for v in s.split(",")], help="CUDA 64,128,256,256; CPU 8,16,32,32.")
    ap.add_argument("--mem-size", type=int, help="CUDA 1024, CPU 64.")
    ap.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--batch-size", type=int, help="CUDA 16, CPU 4.")
    ap.add_argument("--steps", type=int, help=f"Steps per throughput run, the first {WINDOW} untimed; CUDA 30, CPU 10.")
    ap.add_argument("--curve-steps", type=int, default=50)
    ap.add_argument("--num-workers", type=int, help="Loader workers; CUDA 12, CPU 2.")
    ap.add_argument("--backends", default="torch,dali")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train.json"))
    args = ap.parse_args()
    args.device = torch.device("cuda" if args.device != "cpu" and torch.cuda.is_available() else "cpu")
    for k, v in (PAPER if args.device.type == "cuda" else SMALL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.steps < 2 * WINDOW:
        ap.error(f"--steps must be at least {2 * WINDOW} (one warm-up window and one timed)")
    return args


def main() -> None:
    args = parse_args()
    backends = [b for b in args.backends.split(",") if b != "dali" or dali_available()]
    card = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    console = Console()
    results = {f"in memory, {name}": run_ceiling(args, over) for name, (over, _) in VARIANTS.items()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards = make_shards(work, args.videos, args.frames, args.frame_size)
        for backend in backends:
            results[f"loader: {backend} (fast fp32)"] = run_loader(args, shards, work, backend)
    flops = flops_per_clip(args)
    add_rates(results, flops, card)
    curves = {name: in_fresh_process(loss_curve, args, VARIANTS[variant][0])
              for name, variant in (("eager 1", "eager fp32 (--no-fast)"), ("eager 2", "eager fp32 (--no-fast)"),
                                    ("fast fp32", "fast fp32"))}
    diffs = spread(curves)
    console.print(throughput_table(results, f"training throughput on {card} — {args.arch} widths {args.widths}"
                                            f"{' bidirectional' if args.bidirectional else ''}, {args.size}², batch "
                                            f"{args.batch_size}, {flops / 1e9:.3g} GFLOP per clip (fwd + bwd), "
                                            f"{torch.get_num_threads()} threads"))
    console.print(spread_table(diffs, args.curve_steps))
    write_json_atomic(args.out, {"args": {k: str(v) if k == "device" else v for k, v in vars(args).items()
                                          if k != "out"},
                                 "card": card, "torch": torch.__version__, "threads": torch.get_num_threads(),
                                 "flops_per_clip": flops, "results": results, "loss_curves": curves,
                                 "loss_curve_max_abs_diff": diffs})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
