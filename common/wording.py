"""How counts, lists of names, sizes, durations and errors read in messages: ``1 video``, ``3 classes``, ``a, b, c
and 2 more``, ``1.2 GB``, ``5 h 12 min``, ``OSError: first line``."""

from __future__ import annotations

__all__ = ["duration_text", "error_line", "name_list", "plural", "size_text"]


def plural(n: int, noun: str) -> str:
    """``1 video``, ``2 videos``, ``3 classes``, ``4 batches``, ``2 epochs``, ``9,537 videos``."""
    if n == 1:
        return f"{n:,} {noun}"
    es = noun.endswith(("s", "sh", "ch", "x")) and not noun.endswith("och")  # epoch: the ch of a k
    return f"{n:,} {noun}{'es' if es else 's'}"


def name_list(names: list[str], most: int = 10) -> str:
    """``a, b, c`` for a message: at most ``most`` names, then how many more."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")


def size_text(n: float) -> str:
    """``512 B``, ``3.4 MB``, ``1.2 GB`` (powers of 1000)."""
    units = ("B", "kB", "MB", "GB", "TB")
    i = 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def duration_text(seconds: float) -> str:
    """``42 s``, ``7 min``, ``5 h 12 min``, ``3 d 4 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def error_line(error: BaseException, most: int = 200) -> str:
    """``OSError: the first line of its message`` (at most ``most`` characters of it), for a one-line report."""
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:most]}"
