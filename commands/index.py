"""``memdpc index``: a dataset in its official layout → one video index (JSONL)."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console
from memdpc.common.settings import from_flat
from memdpc.preprocess.datasets import IndexOptions, IndexRun, make_index

__all__ = ["command"]


@click.command("index")
@click.argument("dataset_root", type=click.Path(path_type=Path))
@config_options(IndexRun)
@config_options(IndexOptions)
def command(dataset_root: Path, layout: str, out: Path | None, overwrite: bool, **options) -> None:
    """Read a dataset in its official layout and write one video index (JSONL)."""
    from memdpc.report.stage_tables import print_index_report

    report = make_index(
        dataset_root, layout, from_flat(IndexOptions, options, "options"), out=out, overwrite=overwrite
    )
    print_index_report(report, dataset_root, rich_console(), rich_console(stderr=True))
