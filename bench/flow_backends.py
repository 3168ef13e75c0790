"""Benchmark: the TV-L1 backends against OpenCV's CPU TV-L1 on the same frames.

Real-looking frames (textured scenes with moving objects, ``preprocess.examples.synthetic``), consecutive
greyscale pairs.

``--native``: the native (numba) TV-L1 against OpenCV, per core and with 1 and 2 worker processes, at each
frame size: pairs/s per core from each backend's CPU time (``time.thread_time``, not affected by other
processes' load the way wall time is; best of ``--rounds`` interleaved rounds), pairs/s of a pool of 1 and 2
spawned workers on the wall clock (best of ``--rounds``, alternating; the 1-minute load average is recorded
beside each run) and the 2 workers' speed-up also by their CPU time (what it is where both have a core of
their own), fidelity (pairs whose flow is OpenCV's to the bit, end-point difference, identical stored codes)
on the rendered pairs and on pairs decoded from xvid video files; the native code's compile time with an
empty numba cache and its load time from the cache (fresh processes); and the quickstart's preprocessing step
(its synthetic videos, RGB + flow, 2 workers) with ``--flow-backend opencv`` and ``native``: wall time and the
flow stage's seconds. Targets: ≥ 4× OpenCV per core at 128² and 256², ≥ 2× at 64²; 2 workers ≥ 1.8× one.

    python -m bench.flow_backends --native [--sizes 64,128,256 --pairs 8 --rounds 3 \
        --out bench/results/flow_native.json]

Otherwise, the batched PyTorch TV-L1: for each frame size and torch batch size it times both backends on one
core each (``torch.set_num_threads`` / ``cv2.setNumThreads``), interleaving them chunk by chunk so that load
from other processes hits both alike, and reports pairs/s, the ratio (target ≥ 0.8 on CPU), the mean / max
end-point difference between the two flows (target mean ≤ 0.02 px) and the share of identical stored
uint8 codes after the ±20 px clip and mapping (target ≥ 90 %). With ``--device cuda`` it also times the
GPU (target ≥ 500 pairs/s at 256² on one H100), after a warm-up call.

    python -m bench.flow_backends [--sizes 128,256 --pairs 8 --batches 1,8 --threads 1 --device cpu \
        --compile --out bench/results/flow_backends.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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

from memdpc.common.atomic import write_json_atomic
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow.backends import flow_to_codes, make_backend
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.tvl1_torch import Schedule, tvl1_flow
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import hold_out, read_index, write_index
from memdpc.quickstart import PROFILES

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


# ------------------------------------------------------------------------------- native vs OpenCV (--native)
CPU_BACKENDS = ("opencv", "native")
_WORKER: dict = {}


def decoded_pairs(root: Path, size: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` greyscale pairs (frames 1 and 2) decoded from xvid files of rendered videos of different classes."""
    prev, nxt = [], []
    for k in range(n):
        path = root / f"{size}-{k}.avi"
        write_video(
            path,
            render_video(CLASSES[k % len(CLASSES)], size, 4, np.random.default_rng(100 + k)),
            25.0,
            "xvid",
        )
        cap = cv2.VideoCapture(str(path))
        frames = [cv2.cvtColor(cap.read()[1], cv2.COLOR_BGR2GRAY) for _ in range(3)]
        prev.append(frames[1])
        nxt.append(frames[2])
    return np.stack(prev), np.stack(nxt)


def fidelity(ours: np.ndarray, ref: np.ndarray) -> dict:
    """Pairs whose flow is the reference's to the bit, end-point difference, identical stored codes."""
    epd = np.linalg.norm(ours - ref, axis=-1)
    same = [a.tobytes() == b.tobytes() for a, b in zip(ours, ref, strict=True)]
    return {
        "identical_pairs": int(sum(same)),
        "pairs": len(same),
        "epd_mean": float(epd.mean()),
        "epd_max": float(epd.max()),
        "identical_codes": float((flow_to_codes(ours) == flow_to_codes(ref))[..., :2].mean()),
    }


