"""``memdpc convert``: checkpoints between the reference implementation's layout and memdpc's."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console, titled_table
from memdpc.model.convert_options import ConvertOptions

__all__ = ["command"]


@click.command("convert")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@config_options(ConvertOptions)
def command(checkpoint: Path, out: Path, to: str, stream: str | None, input_size: int | None) -> None:
    """Convert CHECKPOINT between the reference implementation's layout and memdpc's; write OUT."""
    from memdpc.model.convert import convert_file

    report = convert_file(checkpoint, out, to=to, stream=stream, input_size=input_size)
    table = titled_table(f"{checkpoint} -> {out} ({report.kind}, {report.config['name']})")
    table.add_column("keys")
    table.add_column("count", justify="right")
    table.add_column("names")
    for label, keys in (
        ("unused (in the source, not used)", report.unused),
        ("missing (left at initial values)", report.missing),
    ):
        table.add_row(label, str(len(keys)), "\n".join(keys) or "-")
    rich_console().print(table)
    if to == "memdpc":
        verb = "classify" if report.kind == "classifier" else "retrieve"
        stream_opt = "" if stream else " --stream rgb|flow"
        rich_console().print(
            f"next: memdpc eval {verb} {out} --shards SHARDS --out EVAL_DIR{stream_opt}",
            markup=False,
            soft_wrap=True,
        )
