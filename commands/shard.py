"""``memdpc shard``: per-video frame archives → WebDataset shards of 40-frame samples with DALI indexes; or,
with ``--verify``, every shard of a folder checked against its manifest and index."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options, take
from memdpc.common.console import rich_console
from memdpc.common.settings import from_flat
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardJob, ShardSettings

__all__ = ["command"]


@click.command("shard")
@click.argument("archive_root", type=click.Path(path_type=Path), required=False)
@config_options(ShardJob)
@config_options(ShardSettings)
def command(archive_root: Path | None, verify: Path | None, **kw) -> None:
    """Cut per-video frame archives into WebDataset shards of 40-frame samples, with DALI indexes."""
    from memdpc.pipeline.manifest import verify_shards
    from memdpc.report.stage_tables import print_shard_report, print_verify

    if verify is not None:
        if not print_verify(verify_shards(verify), rich_console()):
            raise SystemExit(1)
        return
    missing = ["ARCHIVE_ROOT"] * (archive_root is None) + [
        f"--{o}" for o in ("index", "stream", "out") if not kw[o]
    ]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)} (or give --verify DIR)")
    index, stream, out, split = kw.pop("index"), kw.pop("stream"), kw.pop("out"), kw.pop("split")
    settings = from_flat(ShardSettings, take(ShardSettings, kw), "options")
    console = rich_console()
    report = run_shard(archive_root, index, stream, out, split, settings, console=console, **kw)
    print_shard_report(report, console, next_step=True)