def per_core(prev: np.ndarray, nxt: np.ndarray, rounds: int) -> tuple[dict, dict]:
    """Pairs/s per core of each CPU backend (best of ``rounds`` interleaved rounds, by CPU time), and its flows."""
    backends = {name: make_backend(name, TVL1Params()) for name in CPU_BACKENDS}
    best, flows = dict.fromkeys(CPU_BACKENDS, float("inf")), {}
    for _ in range(rounds):
        for name, backend in backends.items():
            t = time.thread_time()
            flows[name] = backend(prev, nxt)
            best[name] = min(best[name], time.thread_time() - t)
    return {f"{name}_pairs_per_s_core": len(prev) / best[name] for name in CPU_BACKENDS}, flows


def _init_worker(name: str, barrier) -> None:
    cv2.setNumThreads(1)  # as the preprocessing workers
    _WORKER.update(backend=make_backend(name, TVL1Params()), barrier=barrier)


def _started(_: int) -> int:
    _WORKER["barrier"].wait(timeout=300)  # one task per worker: returns once every worker has started
    return os.getpid()


def _flows(prev: np.ndarray, nxt: np.ndarray) -> tuple[int, float]:
    t = time.thread_time()
    _WORKER["backend"](prev, nxt)
    return len(prev), time.thread_time() - t


def pool_rate(name: str, prev: np.ndarray, nxt: np.ndarray, workers: int, reps: int) -> dict:
    """Pairs/s (wall clock) of ``workers`` spawned processes running backend ``name`` on the pairs ``reps``
    times over, in 4 tasks per worker; the workers start and load the backend before the clock starts. Also pairs
    per CPU-second of the workers: where the machine's other work takes cores away, the wall clock cannot show
    how the workers scale, but a CPU-second costing as many pairs with 2 workers as with 1 shows that they do not
    slow each other down (through shared caches or memory bandwidth)."""
    tasks = 4 * workers  # few enough that handing them out costs little, enough to keep every worker busy
    prev, nxt = np.concatenate([prev] * reps), np.concatenate([nxt] * reps)
    jobs = [
        (a, b) for a, b in zip(np.array_split(prev, tasks), np.array_split(nxt, tasks), strict=True) if len(a)
    ]
    ctx = get_context("spawn")
    init = (name, ctx.Barrier(workers))
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=init) as ex:
        assert len(set(ex.map(_started, range(workers)))) == workers
        load = os.getloadavg()[0]
        t = time.perf_counter()
        done, cpu = np.sum(list(ex.map(_flows, *zip(*jobs, strict=True))), axis=0)
        wall = time.perf_counter() - t
    return {"pairs_per_s": done / wall, "pairs_per_cpu_s": done / cpu, "load_before": load}


