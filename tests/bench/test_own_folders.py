"""bench/own_folders.py: a family rendered into a labelled folder and a flat unlabelled pool, the one command on
them for real (a tiny recipe), its table gathered; a rerun renders and runs nothing again."""

from __future__ import annotations

import json

import pytest

from tests.bench.test_recipe import run_bench
from tests.test_quickstart import TINY_POOL_RECIPE


@pytest.mark.slow
def test_the_one_command_runs_on_a_labelled_folder_and_a_flat_pool_and_is_not_run_again(tmp_path):
    recipe = tmp_path / "tiny-pool.yaml"
    recipe.write_text(TINY_POOL_RECIPE)
    work, out = tmp_path / "work", tmp_path / "out" / "own"
    first = run_bench("bench.own_folders", recipe, "--family", "directions", "--work", work, "--out", out)
    assert first.returncode == 0, first.stderr[-3000:]
    folders = work / "tiny-pool-directions"
    labelled = sorted(p.parent.name for p in (folders / "labelled" / "UCF-101").rglob("*.avi"))
    assert len(labelled) == 5 * 3 and len(set(labelled)) == 3  # videos per class × classes, by class
    pool = list((folders / "pool").iterdir())
    assert len(pool) == 1 * 5 * 3 and all(p.suffix == ".avi" and p.parent.name == "pool" for p in pool)
    assert not any(c in p.name for p in pool for c in set(labelled))  # its names tell no class
    (result,) = json.loads(out.with_suffix(".json").read_text())
    assert (result["family"], result["streams"], result["minutes"] > 0) == ("directions", ["flow"], True)
    assert f"--videos {folders / 'labelled' / 'UCF-101'} --pool {folders / 'pool'}" in result["command"]
    assert set(result["metrics"]) == {"flow R@1", "flow probe top-1"}
    index = [json.loads(line) for line in (folders / "run" / "pool" / "index.jsonl").read_text().splitlines()]
    assert len(index) == len(pool) and {r["label"] for r in index} == {-1}  # pretrained on without labels
    table = out.with_suffix(".md").read_text()
    assert "--videos --pool on the directions family" in table and "| directions | 0 |" in table
    again = run_bench("bench.own_folders", recipe, "--family", "directions", "--work", work, "--out", out)
    assert again.returncode == 0 and "$ memdpc" not in again.stdout
    assert json.loads(out.with_suffix(".json").read_text()) == [result]
