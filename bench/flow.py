"""Benchmark: TV-L1 flow extraction throughput, stage costs, flow storage error and memory per worker.

Generates real-looking videos (textured scenes with moving objects, ``preprocess.examples.synthetic``,
xvid .avi), then in one run:

1. throughput of ``preprocess --streams rgb,flow`` with 1 worker and with N workers (flow pairs/s, and
   the ratio; target ≥ 1.8 × with 2 workers on 2 cores), the CPU seconds per pair (does not depend on
   how busy the machine is, unlike the wall time; the 1-minute load average is printed beside each run,
   and the pool's start is part of the N-worker time) and time per stage summed over videos
   (decode, flow, encode + write; target: decode + encode ≤ 10 % of flow);
2. the storage error of candidate encodings on real TV-L1 codes (mean / max absolute code error after
   decode, size per image; target mean ≤ 0.5) — the table behind the default flow encoding;
3. peak memory of one worker on a long video vs a short one (default 3000 vs 300 frames, small frames
   and cheap TV-L1 settings, since memory does not depend on them): it must not grow with length.

    python -m bench.flow [--videos 4 --frames 4 --size 256 --workers 2 --out bench/results/flow.json]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from rich.console import Console
from rich.table import Table

from memdpc.common.atomic import write_json_atomic
from memdpc.common.streams import STREAMS
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import FLOW_ENCODING, JpegEncoding, code_error
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow.backends import FlowStage, OpenCVTVL1
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import PreprocessConfig, process_video
from memdpc.preprocess.run import run_preprocess
from memdpc.preprocess.video_index import VideoRecord

console = Console(width=150)
CHEAP = TVL1Params(scales=1, warps=1, inner_iterations=2, outer_iterations=1, median_filtering=1)


def make_videos(root: Path, n: int, frames: int, size: int) -> list[VideoRecord]:
    recs = []
    for v in range(n):
        cls = CLASSES[v % len(CLASSES)]
        path = root / f"v{v:03d}.avi"
        write_video(path, render_video(cls, size, frames, np.random.default_rng(v)), 25.0, "xvid")
        recs.append(VideoRecord(f"v{v:03d}", str(path), v % len(CLASSES), cls, "train"))
    return recs


def throughput(recs: list[VideoRecord], root: Path, workers: list[int]) -> list[dict]:
    rows = []
    for w in workers:
        cfg = PreprocessConfig(
            out=str(root / f"out-w{w}"),
            streams=STREAMS,
            decode=DecodeSpec(size=0),
            flow_backend="opencv",
            workers=w,
        )
        load = os.getloadavg()[0]
        t = time.perf_counter()
        rep = run_preprocess(recs, cfg, progress=False)
        wall = time.perf_counter() - t
        s = rep["summary"]
        assert s["done"] == len(recs), rep["failures"]
        pairs = sum(v["streams"]["flow"] for v in rep["videos"])
        cpu = sum(v["cpu_seconds"] for v in rep["videos"])
        st = s["stage_seconds"]
        rows.append(
            {
                "workers": w,
                "pairs": pairs,
                "seconds": round(wall, 2),
                "pairs_per_s": round(pairs / wall, 3),
                "cpu_s_per_pair": round(cpu / pairs, 3),
                "load_before": round(load, 2),
                "stage_seconds": st,
                "overhead_vs_flow": round((st["decode"] + st["encode"]) / st["flow"], 4),
            }
        )
    for r in rows:
        r["speedup"] = round(r["pairs_per_s"] / rows[0]["pairs_per_s"], 3)
    return rows


def real_codes(size: int, pairs: int) -> list[np.ndarray]:
    """TV-L1 code images of ``pairs`` frame pairs, one per motion class, at ``size``²."""
    out = []
    for i in range(pairs):
        frames = render_video(CLASSES[i % len(CLASSES)], size, 2, np.random.default_rng(100 + i))
        stage = FlowStage(OpenCVTVL1())
        out += [c for f in frames for c in stage.push(f)]
    return out


def storage_table(codes: list[np.ndarray]) -> list[dict]:
    rows = []
    candidates = [JpegEncoding(q, s) for s in ("420", "444") for q in (90, 95, 100)]
    candidates += [JpegEncoding(q, "rgb") for q in (85, 90, 95)]
    for enc in candidates:
        data = [enc.encode_rgb(c) for c in codes]
        errs = [code_error(c, d) for c, d in zip(codes, data, strict=True)]
        xy = [
            np.abs(
                cv2.imdecode(np.frombuffer(d, np.uint8), 1)[..., ::-1][..., :2].astype(int) - c[..., :2]
            ).mean()
            for c, d in zip(codes, data, strict=True)
        ]
        rows.append(
            {
                "encoding": enc.name,
                "mean_abs": round(float(np.mean([e[0] for e in errs])), 4),
                "mean_abs_xy": round(float(np.mean(xy)), 4),
                "max_abs": max(e[1] for e in errs),
                "kb_per_image": round(float(np.mean([len(d) for d in data])) / 1024, 2),
                "default": enc == FLOW_ENCODING,
                "gpu_decodable": enc.sampling != "rgb",
            }
        )
    png = [cv2.imencode(".png", np.ascontiguousarray(c[..., ::-1]))[1].tobytes() for c in codes]
    rows.append(
        {
            "encoding": "png (lossless, not JPEG)",
            "mean_abs": 0.0,
            "mean_abs_xy": 0.0,
            "max_abs": 0,
            "kb_per_image": round(float(np.mean([len(d) for d in png])) / 1024, 2),
            "default": False,
            "gpu_decodable": False,
        }
    )
    return rows


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def _memory_job(rec: VideoRecord, cfg: PreprocessConfig, queue) -> None:
    """Run one video in a fresh process; the peak resident memory (VmHWM) is reset after imports (Linux
    ``clear_refs`` 5), so the peak over the run is the job's own, not the import's."""
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    t = time.perf_counter()
    res = process_video(rec, cfg)
    queue.put(
        {
            "base_mb": base / 1024,
            "peak_mb": _status_kb("VmHWM") / 1024,
            "seconds": time.perf_counter() - t,
            "status": res["status"],
            "frames": res.get("num_frames"),
        }
    )


def memory(root: Path, lengths: list[int], size: int) -> list[dict]:
    rows = []
    ctx = mp.get_context("spawn")
    for n in lengths:
        path = root / f"long{n}.avi"
        write_video(path, render_video("MoveRight", size, n, np.random.default_rng(n)), 25.0, "xvid")
        rec = VideoRecord(f"long{n}", str(path), 0, "MoveRight", "train")
        cfg = PreprocessConfig(
            out=str(root / "mem"),
            streams=STREAMS,
            decode=DecodeSpec(size=0),
            tvl1=CHEAP,
            flow_backend="opencv",
        )
        queue = ctx.Queue()
        proc = ctx.Process(target=_memory_job, args=(rec, cfg, queue))
        proc.start()
        r = queue.get()
        proc.join()
        assert r["status"] == "done" and r["frames"] == n, r
        rows.append(
            {
                "frames": n,
                **{k: round(v, 2) for k, v in r.items() if k in ("base_mb", "peak_mb", "seconds")},
                "growth_mb": round(r["peak_mb"] - r["base_mb"], 2),
                "whole_video_mb": round(n * size * size * (3 + 2 * 4) / 2**20, 2),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--videos", type=int, default=4, help="videos for the throughput runs")
    ap.add_argument(
        "--frames", type=int, default=4, help="frames per throughput video (frames − 1 flow pairs)"
    )
    ap.add_argument("--size", type=int, default=256, help="frame side for throughput and storage error")
    ap.add_argument("--workers", type=int, default=2, help="N of the N-worker run (compared with 1 worker)")
    ap.add_argument("--storage-pairs", type=int, default=6, help="flow images for the storage-error table")
    ap.add_argument("--long", type=int, default=3000, help="frames of the long video (memory)")
    ap.add_argument("--short", type=int, default=300, help="frames of the short video (memory)")
    ap.add_argument("--mem-size", type=int, default=32, help="frame side of the memory videos")
    ap.add_argument("--out", type=Path, default=Path("bench/results/flow.json"))
    args = ap.parse_args()
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        recs = make_videos(root / "videos", args.videos, args.frames, args.size)
        thr = throughput(recs, root, [1, args.workers])
        store = storage_table(real_codes(args.size, args.storage_pairs))
        mem = memory(root, [args.short, args.long], args.mem_size)

    t = Table(
        title=f"flow throughput, rgb+flow, {args.videos} videos × {args.frames} frames of {args.size}² (xvid)"
    )
    cols = (
        "workers",
        "load",
        "pairs",
        "s",
        "pairs/s",
        "speedup",
        "CPU s/pair",
        "decode s",
        "flow s",
        "encode+write s",
        "(dec+enc)/flow",
    )
    for c in cols:
        t.add_column(c, justify="right")
    for r in thr:
        st = r["stage_seconds"]
        t.add_row(
            str(r["workers"]),
            f"{r['load_before']:.1f}",
            str(r["pairs"]),
            f"{r['seconds']:.1f}",
            f"{r['pairs_per_s']:.2f}",
            f"{r['speedup']:.2f}×",
            f"{r['cpu_s_per_pair']:.2f}",
            f"{st['decode']:.2f}",
            f"{st['flow']:.2f}",
            f"{st['encode']:.2f}",
            f"{100 * r['overhead_vs_flow']:.1f} %",
        )
    console.print(t)
    t = Table(
        title=f"flow storage error: uint8 codes after decode vs before ({args.storage_pairs} "
        f"TV-L1 fields of {args.size}², target mean ≤ 0.5)"
    )
    for c in (
        "encoding",
        "mean |err|",
        "mean |err| x,y",
        "max |err|",
        "KB/image",
        "≤ 0.5",
        "GPU decode",
        "default",
    ):
        t.add_column(c, justify="right")
    for r in store:
        t.add_row(
            r["encoding"],
            f"{r['mean_abs']:.3f}",
            f"{r['mean_abs_xy']:.3f}",
            str(r["max_abs"]),
            f"{r['kb_per_image']:.1f}",
            "yes" if r["mean_abs"] <= 0.5 else "no",
            "yes" if r["gpu_decodable"] else "no",
            "◀" if r["default"] else "",
        )
    console.print(t)
    t = Table(title=f"peak memory of one worker, rgb+flow, {args.mem_size}² frames, cheap TV-L1 settings")
    for c in ("frames", "RSS before MB", "peak RSS MB", "growth MB", "whole video would be MB", "s"):
        t.add_column(c, justify="right")
    for r in mem:
        t.add_row(
            str(r["frames"]),
            f"{r['base_mb']:.1f}",
            f"{r['peak_mb']:.1f}",
            f"{r['growth_mb']:.1f}",
            f"{r['whole_video_mb']:.1f}",
            f"{r['seconds']:.1f}",
        )
    console.print(t)
    write_json_atomic(
        args.out,
        {
            "bench": "flow",
            "args": {k: str(v) for k, v in vars(args).items()},
            "throughput": thr,
            "storage": store,
            "memory": mem,
            "cheap_tvl1": CHEAP.to_dict(),
        },
    )
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
