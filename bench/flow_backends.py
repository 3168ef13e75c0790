"""Benchmark: the batched PyTorch TV-L1 against OpenCV's CPU TV-L1 on the same frames.

Real-looking frames (textured scenes with moving objects, ``preprocess.synthetic``), consecutive greyscale
pairs. For each frame size and torch batch size it times both backends on one core each
(``torch.set_num_threads`` / ``cv2.setNumThreads``), interleaving them chunk by chunk so that load from
other processes hits both alike, and reports pairs/s, the ratio (target ≥ 0.8 on CPU), the mean / max
end-point difference between the two flows (target mean ≤ 0.02 px) and the share of identical stored
uint8 codes after the ±20 px clip and mapping (target ≥ 90 %). With ``--device cuda`` it also times the
GPU (target ≥ 500 pairs/s at 256² on one H100), after a warm-up call.

    python bench/flow_backends.py [--sizes 128,256 --pairs 8 --batches 1,8 --threads 1 --device cpu \
        --compile --out bench/results/flow_backends.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from memdpc.atomic import write_json_atomic
from memdpc.preprocess.flow import flow_to_codes
from memdpc.preprocess.synthetic import CLASSES, render_video
from memdpc.preprocess.tvl1_params import TVL1Params
from memdpc.preprocess.tvl1_torch import Schedule, tvl1_flow

console = Console(width=160)


def make_pairs(size: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` consecutive greyscale pairs (n, size, size) uint8 from videos of different classes."""
    rng = np.random.default_rng(seed)
    prev, nxt = [], []
    for k in range(n):
        frames = render_video(CLASSES[k % len(CLASSES)], size, 2 + k % 3, rng)
        grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in frames[-2:]]
        prev.append(grey[0])
        nxt.append(grey[1])
    return np.stack(prev), np.stack(nxt)


def run_torch(prev: np.ndarray, nxt: np.ndarray, device: str, schedule: Schedule) -> np.ndarray:
    flow = tvl1_flow(
        torch.from_numpy(prev).to(device), torch.from_numpy(nxt).to(device), TVL1Params(), schedule
    )
    return flow.cpu().numpy()


def compare_cpu(prev, nxt, batch: int, schedule: Schedule) -> dict:
    """Time torch (batches of ``batch``) and OpenCV on the same pairs, interleaved; compare the flows."""
    tv = TVL1Params().to_opencv()
    t_torch = t_cv = 0.0
    ours, ref = [], []
    for i in range(0, len(prev), batch):
        t = time.perf_counter()
        ours.append(run_torch(prev[i : i + batch], nxt[i : i + batch], "cpu", schedule))
        t_torch += time.perf_counter() - t
        t = time.perf_counter()
        ref += [tv.calc(a, b, None) for a, b in zip(prev[i : i + batch], nxt[i : i + batch], strict=True)]
        t_cv += time.perf_counter() - t
    ours, ref = np.concatenate(ours), np.stack(ref)
    epd = np.linalg.norm(ours - ref, axis=-1)
    return {
        "opencv_pairs_per_s": len(prev) / t_cv,
        "torch_pairs_per_s": len(prev) / t_torch,
        "ratio": t_cv / t_torch,
        "epd_mean": float(epd.mean()),
        "epd_max": float(epd.max()),
        "identical_codes": float((flow_to_codes(ours) == flow_to_codes(ref))[..., :2].mean()),
        "flow_magnitude_mean": float(np.linalg.norm(ref, axis=-1).mean()),
    }


def time_device(prev, nxt, device: str, batch: int, schedule: Schedule, repeat: int) -> dict:
    """Pairs/s of torch on ``device`` for batches of ``batch`` pairs (the frames tiled to fill a batch)."""
    reps = -(-batch // len(prev))
    p, n = np.concatenate([prev] * reps)[:batch], np.concatenate([nxt] * reps)[:batch]
    run_torch(p, n, device, schedule)  # warm-up (allocator, kernels, compilation)
    torch.cuda.synchronize() if device.startswith("cuda") else None
    t = time.perf_counter()
    for _ in range(repeat):
        run_torch(p, n, device, schedule)
    wall = time.perf_counter() - t
    return {"torch_pairs_per_s": batch * repeat / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256", help="comma-separated frame sizes (square)")
    ap.add_argument("--pairs", type=int, default=8, help="frame pairs per size")
    ap.add_argument("--batches", default="1,8", help="comma-separated torch batch sizes")
    ap.add_argument("--threads", type=int, default=1, help="threads per backend (torch and OpenCV alike)")
    ap.add_argument("--device", default="cpu", help="also time torch on this device (e.g. cuda)")
    ap.add_argument("--gpu-batches", default="64,256", help="batch sizes timed on --device cuda")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd kernels on CPU")
    ap.add_argument("--out", type=Path, default=Path("bench/results/flow_backends.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)
    schedules = {"eager": Schedule()} | ({"compiled": Schedule(compile=True)} if args.compile else {})

    rows = []
    for size in map(int, args.sizes.split(",")):
        prev, nxt = make_pairs(size, args.pairs)
        for name, schedule in schedules.items():
            for batch in map(int, args.batches.split(",")):
                if name == "compiled":
                    run_torch(prev[:batch], nxt[:batch], "cpu", schedule)  # compile outside the timing
                r = {"size": size, "device": "cpu", "mode": name, "batch": batch, "threads": args.threads}
                rows.append(r | compare_cpu(prev, nxt, batch, schedule))
                console.log(f"{r['size']} px {r['mode']} batch {r['batch']}: done")
        if args.device.startswith("cuda"):
            dev_name = torch.cuda.get_device_name(args.device)
            for batch in map(int, args.gpu_batches.split(",")):
                for name, schedule in {"eager": Schedule.for_device("cuda"),
                                       "compiled": Schedule(10, 0.5, True)}.items():  # fmt: skip
                    r = {
                        "size": size,
                        "device": dev_name,
                        "mode": name,
                        "batch": batch,
                        "threads": args.threads,
                    }
                    rows.append(r | time_device(prev, nxt, args.device, batch, schedule, repeat=3))
                    console.log(f"{r['size']} px {r['mode']} batch {r['batch']}: done")

    table = Table(title=f"TV-L1: torch vs OpenCV, same frames ({args.threads} thread(s) each)")
    for col in ("size", "device", "mode", "batch", "OpenCV pairs/s", "torch pairs/s", "torch / OpenCV",
                "EPD mean px", "EPD max px", "identical codes"):  # fmt: skip
        table.add_column(col, justify="right")

    def fmt(r: dict, key: str, spec: str) -> str:
        return format(r[key], spec) if key in r else "–"

    for r in rows:
        table.add_row(
            str(r["size"]), r["device"], r["mode"], str(r["batch"]), fmt(r, "opencv_pairs_per_s", ".2f"),
            fmt(r, "torch_pairs_per_s", ".2f"), fmt(r, "ratio", ".2f"), fmt(r, "epd_mean", ".4f"),
            fmt(r, "epd_max", ".3f"), f"{100 * r['identical_codes']:.2f} %" if "identical_codes" in r else "–",
        )  # fmt: skip
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
