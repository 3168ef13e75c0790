"""``memdpc index``: a dataset in its official layout → one video index (JSONL)."""

from __future__ import annotations

import inspect
from pathlib import Path

import click
from rich.markup import escape

from memdpc.common.console import rich_console, titled_table
from memdpc.common.wording import name_list, plural
from memdpc.preprocess.datasets import READERS, make_index

__all__ = ["index_cmd"]

_DEFAULTS = {name: p.default for name, p in inspect.signature(make_index).parameters.items()}  # the library's


@click.command("index")
@click.argument("dataset_root", type=click.Path(path_type=Path))
@click.option(
    "--layout", type=click.Choice(list(READERS)), required=True, help="Dataset layout of DATASET_ROOT."
)
@click.option(
    "--split",
    type=click.IntRange(1, 3),
    default=_DEFAULTS["split"],
    show_default=True,
    help="Official split 1–3.",
)
@click.option(
    "--test-per-class",
    type=click.IntRange(min=0),
    default=_DEFAULTS["test_per_class"],
    show_default=True,
    help="Move this many training videos per class to a 'test' split (for a folder without test/).",
)
@click.option(
    "--val-per-class",
    type=click.IntRange(min=0),
    default=_DEFAULTS["val_per_class"],
    show_default=True,
    help="Then move this many training videos per class to a 'val' split.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Draw the held-out videos at random per class with this seed (default: the last ones by id).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Index file to write (default: DATASET_ROOT/index_<layout>_split<N>.jsonl).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Write over an index that shards were made from (default: refuse it, naming them).",
)
def index_cmd(dataset_root: Path, layout: str, **kw) -> None:
    """Read a dataset in its official layout and write one video index (JSONL)."""
    from memdpc.preprocess.video_index import summary

    report = make_index(dataset_root, layout, **kw)
    counts = summary(report.records)
    table = titled_table(f"{report.path} — {len(report.records)} videos")
    table.add_column("class")
    for s in counts:
        table.add_column(s, justify="right")
    for name in sorted({n for c in counts.values() for n in c}):
        table.add_row(name or "(none)", *(str(c.get(name, 0)) for c in counts.values()))
    table.add_row("[bold]total", *(f"[bold]{sum(c.values())}" for c in counts.values()))
    rich_console().print(table)
    err = rich_console(stderr=True)
    if report.passed_over:
        files = name_list([f"{path} ({why})" for path, why in report.passed_over])
        err.print(
            "[yellow]warning:[/yellow]",
            escape(
                f"held out only videos whose files read: passed over {plural(len(report.passed_over), 'file')}, "
                f"left in train, where preprocess reports them: {files}"
            ),
            soft_wrap=True,
        )
    if report.not_indexed:
        by_why: dict[str, list[str]] = {}
        for path, why in report.not_indexed:
            by_why.setdefault(why, []).append(path)
        err.print(
            "[yellow]warning:[/yellow]",
            escape(
                f"not indexed: {plural(len(report.not_indexed), 'file')} of {dataset_root}: "
                + "; ".join(
                    f"{plural(len(paths), 'file')} {why} ({name_list(paths)})"
                    for why, paths in by_why.items()
                )
            ),
            soft_wrap=True,
        )
    for w in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    err.print(
        f"wrote {report.path}; next: memdpc preprocess flow {report.path} --out FRAMES --streams rgb,flow "
        "(FRAMES: a new folder for the frame archives)",
        soft_wrap=True,
    )
