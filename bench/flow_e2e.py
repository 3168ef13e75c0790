"""Benchmark: GPU TV-L1 flow, from the kernels to `memdpc preprocess flow` end to end, in one run.

Four tables, side by side on the same frames and videos (real-looking synthetic scenes with moving objects,
``preprocess.examples.synthetic``, written as real video files for the end-to-end part):

1. **kernel**: pairs/s of the fused Triton kernels (``tvl1_triton``) and of the torch port (``tvl1_torch``)
   per frame size and batch size, after a warm-up call (targets on one H100 at 256²: ≥ 1500 pairs/s at the
   best batch): 16 pairs tiled to the batch, and a batch of distinct pairs decoded from the video files
   (with a real batch's stragglers); ``--tiles`` first times other tiles of the iteration kernels and
   keeps the fastest;
2. **roofline**: the inner iterations each pair ran (counted by the kernels; "finest-level equivalent":
   every level's iterations weighted by its share of the finest level's pixels), the bytes the iteration
   kernels move per pair (``ITERATION_BYTES`` per pixel and iteration), the bandwidth that the best kernel
   rate achieves against the card's (``--peak-gbps``), and the rate a single pass over 16 float fields
   per iteration would allow at the card's bandwidth (the bound the target was set from);
3. **fidelity** against OpenCV's CPU TV-L1 on the benchmark frames and on frames decoded from the video
   files: mean end-point difference (target ≤ 0.02 px) and identical stored codes (target ≥ 99 %);
4. **end to end**: ``run_preprocess`` (flow only) from the video files to archives on disk, per backend,
   device and worker count, in pairs/s (target on one H100 at 256²: ≥ 1000).

    python bench/flow_e2e.py [--sizes 128,256 --batches 16,64,256 --device cuda --videos 32 --frames 64 \
        --cpu-workers 1,16 --torch-videos 4 --out bench/results/flow_e2e.json]
    TRITON_INTERPRET=1 python bench/flow_e2e.py --quick     # a check of the script on a CPU (slow kernels)

Where the GPU machine has no OpenCV contrib, make the fidelity rows' frames and OpenCV flows first on a
machine that has it (``python bench/flow_e2e.py --make-reference ref.npz``, same ``--sizes``, ``--frames``
and ``--fidelity-pairs``), then pass ``--reference ref.npz`` on the GPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from memdpc.atomic import write_json_atomic
from memdpc.bench.flow_backends import make_pairs
from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow import tvl1_torch, tvl1_triton
from memdpc.preprocess.flow.backends import flow_to_codes
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.tvl1_torch import level_sizes
from memdpc.preprocess.run import PreprocessConfig, run_preprocess
from memdpc.preprocess.video_index import VideoRecord

console = Console(width=170)
ITERATION_BYTES = 4 * (11 + 10)  # float32 fields read + written per pixel by _u_kernel and _p_kernel
ONE_PASS_BYTES = 4 * 16  # the bound's model: 16 float fields per pixel and iteration, read or written once
QUICK = TVL1Params(
    scales=2, warps=1, outer_iterations=2, inner_iterations=5
)  # --quick: the interpreter is slow
PEAK_GBPS = {
    "H100 80GB HBM3": 3350,
    "H100 PCIe": 2000,
    "H100 NVL": 3900,
    "H200": 4800,
    "A100-SXM4-80GB": 2039,
}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _fill(prev: np.ndarray, nxt: np.ndarray, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    reps = -(-batch // len(prev))
    return tuple(torch.from_numpy(np.concatenate([a] * reps)[:batch]).to(device) for a in (prev, nxt))


def fns_for(params: TVL1Params) -> dict:
    """The two batched TV-L1 implementations timed here, by name."""
    return {
        "triton": lambda p, n: tvl1_triton.tvl1_flow(p, n, params),
        "torch": lambda p, n: tvl1_torch.tvl1_flow(p, n, params),
    }


def time_kernel(fn, prev, nxt, device: str, batch: int, repeat: int) -> float:
    """Pairs/s of ``fn`` on batches of ``batch`` pairs (the frames tiled to fill a batch), after a warm-up."""
    p, n = _fill(prev, nxt, batch, device)
    fn(p, n)  # warm-up: compilation, allocator
    _sync(device)
    t = time.perf_counter()
    for _ in range(repeat):
        fn(p, n)
    _sync(device)
    return batch * repeat / (time.perf_counter() - t)


def flow_and_iterations(prev, nxt, device: str, params: TVL1Params) -> tuple[np.ndarray, torch.Tensor]:
    """The kernels' flow of NumPy pairs, and each pair's pixel-iterations (every level's inner iterations
    times its pixel count), float64 (B,)."""
    p, n = (torch.from_numpy(a).to(device) for a in (prev, nxt))
    flow, counts = tvl1_triton.tvl1_flow_with_iterations(p, n, params)
    pixels = torch.tensor([a * b for a, b in level_sizes(*prev.shape[1:], params)], dtype=torch.float64)
    return flow.cpu().numpy(), (counts.cpu().double() * pixels[:, None]).sum(0)


def roofline(prev, nxt, device: str, params: TVL1Params, kernel_rate: float, peak_gbps: float | None) -> dict:
    """Iterations per pair, bytes moved per pair, achieved bandwidth at ``kernel_rate`` pairs/s."""
    per_pair = flow_and_iterations(prev, nxt, device, params)[1]
    finest = per_pair / (prev.shape[1] * prev.shape[2])
    bytes_per_pair = float(per_pair.mean()) * ITERATION_BYTES
    achieved = bytes_per_pair * kernel_rate / 1e9
    out = {
        "iterations_mean": float(finest.mean()),
        "iterations_min": float(finest.min()),
        "iterations_max": float(finest.max()),
        "mb_per_pair": bytes_per_pair / 1e6,
        "achieved_gbps": achieved,
    }
    if peak_gbps:
        out |= {
            "peak_gbps": peak_gbps,
            "share_of_peak": achieved / peak_gbps,
            "one_pass_bound_pairs_per_s": peak_gbps * 1e9 / (float(per_pair.mean()) * ONE_PASS_BYTES),
        }
    return out


def opencv_reference(key: str, prev, nxt, params: TVL1Params, saved: dict):
    """The frames and OpenCV's flow for fidelity row ``key``: from ``saved`` (a ``--reference`` file made
    on a machine with OpenCV contrib) when it has them, else computed now and added to ``saved``."""
    if f"{key}/flow" not in saved:
        saved |= {
            f"{key}/prev": prev,
            f"{key}/next": nxt,
            f"{key}/flow": tvl1_torch.opencv_flow(prev, nxt, params),
        }
    return saved[f"{key}/prev"], saved[f"{key}/next"], saved[f"{key}/flow"]


def fidelity(prev, nxt, ref, device: str, params: TVL1Params) -> dict:
    """The Triton kernels against OpenCV's CPU TV-L1 flow ``ref`` of the same pairs (and the iterations the
    pairs took, finest-level equivalent)."""
    ours, per_pair = flow_and_iterations(prev, nxt, device, params)
    epd = np.linalg.norm(ours - ref, axis=-1)
    return {
        "pairs": len(prev),
        "iterations_mean": float(per_pair.mean()) / (prev.shape[1] * prev.shape[2]),
        "epd_mean": float(epd.mean()),
        "epd_max": float(epd.max()),
        "identical_codes": float((flow_to_codes(ours) == flow_to_codes(ref))[..., :2].mean()),
        "flow_magnitude_mean": float(np.linalg.norm(ref, axis=-1).mean()),
    }


def _write_video(path: Path, k: int, frames: int, size: int) -> None:
    write_video(path, render_video(CLASSES[k % len(CLASSES)], size, frames, np.random.default_rng(k)), 25.0, "xvid")


def make_videos(root: Path, n: int, frames: int, size: int) -> list[VideoRecord]:
    """``n`` real video files (xvid .avi) of ``frames`` frames at ``size``², and their index records."""
    paths = [root / f"v{k:03d}.avi" for k in range(n)]
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(_write_video, paths, range(n), [frames] * n, [size] * n))
    return [VideoRecord(id=p.stem, path=str(p), label=0, label_name="x", split="train") for p in paths]


def video_pairs(records: list[VideoRecord], n: int, per_video: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """``n`` consecutive greyscale pairs decoded from the video files (``per_video`` from each)."""
    prev, nxt = [], []
    for rec in records:
        grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in VideoStream(rec.path, DecodeSpec(size=0))]
        take = min(per_video, n - len(prev))
        prev += grey[:take]
        nxt += grey[1 : take + 1]
        if len(prev) >= n:
            break
    return np.stack(prev), np.stack(nxt)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def end_to_end(records, backend: str, device: str, workers: int, out: Path, params: TVL1Params) -> dict:
    """Pairs/s of ``run_preprocess`` (flow only) from video files to archives on disk, and where the time
    went: CPU cores busy on average (this process and its workers), and the report's stage seconds (summed
    over threads: the flow stage's share of the device thread, JPEG encoding, decoding) per wall second."""
    cfg = PreprocessConfig(out=str(out), streams=("flow",), decode=DecodeSpec(size=0), tvl1=params,
                           flow_backend=backend, device=device, workers=workers)  # fmt: skip
    t, cpu = time.perf_counter(), _cpu_seconds()
    report = run_preprocess(records, cfg, progress=False)
    wall, cpu = time.perf_counter() - t, _cpu_seconds() - cpu
    pairs = sum(v.get("streams", {}).get("flow", 0) for v in report["videos"])
    failed = sum(v["status"] == "failed" for v in report["videos"])
    stages = report["summary"]["stage_seconds"]
    return {"pairs": pairs, "seconds": wall, "pairs_per_s": pairs / wall, "failed": failed,
            "cores_busy": cpu / wall, **{f"{k}_busy": v / wall for k, v in stages.items()}}  # fmt: skip


