"""A setting carries its default, help and bounds once; lists are fresh per instance; every instance is checked
against the bounds; a config and the configs it nests read and write as one flat mapping of names."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

import pytest

from memdpc.common.errors import UserError
from memdpc.common.settings import Checked, flat, from_flat, names_of, options_of, setting


@dataclass
class Example:
    name: str = setting(MISSING, "Required, no default.")
    widths: list[int] = setting([1, 2], "A list.")
    mode: str = setting("a", "One of a few.", choices=("a", "b"))
    hidden: int = 3


@dataclass(frozen=True)
class Inner(Checked):
    steps: int = setting(3, "Steps.", min=1, max=9)
    mode: str = setting("a", "One of a few.", choices=("a", "b"))


@dataclass(frozen=True)
class Outer(Checked):
    inner: Inner = setting(Inner(steps=4), nested=True, flags={"steps": ("--steps", "--num-steps")})
    rate: float | None = setting(None, "Decided later.", min=0.0)
    pair: tuple[float, float] = setting((1.0, 1.0), "Two weights.", nargs=2)


def test_a_setting_is_a_field_with_its_help_and_how_the_command_line_shows_it():
    by_name = {f.name: f for f in fields(Example)}
    assert by_name["widths"].metadata["help"] == "A list."
    assert by_name["mode"].metadata["choices"] == ("a", "b")
    assert "help" not in by_name["hidden"].metadata
    with pytest.raises(TypeError):
        Example()  # MISSING: a field without a default


def test_a_list_default_is_copied_for_every_instance():
    a, b = Example("a"), Example("b")
    a.widths.append(3)
    assert b.widths == [1, 2] and Example.__dataclass_fields__["widths"].default_factory() == [1, 2]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"steps": 0}, "steps must be ≥ 1, not 0"),
        ({"steps": 10}, "steps must be ≤ 9, not 10"),
        ({"mode": "c"}, "mode must be one of a, b, not 'c'"),
    ],
)
def test_every_instance_is_checked_against_its_settings_bounds_and_choices(kw, message):
    with pytest.raises(UserError, match=f"^{message}$"):
        Inner(**kw)
    with pytest.raises(UserError, match="^rate must be ≥ 0.0, not -1.0$"):
        Outer(rate=-1.0)
    assert Outer().rate is None  # None: not given, not checked


def test_nested_settings_are_options_in_their_place_with_the_nesting_defaults_and_flags():
    options = {f.name: (meta, default) for f, meta, default in options_of(Outer)}
    assert list(options) == ["steps", "mode", "rate", "pair"]
    assert options["steps"] == ({**fields(Inner)[0].metadata, "flags": ("--steps", "--num-steps")}, 4)
    assert "flags" not in fields(Inner)[0].metadata  # the nesting's flags, not the setting's own
    assert options["mode"][1] == "a" and options["pair"][0]["nargs"] == 2
    assert set(names_of(Outer)) == {"steps", "mode", "rate", "pair"}


def test_a_config_reads_and_writes_as_one_flat_mapping():
    outer = from_flat(Outer, {"steps": "5", "rate": 0.5, "pair": "2,3"})
    assert outer == Outer(Inner(steps=5), rate=0.5, pair=(2.0, 3.0))  # values coerced to the fields' types
    assert flat(outer) == {"steps": 5, "mode": "a", "rate": 0.5, "pair": [2.0, 3.0]}
    assert from_flat(Outer, {"mode": "b"}, base=outer).inner == Inner(steps=5, mode="b")
    assert from_flat(Outer, {}).inner == Inner(steps=4)  # the nesting's default


@pytest.mark.parametrize(
    "values, message",
    [
        ({"stepz": 1}, "where: unknown setting(s) stepz"),
        ({"steps": 1.5}, "where: steps must be int, not 1.5"),
        ({"steps": 0}, "where: steps must be ≥ 1, not 0"),
    ],
)
def test_a_bad_mapping_is_one_line_naming_where_it_came_from(values, message):
    with pytest.raises(UserError) as e:
        from_flat(Outer, values, "where")
    assert str(e.value) == message
