"""A setting carries its default and help once; lists are fresh per instance; choices are read back."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

import pytest

from memdpc.common.settings import choices_of, setting


@dataclass
class Example:
    name: str = setting(MISSING, "Required, no default.")
    widths: list[int] = setting([1, 2], "A list.")
    mode: str = setting("a", "One of a few.", choices=("a", "b"))
    hidden: int = 3


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


def test_choices_of_lists_the_fields_that_take_one_of_a_few_values():
    assert choices_of(Example) == {"mode": ("a", "b")}
