"""progress.py: the progress bar every long stage shows, rendered for real into a recording console: a bar on a
terminal, whole lines in a log file or a pipe (a real `memdpc` process writing into a file)."""

from __future__ import annotations

import io
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from memdpc.common import progress
from memdpc.common.progress import LogLines, progress_bar

from ..conftest import run_memdpc


def _console(terminal: bool = True, width: int = 100) -> Console:
    return Console(file=io.StringIO(), record=True, width=width, force_terminal=terminal, color_system=None)


def test_columns_follow_the_options():
    default = [type(c) for c in progress_bar(console=_console()).columns]
    assert default == [TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn]
    lean = progress_bar("{task.fields[fps]} fps", elapsed=False, bold=True, console=_console()).columns
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
    for terminal in (True, False):
        console = _console(terminal)
        with progress_bar(console=console, disable=True) as bar:
            assert bar.disable
            task = bar.add_task("sharding", total=4)
            bar.advance(task, 4)
            assert bar.tasks[0].finished
        assert console.export_text() == ""


def test_a_transient_bar_is_passed_through():
    assert progress_bar(transient=True, console=_console()).live.transient
    assert not progress_bar(console=_console()).live.transient


def test_a_log_gets_whole_lines_when_a_task_finishes_or_is_removed_and_every_so_often(monkeypatch):
    console = _console(terminal=False, width=40)  # narrower than a line: nothing is cut
    long = "x" * 60
    with progress_bar("{task.fields[info]}", console=console) as bar:
        assert isinstance(bar, LogLines)
        first = bar.add_task("[bold]epoch 0", total=3, info="")
        for _ in range(3):
            bar.update(first, advance=1, info="")
        bar.update(first, info=f"loss 2.197 {long}")  # after its count was complete
        bar.remove_task(first)
        slow = bar.add_task("epoch 1", total=100, info="")
        bar.advance(slow, 5)
        assert len(console.export_text(clear=False).splitlines()) == 1  # no line before a minute has passed
        monkeypatch.setattr(progress, "LOG_EVERY", 0.0)  # the next update comes a minute later, as it were
        time.sleep(0.01)
        bar.update(slow, advance=5, info="loss 2.1")
        monkeypatch.undo()
        left = bar.add_task("epoch 2", total=None, info="")
        bar.advance(left, 7)
    lines = console.export_text().splitlines()
    assert [line.rsplit(" · ", 1)[0] for line in lines] == [
        f"epoch 0 3/3 loss 2.197 {long}",  # removed: its last counts; markup gone
        "epoch 1 10/100 loss 2.1",  # a minute on
        "epoch 1 10/100 loss 2.1",  # the display stopped
        "epoch 2 7",
    ]
    assert all(line.endswith(" s") for line in lines)
    quiet = _console(terminal=False)
    with progress_bar(console=quiet, transient=True) as bar:
        bar.advance(bar.add_task("features", total=2), 2)
    assert quiet.export_text() == ""


def test_a_verb_writing_into_a_file_leaves_whole_lines_and_no_bar(tiny_dataset, tmp_path):
    from memdpc.preprocess.datasets import build_index
    from memdpc.preprocess.video_index import write_index

    write_index(build_index(tiny_dataset, "ucf101", 1), tmp_path / "index.jsonl")
    res = run_memdpc(
        "preprocess", "frames", tmp_path / "index.jsonl", "--out", tmp_path / "frames", "--workers", "1"
    )
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert "━" not in res.stderr
    assert any(
        line.startswith("preprocess rgb 9/9 videos · 270 frames · ") and " frames/s · " in line
        for line in lines
    )


def test_a_log_writes_the_last_line_of_a_finished_task_before_what_follows_it():
    """``settle`` (a run's summary and its ``next:`` come after it) writes a finished task's last line then, not
    when the display stops after them; a task still counting is left to the display."""
    console = _console(terminal=False)
    with progress_bar(console=console) as bar:
        done = bar.add_task("epoch 3", total=2)
        bar.advance(done, 2)
        going = bar.add_task("features", total=5)
        bar.advance(going, 1)
        bar.settle()
        console.print("next: memdpc eval retrieve best.pt")
    lines = [line.rsplit(" · ", 1)[0] for line in console.export_text().splitlines()]
    assert lines == ["epoch 3 2/2", "next: memdpc eval retrieve best.pt", "features 1/5"]
