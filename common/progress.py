"""The progress bar every long-running stage shows: description, bar, done/total, then optional columns.

Preprocessing, sharding, training and evaluation features all build theirs here, so they look alike and a
change of style happens in one place.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["progress_bar"]


def progress_bar(
    detail: str | None = None,
    *,
    bold: bool = False,
    elapsed: bool = True,
    console: Console | None = None,
    disable: bool = False,
    transient: bool = False,
) -> Progress:
    """A rich :class:`Progress`: ``description  ━━━  n/total  [detail]  [elapsed]  remaining``.

    Args:
        detail: a rich format string shown after the count (it may read ``{task.fields[...]}``).
        bold: show the description in bold.
        elapsed: show the elapsed time before the remaining time.
        console, disable, transient: passed to :class:`Progress` (``console=None`` means rich's default).
    """
    columns: list[ProgressColumn] = [
        TextColumn(("[bold]" if bold else "") + "{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
    ]
    if detail is not None:
        columns.append(TextColumn(detail))
    if elapsed:
        columns.append(TimeElapsedColumn())
    columns.append(TimeRemainingColumn())
    return Progress(*columns, console=console, disable=disable, transient=transient)
