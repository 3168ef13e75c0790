"""``memdpc data``: the built-in example families, written in the UCF101 layout."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import OUT_DIR, config_options
from memdpc.common.console import rich_console
from memdpc.preprocess.examples.directions import DirectionConfig, make_directions
from memdpc.preprocess.examples.layout import ExampleConfig
from memdpc.preprocess.examples.photos import PhotoConfig, make_photos
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic

__all__ = ["command"]


@click.group("data")
def command() -> None:
    """Built-in example data."""


def _wrote(root: Path, cfg: ExampleConfig) -> None:
    rich_console().print(f"wrote {cfg.num_classes} classes × {cfg.videos_per_class} videos to {root}")
    rich_console().print(f"next: memdpc index {root} --layout ucf101")


@command.command("synthetic")
@click.argument("out", type=OUT_DIR)
@config_options(ExampleConfig, defaults=SyntheticConfig())
def data_synthetic(out: Path, **kw) -> None:
    """Write the built-in motion-class dataset to OUT in the UCF101 layout."""
    cfg = SyntheticConfig(**kw)
    _wrote(make_synthetic(out, cfg), cfg)


@command.command("photos")
@click.argument("out", type=OUT_DIR)
@config_options(ExampleConfig, defaults=PhotoConfig())
def data_photos(out: Path, **kw) -> None:
    """Write the held-out family (camera and object motions over photographs) to OUT in the UCF101 layout."""
    cfg = PhotoConfig(**kw)
    _wrote(make_photos(out, cfg), cfg)


@command.command("directions")
@click.argument("out", type=OUT_DIR)
@config_options(ExampleConfig, defaults=DirectionConfig())
def data_directions(out: Path, **kw) -> None:
    """Write the family whose classes are directions (camera pans, tilts, rolls and zooms over photographs, each
    way a class of its own) to OUT in the UCF101 layout."""
    cfg = DirectionConfig(**kw)
    _wrote(make_directions(out, cfg), cfg)