def choose_tiles(args: argparse.Namespace, dev: str, params: TVL1Params) -> list[dict]:
    """Time each of ``--tiles`` at the largest size and batch, then keep the fastest for the rest of the run
    (``tvl1_triton.TILES``); rows of the table."""
    size, batch = max(map(int, args.sizes.split(","))), max(map(int, args.batches.split(",")))
    prev, nxt = make_pairs(size, 16)
    kind = torch.device(dev).type
    run = tvl1_triton.TILES[kind][3]
    rows = []
    for spec in args.tiles.split(","):
        bh, bw, warps = map(int, spec.split("x"))
        tvl1_triton.TILES[kind] = (bh, bw, warps, run)
        rate = time_kernel(fns_for(params)["triton"], prev, nxt, dev, batch, args.repeat)
        rows.append({"size": size, "batch": batch, "tile": f"{bh}×{bw}", "warps": warps, "pairs_per_s": rate})
        console.log(f"tile {bh}×{bw}, {warps} warps: {rate:.1f} pairs/s")
    best = max(rows, key=lambda r: r["pairs_per_s"])
    tvl1_triton.TILES[kind] = (*map(int, best["tile"].split("×")), best["warps"], run)
    return rows


def _table(title: str, rows: list[dict], cols: dict[str, str]) -> Table:
    table = Table(title=title)
    for name in cols:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(*(format(r[k], spec) if k in r else "–" for k, spec in cols.items()))
    return table


