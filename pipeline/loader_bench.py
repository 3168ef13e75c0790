"""The loader benchmark of ``memdpc bench loader``: the DALI loader against the torch reference loader, side by
side, on the same shards.

Runs alternate (torch, DALI, torch, DALI, … for full augmentation, then for augmentation off = decode and a
centre crop at the frame's own size, i.e. no resampling; with frames of several sizes, at the smallest short
side), so machine load hits both alike. The clip geometry and the frame sizes come from the shards'
manifest. Each run reads ``batches`` batches after ``2 × workers + 1`` warm-up batches and reports clips/s
(wall) and CPU-ms per clip (this process and its DataLoader workers, all threads), best of ``repeat``. The
figure of merit is the DALI / torch clips/s ratio (target on CPU: ≥ 1.0 with full augmentation). The warm-up
drains what the loaders made ahead while starting (the DataLoader queues 2 batches per worker, DALI 2), so the
timed batches are made while timed (with one warm-up batch, 16 workers had 32 batches ready and the torch
loader timed reading its queue).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import psutil
from rich.console import Console

from memdpc.common.atomic import write_json_atomic
from memdpc.common.console import rich_console, titled_table
from memdpc.common.errors import UserError
from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import dali_available, make_loader
from memdpc.pipeline.loader_bench_options import LoaderBench
from memdpc.pipeline.manifest import find_manifests, manifest_path
from memdpc.pipeline.shard_set import ShardSplit, open_split

__all__ = ["bench_loader"]


def _cpu_seconds(proc: psutil.Process) -> float:
    """CPU time of this process (all threads) and of its live children (DataLoader workers)."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def time_loader(cfg: LoaderBench, backend: str, augment: bool, frame_side: int, clip: ClipSpec) -> dict:
    """One run: warm up until nothing made ahead is left, then time ``cfg.batches`` batches (wall and CPU)."""
    spec = (cfg.spec or AugmentSpec()) if augment else AugmentSpec.off()
    size = cfg.size if augment else frame_side
    loader = make_loader(
        cfg.shards,
        cfg.stream,
        cfg.split,
        train=True,
        batch_size=cfg.batch_size,
        backend=backend,
        size=size,
        num_workers=cfg.workers,
        device=cfg.device,
        spec=spec,
        clip=clip,
        drop_last=True,
    )
    warmup = 2 * cfg.workers + 1
    if len(loader) < cfg.batches + warmup:
        raise UserError(
            f"{cfg.shards}: an epoch has {len(loader)} batches of {cfg.batch_size}; the bench "
            f"needs {cfg.batches + warmup} ({warmup} to warm up; use fewer --batches or a smaller --batch-size)"
        )
    proc = psutil.Process()
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    t0, c0 = time.perf_counter(), _cpu_seconds(proc)
    clips = 0
    for _ in range(cfg.batches):
        clips += next(it).clips.shape[0]
    wall, cpu = time.perf_counter() - t0, _cpu_seconds(proc) - c0
    it.close()
    return {
        "clips": clips,
        "seconds": wall,
        "clips_per_s": clips / wall,
        "cpu_ms_per_clip": 1000 * cpu / clips,
    }


def bench_loader(cfg: LoaderBench, console: Console | None = None) -> dict:
    """Alternating runs of both backends, with and without augmentation; prints a table, writes JSON."""
    console = console or rich_console()
    if not dali_available():
        raise UserError(
            "the loader bench compares DALI with the torch loader, but nvidia-dali is not installed"
        )
    shards = _shards(cfg)
    clip = shards.clip
    side = min((min(hw) for hw in shards.frame_sizes), default=cfg.size)
    best: dict[tuple[str, str], dict] = {}
    for _ in range(cfg.repeat):
        for augment in (True, False):
            for backend in ("torch", "dali"):
                key = (backend, "full" if augment else "off")
                run = time_loader(cfg, backend, augment, side, clip)
                if key not in best or run["clips_per_s"] > best[key]["clips_per_s"]:
                    best[key] = run
    rows = []
    for aug in ("full", "off"):
        base = best[("torch", aug)]["clips_per_s"]
        for backend in ("torch", "dali"):
            r = best[(backend, aug)]
            rows.append(
                {"backend": backend, "augmentation": aug, **r, "ratio_to_torch": r["clips_per_s"] / base}
            )
    _print(cfg, shards, side, rows, console)
    result = {
        "config": {k: str(v) for k, v in asdict(cfg).items()},
        "clip": shards.clip.to_dict(),
        "frame_sizes": [list(hw) for hw in shards.frame_sizes],
        "size_off": side,
        "results": rows,
    }
    write_json_atomic(cfg.out, result)
    return result


def _shards(cfg: LoaderBench) -> ShardSplit:
    """The benchmarked stream's split; a one-line error naming what the folder holds."""
    if not manifest_path(cfg.shards, cfg.stream, cfg.split).is_file():
        if any(Path(cfg.shards).glob("manifest-*.json")):
            raise UserError(f"{cfg.shards}: a stream's folder; give the shard folder that holds it")
        held = [f"{p.parent.name}/{p.stem.removeprefix('manifest-')}" for p in find_manifests(cfg.shards)]
        raise UserError(
            f"{cfg.shards}: no {cfg.stream}/{cfg.split} shards (it holds {', '.join(held)}); "
            "choose with --stream and --split"
        )
    return open_split(cfg.shards, cfg.stream, cfg.split)


def _print(cfg: LoaderBench, shards: ShardSplit, side: int, rows: list[dict], console: Console) -> None:
    sizes = [f"{w}×{h}" for h, w in shards.frame_sizes] or ["mixed-size"]  # width×height, as every message
    clip = shards.clip
    table = titled_table(
        f"loaders on {cfg.shards}/{cfg.stream} ({', '.join(sizes)} JPEG frames, {clip.num_frames} per "
        f"clip), output {cfg.size}² (aug off: {side}²), batch {cfg.batch_size}, {cfg.workers} "
        f"workers/threads, best of {cfg.repeat}"
    )
    for col in ("backend", "augmentation", "clips", "clips/s", "CPU-ms/clip", "× torch"):
        table.add_column(col, justify="left" if col in ("backend", "augmentation") else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            r["augmentation"],
            str(r["clips"]),
            f"{r['clips_per_s']:.1f}",
            f"{r['cpu_ms_per_clip']:.1f}",
            f"{r['ratio_to_torch']:.2f}",
        )
    console.print(table)
    full = next(r for r in rows if r["backend"] == "dali" and r["augmentation"] == "full")
    target = 1000.0 if cfg.device.startswith("cuda") else None
    if target:
        met = full["clips_per_s"] >= target
        console.print(
            f"DALI on {cfg.device}: {full['clips_per_s']:.0f} clips/s (target ≥ {target:.0f}): "
            f"{'[green]met' if met else '[red]missed'}"
        )
    else:
        met = full["ratio_to_torch"] >= 1.0
        console.print(
            f"DALI CPU / torch with full augmentation: {full['ratio_to_torch']:.2f}× (target ≥ 1.0): "
            f"{'[green]met' if met else '[red]missed'}"
        )
