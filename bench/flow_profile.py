"""Benchmark: where the native TV-L1's time goes on one core, and how far it stands from the machine's limits.

Real-looking frames (``preprocess.examples.synthetic``, resized to ``--size`` W×H, grey), consecutive pairs,
default TV-L1 parameters. In one run:

1. **per function and per level**: the solver replayed from Python, calling the same compiled functions in the
   same order (checked: the replay's flow is the kernel's, bit for bit), each call timed by this thread's CPU
   time: the pyramid's resizes, the warp's sources, the warp, the median, the inner iteration's one pass and
   the stopping rule; per pyramid level the inner iteration's nanoseconds per pixel and iteration (whether a
   level whose fields outgrow a cache runs slower per pixel). Kernel and replay each reuse their buffers pair
   after pair, as the flow backend does;
2. **vectorised or not**: each hot function compiled afresh in a child process (an empty numba cache) and its
   optimised LLVM IR read: the widest vector of floats or doubles it operates on, and its vector and scalar
   divisions and square roots;
3. **the roofline**: this core's streaming bandwidth (a read and a write of float32 arrays, a working set the
   size of the finest level's fields and one of the coarsest's) and the inner iteration's bytes and flops per
   pixel counted from its code, against the bytes and flops per second it reached.

Instructions per cycle need hardware counters, which a virtual machine often hides: ``perf stat`` is tried and
the row says so where they are not supported.

    python -m bench.flow_profile [--size 341x256 --pairs 6 --out bench/results/flow_profile.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np
from rich.console import Console
from rich.table import Table

from bench.scale import machine
from memdpc.common.atomic import write_json_atomic
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.flow import tvl1_native as native
from memdpc.preprocess.flow.tvl1_params import TVL1Params, level_sizes

console = Console(width=200)
F32 = np.float32
HOT = ("_iteration", "_warp", "_median", "_above", "_resize", "_warp_sources")
# The inner iteration per pixel, counted from ``_iteration`` and ``_above``: it reads u1, u2, p11, p12, p21, p22,
# I1wx, I1wy and ρ_c and writes u1, u2, the four p and the squared update e, which ``_above`` reads again
# (4-byte floats); estimateV + estimateU take 23 operations (one division), the divergence 6, the dual update
# of both components 26 (four divisions, two square roots in double).
BYTES_PER_PIXEL = 4 * (9 + 7 + 1)
FLOPS_PER_PIXEL = 23 + 6 + 26


def field_mb(height: int, width: int) -> float:
    """The MB of a level's fields (``tvl1_native.WORKSPACE_FIELDS`` and the two flow components)."""
    return (native.WORKSPACE_FIELDS + 2) * height * width * 4 / 2**20