def make_reference(args: argparse.Namespace, params: TVL1Params, saved: dict) -> None:
    """The fidelity rows' frames and OpenCV flows (rendered and decoded, per size) into ``--make-reference``."""
    with tempfile.TemporaryDirectory() as tmp:
        for size in map(int, args.sizes.split(",")):
            opencv_reference(
                f"{size}/rendered", *make_pairs(size, args.fidelity_pairs, seed=1), params, saved
            )
            records = make_videos(Path(tmp) / f"videos{size}", args.videos, args.frames, size)
            opencv_reference(f"{size}/video", *video_pairs(records, args.fidelity_pairs), params, saved)
    args.make_reference.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.make_reference, **saved)
    console.print(f"wrote {args.make_reference}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="128,256", help="comma-separated frame sizes (square)")
    ap.add_argument("--batches", default="16,64,256", help="comma-separated kernel batch sizes")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=3, help="timed batches per kernel measurement")
    ap.add_argument("--torch-batches", default="64", help="batch sizes timed for the torch port")
    ap.add_argument("--fidelity-pairs", type=int, default=8, help="pairs per fidelity row (OpenCV is slow)")
    ap.add_argument("--videos", type=int, default=32, help="video files for the end-to-end run")
    ap.add_argument("--frames", type=int, default=64, help="frames per video")
    ap.add_argument("--cpu-workers", default=f"1,{os.cpu_count()}", help="OpenCV worker counts, end to end")
    ap.add_argument(
        "--cpu-videos", type=int, default=0, help="videos for the OpenCV runs (0: --cpu-workers' max)"
    )
    ap.add_argument(
        "--torch-videos", type=int, default=4, help="videos for the torch port's runs (it is the slow baseline)"
    )
    ap.add_argument(
        "--peak-gbps", type=float, default=0.0, help="the card's memory bandwidth (default: by name)"
    )
    ap.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="frames and OpenCV flows for the fidelity rows, from --make-reference",
    )
    ap.add_argument(
        "--make-reference",
        type=Path,
        default=None,
        help="only compute the fidelity rows' frames and OpenCV flows into this .npz, then stop",
    )
    ap.add_argument(
        "--tiles",
        default="",
        help="iteration-kernel tiles to try first, ROWSxCOLSxWARPS,… (the fastest is used for the rest)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes: checks the script, measures nothing")
    ap.add_argument("--out", type=Path, default=Path("bench/results/flow_e2e.json"))
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.batches, args.torch_batches, args.repeat = "32", "2,4", "4", 1
        args.fidelity_pairs, args.videos, args.frames, args.cpu_workers = 2, 2, 4, "1"
        args.tiles = args.tiles and "64x64x4"
    dev = args.device
    params = QUICK if args.quick else TVL1Params()
    card = torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "CPU (Triton interpreter)"
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in card), None)
    console.print(f"device: {card}; peak bandwidth: {peak or 'unknown'} GB/s")
    cv2.setNumThreads(os.cpu_count() or 1)
    rows: dict[str, list[dict]] = {"kernel": [], "roofline": [], "fidelity": [], "end_to_end": []}
    saved = dict(np.load(args.reference)) if args.reference else {}
    if saved.setdefault("params", np.array(repr(params))) != repr(params):
        raise SystemExit(f"{args.reference}: made with other TV-L1 parameters ({saved['params']})")
    if args.make_reference:
        make_reference(args, params, saved)
        return
    has_opencv_tvl1 = hasattr(cv2, "optflow")

    if args.tiles:
        rows["tiles"] = choose_tiles(args, dev, params)
    for size in map(int, args.sizes.split(",")):
        prev, nxt = make_pairs(size, 16)
        fns = fns_for(params)
        best = 0.0
        for name, batches in (("triton", args.batches), ("torch", args.torch_batches)):
            for batch in map(int, batches.split(",")):
                rate = time_kernel(fns[name], prev, nxt, dev, batch, args.repeat)
                best = max(best, rate) if name == "triton" else best
                rows["kernel"].append({"size": size, "kernel": name, "batch": batch, "pairs_per_s": rate})
                console.log(f"kernel {name} {size}² batch {batch}: {rate:.1f} pairs/s")
        rows["roofline"].append(
            {"size": size, "pairs_per_s": best} | roofline(prev, nxt, dev, params, best, peak)
        )
        frames = opencv_reference(f"{size}/rendered", *make_pairs(size, args.fidelity_pairs, seed=1), params,
                                  saved)  # fmt: skip
        rows["fidelity"].append({"size": size, "frames": "rendered"} | fidelity(*frames, dev, params))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for size in map(int, args.sizes.split(",")):
            records = make_videos(tmp / f"videos{size}", args.videos, args.frames, size)
            frames = opencv_reference(f"{size}/video", *video_pairs(records, args.fidelity_pairs), params,
                                      saved)  # fmt: skip
            rows["fidelity"].append({"size": size, "frames": "video files"} | fidelity(*frames, dev, params))
            # The kernel rows tile 16 pairs; a batch of distinct pairs also has the stragglers of real batches
            batch = max(map(int, args.batches.split(",")))
            distinct = video_pairs(records, batch, per_video=-(-batch // len(records)))
            rate = time_kernel(fns_for(params)["triton"], *distinct, dev, batch, args.repeat)
            rows["kernel"].append({"size": size, "kernel": "triton, distinct video pairs", "batch": batch,
                                   "pairs_per_s": rate})  # fmt: skip
            console.log(f"kernel triton {size}² batch {batch} of {len(distinct[0])} distinct video pairs: {rate:.1f}")
            runs = (
                [("triton", dev, 1), ("torch", dev, 1)] if dev.startswith("cuda") else [("triton", "cpu", 1)]
            )
            if has_opencv_tvl1:
                runs += [("opencv", "cpu", int(w)) for w in args.cpu_workers.split(",")]
            else:
                console.print("OpenCV contrib (cv2.optflow) is not installed: no OpenCV end-to-end rows")
            for backend, device, workers in runs:
                subset = records
                if backend == "opencv":
                    subset = records[: args.cpu_videos or max(int(w) for w in args.cpu_workers.split(","))]
                elif backend == "torch":
                    subset = records[: args.torch_videos]
                out = tmp / f"out-{size}-{backend}-{workers}"
                r = end_to_end(subset, backend, device, workers, out, params)
                rows["end_to_end"].append({"size": size, "backend": backend, "device": device,
                                           "workers": workers, "videos": len(subset)} | r)  # fmt: skip
                console.log(f"end to end {backend} {size}² workers {workers}: {r['pairs_per_s']:.1f} pairs/s")

    if "tiles" in rows:
        console.print(_table(f"Iteration-kernel tiles on {card} (the fastest used below)", rows["tiles"],
                             {"size": "d", "batch": "d", "tile": "s", "warps": "d", "pairs_per_s": ".1f"}))
    console.print(_table(f"Kernels on {card}", rows["kernel"],
                         {"size": "d", "kernel": "s", "batch": "d", "pairs_per_s": ".1f"}))  # fmt: skip
    console.print(_table(f"Roofline of the Triton iteration kernels on {card}", rows["roofline"], {
        "size": "d", "pairs_per_s": ".1f", "iterations_mean": ".0f", "iterations_min": ".0f",
        "iterations_max": ".0f", "mb_per_pair": ".1f", "achieved_gbps": ".0f", "peak_gbps": ".0f",
        "share_of_peak": ".1%", "one_pass_bound_pairs_per_s": ".0f"}))  # fmt: skip
    console.print(_table(f"Fidelity: Triton on {card} vs OpenCV CPU", rows["fidelity"], {
        "size": "d", "frames": "s", "pairs": "d", "iterations_mean": ".0f", "epd_mean": ".4f", "epd_max": ".3f",
        "identical_codes": ".2%", "flow_magnitude_mean": ".3f"}))  # fmt: skip
    console.print(_table("End to end: video files → flow archives", rows["end_to_end"], {
        "size": "d", "backend": "s", "device": "s", "workers": "d", "videos": "d", "pairs": "d",
        "seconds": ".1f", "pairs_per_s": ".1f", "failed": "d", "cores_busy": ".1f", "flow_busy": ".2f",
        "encode_busy": ".1f", "decode_busy": ".1f"}))  # fmt: skip
    tiles = tvl1_triton.TILES[torch.device(dev).type]
    write_json_atomic(args.out, {"device": card, "tiles_used": tiles,
                                 "args": {k: str(v) for k, v in vars(args).items()}, **rows})  # fmt: skip
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
