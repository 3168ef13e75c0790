"""``memdpc show``: pictures of what a stage made."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource
from rich.markup import escape

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console
from memdpc.report.show_options import ShowOptions, ShowOut

__all__ = ["command"]


@click.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@config_options(ShowOut)
@config_options(ShowOptions)
def command(path: Path, out: Path, **kw) -> None:
    """Pictures of PATH: a frame archive or folder of them (contact sheet + GIF, flow in colour), a shard or shard
    folder (samples as the model reads them), a run folder (curves) or an eval folder (retrieval strips,
    confusion matrices)."""
    from memdpc.report.show import show

    if click.get_current_context().get_parameter_source("crop_size") is ParameterSource.DEFAULT:
        # not given: ShowOptions' own default (the shards' frame size), not the value the option keeps (train's)
        del kw["crop_size"]
    err = rich_console(stderr=True)

    def warn(text: str) -> None:
        err.print("[yellow]warning:[/yellow]", escape(text), soft_wrap=True)

    for written in show(path, out, ShowOptions(**kw), warn):
        rich_console().print(f"wrote {written}", markup=False, soft_wrap=True)
    err.print(
        "next: open them in an image viewer, or `memdpc report FOLDER` for one page of a whole run (e.g. a "
        "quickstart folder)",
        markup=False,
        soft_wrap=True,
    )
