"""Benchmark: TV-L1 flow extraction throughput, stage costs, flow storage error and memory per worker.

Generates real-looking videos (textured scenes with moving objects, ``preprocess.examples.synthetic``,
xvid .avi), then in one run:

1. throughput of ``preprocess --streams rgb,flow`` (``--flow-backend``: as preprocess chooses by default) of
   videos of ``--source`` frames decoded at the short side ``--size``, with 1 worker and with N workers (flow
   pairs/s, and the ratio; target ≥ 13 pairs/s with one worker at 640×480 → 341×256, ≥ 1.9 × with 2 workers on 2
   cores), the CPU seconds per pair (does not depend on how busy the machine is, unlike the wall time; the
   1-minute load average is printed beside each run, and the pool's start is part of the N-worker time) and time
   per stage summed over videos (decode, flow, encode + write; target: decode + encode ≤ 10 % of flow);
2. the storage error of candidate encodings on real TV-L1 fields of decoded video frames (videos of 4:3
   frames written as xvid, decoded at the short side ``--size``, as preprocess reads them): per axis the signed
   mean error of the codes after decoding (a drift; target |mean| ≤ 0.02 codes) and the mean absolute error,
   the absolute error on still pixels (computed codes x = y = 128) and on moving ones, the third channel's
   signed error, the largest error and the size per image — the table behind the default flow encoding. With
   ``--dali-device cpu|gpu`` also the codes as DALI's decoder gives them (``gpu``: nvJPEG's hardware decoder, as
   the GPU loader reads them; ``bench/gpu_checks.sh`` runs it);
3. peak memory of one worker on a long video vs a short one (default 3000 vs 300 frames, small frames
   and cheap TV-L1 settings, since memory does not depend on them): it must not grow with length.

    python -m bench.flow [--parts throughput,storage,memory --videos 4 --frames 4 --size 256 --source 640x480
                          --flow-backend auto --workers 2 --dali-device none --out bench/results/flow.json]
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
from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.encode import (
    FLOW_ENCODING,
    PLANES,
    JpegEncoding,
    decode_rgb,
    gpu_decodes_alike,
    is_planes,
    split_planes,
)
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow.backends import AUTO, BACKENDS, FlowStage, OpenCVTVL1
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import process_video
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.run import run_preprocess
from memdpc.preprocess.video_index import VideoRecord

console = Console(width=220)
CHEAP = TVL1Params(scales=1, warps=1, inner_iterations=2, outer_iterations=1, median_filtering=1)


def make_videos(root: Path, n: int, frames: int, source: tuple[int, int]) -> list[VideoRecord]:
    """``n`` xvid videos of ``frames`` frames of ``source`` (width, height): scenes rendered at the height,
    stretched to the width."""
    recs = []
    width, height = source
    for v in range(n):
        cls = CLASSES[v % len(CLASSES)]
        path = root / f"v{v:03d}.avi"
        rendered = render_video(cls, height, frames, np.random.default_rng(v))
        write_video(path, np.stack([cv2.resize(f, (width, height)) for f in rendered]), 25.0, "xvid")
        recs.append(VideoRecord(f"v{v:03d}", str(path), v % len(CLASSES), cls, "train"))
    return recs


def throughput(
    recs: list[VideoRecord], root: Path, workers: list[int], size: int, backend: str
) -> list[dict]:
    """``preprocess`` of both streams, the videos decoded at the short side ``size``, with each worker count."""
    rows = []
    for w in workers:
        cfg = PreprocessConfig(
            out=str(root / f"out-w{w}"),
            streams=STREAMS,
            decode=DecodeSpec(size=size),
            flow_backend=backend,
            workers=w,
        )
        load = os.getloadavg()[0]
        t = time.perf_counter()
        rep = run_preprocess(recs, cfg, progress=False)
        wall = time.perf_counter() - t
        s = rep.summary
        assert s.done == len(recs), rep.failures
        pairs = rep.pairs()
        cpu = sum(v["cpu_seconds"] for v in rep.videos)
        st = s.stage_seconds
        rows.append(
            {
                "workers": w,
                "backend": rep.flow["backend"],
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


def real_codes(root: Path, size: int, videos: int, frames: int) -> list[np.ndarray]:
    """TV-L1 code images (OpenCV's defaults) of ``videos`` rendered videos, one per motion class, of ``frames``
    4:3 frames each, written as xvid and decoded at the short side ``size``."""
    out = []
    for i in range(videos):
        path = root / f"storage{i}.avi"
        rendered = render_video(CLASSES[i % len(CLASSES)], 240, frames, np.random.default_rng(100 + i))
        write_video(path, np.stack([cv2.resize(f, (320, 240)) for f in rendered]), 25.0, "xvid")
        stage = FlowStage(OpenCVTVL1())
        out += [c for f in VideoStream(path, DecodeSpec(size=size)) for c in stage.push(f)]
    return out


CANDIDATES = [JpegEncoding(q, PLANES) for q in (90, 95, 98, 100)]
CANDIDATES += [JpegEncoding(90, "420")] + [JpegEncoding(q, "444") for q in (90, 95, 100)]
CANDIDATES += [JpegEncoding(q, "rgb") for q in (90, 95, 100)]
PNG = "png (lossless, not JPEG)"


def dali_decode(images: list[bytes], planes: bool, device: str) -> list[np.ndarray]:
    """The images as DALI's decoder gives them, as codes (H, W, 3): on the CPU (libjpeg-turbo) or, ``gpu``, with
    the GPU loader's settings (nvJPEG, the hardware decoder where the card has one)."""
    from nvidia.dali import fn, pipeline_def, types

    data = [np.frombuffer(d, np.uint8) for d in images]
    gpu = device == "gpu"
    where = {"device": "mixed", "hw_decoder_load": 1.0} if gpu else {"device": "cpu"}

    @pipeline_def(batch_size=len(data), num_threads=1, device_id=0 if gpu else None)
    def pipe():
        raw = fn.external_source(source=lambda: data, batch=True, dtype=types.UINT8)
        return fn.decoders.image(raw, output_type=types.GRAY if planes else types.RGB, **where)

    p = pipe()
    p.build()
    (out,) = p.run()
    out = out.as_cpu() if gpu else out
    decoded = [np.array(out.at(i)) for i in range(len(data))]
    return [split_planes(d) if planes else d for d in decoded]


def errors(codes: list[np.ndarray], decoded: list[np.ndarray]) -> dict[str, float]:
    """The decoded codes against the computed ones: per axis the signed and absolute mean error, the absolute
    error of x and y on still pixels (both computed codes 128) and on moving ones, the third channel's signed
    error and the largest error."""
    diff = np.stack([d.astype(np.int16) - c for c, d in zip(codes, decoded, strict=True)])  # (N, H, W, 3)
    still = np.stack([(c[..., 0] == 128) & (c[..., 1] == 128) for c in codes])
    xy = np.abs(diff[..., :2])
    return {
        "signed_x": round(float(diff[..., 0].mean()), 4),
        "signed_y": round(float(diff[..., 1].mean()), 4),
        "abs_x": round(float(xy[..., 0].mean()), 4),
        "abs_y": round(float(xy[..., 1].mean()), 4),
        "abs_still": round(float(xy[still].mean()), 4) if still.any() else None,
        "abs_moving": round(float(xy[~still].mean()), 4) if (~still).any() else None,
        "signed_third": round(float(diff[..., 2].mean()), 4),
        "max_abs": int(np.abs(diff).max()),
        "still_share": round(float(still.mean()), 4),
    }


def storage_table(codes: list[np.ndarray], dali_device: str) -> list[dict]:
    rows = []
    encoded = {enc.name: [enc.encode_rgb(c) for c in codes] for enc in CANDIDATES}
    encoded[PNG] = [cv2.imencode(".png", np.ascontiguousarray(c[..., ::-1]))[1].tobytes() for c in codes]
    for name, data in encoded.items():
        row = {
            "encoding": name,
            **errors(codes, [decode_rgb(d) for d in data]),
            "kb_per_image": round(float(np.mean([len(d) for d in data])) / 1024, 2),
            "default": name == FLOW_ENCODING.name,
            "gpu_decodable": name != PNG and gpu_decodes_alike(name),
        }
        if dali_device != "none":
            dali = errors(codes, dali_decode(data, is_planes(name), dali_device))
            row["dali"] = {"device": dali_device, **dali}
        rows.append(row)
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


PARTS = ("throughput", "storage", "memory")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"what to measure, of {','.join(PARTS)}")
    ap.add_argument("--videos", type=int, default=4, help="videos for the throughput runs")
    ap.add_argument(
        "--frames", type=int, default=4, help="frames per throughput video (frames − 1 flow pairs)"
    )
    ap.add_argument(
        "--size",
        type=int,
        default=256,
        help="short side the videos are decoded at (throughput, storage error)",
    )
    ap.add_argument(
        "--source", default="640x480", help="WIDTHxHEIGHT of the throughput videos' frames, before decoding"
    )
    ap.add_argument(
        "--flow-backend",
        default=AUTO,
        choices=(AUTO, *BACKENDS),
        help="flow backend of the throughput runs (auto: as preprocess chooses it)",
    )
    ap.add_argument("--workers", type=int, default=2, help="N of the N-worker run (compared with 1 worker)")
    ap.add_argument(
        "--storage-videos", type=int, default=6, help="videos (one per motion class) for the storage table"
    )
    ap.add_argument(
        "--storage-frames", type=int, default=3, help="frames per storage video (frames − 1 fields)"
    )
    ap.add_argument(
        "--dali-device",
        choices=("none", "cpu", "gpu"),
        default="none",
        help="also decode the stored images with DALI on this device",
    )
    ap.add_argument("--long", type=int, default=3000, help="frames of the long video (memory)")
    ap.add_argument("--short", type=int, default=300, help="frames of the short video (memory)")
    ap.add_argument("--mem-size", type=int, default=32, help="frame side of the memory videos")
    ap.add_argument("--out", type=Path, default=Path("bench/results/flow.json"))
    args = ap.parse_args()
    parts = [x for x in args.parts.split(",") if x]
    if set(parts) - set(PARTS):
        ap.error(f"--parts takes {', '.join(PARTS)}, not {args.parts}")
    cv2.setNumThreads(1)
    result: dict = {"bench": "flow", "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "throughput" in parts:
            width, height = (int(x) for x in args.source.split("x"))
            recs = make_videos(root / "videos", args.videos, args.frames, (width, height))
            result["throughput"] = throughput(recs, root, [1, args.workers], args.size, args.flow_backend)
            print_throughput(result["throughput"], args)
        if "storage" in parts:
            codes = real_codes(root, args.size, args.storage_videos, args.storage_frames)
            result["storage"] = storage_table(codes, args.dali_device)
            print_storage(result["storage"], codes, args)
        if "memory" in parts:
            result["memory"] = memory(root, [args.short, args.long], args.mem_size)
            result["cheap_tvl1"] = CHEAP.to_dict()
            print_memory(result["memory"], args)
    write_json_atomic(args.out, result)
    console.print(f"wrote {args.out}")


def print_throughput(thr: list[dict], args: argparse.Namespace) -> None:
    t = Table(
        title=f"flow throughput, rgb+flow, {args.videos} videos × {args.frames} frames of {args.source} (xvid), "
        f"decoded at the short side {args.size}, flow backend {thr[0]['backend']}"
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


def print_storage(store: list[dict], codes: list[np.ndarray], args: argparse.Namespace) -> None:
    h, w = codes[0].shape[:2]
    still = store[0]["still_share"]
    t = Table(
        title=f"flow storage error, in codes: decoded − computed, {len(codes)} TV-L1 fields of {w}×{h} of xvid "
        f"videos ({100 * still:.0f} % still pixels); drift target |signed mean| ≤ 0.02"
    )
    cols = ["encoding", "signed x", "signed y", "|err| x", "|err| y", "|err| still", "|err| moving"]
    cols += ["signed third", "max", "KB/image", "no drift", "GPU decode"]
    dali = store[0].get("dali", {}).get("device")
    if dali:
        cols += [f"DALI {dali}: signed x, y", f"DALI {dali}: |err| x, y"]
    for c in [*cols, "default"]:
        t.add_column(c, justify="left" if c == "encoding" else "right")
    for r in store:
        drift = max(abs(r["signed_x"]), abs(r["signed_y"]))
        row = [r["encoding"]] + [f"{r[k]:+.3f}" for k in ("signed_x", "signed_y")]
        row += [f"{r[k]:.3f}" for k in ("abs_x", "abs_y", "abs_still", "abs_moving")]
        row += [f"{r['signed_third']:+.3f}", str(r["max_abs"]), f"{r['kb_per_image']:.1f}"]
        row += ["yes" if drift <= 0.02 else "no", "yes" if r["gpu_decodable"] else "no"]
        if dali:
            d = r["dali"]
            row += [f"{d['signed_x']:+.3f}, {d['signed_y']:+.3f}", f"{d['abs_x']:.3f}, {d['abs_y']:.3f}"]
        t.add_row(*row, "◀" if r["default"] else "")
    console.print(t)


def print_memory(mem: list[dict], args: argparse.Namespace) -> None:
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


if __name__ == "__main__":
    main()
