"""The loader benchmark (``memdpc bench loader``, :mod:`memdpc.pipeline.loader_bench`) without a shard set of
one's own: renders and shards a synthetic train set first.

    python -m bench.loader [SHARDS]   # without SHARDS: renders a synthetic shard set first
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.shard import make_archives
from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.loader_bench import bench_loader
from memdpc.pipeline.loader_bench_options import LoaderBench
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings


def synthetic_shards(root: Path, videos: int, frames: int, side: int) -> Path:
    """Render and shard a synthetic train set (for running this file without a shard set)."""
    records = make_archives(root / "archives", videos, frames, side)
    shard_stream(
        root / "archives",
        records,
        "rgb",
        root / "shards",
        "train",
        ShardSettings(window_step=10, max_count=4),
    )
    return root / "shards"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shards", type=Path, nargs="?", help="Shard directory (default: render a synthetic set).")
    ap.add_argument("--videos", type=int, default=16, help="Synthetic set: videos.")
    ap.add_argument("--frames", type=int, default=200, help="Synthetic set: frames per video.")
    ap.add_argument("--frame-size", type=int, default=256, help="Synthetic set: frame side in pixels.")
    for f in ("size", "batch_size", "batches", "repeat", "workers"):
        ap.add_argument(f"--{f.replace('_', '-')}", type=int, default=getattr(LoaderBench, f))
    ap.add_argument("--crop-size", type=int, default=224, help="Intermediate crop size; 0 = resize once.")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=LoaderBench.out)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        shards = args.shards or synthetic_shards(Path(tmp), args.videos, args.frames, args.frame_size)
        bench_loader(
            LoaderBench(
                shards=shards,
                size=args.size,
                batch_size=args.batch_size,
                batches=args.batches,
                repeat=args.repeat,
                spec=AugmentSpec(crop_size=args.crop_size or None),
                workers=args.workers,
                device=args.device,
                out=args.out,
            )
        )


if __name__ == "__main__":
    main()
