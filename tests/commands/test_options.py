"""Options generated from a config: flags, types, defaults and help from its settings; a real click command
parses them back into the config's keyword arguments."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

import click
from click.testing import CliRunner

from memdpc.commands.options import SettingOption, config_options, stack, take
from memdpc.common.settings import setting

from ..test_declared_once import commands


@dataclass(frozen=True)
class Inner:
    lambda_: float = setting(0.5, "A nested float.")
    off: float = 0.0  # not an option


@dataclass(frozen=True)
class Config:
    shards: Path = setting(MISSING, "Required folder.", required=True)
    steps: int = setting(3, "Steps.", min=1)
    blocks: int = setting(8, "Blocks.", flags=("--blocks", "--num-blocks"))
    mode: str = setting("a", "Mode.", choices=("a", "b"))
    strict: bool = setting(False, "A plain flag.")
    jitter: bool = setting(True, "On unless turned off.")
    later: int | None = setting(7, "Decided later.", option_default=None)
    inner: Inner = setting(Inner(), nested=True)


def command(**kw) -> click.Command:
    @click.command()
    @config_options(Config, **kw)
    def cmd(**values):
        inner = take(Inner, values)
        click.echo(repr(sorted(values.items())) + "|" + repr(inner))

    return cmd


def params(cmd: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in cmd.params}


def test_each_setting_becomes_an_option_with_its_flags_type_and_default():
    p = params(command())
    assert list(p) == ["shards", "steps", "blocks", "mode", "strict", "jitter", "later", "lambda_"]
    assert p["shards"].required and p["shards"].opts == ["--shards"]
    assert isinstance(p["steps"].type, click.IntRange) and p["steps"].default == 3
    assert p["blocks"].opts == ["--blocks", "--num-blocks"]
    assert p["mode"].type.choices == ("a", "b")
    assert p["strict"].is_flag and p["strict"].secondary_opts == [] and p["strict"].default is False
    assert p["jitter"].opts == ["--jitter"] and p["jitter"].secondary_opts == ["--no-jitter"]
    assert p["later"].default is None and p["later"].help == "Decided later."
    assert p["lambda_"].opts == ["--lambda"]  # a trailing underscore is the field's, not the flag's


def test_the_command_parses_back_into_the_configs_keyword_arguments(tmp_path):
    res = CliRunner().invoke(
        command(),
        ["--shards", str(tmp_path), "--num-blocks", "4", "--no-jitter", "--strict", "--lambda", "0.25"],
    )
    assert res.exit_code == 0, res.output
    values, inner = res.output.strip().split("|")
    assert inner == "{'lambda_': 0.25}"
    assert "('blocks', 4)" in values and "('jitter', False)" in values and "('strict', True)" in values
    assert "('shards', PosixPath(" in values and "('later', None)" in values


def test_bad_values_are_usage_errors():
    for args in (["--shards", "x", "--steps", "0"], ["--shards", "x", "--mode", "c"], ["--steps", "2"]):
        res = CliRunner().invoke(command(), args)
        assert res.exit_code == 2, (args, res.output)


def test_defaults_of_an_instance_and_unset_options():
    p = params(command(defaults=Config(Path("s"), steps=9)))
    assert p["steps"].default == 9
    unset = params(command(unset=True))
    assert unset["steps"].default is None and "[default: 3]" in unset["steps"].help
    assert unset["strict"].secondary_opts == ["--no-strict"]  # off must be sayable over a settings file


def test_stack_applies_decorators_in_the_order_written():
    @click.command()
    @stack(click.option("--a"), click.option("--b"))
    def cmd(a, b):
        pass

    assert [p.name for p in cmd.params] == ["a", "b"]


def test_every_option_of_every_verb_is_a_setting():
    """No verb types an option's flags, default or help of its own: each comes from a setting of a config."""
    from memdpc.cli import main

    own = [
        f"{path} {p.opts[0]}"
        for path, cmd in commands(main)
        for p in cmd.params
        if isinstance(p, click.Option)
        and not isinstance(p, SettingOption)
        and p.name not in ("help", "version")
    ]
    assert own == []
    assert len([v for v in commands(main)]) > 15


def test_a_hand_written_option_is_found():
    @click.command()
    @config_options(Config)
    @click.option("--own", default=3, help="Typed in the verb.")
    def cmd(**_): ...

    kinds = {p.name: isinstance(p, SettingOption) for p in cmd.params}
    assert kinds["own"] is False and kinds["steps"] is True
