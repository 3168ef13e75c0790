"""progress.py: the progress bar every long stage shows, rendered for real into a recording console."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from memdpc.common.progress import progress_bar


def _console() -> Console:
    return Console(file=io.StringIO(), record=True, width=100, force_terminal=False, color_system=None)


def test_columns_follow_the_options():
    default = [type(c) for c in progress_bar().columns]
    assert default == [TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn]
    lean = progress_bar("{task.fields[fps]} fps", elapsed=False, bold=True).columns
    assert [type(c) for c in lean] == [
        TextColumn,
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeRemainingColumn,
    ]
    assert (
        lean[0].text_format == "[bold]{task.description}" and lean[3].text_format == "{task.fields[fps]} fps"
    )


def test_counts_advance_and_are_shown_as_done_of_total():
    console = _console()
    with progress_bar("{task.fields[fps]} fps", console=console) as bar:
        task = bar.add_task("decoding", total=10, fps=0)
        bar.advance(task)
        bar.update(task, advance=2, fps=25)
        assert bar.tasks[0].completed == 3
    text = console.export_text()  # the final state, printed when the bar stops
    assert "decoding" in text and "3/10" in text and "25 fps" in text


def test_a_disabled_bar_prints_nothing_but_still_counts():
    console = _console()
    with progress_bar(console=console, disable=True) as bar:
        assert bar.disable
        task = bar.add_task("sharding", total=4)
        bar.advance(task, 4)
        assert bar.tasks[0].finished
    assert console.export_text() == ""


def test_a_transient_bar_is_passed_through():
    assert progress_bar(transient=True).live.transient
    assert not progress_bar().live.transient
