"""Benchmark: MemDPC forward+backward throughput and peak memory, eager vs channels_last_3d vs torch.compile
vs bf16 autocast, side by side in one run (ratios against eager on the same machine).

Default: bidirectional MemDPC R18 at 128², batch 8, 8 blocks × 5 frames (40 frames), on CPU and, when one
exists, on a CUDA device. Each variant runs in a fresh process, so peak memory (CPU: the process's maximum
resident set; CUDA: ``max_memory_allocated``) belongs to that variant alone.

    python -m bench.model [--quick] [--device cpu|cuda|all] [--steps 2] [--out bench/results/model.json]

On a 2-core CPU the full setting takes minutes per step and torch.compile minutes to compile: use --quick
(batch 2 at 64²) or --variants to pick a subset.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import resource
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from memdpc.common.atomic import write_json_atomic
from memdpc.model import create_model

VARIANTS = ("eager", "channels_last_3d", "compile", "bf16_autocast")


def _step_fn(model: torch.nn.Module, variant: str, device: str):
    run = torch.compile(model) if variant == "compile" else model
    if variant == "channels_last_3d":
        model.backbone.to(memory_format=torch.channels_last_3d)
    amp = (
        torch.autocast(device, dtype=torch.bfloat16)
        if variant == "bf16_autocast"
        else contextlib.nullcontext()
    )

    def step(clips: torch.Tensor) -> float:
        model.zero_grad(set_to_none=True)
        with amp:
            loss = run(clips)["loss"]
        loss.backward()
        return loss.item()

    return step


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _measure(args: dict, variant: str, device: str, queue) -> None:
    """Child process: build, warm up, time ``steps`` forward+backward passes, report numbers on ``queue``."""
    try:
        torch.set_num_threads(args["threads"])
        model = (
            create_model(f"memdpc_r{args['depth']}", widths=args["widths"], input_size=args["size"], seed=0)
            .to(device)
            .train()
        )
        g = torch.Generator().manual_seed(0)
        clips = torch.randn(
            args["batch"], args["blocks"], 3, args["block_len"], args["size"], args["size"], generator=g
        ).to(device)
        step = _step_fn(model, variant, device)
        t0 = time.perf_counter()
        for _ in range(args["warmup"]):
            loss = step(clips)
        _sync(device)
        warm_s = time.perf_counter() - t0
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(args["steps"]):
            loss = step(clips)
        _sync(device)
        sec = (time.perf_counter() - t0) / args["steps"]
        peak = (
            torch.cuda.max_memory_allocated()
            if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        queue.put(
            {
                "variant": variant,
                "device": device,
                "ok": True,
                "s_per_step": sec,
                "clips_per_s": args["batch"] / sec,
                "peak_mb": peak / 2**20,
                "warmup_s": warm_s,
                "loss": loss,
            }
        )
    # a variant that cannot run here (no compiler, no bf16 kernel) is reported, not fatal
    except Exception as e:
        queue.put(
            {"variant": variant, "device": device, "ok": False, "error": f"{type(e).__name__}: {e}"[:200]}
        )


def run_variant(args: dict, variant: str, device: str) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(args, variant, device, queue))
    proc.start()
    proc.join()
    if queue.empty():
        return {"variant": variant, "device": device, "ok": False, "error": f"process exited {proc.exitcode}"}
    return queue.get()


def _table(rows: list[dict], args: dict) -> Table:
    title = (
        f"MemDPC-bi R{args['depth']} {args['size']}², batch {args['batch']}, "
        f"{args['blocks']}×{args['block_len']} frames, forward+backward, {args['threads']} CPU threads"
    )
    table = Table(title=title)
    for col in ("device", "variant", "clips/s", "s/step", "× eager", "peak MB", "warm-up s", "loss"):
        table.add_column(col, justify="left" if col in ("device", "variant") else "right")
    for r in rows:
        if not r["ok"]:
            table.add_row(r["device"], r["variant"], "failed", r["error"], "", "", "", "")
            continue
        table.add_row(
            r["device"],
            r["variant"],
            f"{r['clips_per_s']:.3f}",
            f"{r['s_per_step']:.2f}",
            f"{r['speedup']:.2f}" if "speedup" in r else "",
            f"{r['peak_mb']:.0f}",
            f"{r['warmup_s']:.1f}",
            f"{r['loss']:.3f}",
        )
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="batch 2 at 64², 1 timed step (a smoke run)")
    p.add_argument(
        "--device", choices=["cpu", "cuda", "all"], default="all", help="all = CPU and CUDA if present"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    p.add_argument("--depth", type=int, choices=[18, 34], default=18)
    p.add_argument("--widths", default="64,128,256,256", help="encoder widths res2..res5")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--block-len", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed steps per variant (compilation happens here)"
    )
    p.add_argument("--threads", type=int, default=2, help="CPU threads per variant")
    p.add_argument("--out", type=Path, default=Path("bench/results/model.json"))
    a = p.parse_args()
    if a.quick:
        a.batch, a.size, a.steps = 2, 64, 1
    args = {
        k: getattr(a, k)
        for k in ("depth", "batch", "size", "blocks", "block_len", "steps", "warmup", "threads")
    }
    args["widths"] = [int(w) for w in a.widths.split(",")]
    devices = ["cpu"] if a.device == "cpu" else ["cuda"] if a.device == "cuda" else ["cpu"]
    if a.device == "all" and torch.cuda.is_available():
        devices.append("cuda")
    rows = []
    for device in devices:
        for variant in a.variants.split(","):
            rows.append(run_variant(args, variant, device))
            Console(stderr=True).print(f"{device} {variant}: {rows[-1]}")
        base = next((r for r in rows if r["device"] == device and r["variant"] == "eager" and r["ok"]), None)
        for r in rows:
            if base and r["device"] == device and r["ok"]:
                r["speedup"] = r["clips_per_s"] / base["clips_per_s"]
    Console().print(_table(rows, args))
    write_json_atomic(a.out, {"config": args, "torch": torch.__version__, "results": rows})
    Console().print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