def frame_pairs(width: int, height: int, pairs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``pairs`` consecutive grey pairs of rendered videos (one video per 5 pairs, a class each)."""
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for v in range(-(-pairs // 5)):
        video = render_video(CLASSES[v % len(CLASSES)], max(width, height), 6, np.random.default_rng(v))
        grey = [cv2.cvtColor(cv2.resize(f, (width, height)), cv2.COLOR_BGR2GRAY) for f in video]
        out += list(zip(grey[:-1], grey[1:], strict=True))
    return out[:pairs]


class Replay:
    """The native solver replayed from Python: the compiled functions of ``tvl1_native`` called in the order
    ``_flow`` and ``_solve_level`` call them, each call's CPU time added to its function (and the inner
    iteration's to its level)."""

    def __init__(self, params: TVL1Params) -> None:
        self.p, self.space = params, None
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.level_seconds: dict[int, float] = defaultdict(float)
        self.level_pixels: dict[int, int] = defaultdict(int)  # pixel × inner iteration

    def _call(self, name: str, fn, *args):
        t = time.thread_time()
        out = fn(*args)
        self.seconds[name] += time.thread_time() - t
        self.calls[name] += 1
        return out

    def _solve_level(self, s: int, i0, i1, u1, u2, ws, scaled_eps) -> None:
        p = self.p
        l_t, theta, taut = F32(p.lambda_ * p.theta), F32(p.theta), F32(p.tau / p.theta)
        h, w = i0.shape
        a, n = h * w, ws.size // native.WORKSPACE_FIELDS
        p11, p21 = ws[0:a].reshape(h, w), ws[n : n + a].reshape(h, w)
        p12, p22 = ws[2 * n : 2 * n + a + w].reshape(h + 1, w), ws[3 * n : 3 * n + a + w].reshape(h + 1, w)
        wx, wy = ws[4 * n : 4 * n + a].reshape(h, w), ws[5 * n : 5 * n + a].reshape(h, w)
        rc, e = ws[6 * n : 6 * n + a].reshape(h, w), ws[7 * n : 7 * n + a]
        hp, wp = h + 2 * native.PAD, w + 2 * native.PAD
        imgs, scratch = ws[8 * n : 8 * n + 3 * hp * wp].reshape(3, hp, wp), ws[11 * n :]
        for f in (p11, p21, p12, p22):
            f[:] = 0.0
        self._call("_warp_sources", native._warp_sources, i1, imgs)
        for _ in range(p.warps):
            self._call("_warp", native._warp, i0, imgs, u1, u2, wx, wy, rc)
            running, n_outer = True, 0
            while running and n_outer < p.outer_iterations:
                if p.median_filtering > 1:
                    self._call("_median", native._median, u1, p.median_filtering, scratch)
                    self._call("_median", native._median, u2, p.median_filtering, scratch)
                n_inner = 0
                while running and n_inner < p.inner_iterations:
                    before = self.seconds["_iteration"]
                    args = (u1, u2, p11, p12, p21, p22, wx, wy, rc, e, l_t, theta, taut)
                    self._call("_iteration", native._iteration, *args)
                    self.level_seconds[s] += self.seconds["_iteration"] - before
                    self.level_pixels[s] += a
                    running = self._call("_above", native._above, e, scaled_eps)
                    n_inner += 1
                n_outer += 1

    def flow(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """The flow of one pair, as ``tvl1_native.tvl1_flow`` computes it."""
        p = self.p
        if (
            self.space is None or self.space.shape != prev.shape
        ):  # reused pair after pair, as the backend does
            self.space = native.Workspace(*prev.shape, p)
        space = self.space
        sizes, offsets, pyr, ws = space.sizes, space.offsets, space.pyr, space.ws
        scratch = ws[(native.WORKSPACE_FIELDS - 1) * (ws.size // native.WORKSPACE_FIELDS) :]

        def level(row: int, s: int) -> np.ndarray:
            return pyr[row, offsets[s] : offsets[s] + sizes[s, 0] * sizes[s, 1]].reshape(sizes[s])

        level(0, 0)[:], level(1, 0)[:] = prev, nxt
        step = 1.0 / p.scale_step
        for s in range(1, len(sizes)):
            for row in (0, 1):
                self._call("_resize", native._resize, level(row, s - 1), level(row, s), scratch, step, step)
        level(2, len(sizes) - 1)[:], level(3, len(sizes) - 1)[:] = 0.0, 0.0
        for s in range(len(sizes) - 1, -1, -1):
            h, w = sizes[s]
            u1, u2 = level(2, s), level(3, s)
            self._solve_level(s, level(0, s), level(1, s), u1, u2, ws, F32(p.epsilon * p.epsilon * (h * w)))
            if s > 0:
                for row, u in ((2, u1), (3, u2)):
                    finer = level(row, s - 1)
                    self._call(
                        "_resize", native._resize, u, finer, scratch, h / sizes[s - 1, 0], w / sizes[s - 1, 1]
                    )
                    finer[:] = (finer.astype(np.float64) * p.flow_scale()).astype(F32)
        return np.stack([level(2, 0), level(3, 0)], axis=-1)


def profile(pairs: list[tuple[np.ndarray, np.ndarray]], params: TVL1Params) -> dict:
    """Per function and per level, and the whole compiled kernel's CPU time on the same pairs (interleaved)."""
    space = native.Workspace(*pairs[0][0].shape, params)  # reused, as the flow backend reuses its buffers
    native.tvl1_flow(*pairs[0], params, space)  # compiled, or loaded from the cache, before any timing
    replay, whole = Replay(params), 0.0
    for prev, nxt in pairs:
        t = time.thread_time()
        flow = native.tvl1_flow(prev, nxt, params, space)
        whole += time.thread_time() - t
        if not np.array_equal(replay.flow(prev, nxt), flow):
            raise SystemExit(
                "the replay's flow is not the kernel's: bench/flow_profile.py no longer follows _flow"
            )
    n = len(pairs)
    timed = sum(replay.seconds.values())
    functions = [
        {
            "function": name,
            "ms_per_pair": 1000 * replay.seconds[name] / n,
            "share": replay.seconds[name] / timed,
            "calls_per_pair": replay.calls[name] / n,
        }
        for name in sorted(replay.seconds, key=replay.seconds.get, reverse=True)
    ]
    h0, w0 = pairs[0][0].shape
    sizes = level_sizes(h0, w0, params)
    levels = [
        {
            "level": s,
            "size": list(sizes[s]),
            "field_mb": field_mb(*sizes[s]),
            "iterations_per_pair": replay.level_pixels[s] / n / (sizes[s][0] * sizes[s][1]),
            "ns_per_pixel_iteration": 1e9 * replay.level_seconds[s] / replay.level_pixels[s],
            "share_of_iteration": replay.level_seconds[s] / replay.seconds["_iteration"],
        }
        for s in sorted(replay.level_seconds)
    ]
    pixel_iterations = sum(replay.level_pixels.values()) / n
    return {
        "pairs_per_cpu_second": n / whole,
        "ms_per_pair": 1000 * whole / n,
        "replay_ms_per_pair": 1000 * timed / n,
        "functions": functions,
        "levels": levels,
        "pixel_iterations_per_pair": pixel_iterations,
        "finest_equivalent_iterations": pixel_iterations / (h0 * w0),
        "iteration_s_per_pair": replay.seconds["_iteration"] / n,
    }


VECTOR = re.compile(r"<(\d+) x (float|double)>")


def _ir_facts() -> None:
    """(child) Compile the kernel afresh and print, per hot function, what its optimised LLVM IR holds."""
    native.tvl1_flow(
        np.zeros((24, 24), np.uint8), np.zeros((24, 24), np.uint8), TVL1Params(scales=1, warps=1)
    )
    facts = {}
    for name in HOT:
        ir = "\n".join(getattr(native, name).inspect_llvm().values())
        widths = [int(w) for w, _ in VECTOR.findall(ir)]
        facts[name] = {
            "widest_vector": max(widths, default=1),
            "vector_div": len(re.findall(r"fdiv <\d+ x", ir)),
            "scalar_div": len(re.findall(r"fdiv (float|double) ", ir)),
            "vector_sqrt": len(re.findall(r"llvm\.sqrt\.v\d+f", ir)),
            "scalar_sqrt": len(re.findall(r"llvm\.sqrt\.f(32|64)", ir)),
        }
    print(json.dumps(facts))


def ir_facts() -> dict:
    """Per hot function: the widest vector it operates on and its vector and scalar divisions and roots (a
    fresh compile in a child process: code loaded from numba's cache has no IR to read)."""
    with tempfile.TemporaryDirectory() as cache:
        res = subprocess.run(
            [sys.executable, "-m", "bench.flow_profile", "--ir-facts"],
            capture_output=True,
            text=True,
            env={**os.environ, "NUMBA_CACHE_DIR": cache},
            check=True,
        )
    return json.loads(res.stdout.strip().splitlines()[-1])


def bandwidth(mb: float, rounds: int = 20) -> float:
    """GB/s of ``np.copyto`` between two float32 arrays of ``mb`` MB together (read + write), best of rounds."""
    n = max(int(mb * 2**20 / 8), 1024)
    a, b = np.ones(n, F32), np.empty(n, F32)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(max(1, int(64 / mb))):
            np.copyto(b, a)
        best = min(best, (time.perf_counter() - t) / max(1, int(64 / mb)))
    return 2 * 4 * n / best / 1e9


def counters() -> str:
    """Instructions per cycle of a short kernel run by ``perf stat``, or why there is none."""
    if shutil.which("perf") is None:
        return "perf is not installed (Debian: linux-perf)"
    res = subprocess.run(
        ["perf", "stat", "-x,", "-e", "cycles,instructions", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
    )
    if "<not supported>" in res.stderr or res.returncode != 0:
        return "not measurable here: the machine's hardware counters are not exposed (perf stat: <not supported>)"
    got = {
        line.split(",")[2]: float(line.split(",")[0])
        for line in res.stderr.splitlines()
        if line.count(",") > 2
    }
    return f"{got['instructions'] / got['cycles']:.2f} (python start-up; run perf on the kernel for its own)"


def roofline(prof: dict, finest_mb: float, coarsest_mb: float) -> dict:
    seconds = prof["iteration_s_per_pair"]
    px = prof["pixel_iterations_per_pair"]
    return {
        "bytes_per_pixel_iteration": BYTES_PER_PIXEL,
        "flops_per_pixel_iteration": FLOPS_PER_PIXEL,
        "gb_per_pair": BYTES_PER_PIXEL * px / 1e9,
        "gflop_per_pair": FLOPS_PER_PIXEL * px / 1e9,
        "iteration_gb_per_s": BYTES_PER_PIXEL * px / seconds / 1e9,
        "iteration_gflop_per_s": FLOPS_PER_PIXEL * px / seconds / 1e9,
        "copy_gb_per_s_finest": bandwidth(finest_mb),
        "copy_gb_per_s_coarsest": bandwidth(coarsest_mb),
    }


def print_tables(res: dict) -> None:
    prof, roof = res["profile"], res["roofline"]
    t = Table(
        title=f"native TV-L1, one {res['size']} pair on one core ({res['cpu']}): "
        f"{prof['pairs_per_cpu_second']:.2f} pairs per CPU-second"
    )
    for col in (
        "function",
        "ms/pair",
        "share",
        "calls/pair",
        "widest vector",
        "div (vector/scalar)",
        "sqrt (v/s)",
    ):
        t.add_column(col, justify="right")
    for f in prof["functions"]:
        ir = res["ir"].get(f["function"], {})
        t.add_row(
            f["function"],
            f"{f['ms_per_pair']:.1f}",
            f"{100 * f['share']:.1f} %",
            f"{f['calls_per_pair']:.0f}",
            str(ir.get("widest_vector", "")),
            f"{ir.get('vector_div', '')}/{ir.get('scalar_div', '')}",
            f"{ir.get('vector_sqrt', '')}/{ir.get('scalar_sqrt', '')}",
        )
    console.print(t)
    t = Table(title="the inner iteration per pyramid level")
    for col in ("level", "size", "fields MB", "iterations/pair", "ns per pixel-iteration", "share"):
        t.add_column(col, justify="right")
    for lv in prof["levels"]:
        t.add_row(
            str(lv["level"]),
            "×".join(map(str, lv["size"][::-1])),
            f"{lv['field_mb']:.2f}",
            f"{lv['iterations_per_pair']:.0f}",
            f"{lv['ns_per_pixel_iteration']:.2f}",
            f"{100 * lv['share_of_iteration']:.1f} %",
        )
    console.print(t)
    console.print(
        f"roofline: {roof['gb_per_pair']:.2f} GB and {roof['gflop_per_pair']:.2f} GFLOP per pair in the inner "
        f"iteration ({prof['finest_equivalent_iterations']:.0f} finest-level-equivalent iterations); it reached "
        f"{roof['iteration_gb_per_s']:.1f} GB/s and {roof['iteration_gflop_per_s']:.1f} GFLOP/s; this core copies "
        f"{roof['copy_gb_per_s_finest']:.1f} GB/s with the finest level's working set and "
        f"{roof['copy_gb_per_s_coarsest']:.1f} GB/s with the coarsest's. Instructions per cycle: {res['ipc']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="341x256", help="W×H of the frames.")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("bench/results/flow_profile.json"))
    ap.add_argument("--ir-facts", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ir_facts:
        _ir_facts()
        return
    width, height = map(int, args.size.lower().split("x"))
    params = TVL1Params()
    pairs = frame_pairs(width, height, args.pairs)
    sizes = level_sizes(height, width, params)
    prof = profile(pairs, params)
    res = {
        "cpu": machine(),
        "size": f"{width}x{height}",
        "pairs": len(pairs),
        "load_before": os.getloadavg()[0],
        "profile": prof,
        "ir": ir_facts(),
        "roofline": roofline(prof, field_mb(*sizes[0]), field_mb(*sizes[-1])),
        "ipc": counters(),
    }
    print_tables(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, res)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
