"""``memdpc recipes``: the paper's experiments, one recipe per table row."""

from __future__ import annotations

import click

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console
from memdpc.common.errors import UserError
from memdpc.common.settings import from_flat
from memdpc.preprocess.datasets import OwnFolders
from memdpc.recipes.recipe import RecipeFolders, commands, load, names

__all__ = ["command"]


@click.command("recipes")
@click.argument("name", required=False)
@config_options(RecipeFolders)
@config_options(OwnFolders)
def command(name: str | None, data: str, work: str, **own) -> None:
    """The paper's experiments, one recipe per table row: list them, or print the commands of recipe NAME (a short
    name or a path), from the datasets to the figures to expect; with --videos, an example recipe's commands for
    your own folders (what `memdpc quickstart --recipe NAME --videos DIR` runs)."""
    from memdpc.report.tables import print_recipes

    folders = from_flat(OwnFolders, own, "options")
    if folders.videos is not None and name is None:
        raise UserError("--videos and --pool go with an example recipe's NAME (`memdpc recipes` lists them)")
    if folders.videos is not None:
        from memdpc.quickstart import own_commands

        lines = own_commands(name, folders, work)
    elif name is not None:
        lines = commands(load(name), data, work)
    else:
        print_recipes([load(n) for n in names()], rich_console())
        return
    rich_console().print("\n".join(lines), markup=False, soft_wrap=True)
