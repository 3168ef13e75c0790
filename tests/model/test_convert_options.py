"""``memdpc convert``'s options: the paper's defaults, and a bad value one line (exit 2)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.model.convert_options import ConvertOptions


def test_defaults_and_checks():
    assert ConvertOptions() == ConvertOptions("memdpc", None, None)
    with pytest.raises(UserError, match="input_size must be ≥ 1, not 0"):
        ConvertOptions(input_size=0)
    with pytest.raises(UserError, match="to must be one of memdpc, reference"):
        ConvertOptions(to="timm")


def test_the_command_line_refuses_a_bad_value(tmp_path):
    res = CliRunner().invoke(
        main, ["convert", str(tmp_path / "a.pth"), str(tmp_path / "b.pt"), "--size", "0"]
    )
    assert res.exit_code == 2 and "--size" in res.output and "0" in res.output
    assert not (tmp_path / "b.pt").exists()
