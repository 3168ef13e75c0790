"""A setting: a dataclass field that carries its help text, its range or choices and how the command line shows
it, so that a config holds each default, each help and each bound once; the command line is generated from it
(``memdpc.commands.options``) and :func:`check` enforces the bounds on every instance, however it was made.

A config may nest another (``setting(Other(), nested=True)``): the nested config's settings are the outer one's
options too, and :func:`flat` / :func:`from_flat` read and write both as one mapping of names (a settings file,
a recipe section, the recorded ``config.yaml``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from memdpc.common.errors import UserError

__all__ = [
    "Checked",
    "check",
    "check_value",
    "coerce",
    "flat",
    "from_flat",
    "kind",
    "names_of",
    "options_of",
    "setting",
]

C = TypeVar("C")


def setting(default: Any, help: str = "", **cli: Any) -> Any:
    """A dataclass field with ``default`` (a list is copied for every instance) and its option's ``help``.

    ``cli`` says what the values may be and how the command line shows them, where the field's name and type do
    not: ``choices``, ``min`` and ``max`` (checked by :func:`check`; a None value is "not given" and passes),
    ``flags`` (the option's flags, e.g. ``("--blocks",)`` or ``("--linear/--mlp",)``), ``nargs`` (a tuple of that
    many values), ``metavar`` (how the help names the value), ``required``, ``path`` (a path on the command line: ``click.Path``'s settings),
    ``option_default`` (the option's default where it differs from the field's, e.g. None for "decided later",
    which the help then explains), ``nested`` (a dataclass whose own settings become options; its default is an
    instance, which gives the nested settings' defaults in this config) and, with it, ``flags`` as a mapping of
    the nested settings whose flags differ here. A field without help is not an option.
    ``default`` may be ``dataclasses.MISSING``: a field without a default.
    """
    metadata = {"help": help, **cli}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _nested(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("nested"))


def options_of(cls: type, defaults: Any = None) -> Iterator[tuple[dataclasses.Field, dict[str, Any], Any]]:
    """The settings of ``cls`` that are options (those with help), nested configs' own in their place: each
    field with its metadata as used here (a nesting config's flags for it applied) and its default here (from
    ``defaults``, an instance of ``cls``, else the field's own; a nested field's from the nesting default)."""
    for f in dataclasses.fields(cls):
        default = _default(f, defaults)
        if _nested(f):
            flags = f.metadata.get("flags") or {}
            for inner, meta, value in options_of(type(default), default):
                yield inner, {**meta, **({"flags": flags[inner.name]} if inner.name in flags else {})}, value
        elif f.metadata.get("help"):
            yield f, dict(f.metadata), default


def _default(f: dataclasses.Field, defaults: Any) -> Any:
    if defaults is not None and hasattr(defaults, f.name):
        return getattr(defaults, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def kind(f: dataclasses.Field) -> str:
    """The field's type as a name: int, float, str, bool, Path, list or tuple (``X | None`` reads as X)."""
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    text = text.replace(" | None", "").replace("None | ", "")
    return "list" if text.startswith("list") else "tuple" if text.startswith("tuple") else text


def check(config: Any) -> None:
    """Every setting of ``config`` within its field's ``choices``, ``min`` and ``max``; UserError naming the first
    that is not (nested configs check themselves when they are made)."""
    for f in dataclasses.fields(config):
        if not _nested(f):
            check_value(f, getattr(config, f.name))


def check_value(f: dataclasses.Field, value: Any) -> None:
    """``value`` within the ``choices``, ``min`` and ``max`` of the setting ``f`` (None passes: "not given");
    UserError naming the setting otherwise."""
    meta = f.metadata
    if value is None:
        return
    if "choices" in meta and value not in meta["choices"]:
        raise UserError(f"{f.name} must be one of {', '.join(map(str, meta['choices']))}, not {value!r}")
    if "min" in meta and value < meta["min"]:
        raise UserError(f"{f.name} must be ≥ {meta['min']}, not {value}")
    if "max" in meta and value > meta["max"]:
        raise UserError(f"{f.name} must be ≤ {meta['max']}, not {value}")


class Checked:
    """A config whose every instance is checked against its settings' ranges and choices (:func:`check`)."""

    def __post_init__(self) -> None:
        check(self)


def flat(config: Any) -> dict[str, Any]:
    """The settings of ``config`` as one mapping of names, nested configs' in their place (lists copied)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if _nested(f):
            out |= flat(value)
        else:
            out[f.name] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def names_of(cls: type) -> dict[str, dataclasses.Field]:
    """The settings of ``cls`` by name, nested configs' in their place (the names :func:`from_flat` takes)."""
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        out |= names_of(type(_default(f, None))) if _nested(f) else {f.name: f}
    return out


def coerce(f: dataclasses.Field, value: Any, where: str) -> Any:
    """``value`` (as a settings file or the command line gives it) as the type of ``f``; UserError otherwise."""
    name = kind(f)
    try:
        if value is None:
            if "None" in str(f.type) or name == "str":
                return None if "None" in str(f.type) else ""
            raise ValueError
        if name == "bool":
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
                return value.lower() in ("true", "yes", "1")
            if not isinstance(value, bool):
                raise ValueError
            return value
        if name == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if name == "float":
            return float(value)
        if name in ("list", "tuple"):
            item = float if "float" in str(f.type) else int
            if isinstance(value, str):
                value = [v for v in value.replace(" ", "").split(",") if v]
            values = [item(v) for v in value]
            return values if name == "list" else tuple(values)
        if name == "Path":
            return Path(value)
        return str(value)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {f.name} must be {f.type}, not {value!r}") from None


def from_flat(cls: type[C], values: Mapping[str, Any], where: str = "config", base: C | None = None) -> C:
    """A ``cls`` from a mapping of setting names (nested configs' included) over ``base`` (default: the
    defaults), each value coerced to its field's type and checked; UserError naming ``where`` and the problem
    (an unknown name too)."""
    by_name = names_of(cls)
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise UserError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    merged = flat(base) if base is not None else {}
    merged |= {k: coerce(by_name[k], v, where) for k, v in values.items()}
    try:
        return _build(cls, merged)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def _build(cls: type[C], values: Mapping[str, Any]) -> C:
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _nested(f):
            nested_default = _default(f, None)
            inner = {k: v for k, v in values.items() if k in names_of(type(nested_default))}
            kw[f.name] = dataclasses.replace(nested_default, **inner) if inner else nested_default
        elif f.name in values:
            kw[f.name] = values[f.name]
    return cls(**kw)
