"""Benchmark: GPU TV-L1 flow, from the kernels to `memdpc preprocess flow` at a steady state, in one run.

Parts (``--parts``, all by default), side by side on the same frames and videos (real-looking synthetic
scenes with moving objects, ``preprocess.examples.synthetic``, written as real video files):

1. **kernels**: pairs/s of the fused Triton kernels (``tvl1_triton``) and of the torch port
   (``tvl1_torch``) per frame size and batch size, ``KERNEL_PAIRS`` rendered pairs tiled to the batch, after a
   warm-up call (target on one H100 at 256²: ≥ 1500 pairs/s at the best batch); ``--tiles`` first times other tiles of
   the iteration kernels and keeps the fastest. With it the **roofline**: the inner iterations each pair
   ran (counted by the kernels; "finest-level equivalent": every level's iterations weighted by its share
   of the finest level's pixels), the bytes the iteration kernels move per pair (``ITERATION_BYTES`` per
   pixel and iteration), the bandwidth the best kernel rate achieves against the card's (``--peak-gbps``),
   and the rate one pass over 16 float fields per iteration would allow at that bandwidth;
2. **fidelity** against OpenCV's CPU TV-L1 on rendered frames and on frames decoded from video files: mean
   end-point difference (target ≤ 0.02 px) and identical stored codes (target ≥ 99 %);
3. **compaction**: the Triton kernels on batches of distinct pairs decoded from the steady-state videos, as
   many as the batched stage puts in a batch (so with the stragglers of real batches), with the grid
   compaction on and off and the stop checks lagged or waited for (``tvl1_triton.Checks``);
4. **steady**: ``run_preprocess`` (flow only, the batched stage) from ``--videos`` video files of several
   lengths (mean ``--frames``; 160 × 256 give 40,800 pairs) to archives on disk, per size (the videos are
   written at the largest size and decoded to the others): the whole run's pairs/s, the steady-state
   pairs/s (pairs written per second between 10 % and 90 % of the run's pairs), seconds to the first
   finished archive, the device's busy fraction (its compute stream's spans, CUDA events, over the wall
   time), CPU cores busy (this process's CPU time over the wall time) and cores per 1000 pairs/s, the share
   of the wall time the device thread waited for frames and for the encode threads; beside it the kernels
   alone on distinct pairs of the same videos at the stage's batch size, and steady state / kernels
   (targets on one H100 at 256²: steady ≥ 1000 pairs/s and ≥ 0.85 × the kernels; whole run ≥ 900).
   ``--sequential-videos N``: the stage with one batch at a time against two in flight, on N videos at the
   largest size;
5. **projection**: from the steady state at the largest size and the cores it kept busy, the wall time of
   UCF101's and Kinetics-400's flow on one card and on eight (assumptions in :data:`DATASETS` and the
   table's notes).

    python -m bench.flow_e2e [--sizes 128,256 --batches 64,256,512 --device cuda --videos 160 --frames 256 \
        --out bench/results/flow_e2e.json]
    TRITON_INTERPRET=1 python -m bench.flow_e2e --quick --device cpu --backend torch   # checks the script

Where the GPU machine has no OpenCV contrib, make the fidelity rows' frames and OpenCV flows first on a
machine that has it (``python -m bench.flow_e2e --make-reference ref.npz``, same ``--sizes`` and
``--fidelity-pairs``), then pass ``--reference ref.npz`` on the GPU.
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import cv2
import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from bench.flow_backends import make_pairs
from memdpc.common.atomic import write_json_atomic
from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow import tvl1_torch, tvl1_triton
from memdpc.preprocess.flow.backends import (
    BatchedFlowBackend,
    batch_pairs,
    flow_to_codes,
    make_backend,
    resolve_backend,
)
from memdpc.preprocess.flow.batched import DeviceStage
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.tvl1_torch import level_sizes
from memdpc.preprocess.flow.tvl1_triton import Checks
from memdpc.preprocess.run import PreprocessConfig, run_preprocess
from memdpc.preprocess.video_index import VideoRecord

console = Console(width=200)
PARTS = ("kernels", "fidelity", "compaction", "steady", "projection")
KERNEL_PAIRS = 16  # rendered pairs of the kernel rows and the tile trials, tiled to fill each batch
ITERATION_BYTES = 4 * (11 + 10)  # float32 fields read + written per pixel by _u_kernel and _p_kernel
ONE_PASS_BYTES = 4 * 16  # the bound's model: 16 float fields per pixel and iteration, read or written once
QUICK = TVL1Params(
    scales=1, warps=1, outer_iterations=2, inner_iterations=3
)  # --quick: the interpreter is slow
PEAK_GBPS = {
    "H100 80GB HBM3": 3350,
    "H100 PCIe": 2000,
    "H100 NVL": 3900,
    "H200": 4800,
    "A100-SXM4-80GB": 2039,
}
LENGTHS = (0.5, 0.75, 1.0, 1.25, 1.5)  # the steady-state videos' lengths, × --frames, in turn (mean 1)
CHECKS = {  # the compaction part's variants of the host's stop checks
    "compaction on, checks lagged (default)": Checks(),
    "compaction off, checks lagged": Checks(compact=False),
    "compaction on, checks waited for": Checks(lagged=False),
    "compaction off, checks waited for": Checks(compact=False, lagged=False),
}
# The projection's datasets: flow pairs, and the frame size of `preprocess --size 256` (short side 256).
DATASETS = (
    ("UCF101", 13_320, 2_500_000, (341, 256)),  # 320×240 sources at 25 fps, ~7 s each
    ("Kinetics-400 train", 240_000, 240_000 * 250, (455, 256)),  # ~10 s clips, ~250 frames, mostly 16:9
)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _fill(prev: np.ndarray, nxt: np.ndarray, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    reps = -(-batch // len(prev))
    return tuple(torch.from_numpy(np.concatenate([a] * reps)[:batch]).to(device) for a in (prev, nxt))


def fns_for(params: TVL1Params, checks: Checks = Checks()) -> dict:
    """The two batched TV-L1 implementations timed here, by name."""
    return {
        "triton": lambda p, n: tvl1_triton.tvl1_flow(p, n, params, checks),
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


def time_batches(fn, batches: list[tuple[torch.Tensor, torch.Tensor]], device: str) -> float:
    """Pairs/s of ``fn`` over ``batches`` of distinct pairs, each run once (warm up first)."""
    _sync(device)
    t = time.perf_counter()
    for p, n in batches:
        fn(p, n)
    _sync(device)
    return sum(len(p) for p, _ in batches) / (time.perf_counter() - t)


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
    write_video(
        path, render_video(CLASSES[k % len(CLASSES)], size, frames, np.random.default_rng(k)), 25.0, "xvid"
    )


def make_videos(
    root: Path, n: int, frames: int, size: int, lengths: tuple[float, ...] = (1.0,)
) -> list[VideoRecord]:
    """``n`` real video files (xvid .avi) at ``size``², of ``frames`` × each of ``lengths`` frames in turn,
    and their index records."""
    paths = [root / f"v{k:03d}.avi" for k in range(n)]
    counts = [max(2, round(frames * lengths[k % len(lengths)])) for k in range(n)]
    # spawned, not forked: a child forked after OpenCV's threads have started can wait forever on their lock
    with ProcessPoolExecutor(os.cpu_count(), mp_context=get_context("spawn")) as pool:
        list(pool.map(_write_video, paths, range(n), counts, [size] * n))
    return [VideoRecord(id=p.stem, path=str(p), label=0, label_name="x", split="train") for p in paths]


def video_pairs(
    records: list[VideoRecord], n: int, per_video: int = 3, size: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` consecutive greyscale pairs decoded from the video files (``per_video`` from each; short side
    resized to ``size``, 0: as they are)."""
    prev, nxt = [], []
    for rec in records:
        frames = itertools.islice(
            VideoStream(rec.path, DecodeSpec(size=size)), min(per_video, n - len(prev)) + 1
        )
        grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in frames]
        take = len(grey) - 1
        prev += grey[:take]
        nxt += grey[1 : take + 1]
        if len(prev) >= n:
            break
    return np.stack(prev), np.stack(nxt)


