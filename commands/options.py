"""Click options generated from the library's configs: one option per setting (:func:`memdpc.common.settings.
setting`), with the setting's default and help, so that no verb types a default or a help text again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from memdpc.common.settings import kind, options_of

__all__ = ["OUT_DIR", "SettingOption", "config_options", "stack", "take"]

F = TypeVar("F", bound=Callable[..., Any])

# an output folder: click rejects an existing file of that name before any work starts
OUT_DIR = click.Path(path_type=Path, file_okay=False)
_KINDS = {"int": int, "float": float, "str": str, "bool": bool, "Path": Path}


class SettingOption(click.Option):
    """An option generated from a setting: its flags, type, default and help are the setting's (a verb's option of
    another class typed its own, which a test of the command line refuses)."""


def stack(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """The decorators applied as if written one above the other, the first on top (options listed in order)."""

    def wrap(fn: F) -> F:
        for deco in reversed(decorators):
            fn = deco(fn)
        return fn

    return wrap


def _type(f: dataclasses.Field, meta: dict[str, Any], kind_: str, unset: bool) -> click.ParamType | type:
    if "choices" in meta:
        return click.Choice([str(c) for c in meta["choices"]])
    if kind_ == "Path" or ("path" in meta and not unset):
        return click.Path(path_type=Path, **meta.get("path", {}))
    if kind_ == "tuple":
        return float if "float" in str(f.type) else int
    if ("min" in meta or "max" in meta) and not unset:
        # unset: the value is checked when the config is made (check), as a settings file's are
        ranged = click.FloatRange if kind_ == "float" else click.IntRange
        return ranged(min=meta.get("min"), max=meta.get("max"))
    return _KINDS.get(kind_, str)


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "none" if value in ("", None) else str(value)


def _option(f: dataclasses.Field, meta: dict[str, Any], default: Any, unset: bool) -> Callable[[F], F]:
    kind_ = kind(f)
    name = f.name
    flags = tuple(meta.get("flags") or ("--" + name.rstrip("_").replace("_", "-"),))
    text = meta["help"]
    kw: dict[str, Any] = {"help": text}
    for key in ("nargs", "metavar"):
        if key in meta:
            kw[key] = meta[key]
    if "option_default" in meta:  # "decided later", as the help says
        default = meta["option_default"]
    elif unset:  # "not given here": the value comes from a settings file, else the config's default
        kw["help"] = f"{text} [default: {_shown(default)}]"
        default = None
    elif meta.get("required"):
        kw["required"] = True
        default = None
    elif default is not None:
        kw["show_default"] = True
    if kind_ == "bool":  # an on/off pair where off must be sayable (default on, or unset); else a plain flag
        if "/" not in flags[-1] and (unset or default):
            flags = (*flags[:-1], f"{flags[-1]}/--no-{flags[-1][2:]}")
        if "/" in flags[-1]:
            return click.option(*flags, name, cls=SettingOption, default=default, **kw)
        kw.pop("show_default", None)  # a plain flag is off unless given
        return click.option(*flags, name, cls=SettingOption, is_flag=True, default=bool(default), **kw)
    if "choices" in meta and default is not None:
        default = str(default)
    if not kw.get("required"):  # a required option has no default at all (click counts None as given)
        kw["default"] = default
    return click.option(*flags, name, cls=SettingOption, type=_type(f, meta, kind_, unset), **kw)


def config_options(cls: type, *, defaults: Any = None, unset: bool = False) -> Callable[[F], F]:
    """One click option per setting of the dataclass ``cls``, in field order.

    ``defaults``: an instance whose values are shown as the defaults (a family's or a task's own); ``unset``:
    every option defaults to None ("not given"), its help naming the config's default — for verbs whose
    settings files fill what the command line leaves out; their values are checked when the config is made
    (:func:`memdpc.common.settings.check`), as a file's are, so the options carry no range of their own.
    """
    return stack(*(_option(f, meta, default, unset) for f, meta, default in options_of(cls, defaults)))


def take(cls: type, kw: dict[str, Any]) -> dict[str, Any]:
    """Pop the options of ``cls``'s settings from the parsed ``kw`` (as keyword arguments of ``cls``)."""
    return {f.name: kw.pop(f.name) for f, _, _ in options_of(cls) if f.name in kw}
