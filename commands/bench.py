"""``memdpc bench loader``: the user's benchmark of the loaders on their own shards (the developers' benchmarks
are the checkout's ``bench/``)."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options
from memdpc.pipeline.loader_bench_options import LoaderBench

__all__ = ["command"]


@click.group("bench")
def command() -> None:
    """Benchmarks: each prints a table and writes JSON."""


@command.command("loader")
@click.argument("shards", type=click.Path(path_type=Path, exists=True, file_okay=False))
@config_options(LoaderBench)
def bench_loader_cmd(shards: Path, **kw) -> None:
    """DALI vs the torch loader on SHARDS: clips/s and CPU-ms per clip, with full augmentation and with none."""
    from memdpc.pipeline.loader_bench import bench_loader

    bench_loader(LoaderBench(shards=shards, **kw))
