"""The progress bar every long-running stage shows: description, bar, done/total, then optional columns.

Preprocessing, sharding, training and evaluation features all build theirs here, so they look alike and a
change of style happens in one place. Where the output is not a terminal (a log file, a pipe), no bar is
redrawn in place: each task writes whole lines instead (:class:`LogLines`), so that a log holds what a bar
showed, uncut (rich prints a bar's last frame there, cut to 80 columns).
"""

from __future__ import annotations

import time
from typing import Any

from rich import get_console
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from memdpc.common.wording import duration_text

__all__ = ["LOG_EVERY", "LogLines", "progress_bar"]

LOG_EVERY = 60.0
"""Seconds between two lines of a task's progress in a log (and one more when it finishes)."""


def progress_bar(
    detail: str | None = None,
    *,
    bold: bool = False,
    elapsed: bool = True,
    console: Console | None = None,
    disable: bool = False,
    transient: bool = False,
) -> Progress:
    """A rich :class:`Progress`: ``description  ━━━  n/total  [detail]  [elapsed]  remaining``; where ``console``
    (rich's default one when None) is not a terminal, :class:`LogLines` (nothing for a ``transient`` bar).

    Args:
        detail: a rich format string shown after the count (it may read ``{task.fields[...]}``).
        bold: show the description in bold.
        elapsed: show the elapsed time before the remaining time.
        console, disable, transient: passed to :class:`Progress` (``console=None`` means rich's default).
    """
    target = console or get_console()
    if not target.is_terminal and not disable:
        return LogLines(detail, console=target, quiet=transient)
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


class LogLines(Progress):
    """A progress display for a log file or a pipe: tasks are counted as :class:`Progress` counts them, and each
    writes one whole line (``description n/total detail · elapsed``) every :data:`LOG_EVERY` seconds and a last
    one when it is removed or the display stops (its final counts: a stage may update a task after its count is
    complete); ``quiet``: no line at all (a bar that would vanish)."""

    def __init__(self, detail: str | None, *, console: Console, quiet: bool = False) -> None:
        super().__init__(console=console, disable=True)
        self.detail, self.quiet = detail, quiet
        self._written: dict[TaskID, float] = {}  # when each task's last line was written
        self._done: set[TaskID] = set()  # tasks whose last line is written

    def line(self, task: Task) -> str:
        """The task's progress as one line of text: what the bar shows beside it, and the time it took."""
        done = f"{task.completed:,.0f}" + (f"/{task.total:,.0f}" if task.total is not None else "")
        detail = Text.from_markup(self.detail.format(task=task)).plain if self.detail is not None else ""
        shown = " ".join(p for p in (Text.from_markup(task.description).plain, done, detail) if p.strip())
        return f"{shown} · {duration_text(task.elapsed or 0.0)}"

    def _write(self, task_id: TaskID, last: bool = False) -> None:
        task = self._tasks.get(task_id)
        if task is None or task_id in self._done or self.quiet:
            return
        now = time.monotonic()
        if last or now - self._written.setdefault(task_id, now) >= LOG_EVERY:
            self._written[task_id] = now
            self.console.print(self.line(task), markup=False, highlight=False, soft_wrap=True)
            if last:
                self._done.add(task_id)

    def settle(self) -> None:
        """Write the last line of every task whose count is complete, now: before a line that says what comes
        after it (a run's summary, its ``next:``), not when the display stops."""
        for task_id, task in list(self._tasks.items()):
            if task.total is not None and task.completed >= task.total:
                self._write(task_id, last=True)

    def update(self, task_id: TaskID, **kw: Any) -> None:
        super().update(task_id, **kw)
        self._write(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._write(task_id)

    def remove_task(self, task_id: TaskID) -> None:
        self._write(task_id, last=True)
        super().remove_task(task_id)

    def stop(self) -> None:
        for task_id in list(self._tasks):
            self._write(task_id, last=True)
        super().stop()
