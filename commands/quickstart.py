"""``memdpc quickstart``: the main job end to end on example data, in one table."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import OUT_DIR, config_options
from memdpc.common.settings import from_flat
from memdpc.pipeline.backends import BACKENDS
from memdpc.preprocess.datasets import OwnFolders
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES

__all__ = ["command"]


@click.command("quickstart")
@click.option(
    "--out",
    type=OUT_DIR,
    default=Path("quickstart"),
    show_default=True,
    help="Folder for everything the run makes (data, frames, shards, runs, eval, the table).",
)
@click.option(
    "--tiny", is_flag=True, help="A reduced run (3 classes, 32² frames, 2–3 epochs) for CI and smoke tests."
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Preprocessing processes and loader workers.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of every stage.")
@click.option(
    "--data",
    type=click.Choice(EXAMPLE_FAMILIES),
    default=next(iter(EXAMPLE_FAMILIES)),
    show_default=True,
    help="Example family: the built-in synthetic motions, or the held-out photos (needs memdpc[photos]).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="auto",
    show_default=True,
    help="Loader backend for training and evaluation (auto: DALI where installed).",
)
@click.option(
    "--recipe",
    default=None,
    help="An example recipe's sizes instead of the default's (`memdpc recipes` lists them): a name or a file.",
)
@config_options(OwnFolders)
def command(
    out: Path,
    tiny: bool,
    workers: int,
    seed: int,
    data: str,
    backend: str,
    recipe: str | None,
    **own,
) -> None:
    """The main job end to end on example data: data, preprocess, shard, train rgb and flow, evaluate
    MemDPC against random init (retrieval, linear probe, late fusion) and print one table; --recipe runs an
    example recipe's job instead (e.g. pretraining on a pool of unlabelled videos); --videos (and --pool) runs
    it on your own folders."""
    from memdpc.quickstart import quickstart

    quickstart(
        out,
        tiny=tiny,
        workers=workers,
        seed=seed,
        data=data,
        backend=backend,
        recipe=recipe,
        own=from_flat(OwnFolders, own, "options"),
    )