_COMPILE = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from memdpc.preprocess.flow import tvl1_native
t1 = time.perf_counter()
frame = np.zeros((32, 32), np.uint8)
tvl1_native.tvl1_flow(frame, frame)
print(json.dumps({"import_s": t1 - t0, "first_pair_s": time.perf_counter() - t1}))
"""


def compile_times() -> dict:
    """Import time and first pair's time of the native code in a fresh process: with an empty numba cache
    (compilation), then again with the cache it wrote (loading)."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for key in ("cold", "cached"):
            run = subprocess.run(
                [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, check=True
            )
            out[key] = json.loads(run.stdout)
    return out


def quickstart_flow_stage(root: Path, workers: int) -> list[dict]:
    """The quickstart's preprocessing step (its synthetic videos and TV-L1 settings, RGB + flow) with the
    opencv backend and with ``auto`` (native on a machine without CUDA): wall time, the flow stage's seconds
    (summed over videos) and whether the flow archives' images are the same bytes."""
    p = PROFILES["default"]
    config, make = EXAMPLE_FAMILIES["synthetic"]
    data = make(root / "data", config(**p.data, seed=0))
    index = root / "index.jsonl"
    write_index(hold_out(build_index(data, "ucf101", 1), p.val_per_class), index)
    rows, images = [], {}
    for backend in ("opencv", "auto"):
        out = root / f"frames-{backend}"
        load = os.getloadavg()[0]
        t = time.perf_counter()
        rep = preprocess(
            index,
            out,
            "rgb,flow",
            size=p.data["size"],
            tvl1=p.tvl1,
            workers=workers,
            flow_backend=backend,
            progress=False,
        )
        wall = time.perf_counter() - t
        images[backend] = [read_archive(archive_path(out, "flow", r.id))[1] for r in read_index(index)]
        rows.append(
            {
                "requested": backend,
                "backend": rep.flow["backend"],
                "workers": workers,
                "videos": rep.summary.done,
                "pairs": rep.pairs(),
                "seconds": wall,
                "flow_stage_s": rep.summary.stage_seconds["flow"],
                "load_before": load,
            }
        )
    rows[1]["same_flow_images"] = images["auto"] == images["opencv"]
    return rows


def main_native(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in map(int, args.sizes.split(",")):
            prev, nxt = make_pairs(size, args.pairs)
            rates, flows = per_core(prev, nxt, args.rounds)
            r = {"size": size, "pairs": args.pairs, **rates}
            r["ratio_core"] = r["native_pairs_per_s_core"] / r["opencv_pairs_per_s_core"]
            dprev, dnxt = decoded_pairs(Path(tmp), size, args.pairs)
            dflows = {name: make_backend(name, TVL1Params())(dprev, dnxt) for name in CPU_BACKENDS}
            r["fidelity_rendered"] = fidelity(flows["native"], flows["opencv"])
            r["fidelity_decoded"] = fidelity(dflows["native"], dflows["opencv"])
            for name in CPU_BACKENDS:  # OpenCV's pairs once; the native's as often as it takes as long
                reps = 1 if name == "opencv" else max(1, round(r["ratio_core"]))
                runs = [(w, pool_rate(name, prev, nxt, w, reps)) for _ in range(args.rounds) for w in (1, 2)]
                for w in (1, 2):  # the best of the rounds, 1 and 2 workers alternating, as per core
                    r[f"{name}_{w}w"] = max((x for v, x in runs if v == w), key=lambda x: x["pairs_per_s"])
                one, two = r[f"{name}_1w"], r[f"{name}_2w"]
                r[f"{name}_2w_over_1w"] = two["pairs_per_s"] / one["pairs_per_s"]
                r[f"{name}_2w_over_1w_cpu"] = 2 * two["pairs_per_cpu_s"] / one["pairs_per_cpu_s"]
            rows.append(r)
            console.log(f"{size}²: done")
        compiled = compile_times()
        quick = [] if args.no_quickstart else quickstart_flow_stage(Path(tmp) / "quickstart", workers=2)

    t = Table(
        title="TV-L1 on the CPU: native (numba) vs OpenCV, same frames (pairs/s; per core by CPU time; "
        "1 and 2 workers by the wall clock, 2w/1w also by CPU time)"
    )
    for col in (
        "size",
        "OpenCV /core",
        "native /core",
        "× OpenCV",
        "OpenCV 1w",
        "OpenCV 2w",
        "2w/1w (CPU)",
        "native 1w",
        "native 2w",
        "2w/1w (CPU)",
        "load",
        "bit-identical pairs",
        "EPD max px",
        "identical codes",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        fr, fd = r["fidelity_rendered"], r["fidelity_decoded"]
        loads = [r[f"{n}_{w}w"]["load_before"] for n in CPU_BACKENDS for w in (1, 2)]
        scaling = {n: f"{r[f'{n}_2w_over_1w']:.2f} ({r[f'{n}_2w_over_1w_cpu']:.2f})" for n in CPU_BACKENDS}
        t.add_row(
            f"{r['size']}²",
            f"{r['opencv_pairs_per_s_core']:.2f}",
            f"{r['native_pairs_per_s_core']:.2f}",
            f"{r['ratio_core']:.2f}",
            *(
                f"{r[f'{n}_{w}w']['pairs_per_s']:.2f}" if w else scaling[n]
                for n in CPU_BACKENDS
                for w in (1, 2, 0)
            ),
            f"{min(loads):.1f}–{max(loads):.1f}",
            f"{fr['identical_pairs'] + fd['identical_pairs']}/{fr['pairs'] + fd['pairs']}",
            f"{max(fr['epd_max'], fd['epd_max']):.4f}",
            f"{100 * min(fr['identical_codes'], fd['identical_codes']):.2f} %",
        )
    console.print(t)
    c = compiled
    console.print(
        f"native code, fresh process: import {c['cold']['import_s']:.2f} s; first pair with an empty cache "
        f"(compilation) {c['cold']['first_pair_s']:.1f} s, from the cache {c['cached']['first_pair_s']:.2f} s"
    )
    if quick:
        t = Table(
            title="the quickstart's preprocessing (RGB + flow, its synthetic videos and TV-L1 settings)"
        )
        for col in (
            "--flow-backend",
            "ran",
            "workers",
            "videos",
            "flow pairs",
            "seconds",
            "flow stage s",
            "load",
            "same flow images",
        ):
            t.add_column(col, justify="right")
        for q in quick:
            t.add_row(
                q["requested"],
                q["backend"],
                str(q["workers"]),
                str(q["videos"]),
                str(q["pairs"]),
                f"{q['seconds']:.1f}",
                f"{q['flow_stage_s']:.1f}",
                f"{q['load_before']:.1f}",
                {True: "yes", False: "NO"}.get(q.get("same_flow_images"), "–"),
            )
        console.print(t)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        args.out,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "cpu": os.cpu_count(),
            "rows": rows,
            "compile": compiled,
            "quickstart": quick,
        },
    )
    console.print(f"wrote {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--native", action="store_true", help="the native TV-L1 against OpenCV (CPU)")
    ap.add_argument(
        "--no-quickstart", action="store_true", help="--native: skip the quickstart's preprocessing"
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="--native: interleaved rounds per core and per worker count (best counts)",
    )
    ap.add_argument("--sizes", default="256", help="comma-separated frame sizes (square)")
    ap.add_argument("--pairs", type=int, default=8, help="frame pairs per size")
    ap.add_argument("--batches", default="1,8", help="comma-separated torch batch sizes")
    ap.add_argument("--threads", type=int, default=1, help="threads per backend (torch and OpenCV alike)")
    ap.add_argument("--device", default="cpu", help="also time torch on this device (e.g. cuda)")
    ap.add_argument("--gpu-batches", default="64,256", help="batch sizes timed on --device cuda")
    ap.add_argument("--compile", action="store_true", help="also time the torch.compile'd kernels on CPU")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON file (default bench/results/flow_backends.json, with --native flow_native.json)",
    )
    args = ap.parse_args()
    if args.native:
        args.sizes = "64,128,256" if args.sizes == ap.get_default("sizes") else args.sizes
        args.out = args.out or Path("bench/results/flow_native.json")
        cv2.setNumThreads(1)
        return main_native(args)
    args.out = args.out or Path("bench/results/flow_backends.json")
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
                for name, schedule in {
                    "eager": Schedule.for_device("cuda"),
                    "compiled": Schedule(10, 0.5, True),
                }.items():
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
    for col in (
        "size",
        "device",
        "mode",
        "batch",
        "OpenCV pairs/s",
        "torch pairs/s",
        "torch / OpenCV",
        "EPD mean px",
        "EPD max px",
        "identical codes",
    ):
        table.add_column(col, justify="right")

    def fmt(r: dict, key: str, spec: str) -> str:
        return format(r[key], spec) if key in r else "–"

    for r in rows:
        table.add_row(
            str(r["size"]),
            r["device"],
            r["mode"],
            str(r["batch"]),
            fmt(r, "opencv_pairs_per_s", ".2f"),
            fmt(r, "torch_pairs_per_s", ".2f"),
            fmt(r, "ratio", ".2f"),
            fmt(r, "epd_mean", ".4f"),
            fmt(r, "epd_max", ".3f"),
            f"{100 * r['identical_codes']:.2f} %" if "identical_codes" in r else "–",
        )
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