def fidelity_videos(root: Path, size: int, pairs: int) -> list[VideoRecord]:
    """The fidelity rows' video files: 3 pairs from each of ⌈pairs / 3⌉ videos of 8 frames."""
    return make_videos(root / f"fidelity{size}", -(-pairs // 3), 8, size)


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Timeline:
    """The pairs a run has written over time, from ``run_preprocess``'s events (``observe``)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.points: list[tuple[float, int]] = [(0.0, 0)]  # (seconds, pairs written so far)
        self.first_archive: float | None = None

    def __call__(self, kind: str, video_id: str, n: int) -> None:
        t = time.perf_counter() - self.t0
        if kind == "units":
            self.points.append((t, self.points[-1][1] + n))
        elif kind == "done" and n and self.first_archive is None:
            self.first_archive = t

    def rate_between(self, lo: float, hi: float) -> float:
        """Pairs written per second between the moments ``lo`` and ``hi`` of all pairs were written."""
        total = self.points[-1][1]
        a = next(p for p in self.points if p[1] >= lo * total)
        b = next(p for p in self.points if p[1] >= hi * total)
        return (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else float("nan")


def distinct_batches(
    records, size: int, batch: int, count: int, device: str
) -> list[tuple[torch.Tensor, ...]]:
    """``count`` batches of ``batch`` distinct consecutive pairs decoded from the videos, on ``device``."""
    n = batch * count
    prev, nxt = video_pairs(records, n, per_video=-(-n // len(records)), size=size)
    batch = min(batch, len(prev))
    return [
        (torch.from_numpy(prev[i : i + batch]).to(device), torch.from_numpy(nxt[i : i + batch]).to(device))
        for i in range(0, len(prev) - batch + 1, batch)
    ]


def compaction_rows(batches, size: int, device: str, params: TVL1Params) -> list[dict]:
    """The Triton kernels on ``batches`` of distinct pairs with each variant of :data:`CHECKS`."""
    fns = {name: fns_for(params, checks)["triton"] for name, checks in CHECKS.items()}
    next(iter(fns.values()))(*batches[0])  # warm-up: compilation
    rows = []
    for name, fn in fns.items():
        rate = time_batches(fn, batches, device)
        rows.append(
            {
                "size": size,
                "checks": name,
                "batch": len(batches[0][0]),
                "batches": len(batches),
                "pairs_per_s": rate,
            }
        )
        console.log(f"compaction {size}² {name}: {rate:.1f} pairs/s")
    return rows


def steady_state(records, size: int, args: argparse.Namespace, out: Path, params: TVL1Params) -> dict:
    """``run_preprocess`` (flow only) of ``records`` at ``size``: its rates, first archive and where its
    time went."""
    cfg = PreprocessConfig(
        out=str(out),
        streams=("flow",),
        decode=DecodeSpec(size=size),
        tvl1=params,
        flow_backend=args.backend,
        device=args.device,
        threads=args.threads,
    )
    timeline, cpu = Timeline(), _cpu_seconds()
    report = run_preprocess(records, cfg, progress=False, observe=timeline)
    wall, cpu = time.perf_counter() - timeline.t0, _cpu_seconds() - cpu
    pairs = report.pairs()
    stage = report.flow["stage"].values()
    busy = sum(s["device_busy_seconds"] for s in stage) / len(stage) / wall
    rate = pairs / wall
    return {
        "pairs": pairs,
        "failed": report.summary.failed,
        "seconds": wall,
        "pairs_per_s": rate,
        "steady_pairs_per_s": timeline.rate_between(0.1, 0.9),
        "first_archive_s": timeline.first_archive,
        "device_busy": busy,
        "cores_busy": cpu / wall,
        "cores_per_1000": cpu / wall / (rate / 1000),
        "waited_for_frames": sum(s["waited_for_frames_seconds"] for s in stage) / len(stage) / wall,
        "waited_for_encoders": sum(s["waited_for_encoders_seconds"] for s in stage) / len(stage) / wall,
        **{f"{k}_busy": v / wall for k, v in report.summary.stage_seconds.items()},
    }


def sequential_rows(
    records, size: int, args: argparse.Namespace, out: Path, params: TVL1Params
) -> list[dict]:
    """The batched stage with one batch at a time and with two in flight, on the same videos."""
    name, device, _ = resolve_backend(args.backend, args.device)
    backend = make_backend(name, params, device.split(",")[0])
    rows = []
    for pipelined in (False, True):
        cfg = PreprocessConfig(
            out=str(out / f"pipelined-{pipelined}"),
            streams=("flow",),
            decode=DecodeSpec(size=size),
            tvl1=params,
            flow_backend=name,
            device=device,
        )
        threads = args.threads or max(2, os.cpu_count() or 1)
        stage, entries = DeviceStage(backend, cfg, threads, pipelined=pipelined), []
        t = time.perf_counter()
        stage.run(records, entries.append)
        wall = time.perf_counter() - t
        pairs = sum(e.get("streams", {}).get("flow", 0) for e in entries)
        rows.append(
            {
                "size": size,
                "in_flight": 2 if pipelined else 1,
                "videos": len(records),
                "pairs": pairs,
                "seconds": wall,
                "pairs_per_s": pairs / wall,
                "device_busy": stage.stats["device_busy_seconds"] / wall,
            }
        )
        console.log(f"batches in flight {rows[-1]['in_flight']}, {size}²: {pairs / wall:.1f} pairs/s")
    return rows


def projection(steady: dict, size: int) -> list[dict]:
    """Wall time of each of :data:`DATASETS` on one card and on eight, from the steady state at ``size``²:
    pairs/s scaled by the pixels per pair (the kernels' work and the host's JPEG and decoding grow with
    them), each card with the CPU cores the benchmark's steady state needs (its cores per 1000 pairs/s
    grow with the pixels as its pairs/s shrink: the same cores per card)."""
    rows = []
    cores = steady["cores_per_1000"] * steady["steady_pairs_per_s"] / 1000
    for name, videos, pairs, (w, h) in DATASETS:
        rate = steady["steady_pairs_per_s"] * size * size / (w * h)
        for cards in (1, 8):
            rows.append(
                {
                    "dataset": name,
                    "videos": videos,
                    "pairs": pairs,
                    "frame": f"{w}×{h}",
                    "cards": cards,
                    "pairs_per_s": rate * cards,
                    "hours": pairs / (rate * cards) / 3600,
                    "cpu_cores": cores * cards,
                }
            )
    return rows


def choose_tiles(args: argparse.Namespace, dev: str, params: TVL1Params) -> list[dict]:
    """Time each of ``--tiles`` at the largest size and batch, then keep the fastest for the rest of the run
    (``tvl1_triton.TILES``); rows of the table."""
    size, batch = max(map(int, args.sizes.split(","))), max(map(int, args.batches.split(",")))
    prev, nxt = make_pairs(size, KERNEL_PAIRS)
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
        table.add_row(*(format(r[k], spec) if r.get(k) is not None else "–" for k, spec in cols.items()))
    return table


def make_reference(args: argparse.Namespace, params: TVL1Params, saved: dict) -> None:
    """The fidelity rows' frames and OpenCV flows (rendered and decoded, per size) into
    ``--make-reference``."""
    with tempfile.TemporaryDirectory() as tmp:
        for size in map(int, args.sizes.split(",")):
            opencv_reference(
                f"{size}/rendered", *make_pairs(size, args.fidelity_pairs, seed=1), params, saved
            )
            records = fidelity_videos(Path(tmp), size, args.fidelity_pairs)
            opencv_reference(f"{size}/video", *video_pairs(records, args.fidelity_pairs), params, saved)
    args.make_reference.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.make_reference, **saved)
    console.print(f"wrote {args.make_reference}")


def kernel_part(args, dev: str, params: TVL1Params, peak, rows: dict) -> None:
    if args.tiles:
        rows["tiles"] = choose_tiles(args, dev, params)
    batches = {
        name: [int(b) for b in spec.split(",") if b]
        for name, spec in (("triton", args.batches), ("torch", args.torch_batches))
    }
    # no more pairs than the largest batch holds: --quick's roofline runs on 4
    pairs = min(KERNEL_PAIRS, max(batches["triton"] + batches["torch"], default=KERNEL_PAIRS))
    for size in map(int, args.sizes.split(",")):
        prev, nxt = make_pairs(size, pairs)
        fns = fns_for(params)
        best = 0.0
        for name, sizes in batches.items():
            for batch in sizes:
                rate = time_kernel(fns[name], prev, nxt, dev, batch, args.repeat)
                best = max(best, rate) if name == "triton" else best
                rows["kernel"].append(
                    {"size": size, "kernel": name, "batch": batch, "pairs": pairs, "pairs_per_s": rate}
                )
                console.log(f"kernel {name} {size}² batch {batch}: {rate:.1f} pairs/s")
        rows["roofline"].append(
            {"size": size, "pairs_per_s": best} | roofline(prev, nxt, dev, params, best, peak)
        )


def fidelity_part(args, dev: str, params: TVL1Params, saved: dict, tmp: Path, rows: dict) -> None:
    for size in map(int, args.sizes.split(",")):
        frames = opencv_reference(
            f"{size}/rendered", *make_pairs(size, args.fidelity_pairs, seed=1), params, saved
        )
        rows["fidelity"].append({"size": size, "frames": "rendered"} | fidelity(*frames, dev, params))
        key = f"{size}/video"
        pairs = (
            (None, None)
            if f"{key}/flow" in saved
            else video_pairs(fidelity_videos(tmp, size, args.fidelity_pairs), args.fidelity_pairs)
        )
        frames = opencv_reference(key, *pairs, params, saved)
        rows["fidelity"].append({"size": size, "frames": "video files"} | fidelity(*frames, dev, params))


def video_part(args, dev: str, params: TVL1Params, parts: set[str], tmp: Path, rows: dict, save) -> None:
    """The compaction, steady-state and projection parts, on one set of video files, largest size first
    (``save`` after each size: a run stopped by its time limit keeps what it measured)."""
    sizes = sorted(map(int, args.sizes.split(",")), reverse=True)
    records = make_videos(tmp / "videos", args.videos, args.frames, sizes[0], LENGTHS)
    name, device, _ = resolve_backend(args.backend, dev)
    backend = make_backend(name, params, device.split(",")[0])
    if not isinstance(backend, BatchedFlowBackend):
        raise SystemExit(
            f"--backend {args.backend} on {dev} is {name}: the batched stage needs torch or triton"
        )
    for size in sizes:
        batch = min(batch_pairs(backend, size, size), args.distinct_pairs or batch_pairs(backend, size, size))
        batches = distinct_batches(records, size, batch, args.distinct_batches, dev)
        if "compaction" in parts:
            rows["compaction"] += compaction_rows(batches, size, dev, params)
            save()
        if "steady" not in parts:
            continue
        kernel = fns_for(params)[name]
        kernel(*batches[0])  # warm-up
        kernel_rate = time_batches(kernel, batches, dev)
        r = steady_state(records, size, args, tmp / f"out-{size}", params)
        rows["steady"].append(
            {
                "size": size,
                "backend": name,
                "device": device,
                "videos": len(records),
                "batch": len(batches[0][0]),
                **r,
                "kernel_pairs_per_s": kernel_rate,
                "steady_over_kernel": r["steady_pairs_per_s"] / kernel_rate,
            }
        )
        console.log(
            f"steady {size}²: {r['steady_pairs_per_s']:.1f} pairs/s (whole run {r['pairs_per_s']:.1f}, "
            f"kernels alone {kernel_rate:.1f})"
        )
        if "projection" in parts and size == sizes[0]:
            rows["projection"] = projection(rows["steady"][0], size)
        save()
    if args.sequential_videos and "steady" in parts:
        rows["in_flight"] = sequential_rows(
            records[: args.sequential_videos], sizes[0], args, tmp / "seq", params
        )
        save()


def print_tables(rows: dict, card: str) -> None:
    if rows.get("tiles"):
        console.print(
            _table(
                f"Iteration-kernel tiles on {card} (the fastest used below)",
                rows["tiles"],
                {"size": "d", "batch": "d", "tile": "s", "warps": "d", "pairs_per_s": ".1f"},
            )
        )
    if rows["kernel"]:
        console.print(
            _table(
                f"Kernels on {card} ({rows['kernel'][0]['pairs']} rendered pairs tiled)",
                rows["kernel"],
                {"size": "d", "kernel": "s", "batch": "d", "pairs_per_s": ".1f"},
            )
        )
        console.print(
            _table(
                f"Roofline of the Triton iteration kernels on {card}",
                rows["roofline"],
                {
                    "size": "d",
                    "pairs_per_s": ".1f",
                    "iterations_mean": ".0f",
                    "iterations_min": ".0f",
                    "iterations_max": ".0f",
                    "mb_per_pair": ".1f",
                    "achieved_gbps": ".0f",
                    "peak_gbps": ".0f",
                    "share_of_peak": ".1%",
                    "one_pass_bound_pairs_per_s": ".0f",
                },
            )
        )
    if rows["fidelity"]:
        console.print(
            _table(
                f"Fidelity: Triton on {card} vs OpenCV CPU",
                rows["fidelity"],
                {
                    "size": "d",
                    "frames": "s",
                    "pairs": "d",
                    "iterations_mean": ".0f",
                    "epd_mean": ".4f",
                    "epd_max": ".3f",
                    "identical_codes": ".2%",
                    "flow_magnitude_mean": ".3f",
                },
            )
        )
    if rows["compaction"]:
        console.print(
            _table(
                f"Triton kernels on batches of distinct decoded pairs on {card}",
                rows["compaction"],
                {"size": "d", "checks": "s", "batch": "d", "batches": "d", "pairs_per_s": ".1f"},
            )
        )
    if rows["steady"]:
        console.print(
            _table(
                "End to end: video files → flow archives (preprocess flow, the batched stage)",
                rows["steady"],
                {
                    "size": "d",
                    "backend": "s",
                    "videos": "d",
                    "pairs": "d",
                    "failed": "d",
                    "batch": "d",
                    "seconds": ".1f",
                    "pairs_per_s": ".1f",
                    "steady_pairs_per_s": ".1f",
                    "kernel_pairs_per_s": ".1f",
                    "steady_over_kernel": ".2f",
                    "first_archive_s": ".1f",
                },
            )
        )
        console.print(
            _table(
                "… where its time went (per wall second)",
                rows["steady"],
                {
                    "size": "d",
                    "device_busy": ".1%",
                    "cores_busy": ".1f",
                    "cores_per_1000": ".2f",
                    "waited_for_frames": ".1%",
                    "waited_for_encoders": ".1%",
                    "flow_busy": ".2f",
                    "decode_busy": ".2f",
                    "encode_busy": ".2f",
                },
            )
        )
        console.print(
            "pairs_per_s: the whole run; steady: pairs written per second between 10 % and 90 % of "
            "them; kernel: the kernels alone on batches of distinct pairs of the same videos, the "
            "stage's batch; device_busy: the compute stream's busy time (CUDA events); cores_per_1000: "
            "CPU cores busy per 1000 pairs/s (whole run); waited_for_*: the device thread's waits; "
            "*_busy: the report's stage seconds, summed over threads"
        )
    if rows.get("in_flight"):
        console.print(
            _table(
                "The batched stage with one batch and with two batches in flight",
                rows["in_flight"],
                {
                    "size": "d",
                    "in_flight": "d",
                    "videos": "d",
                    "pairs": "d",
                    "seconds": ".1f",
                    "pairs_per_s": ".1f",
                    "device_busy": ".1%",
                },
            )
        )
    if rows.get("projection"):
        size = rows["steady"][0]["size"]
        console.print(
            _table(
                f"Projection from the steady state at {size}²",
                rows["projection"],
                {
                    "dataset": "s",
                    "videos": ",d",
                    "pairs": ",d",
                    "frame": "s",
                    "cards": "d",
                    "pairs_per_s": ".0f",
                    "hours": ".1f",
                    "cpu_cores": ".0f",
                },
            )
        )
        console.print(
            "Assumptions: flow only (RGB archives add their JPEG encoding to the host's work); pairs/s "
            f"scaled from {size}² by the pixels per pair; each card with the CPU cores the steady "
            "state needs here (cpu_cores: for all cards); decoding these xvid files stands in for the "
            "datasets' codecs; eight cards are eight times one (a process per card, nothing shared)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated parts: {', '.join(PARTS)}")
    ap.add_argument("--sizes", default="128,256", help="comma-separated frame sizes (square)")
    ap.add_argument("--batches", default="64,256,512", help="comma-separated kernel batch sizes")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=3, help="timed batches per kernel measurement")
    ap.add_argument("--torch-batches", default="64", help="batch sizes timed for the torch port (none: '')")
    ap.add_argument("--fidelity-pairs", type=int, default=8, help="pairs per fidelity row (OpenCV is slow)")
    ap.add_argument("--videos", type=int, default=160, help="video files of the steady state and compaction")
    ap.add_argument("--frames", type=int, default=256, help="their mean length, in frames (×0.5 … ×1.5)")
    ap.add_argument("--backend", default="auto", help="the steady state's flow backend (auto: as preprocess)")
    ap.add_argument(
        "--threads", type=int, default=0, help="the stage's decode and encode threads (0: default)"
    )
    ap.add_argument("--distinct-batches", type=int, default=3, help="batches of distinct pairs per variant")
    ap.add_argument("--distinct-pairs", type=int, default=0, help="pairs per such batch (0: the stage's)")
    ap.add_argument("--sequential-videos", type=int, default=0, help="videos of the one-batch-at-a-time row")
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
        args.sizes, args.batches, args.torch_batches, args.repeat = "32,24", "2,4", "4", 1
        args.fidelity_pairs, args.videos, args.frames = 2, 4, 6
        args.distinct_batches, args.distinct_pairs = 1, 2
        args.sequential_videos = args.sequential_videos and 2
        args.tiles = args.tiles and "64x64x4"
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        raise SystemExit(
            f"--parts: unknown {', '.join(sorted(parts - set(PARTS)))} (choose from {', '.join(PARTS)})"
        )
    dev = args.device
    params = QUICK if args.quick else TVL1Params()
    card = torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "CPU (Triton interpreter)"
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in card), None)
    console.print(f"device: {card}; peak bandwidth: {peak or 'unknown'} GB/s; {os.cpu_count()} CPU cores")
    cv2.setNumThreads(os.cpu_count() or 1)
    rows: dict[str, list[dict]] = {
        part: [] for part in ("kernel", "roofline", "fidelity", "compaction", "steady")
    }
    saved = dict(np.load(args.reference)) if args.reference else {}
    if saved.setdefault("params", np.array(repr(params))) != repr(params):
        raise SystemExit(f"{args.reference}: made with other TV-L1 parameters ({saved['params']})")
    if args.make_reference:
        make_reference(args, params, saved)
        return

    def save() -> None:
        tiles = tvl1_triton.TILES[torch.device(dev).type]
        write_json_atomic(
            args.out,
            {
                "device": card,
                "cpu_cores": os.cpu_count(),
                "tiles_used": tiles,
                "args": {k: str(v) for k, v in vars(args).items()},
                **rows,
            },
        )

    with tempfile.TemporaryDirectory() as tmp:
        if "kernels" in parts:
            kernel_part(args, dev, params, peak, rows)
            save()
        if "fidelity" in parts:
            fidelity_part(args, dev, params, saved, Path(tmp), rows)
            save()
        if parts & {"compaction", "steady", "projection"}:
            video_part(args, dev, params, parts, Path(tmp), rows, save)
    print_tables(rows, card)
    save()
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
