"""The tests mirror the package: each module has its test file (``tests/<folder>/test_<module>.py``), or is
listed below with the test file that exercises it and why it has none of its own."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("tests", "bench", ".ci", ".venv", ".git", "build")
# module → the test file that exercises it instead: the verbs run in real `memdpc` processes from the tests of
# the stage they call; small modules are exercised whole by their one user's tests
TESTED_IN = {
    "commands/index.py": "tests/preprocess/test_datasets.py",
    "commands/data.py": "tests/preprocess/examples/test_synthetic.py",
    "commands/preprocess.py": "tests/preprocess/test_run.py",
    "commands/shard.py": "tests/pipeline/test_shard.py",
    "commands/train.py": "tests/train/test_loop.py",
    "commands/eval.py": "tests/eval/test_cli.py",
    "commands/convert.py": "tests/model/test_convert.py",
    "commands/recipes.py": "tests/recipes/test_recipe.py",
    "commands/quickstart.py": "tests/test_quickstart.py",
    "commands/show.py": "tests/report/test_show.py",
    "commands/report.py": "tests/report/test_page.py",
    "commands/bench.py": "tests/pipeline/test_loader_bench.py",
    "model/layout.py": "tests/model/test_memdpc.py",
    "model/parts.py": "tests/bench/test_step_profile.py",
    "pipeline/backends.py": "tests/pipeline/test_loader.py",
    "pipeline/loader_bench_options.py": "tests/pipeline/test_loader_bench.py",
    "preprocess/flow/sorting_networks.py": "tests/preprocess/flow/test_tvl1_median.py",
    "report/show_options.py": "tests/report/test_show.py",
    # the training loop's parts, each exercised by the runs of the loop's tests
    "train/parts.py": "tests/train/test_loop.py",
    "train/reading.py": "tests/train/test_loop_faults.py",
    "train/saving.py": "tests/train/test_loop_resume.py",
    "train/wording.py": "tests/train/test_loop.py",
    "train/monitor.py": "tests/train/test_loop.py",
}


def modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in OUTSIDE and p.name != "__init__.py"
    )


def mirror(module: Path) -> Path:
    return Path("tests", *module.parent.parts, f"test_{module.name}")


def test_every_module_has_a_test_file():
    untested = [
        m.as_posix() for m in modules() if not (ROOT / mirror(m)).is_file() and m.as_posix() not in TESTED_IN
    ]
    assert untested == []


def test_the_exceptions_are_real():
    for module, tests in TESTED_IN.items():
        assert (ROOT / module).is_file(), module
        assert (ROOT / tests).is_file(), tests
        assert not (ROOT / mirror(Path(module))).is_file(), (
            f"{module} has a test file now: drop the exception"
        )
