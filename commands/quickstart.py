"""``memdpc quickstart``: the main job end to end on example data, in one table."""

from __future__ import annotations

import click

from memdpc.commands.options import config_options, take
from memdpc.common.settings import from_flat
from memdpc.preprocess.datasets import OwnFolders
from memdpc.recipes.quickstart_options import QuickstartOptions

__all__ = ["command"]


@click.command("quickstart")
@config_options(QuickstartOptions)
@config_options(OwnFolders)
def command(**kw) -> None:
    """The main job end to end on example data: data, preprocess, shard, train rgb and flow, evaluate
    MemDPC against random init (retrieval, linear probe, late fusion) and print one table; --recipe runs an
    example recipe's job instead (e.g. pretraining on a pool of unlabelled videos); --videos (and --pool) runs
    it on your own folders."""
    from memdpc.quickstart import quickstart

    run = take(QuickstartOptions, kw)
    quickstart(**run, own=from_flat(OwnFolders, kw, "options"))
