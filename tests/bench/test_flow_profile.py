"""bench/flow_profile.py at a small size: the replay follows the kernel bit for bit (the benchmark exits
otherwise), every function and level gets its row, and the fresh compile's IR is read."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_recipe import run_bench


@pytest.mark.slow
def test_the_profile_accounts_for_every_function_and_level(tmp_path):
    out = tmp_path / "profile.json"
    res = run_bench("bench.flow_profile", "--size", "64x48", "--pairs", "2", "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    prof = got["profile"]
    names = {f["function"] for f in prof["functions"]}
    assert names == {"_iteration", "_warp", "_median", "_above", "_resize", "_warp_sources"}
    assert sum(f["share"] for f in prof["functions"]) == pytest.approx(1.0)
    assert [lv["level"] for lv in prof["levels"]] == [0, 1, 2, 3, 4]  # OpenCV's five scales
    assert sum(lv["share_of_iteration"] for lv in prof["levels"]) == pytest.approx(1.0)
    assert all(lv["ns_per_pixel_iteration"] > 0 for lv in prof["levels"])
    assert got["ir"]["_iteration"]["vector_div"] > 0  # the inner iteration's divisions are vectorised
    assert got["roofline"]["gb_per_pair"] > 0 and got["roofline"]["copy_gb_per_s_finest"] > 0
    assert "the inner iteration per pyramid level" in res.stdout
