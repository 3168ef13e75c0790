"""``memdpc shard``: per-video frame archives → WebDataset shards of 40-frame samples with DALI indexes; or,
with ``--verify``, every shard of a folder checked against its manifest and index."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import OUT_DIR, config_options, take
from memdpc.common.console import rich_console
from memdpc.common.settings import from_flat
from memdpc.common.streams import STREAMS
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import SPLITS, ShardSettings

__all__ = ["command"]


@click.command("shard")
@click.argument("archive_root", type=click.Path(path_type=Path), required=False)
@click.option("--index", "index", type=click.Path(path_type=Path), help="Video index (JSONL) of the videos.")
@click.option("--stream", type=click.Choice(STREAMS), help="Which archives to shard.")
@click.option("--out", "out", type=OUT_DIR, help="Shard folder (gets <stream>/ inside).")
@click.option(
    "--split",
    type=click.Choice(SPLITS),
    default="train",
    show_default=True,
    help="Videos to shard; train/all: train windows, shuffled; test/val: eval windows (0, 59, 118, …).",
)
@config_options(ShardSettings)
@click.option("--strict", is_flag=True, help="Stop at the first bad video (default: skip and report it).")
@click.option(
    "--allow-missing-classes",
    is_flag=True,
    help="Shard a split although classes with videos in it have no samples (failed in preprocess, or not "
    "written yet), leaving them out (default: refuse, before writing).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Rewrite the split's shards in --out made with other options or from archives changed since "
    "(default: refuse).",
)
@click.option(
    "--verify",
    "verify",
    type=click.Path(path_type=Path),
    default=None,
    help="Instead of sharding: re-read every shard in DIR and check it against its manifest and index.",
)
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
