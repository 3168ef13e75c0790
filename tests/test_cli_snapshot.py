"""The whole command line against a snapshot: every verb and option a user knows keeps its flags, its
default, its type and whether it is required. Options may be added; nothing may be removed or renamed.

The snapshot, ``tests/cli_snapshot.json``, was taken before the command line moved into one file per verb.
To record an addition on purpose: ``python tests/test_cli_snapshot.py --update`` (it refuses to drop or change
what the snapshot holds).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memdpc.cli import main

SNAPSHOT = Path(__file__).with_name("cli_snapshot.json")


def _plain(value):
    """A parameter's default as JSON: paths and tuples as their text and lists, callables by their result."""
    if callable(value):
        value = value()
    if type(value).__name__ == "Sentinel":  # click's "no default given"
        return None
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _type(t: click.ParamType) -> dict:
    out = {"name": t.name}
    if isinstance(t, click.Choice):
        out["choices"] = [str(c) for c in t.choices]
    if isinstance(t, (click.IntRange, click.FloatRange)):
        out["range"] = [t.min, t.max]
    if isinstance(t, click.Path):
        out["file_okay"], out["dir_okay"], out["exists"] = t.file_okay, t.dir_okay, t.exists
    return out


def _param(p: click.Parameter, ctx: click.Context) -> dict:
    out = {
        "kind": "argument" if isinstance(p, click.Argument) else "option",
        "opts": list(p.opts),
        "secondary_opts": list(p.secondary_opts),
        "type": _type(p.type),
        "default": _plain(p.get_default(ctx, call=False)),  # what a user gets (a plain flag: False)
        "required": p.required,
        "nargs": p.nargs,
        "multiple": p.multiple,
    }
    if isinstance(p, click.Option):
        out["is_flag"] = p.is_flag
    return out


def command_line(group: click.Group = main, path: str = "memdpc") -> dict[str, dict]:
    """Every command by its path ('memdpc eval retrieve') → its parameters by name, in order."""
    ctx = click.Context(group)
    found = {path: {p.name: _param(p, ctx) for p in group.params if p.name != "help"}}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            found |= command_line(cmd, f"{path} {name}")
        else:
            found[f"{path} {name}"] = {
                p.name: _param(p, click.Context(cmd)) for p in cmd.params if p.name != "help"
            }
    return found


def _kept(old: dict, new: dict) -> bool:
    """Whether a parameter keeps what the snapshot holds: the same, or a choice with more choices."""
    if old.get("type", {}).get("name") == "choice" == new.get("type", {}).get("name"):
        if set(old["type"]["choices"]) <= set(new["type"]["choices"]):
            new = {**new, "type": old["type"]}
    return new == old


def differences(old: dict, new: dict) -> list[str]:
    """What the snapshot holds that the command line lost or changed (additions, a new choice among them, are
    not differences)."""
    out = []
    for cmd, params in old.items():
        if cmd not in new:
            out.append(f"{cmd}: the verb is gone")
            continue
        for name, spec in params.items():
            if name not in new[cmd]:
                out.append(f"{cmd}: {spec['opts']} is gone")
            elif not _kept(spec, new[cmd][name]):
                changed = sorted(k for k in spec if new[cmd][name].get(k) != spec[k])
                out.append(
                    f"{cmd}: {spec['opts']} changed its {', '.join(changed)}: {spec} → {new[cmd][name]}"
                )
        old_args = [n for n, s in params.items() if s["kind"] == "argument"]
        new_args = [n for n, s in new[cmd].items() if s["kind"] == "argument"]
        if new_args[: len(old_args)] != old_args:
            out.append(f"{cmd}: arguments {old_args} became {new_args}")
    return out


def test_the_command_line_keeps_every_verb_and_option():
    old = json.loads(SNAPSHOT.read_text())
    assert differences(old, command_line()) == []


def test_a_required_option_is_still_refused_when_missing():
    """click counts a default of None as given: a required option must have no default at all."""
    old = json.loads(SNAPSHOT.read_text())
    given = []
    for path, params in _commands():
        for p in params:
            if old.get(path, {}).get(p.name, {}).get("required") and type(p.default).__name__ != "Sentinel":
                given.append(f"{path} {p.opts}")
    assert given == []


def _commands(group: click.Group = main, path: str = "memdpc"):
    ctx = click.Context(group)
    yield path, group.params
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd.params


def test_the_snapshot_check_sees_a_changed_default_and_a_removed_option():
    old = json.loads(SNAPSHOT.read_text())
    changed = json.loads(json.dumps(old))
    changed["memdpc shard"]["max_count"]["default"] = 7
    del changed["memdpc train"]["epochs"]
    changed["memdpc train"]["an_addition"] = {"kind": "option"}
    changed["memdpc index"]["layout"]["type"]["choices"].append("another")  # a choice more: kept
    changed["memdpc train"]["negatives"]["type"]["choices"].pop()  # a choice less: changed
    found = differences(old, changed)
    assert len(found) == 3, found
    assert any("--negatives" in f and "type" in f for f in found)
    assert any("--max-count" in f and "default" in f for f in found)
    assert any("--epochs" in f and "gone" in f for f in found)


if __name__ == "__main__":
    current = command_line()
    if SNAPSHOT.exists() and "--update" in sys.argv:
        lost = differences(json.loads(SNAPSHOT.read_text()), current)
        if lost:
            sys.exit("refused, the command line lost or changed:\n" + "\n".join(lost))
    lines = []
    for cmd, params in current.items():
        inner = ",\n".join(
            f"  {json.dumps(n)}: {json.dumps(s, ensure_ascii=False)}" for n, s in params.items()
        )
        lines.append(f" {json.dumps(cmd)}: {{\n{inner}\n }}" if params else f" {json.dumps(cmd)}: {{}}")
    SNAPSHOT.write_text("{\n" + ",\n".join(lines) + "\n}\n")  # one line a parameter
    print(f"wrote {SNAPSHOT}: {len(current)} commands")
