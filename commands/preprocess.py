"""``memdpc preprocess frames|flow``: decode every video of an index once into per-video frame archives."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options, stack, take
from memdpc.common.console import rich_console
from memdpc.common.streams import FLOW, RGB
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.options import PreprocessOptions, PreprocessRun

__all__ = ["command"]


@click.group("preprocess")
def command() -> None:
    """Decode videos once into per-video archives of RGB frames and/or TV-L1 flow."""


def _options(streams: str):
    return stack(
        click.argument("index", type=click.Path(path_type=Path)),
        config_options(PreprocessOptions, defaults=PreprocessOptions(streams=streams)),
        config_options(PreprocessRun),
    )


def _run(index: Path, dry_run: bool, **kw) -> None:
    from memdpc.preprocess.plan import plan
    from memdpc.preprocess.run import preprocess as run
    from memdpc.report.stage_tables import print_preprocess_report

    tvl1 = take(TVL1Params, kw)
    if dry_run:
        rich_console().print("\n".join(plan(index, tvl1=tvl1, **kw).lines()), markup=False, soft_wrap=True)
        return
    report = run(index, tvl1=tvl1, **kw)
    print_preprocess_report(report, index, rich_console(), rich_console(stderr=True))
    if report.failures and kw["strict"]:
        raise SystemExit(1)


@command.command("frames")
@_options(RGB)
def preprocess_frames(index: Path, **kw) -> None:
    """RGB JPEG frames of every video in INDEX (a video index JSONL from `memdpc index`)."""
    _run(index, **kw)


@command.command("flow")
@_options(FLOW)
def preprocess_flow(index: Path, **kw) -> None:
    """TV-L1 flow images of every video in INDEX, computed from the video (n frames → n − 1 flows)."""
    _run(index, **kw)
