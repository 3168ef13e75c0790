"""One way for every verb that reads a settings file or a recipe: the command line over the file over the
defaults; a file's names are settings or their options' flags, its values coerced and checked, naming the file."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from memdpc.commands.options import config_options
from memdpc.common.settings import Checked, setting
from memdpc.recipes.merge import given_over


@dataclass(frozen=True)
class Settings(Checked):
    epochs: int = setting(10, "Epochs.", min=1)
    num_workers: int = setting(2, "Workers.", flags=("--workers", "--num-workers"))
    mode: str = setting("a", "Mode.", choices=("a", "b"))


def run(args: list[str], values: dict, unset: bool = False) -> click.testing.Result:
    @click.command("verb")
    @config_options(Settings, unset=unset)
    @click.option("--plain", is_flag=True, help="Not a setting.")
    def verb(**options):
        options.pop("plain")
        merged = given_over(click.get_current_context(), options, values, "file.yaml", Settings)
        click.echo(sorted(merged.items()))

    return CliRunner().invoke(verb, args)


@pytest.mark.parametrize("unset", [False, True])
def test_the_command_line_wins_and_the_file_fills_what_it_leaves_out(unset):
    res = run(["--epochs", "3"], {"epochs": 7, "workers": "4", "mode": "b"}, unset)
    assert res.exit_code == 0, res.output
    assert res.output.strip() == "[('epochs', 3), ('mode', 'b'), ('num_workers', 4)]"  # a flag's name too
    res = run([], {}, unset)
    expected = "[('epochs', None), ('mode', None), ('num_workers', None)]" if unset else None
    assert res.output.strip() == (expected or "[('epochs', 10), ('mode', 'a'), ('num_workers', 2)]")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"epoch": 3}, "file.yaml: memdpc verb has no option --epoch"),
        ({"plain": True}, "file.yaml: memdpc verb has no option --plain"),  # an option, but no setting
        ({"epochs": "many"}, "file.yaml: epochs must be int, not 'many'"),
        ({"epochs": 0}, "file.yaml: epochs must be ≥ 1, not 0"),
        ({"mode": "c"}, "file.yaml: mode must be one of a, b, not 'c'"),
    ],
)
def test_a_bad_name_or_value_in_the_file_is_one_line_naming_it(values, message):
    res = run([], values)
    assert res.exit_code == 1 and str(res.exception) == message
