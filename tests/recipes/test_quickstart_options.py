"""``memdpc quickstart``'s options: one home for each default, which the library function takes too."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.pipeline.backends import BACKENDS
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.quickstart import quickstart
from memdpc.recipes.quickstart_options import QuickstartOptions


def test_the_library_function_takes_the_options_defaults():
    given = inspect.signature(quickstart).parameters
    for name, value in vars(QuickstartOptions()).items():
        assert given[name].default == value, name
    assert QuickstartOptions().out == Path("quickstart") and QuickstartOptions().workers == 2


def test_choices_are_the_families_and_backends_and_bad_values_are_refused(tmp_path):
    assert (
        QuickstartOptions().data == next(iter(EXAMPLE_FAMILIES)) and QuickstartOptions().backend in BACKENDS
    )
    with pytest.raises(UserError, match="workers must be ≥ 1, not 0"):
        QuickstartOptions(workers=0)
    res = CliRunner().invoke(main, ["quickstart", "--out", str(tmp_path / "q"), "--workers", "0"])
    assert res.exit_code == 2 and "--workers" in res.output
    res = CliRunner().invoke(main, ["quickstart", "--out", str(tmp_path / "q"), "--data", "faces"])
    assert res.exit_code == 2 and "--data" in res.output
    assert not (tmp_path / "q").exists()
