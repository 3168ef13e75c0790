"""How counts and lists of names read in messages: ``1 video``, ``3 classes``, ``a, b, c and 2 more``."""

from __future__ import annotations


def plural(n: int, noun: str) -> str:
    """``1 video``, ``2 videos``, ``3 classes``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def name_list(names: list[str], most: int = 10) -> str:
    """``a, b, c`` for a message: at most ``most`` names, then how many more."""
    more = len(names) - most
    return ", ".join(names[:most]) + (f" and {more} more" if more > 0 else "")
