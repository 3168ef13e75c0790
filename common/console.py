"""The consoles the verbs print to: rich's, except that output to a file or a pipe (``… 2>&1 | cat``, a log) is
not cut to 80 columns: a table keeps its natural width there, so a long title or a column's name is never broken
mid-word (``mean_class_t`` / ``op1``). A terminal keeps its own width, and ``COLUMNS`` still sets one. A table's
title and caption are wrapped to the table's width, not the console's: :func:`titled_table` makes a table at least as
wide as its title (a path, mostly) and its caption's longest word, so that a caption breaks between words only."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

__all__ = ["PIPE_WIDTH", "rich_console", "titled_table"]

PIPE_WIDTH = 1000  # columns of a console that writes to a file or a pipe: wider than any table memdpc prints


def rich_console(stderr: bool = False) -> Console:
    """A console on stdout (``stderr``: on stderr), :data:`PIPE_WIDTH` wide where that is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    wide = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=PIPE_WIDTH if wide else None)


def titled_table(title: str, caption: str | None = None, **kw) -> Table:
    """A rich :class:`Table` at least as wide as its ``title`` and the longest word of its ``caption``."""
    longest = max([len(title), *(len(word) for word in (caption or "").split())])
    return Table(title=title, caption=caption, min_width=longest, **kw)
