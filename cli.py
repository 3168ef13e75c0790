"""The ``memdpc`` command line: parses options and calls one library function per command, nothing more.

User errors (:class:`memdpc.errors.UserError`) become a one-line message and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from memdpc import __version__
from memdpc.errors import UserError

console = Console(stderr=True)


class _Group(click.Group):
    """A click group that turns UserError from any command into a one-line usage error (exit 2)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.UsageError(str(e)) from None


def _group(**kw):
    return click.group(cls=_Group, **kw)


@_group()
@click.version_option(__version__, prog_name="memdpc")
def main() -> None:
    """memdpc: self-supervised video representation learning with Memory-augmented Dense Predictive Coding."""


# --------------------------------------------------------------------------------------------- index
@main.command("index")
@click.argument("dataset_root", type=click.Path(path_type=Path))
@click.option(
    "--layout",
    type=click.Choice(["ucf101", "hmdb51", "kinetics400", "oops", "folder"]),
    required=True,
    help="Dataset layout of DATASET_ROOT.",
)
@click.option("--split", type=click.IntRange(1, 3), default=1, show_default=True, help="Official split 1–3.")
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path),
    default=None,
    help="Index file to write (default: DATASET_ROOT/index_<layout>_split<N>.jsonl).",
)
def index_cmd(dataset_root: Path, layout: str, split: int, out: Path | None) -> None:
    """Read a dataset in its official layout and write one video index (JSONL)."""
    from memdpc.preprocess.datasets import build_index
    from memdpc.preprocess.video_index import summary, write_index

    records = build_index(dataset_root, layout, split)
    out = out or dataset_root / f"index_{layout}_split{split}.jsonl"
    write_index(records, out)
    counts = summary(records)
    table = Table(title=f"{out} — {len(records)} videos")
    table.add_column("class")
    for s in counts:
        table.add_column(s, justify="right")
    for name in sorted({n for c in counts.values() for n in c}):
        table.add_row(name or "(none)", *(str(c.get(name, 0)) for c in counts.values()))
    table.add_row("[bold]total", *(f"[bold]{sum(c.values())}" for c in counts.values()))
    Console().print(table)


# ---------------------------------------------------------------------------------------------- data
@_group()
def data() -> None:
    """Built-in example data."""


main.add_command(data)


@data.command("synthetic")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--videos-per-class", type=int, default=8, show_default=True, help="Videos per class.")
@click.option("--frames", type=int, default=48, show_default=True, help="Frames per video.")
@click.option("--size", type=int, default=64, show_default=True, help="Frame width and height in pixels.")
@click.option(
    "--classes", "num_classes", type=int, default=10, show_default=True, help="Number of classes (≤ 10)."
)
@click.option("--fps", type=float, default=25.0, show_default=True, help="Frame rate written in the files.")
@click.option(
    "--codec",
    type=click.Choice(["xvid", "mjpg", "mp4v"]),
    default="xvid",
    show_default=True,
    help="Video codec (xvid/mjpg: .avi, mp4v: .mp4).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed (same seed, same bytes).")
def data_synthetic(out: Path, **kw) -> None:
    """Write the built-in motion-class dataset to OUT in the UCF101 layout."""
    from memdpc.preprocess.synthetic import SyntheticConfig, make_synthetic

    root = make_synthetic(out, SyntheticConfig(**kw))
    Console().print(f"wrote {kw['num_classes']} classes × {kw['videos_per_class']} videos to {root}")
    Console().print(f"next: memdpc index {root} --layout ucf101")


if __name__ == "__main__":
    main()
