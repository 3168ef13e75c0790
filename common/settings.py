"""A setting: a dataclass field that carries its help text and how the command line shows it, so that a config
holds each default and each help once and the command line is generated from it (``memdpc.commands.options``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["choices_of", "setting"]


def setting(default: Any, help: str = "", **cli: Any) -> Any:
    """A dataclass field with ``default`` (a list is copied for every instance) and its option's ``help``.

    ``cli`` says how the command line shows it, where the field's name and type do not: ``flags`` (the option's
    flags, e.g. ``("--blocks",)`` or ``("--linear/--mlp",)``), ``choices``, ``min`` (an integer or float range),
    ``required``, ``path`` (``click.Path`` settings), ``option_default`` (the option's default where it differs
    from the field's, e.g. None for "decided later", which the help then explains), ``nested`` (a dataclass
    whose own settings become options; its default is an instance). A field without help is not an option.
    ``default`` may be ``dataclasses.MISSING``: a field without a default.
    """
    metadata = {"help": help, **cli}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def choices_of(cls: type) -> dict[str, tuple[Any, ...]]:
    """The settings of the dataclass ``cls`` that take one of a few values → those values."""
    return {f.name: tuple(f.metadata["choices"]) for f in dataclasses.fields(cls) if "choices" in f.metadata}
