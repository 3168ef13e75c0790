"""How a settings file or a recipe's section fills what the command line leaves out, for every verb that reads
one (``memdpc train --config``, ``memdpc eval TASK --config``): the command line over the file over the
defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from click.core import ParameterSource

from memdpc.common.errors import UserError
from memdpc.common.settings import check_value, coerce, names_of

__all__ = ["given_over"]


def given_over(
    ctx: click.Context, options: dict[str, Any], values: Mapping[str, Any], where: str, *configs: type
) -> dict[str, Any]:
    """``options`` as the command line of ``ctx`` parsed them, with ``values`` (a settings file's or a recipe
    section's) where the command line gave none. A value is named as its setting or as its option's flag
    (``workers`` for ``num_workers``), must be a setting of one of ``configs`` that the command has as an option,
    and is coerced to its setting's type and checked against its range and choices: otherwise a UserError
    naming ``where`` and the problem."""
    fields = {name: f for config in configs for name, f in names_of(config).items()}
    params = [p for p in ctx.command.params if isinstance(p, click.Option) and p.name in fields]
    spelled = {o.lstrip("-").replace("-", "_"): p.name for p in params for o in p.opts} | {
        p.name: p.name for p in params
    }
    names, at = [], ctx
    while at.parent is not None:  # the verb's words below the group: "eval finetune"
        names.insert(0, at.info_name)
        at = at.parent
    verb = " ".join(["memdpc", *(names or [ctx.info_name])])
    merged = dict(options)
    for key, value in values.items():
        name = spelled.get(key)
        if name is None:
            raise UserError(f"{where}: {verb} has no option --{key.replace('_', '-')}")
        value = coerce(fields[name], value, where)
        try:
            check_value(fields[name], value)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        if ctx.get_parameter_source(name) is ParameterSource.DEFAULT:
            merged[name] = value
    return merged
