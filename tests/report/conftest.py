"""Helpers of the report tests: a console that records what a table printed, and the table's cells."""

from __future__ import annotations

import io

from rich.console import Console


def recording_console() -> Console:
    """A wide, colourless console that keeps what it printed (``export_text``)."""
    return Console(file=io.StringIO(), record=True, width=200, color_system=None)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of a rendered table: the header (drawn with ┃), then the body (│)."""
    lines = [line.strip().replace("┃", "│") for line in text.splitlines()]
    return [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
