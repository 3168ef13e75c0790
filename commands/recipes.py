"""``memdpc recipes``: the paper's experiments, one recipe per table row."""

from __future__ import annotations

import click

from memdpc.common.console import rich_console
from memdpc.recipes.recipe import commands, load, names

__all__ = ["command"]


@click.command("recipes")
@click.argument("name", required=False)
@click.option(
    "--datasets",
    "data",
    default="DATA",
    show_default=True,
    help="Folder of the datasets in their official layouts, one sub-folder each (ucf101, hmdb51, k400).",
)
@click.option("--work", default="WORK", show_default=True, help="Folder for everything the commands write.")
def command(name: str | None, data: str, work: str) -> None:
    """The paper's experiments, one recipe per table row: list them, or print the commands of recipe NAME (a short
    name or a path), from the datasets to the figures to expect."""
    from memdpc.report.tables import print_recipes

    if name is not None:
        rich_console().print("\n".join(commands(load(name), data, work)), markup=False, soft_wrap=True)
    else:
        print_recipes([load(n) for n in names()], rich_console())
