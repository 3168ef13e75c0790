"""``memdpc report``: one static page of what a folder holds."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console
from memdpc.report.show_options import ReportOut

__all__ = ["command"]


@click.command("report")
@click.argument("folder", type=click.Path(path_type=Path))
@config_options(ReportOut)
def command(folder: Path, out: Path | None) -> None:
    """One static page of what FOLDER holds (a quickstart folder, or a folder of runs, eval results, shards and
    frame archives): results table, curves, sample clips, retrieval strips; it opens from the file system."""
    from memdpc.report.page import write_report

    page = write_report(folder, out)
    rich_console().print(f"wrote {page} and its pictures in {page.parent}", markup=False, soft_wrap=True)
    rich_console(stderr=True).print(
        f"next: open {page.resolve().as_uri()} in a browser", markup=False, soft_wrap=True
    )
