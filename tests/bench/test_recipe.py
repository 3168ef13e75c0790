"""bench/recipe.py: an example recipe's printed commands run for real (a tiny one, two held-out draws of one
family), their tables gathered into one; a rerun runs nothing again, and runs made elsewhere keep their rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.recipe import runs
from memdpc.recipes.recipe import EXAMPLE_SEEDS, load
from tests.conftest import subprocess_env
from tests.test_quickstart import TINY_POOL_RECIPE

ROOT = Path(__file__).resolve().parents[2]


def run_bench(module: str, *args) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` (a benchmark of ``bench/``) with torch's two threads, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env={**subprocess_env(), "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
        timeout=600,
    )


@pytest.mark.slow
def test_the_recipes_runs_are_gathered_with_their_pairs_and_minutes_and_not_run_again(tmp_path):
    recipe = tmp_path / "tiny-pool.yaml"
    recipe.write_text(TINY_POOL_RECIPE)
    work, out = tmp_path / "work", tmp_path / "out" / "recipe"
    first = run_bench("bench.recipe", recipe, "--work", work, "--out", out, "--only", "synthetic")
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())
    assert [(r["family"], r["seed"], r["streams"], r["n"]) for r in results] == [
        ("synthetic", 0, ["flow"], 6),
        ("synthetic", 1, ["flow"], 6),
    ]
    for r in results:
        assert (
            r["minutes"] > 0
            and (work / "tiny-pool" / f"synthetic-s{r['seed']}" / "quickstart.json").is_file()
        )
        assert r["command"].startswith(f"memdpc quickstart --recipe {recipe} --data synthetic --seed ")
        assert list(r["metrics"]) == ["flow R@1", "flow probe top-1"]
        for m in r["metrics"].values():
            assert set(m["models"]) == {"MemDPC", "random init", "random init, data BN"}
            for p in m["paired"].values():
                assert 0 < p["p"] <= 1 if p["p"] is not None else p["discordant"] == "0/0"
    table = out.with_suffix(".md").read_text().splitlines()
    assert len([line for line in table if line.startswith("| synthetic |")]) == 2 * 2  # runs × metrics
    stamps = [(work / "tiny-pool" / f"synthetic-s{s}" / "quickstart.json").stat().st_mtime_ns for s in (0, 1)]
    again = run_bench("bench.recipe", recipe, "--work", work, "--out", out, "--only", "synthetic")
    assert again.returncode == 0 and "$ memdpc" not in again.stdout
    assert [
        (work / "tiny-pool" / f"synthetic-s{s}" / "quickstart.json").stat().st_mtime_ns for s in (0, 1)
    ] == stamps
    assert json.loads(out.with_suffix(".json").read_text()) == results
    # another work folder, without these runs: their rows are kept as the JSON had them
    elsewhere = run_bench("bench.recipe", recipe, "--work", tmp_path / "elsewhere", "--out", out, "--report")
    assert elsewhere.returncode == 0 and json.loads(out.with_suffix(".json").read_text()) == results


def test_validation_runs_are_on_the_validation_draws_of_the_kinds_families_only():
    """``--validation``: seed 100 of the families whose class is a kind of motion, never a held-out draw, each in
    its own folder, as ``memdpc recipes`` would print it for that seed."""
    todo = runs("example-fused-pool", Path("/w"), validation=True)
    assert [(r["family"], r["seed"], r["folder"]) for r in todo] == [
        ("synthetic", 100, Path("/w/example-fused-pool/synthetic-s100")),
        ("photos", 100, Path("/w/example-fused-pool/photos-s100")),
    ]
    assert todo[0]["command"] == (
        "memdpc quickstart --recipe example-fused-pool --data synthetic --seed 100 "
        "--out /w/example-fused-pool/synthetic-s100"
    )
    assert {r["seed"] for r in runs("example-fused-pool", Path("/w"))} == set(EXAMPLE_SEEDS)


@pytest.mark.parametrize(
    "name,streams,marker",
    [
        ("example-flow-pool", ["flow"], "recipe.md"),
        ("example-fused-pool", ["rgb", "flow", "fused"], "fused-recipe.md"),
    ],
)
def test_the_shipped_recipes_figures_and_readmes_rows_are_the_committed_results(name, streams, marker):
    """`expect` of each shipped example recipe is the mean over the held-out draws of bench/results/recipe-NAME
    (made by this benchmark) of its last row (flow alone, or fused), every run holds the recipe's rows and took at
    most 45 minutes, and README shows that table's rows as written there."""
    results = json.loads((ROOT / "bench" / "results" / f"recipe-{name}.json").read_text())
    expect = load(name).expect
    row = streams[-1]
    assert results and all(r["streams"] == streams for r in results)
    assert {(r["family"], r["seed"]) for r in results} == {(f, s) for f in expect for s in EXAMPLE_SEEDS}
    for family, figures in expect.items():
        for metric, value in figures.items():
            metric = {"top1": "probe top-1"}.get(metric, metric)
            mine = [
                r["metrics"][f"{row} {metric}"]["models"]["MemDPC"][0]
                for r in results
                if r["family"] == family
            ]
            assert value == round(sum(mine) / len(mine), 1), (family, metric)
    assert all(r["minutes"] is not None and r["minutes"] <= 45 for r in results)
    assert_readme_shows(marker, f"recipe-{name}.md")


def assert_readme_shows(marker: str, results: str) -> None:
    """README's rows between ``<!-- marker -->`` and ``<!-- /marker -->`` are rows of bench/results/``results``."""
    shown = (ROOT / "README.md").read_text().split(f"<!-- {marker} -->")[1].split(f"<!-- /{marker} -->")[0]
    rows = [line for line in shown.splitlines() if line.startswith("|")]
    table = (ROOT / "bench" / "results" / results).read_text().splitlines()
    assert len(rows) > 2 and all(row in table for row in rows), [r for r in rows if r not in table]
