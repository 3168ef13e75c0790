"""The paper's experiments as recipes: every recipe shipped parses, names its row, figures and data, prints
commands the real command line accepts, and runs (its training one step, its evaluation on what that step
wrote, its fusion) at tiny scale on the CPU; recipes are found by short name or path and ship in the wheel."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.common.streams import STREAMS
from memdpc.model.checkpoint import read_checkpoint
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord
from memdpc.quickstart import profile_from
from memdpc.recipes.recipe import (
    EXAMPLE_SEEDS,
    RECIPE_DIR,
    commands,
    datasets,
    eval_settings,
    load,
    names,
    resolve,
    train_settings,
)
from memdpc.train.config import config_from_dict

from ..conftest import frame_diffs, write_jpeg_archive

ROOT = Path(__file__).resolve().parents[2]
# the sizes of a one-step CPU run; everything else is the recipe's
TINY_TRAIN = [
    "--widths",
    "8,16,32,32",
    "--size",
    "32",
    "--max-steps",
    "1",
    "--batch-size",
    "2",
    "--backend",
    "torch",
    "--workers",
    "0",
    "--no-progress",
    "--val-split",
    "none",
]
TINY_EVAL = ["--batch-size", "2", "--backend", "torch", "--workers", "0"]
# the paper's rows, and the example recipes (`memdpc quickstart --recipe`: tests/test_quickstart.py runs one)
PAPER = [n for n in names() if not load(n).quickstart]
EXAMPLES = [n for n in names() if load(n).quickstart]


def run_cli(*args):
    """``memdpc ARGS`` in this process (click's runner), each argument as its text."""
    return CliRunner().invoke(main, [str(a) for a in args])


def invoke(*args) -> str:
    """``memdpc ARGS`` in this process, which must succeed; what it printed."""
    res = run_cli(*args)
    assert res.exit_code == 0, (args, res.output, res.exception)
    return res.output


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> Path:
    """RGB and flow shards (train and test) of 9 rendered videos of 30 frames at 16², 3 classes, 2 training
    videos of each: the paper's clip (8 × 5 frames, stride 3), one padded window per video."""
    root = tmp_path_factory.mktemp("recipe_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(3):
            vid = f"v_{cls}_g{g:02d}"
            frames = render_video(cls, 16, 30, np.random.default_rng([ci, g]))
            write_jpeg_archive(root / "archives", "rgb", vid, frames, 25.0)
            write_jpeg_archive(root / "archives", "flow", vid, frame_diffs(frames), 25.0)
            records.append(
                VideoRecord(vid, f"/nowhere/{vid}.avi", ci, cls, "test" if g == 2 else "train", 25.0, 30)
            )
    for stream in STREAMS:
        for split in ("train", "test"):
            shard_stream(
                root / "archives", records, stream, root / "shards", split, ShardSettings(max_count=2, seed=0)
            )
    return root / "shards"


def _the_example_recipes_settings_are_those_of_its_quickstart_on_any_shards(r) -> None:
    """``memdpc train --config NAME`` reads an example recipe's training of a stream (its clip's blocks
    included), ``memdpc eval probe --config NAME`` its probe; a stream it does not train, and an evaluation it
    does not make, are refused."""
    profile = profile_from(r.quickstart, r.name, "synthetic")
    for stream in STREAMS:
        if stream not in profile.streams:
            with pytest.raises(UserError, match=f"{r.path}: trains the .* only, not {stream}"):
                train_settings(r.name, stream)
            continue
        settings = train_settings(r.name, stream)
        assert settings == {
            **profile.train,
            **profile.stream_train.get(stream, {}),
            "num_blocks": profile.clip.num_blocks,
            "block_len": profile.clip.block_len,
            "stream": stream,
        }
    if len(profile.streams) == 1:
        assert train_settings(r.name)["stream"] == profile.streams[0]
    else:
        with pytest.raises(UserError, match="say which"):
            train_settings(r.name)
    assert eval_settings(r.name, "probe") == profile.probe and eval_settings(r.name, "retrieve") == {}
    with pytest.raises(UserError, match="an example recipe evaluates by retrieve and probe, not finetune"):
        eval_settings(r.name, "finetune")


def test_every_recipe_names_its_row_figures_data_and_a_valid_training():
    known = datasets()
    assert len(PAPER) >= 20 and EXAMPLES and "datasets" not in names()
    for name in EXAMPLES:  # the example families instead of datasets, and a valid quickstart profile
        r = load(name)
        assert r.row and r.expect and set(r.expect) <= set(EXAMPLE_FAMILIES), name  # those it was measured on
        assert not (r.pretrain or r.train or r.eval or r.fuse), name
        for family in EXAMPLE_FAMILIES:
            profile = profile_from(r.quickstart, name, family)
            assert profile.pool > 0 and profile.checkpoint == "last", name
            for stream in profile.streams:
                config_from_dict({**profile.train, "stream": stream}, where=name)
        _the_example_recipes_settings_are_those_of_its_quickstart_on_any_shards(r)
    for name in PAPER:
        r = load(name)
        assert r.row and r.expect and set(r.expect) <= set(known), name
        if r.fuse:
            assert not r.train and not r.pretrain
            parts = [load(f["recipe"]) for f in r.fuse]
            assert sorted(p.train["stream"] for p in parts) == ["flow", "rgb"] and all(p.eval for p in parts)
            assert all(set(p.expect) == set(r.expect) for p in parts), name
        else:
            assert r.pretrain in known and r.eval["task"] in ("retrieve", "probe", "finetune"), name
            config = config_from_dict(train_settings(name), where=name)
            assert config.clips_per_video == 1 and config.loader.stream == r.preprocess["streams"], name
    figures = {d: f for n in names() for d, f in load(n).expect.items() if n.endswith("ucf101-r18-fused")}
    assert figures == {"ucf101": {"top1": 84.0}}


def _parses(args: list[str]) -> None:
    """Parse one command line against the real command line (options, types, choices), without running it."""
    command, name, rest = main, "memdpc", list(args)
    while isinstance(command, click.Group):  # none of the commands gives a group an option of its own
        ctx = click.Context(command, info_name=name)
        name, *rest = rest
        command = command.get_command(ctx, name)
        assert command is not None, args
    command.make_context(name, rest)


@pytest.mark.parametrize("name", names())
def test_every_recipe_prints_commands_the_command_line_accepts(name):
    lines = commands(load(name), data="/data", work="/work")
    assert lines[0].startswith(f"# {name}: ")
    runs = [shlex.split(line) for line in lines if not line.startswith("#")]
    assert runs and all(r[0] == "memdpc" for r in runs)
    for args in runs:
        _parses(args[1:])
    verbs = [" ".join(r[1:3]) if r[1] == "eval" else r[1] for r in runs]
    r = load(name)
    if r.quickstart:  # one run of the quickstart per family and held-out draw
        assert verbs == ["quickstart"] * len(r.expect) * len(EXAMPLE_SEEDS)
        assert all(f"--recipe {name} " in line for line in lines if line.startswith("memdpc"))
    elif r.fuse:
        assert set(verbs) == {"eval fuse"}
    else:
        assert {"index", "preprocess", "shard", f"eval {r.eval['task']}"} <= set(verbs) and verbs.count(
            "train"
        ) == 1
        assert verbs.count("index") == len(r.datasets) and verbs.count(f"eval {r.eval['task']}") == len(
            r.expect
        )


def test_recipes_are_found_by_short_name_or_path_and_mistakes_are_named(tmp_path):
    assert resolve("ucf101-r18-rgb") == RECIPE_DIR / "ucf101-r18-rgb.yaml"
    assert load(RECIPE_DIR / "ucf101-r18-flow.yaml").train == load("ucf101-r18-flow").train
    with pytest.raises(
        UserError, match=r"ucf101-r18-rbg: no such file, nor a recipe of that name \(example-flow-pool"
    ):
        resolve("ucf101-r18-rbg")
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "base: ucf101-r18-rgb\nrow: my row\nexpect: {ucf101: {top1: 70}}\ntrain: {mem_size: 256}\n"
    )
    r = load(mine)
    assert (r.train["mem_size"], r.train["arch"], r.run, r.eval["task"]) == (
        256,
        "memdpc_r18",
        "mine",
        "finetune",
    )
    assert load(tmp_path / "mine.yaml").datasets == ["ucf101"]
    configs = {line.split("--config ")[1].split()[0] for line in commands(r) if "--config " in line}
    assert configs == {str(mine)} and resolve(str(mine)) == mine  # the printed commands name the user's file
    (tmp_path / "both.yaml").write_text(
        "row: mine fused\nexpect: {ucf101: {top1: 80}}\nfuse: [{recipe: mine.yaml, "
        "result: a.json}, {recipe: ucf101-r18-flow, result: b.json}]\n"
    )
    fused = load(tmp_path / "both.yaml")  # a fused row's parts: beside it (a user's), else shipped
    assert [f["recipe"] for f in fused.fuse] == [mine, RECIPE_DIR / "ucf101-r18-flow.yaml"]
    assert f"{tmp_path}/eval/mine/ucf101/a.json" in "\n".join(commands(fused, work=str(tmp_path)))
    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    with pytest.raises(UserError, match="its bases lead back to"):
        load(tmp_path / "loop.yaml")
    (tmp_path / "bare.yaml").write_text("row: x\ntrain: {stream: rgb}\n")
    with pytest.raises(UserError, match=r"bare\.yaml: a recipe needs pretrain, train and eval sections"):
        load(tmp_path / "bare.yaml")
    (tmp_path / "odd.yaml").write_text("row: x\ntrian: {}\n")
    with pytest.raises(UserError, match=r"odd\.yaml: unknown section\(s\) trian"):
        load(tmp_path / "odd.yaml")
    with pytest.raises(
        UserError, match="this recipe's evaluation is memdpc eval retrieve, not memdpc eval probe"
    ):
        eval_settings("ucf101-r18-rgb-retrieval", "probe")
    with pytest.raises(UserError, match="trains nothing"):
        train_settings("ucf101-r18-fused")


def test_eval_config_takes_recipes_only(tmp_path):
    plain = tmp_path / "opts.yaml"
    plain.write_text("crops: 10\n")
    with pytest.raises(UserError, match=r"opts\.yaml: memdpc eval --config takes a recipe"):
        eval_settings(plain, "finetune")


def test_a_recipes_eval_options_fill_only_what_the_command_line_leaves(tiny_shards, tmp_path):
    """The recipe asks for 10 crops; --crops 1 on the command line wins. A recipe with an option the verb lacks
    is a one-line error naming it."""
    run = tmp_path / "run"
    invoke("train", "--config", "ucf101-r18-rgb", "--shards", tiny_shards, "--out", run, *TINY_TRAIN)
    ckpt = run / "checkpoints" / "last.pt"

    def finetune(config, out: str, *options) -> list:
        """The arguments of ``memdpc eval finetune`` of the one-step checkpoint with the recipe ``config`` on the
        tiny shards, into ``tmp_path / out``."""
        return [
            "eval",
            "finetune",
            ckpt,
            "--config",
            config,
            "--shards",
            tiny_shards,
            "--out",
            tmp_path / out,
            *options,
        ]

    invoke(*finetune("ucf101-r18-rgb", "a", "--epochs", "1", *TINY_EVAL))
    invoke(*finetune("ucf101-r18-rgb", "b", "--epochs", "1", "--crops", "1", *TINY_EVAL))
    crops = [json.loads((tmp_path / d / "finetune-rgb.json").read_text())["config"]["crops"] for d in "ab"]
    assert crops == [10, 1]
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: ucf101-r18-rgb\neval: {task: finetune, label_fractoin: 0.1}\n")
    res = run_cli(*finetune(bad, "c"))
    assert (
        res.exit_code == 2
        and "bad.yaml: eval: memdpc eval finetune has no option --label-fractoin" in res.output
    )
    bad.write_text("base: ucf101-r18-rgb\neval: {task: finetune, crops: 7}\n")
    res = run_cli(*finetune(bad, "c"))
    assert res.exit_code == 2 and res.output.splitlines()[-1].startswith(
        f"Error: {bad}: eval: crops must be one of 1, 5, 10, not 7"
    )


_DONE: dict[str, Path] = {}  # recipe → the folder of its results, so that fused rows reuse their parts'


def _run_recipe(name: str, shards: Path, work: Path) -> Path:
    """Train (one step) and evaluate one recipe at tiny scale, or fuse its parts' results; its results folder."""
    if name in _DONE:
        return _DONE[name]
    r = load(name)
    out = work / "eval" / name
    if r.fuse:
        parts = [_run_recipe(f["recipe"].stem, shards, work) for f in r.fuse]
        for d in r.expect:
            invoke(
                "eval",
                "fuse",
                *(p / d / f["result"] for p, f in zip(parts, r.fuse, strict=True)),
                "--out",
                out / d / "fused.json",
            )
            assert json.loads((out / d / "fused.json").read_text())["metrics"], name
    else:
        if r.eval.get("random_init"):
            invoke(
                "train",
                "--config",
                name,
                "--shards",
                shards,
                "--out",
                work / "runs" / name,
                *TINY_TRAIN,
                "--init-only",
            )
            ckpt = work / "runs" / name / "checkpoints" / "init.pt"
        else:
            ckpt = work / "runs" / r.run / "checkpoints" / "last.pt"
            if not ckpt.exists():
                invoke("train", "--config", r.run, "--shards", shards, "--out", ckpt.parents[1], *TINY_TRAIN)
                assert read_checkpoint(ckpt)["step"] == 1
        fit = ["--epochs", "1", "--crops", "1"] if r.eval["task"] != "retrieve" else []
        for d in r.expect:
            invoke(
                "eval",
                r.eval["task"],
                ckpt,
                "--config",
                name,
                "--shards",
                shards,
                "--out",
                out / d,
                *TINY_EVAL,
                *fit,
            )
            assert any(out.joinpath(d).glob(f"*-{r.train['stream']}*.json")), name
    _DONE[name] = out
    return out


@pytest.fixture(scope="module")
def recipe_work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("recipe_runs")


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER)
def test_every_recipe_runs_one_step_at_tiny_scale_on_the_cpu(name, tiny_shards, recipe_work):
    out = _run_recipe(name, tiny_shards, recipe_work)
    assert {d.name for d in out.iterdir()} == set(load(name).expect)
    for f in load(name).fuse:  # the results a fused row names are those its parts write
        assert all((_DONE[f["recipe"].stem] / d / f["result"]).is_file() for d in load(name).expect)


@pytest.mark.slow
def test_the_recipes_ship_in_the_wheel(tmp_path):
    """Built from a copy of the checkout, so that no build folder of the checkout's takes part."""
    pytest.importorskip("setuptools", reason="builds the wheel without build isolation (offline)")
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "test-artifacts"),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("memdpc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("memdpc/recipes/") and n.endswith(".yaml")}
    assert shipped == {p.name for p in RECIPE_DIR.glob("*.yaml")}
    assert not [
        n for n in names if n.startswith(("memdpc/bench/", "memdpc/tests/"))
    ]  # developer files stay out


def _docs_page() -> str:
    """docs/reproducing.md: the table of the paper's rows and the commands of every row."""
    return (ROOT / "docs" / "reproducing.md").read_text()


def test_the_docs_list_every_recipe_with_its_figures_and_commands_the_command_line_accepts():
    section = _docs_page()
    for name in PAPER:
        rows = [line for line in section.splitlines() if line.startswith("|") and f"`{name}`" in line]
        assert rows, f"docs/reproducing.md's table lacks {name}"
        figures = [v for f in load(name).expect.values() for v in f.values()]
        assert all(f"{v}" in rows[0] for v in figures), (name, rows[0])
    block = section.split("and then each row is one command:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line]
    assert sorted(name for name in names() for line in lines if f"--out $W/eval/{name}/" in line) == PAPER
    pretraining = section.split("the pretraining runs are", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    readme = set()
    for line in [*pretraining.splitlines(), *lines]:
        loop = "for d in ucf101 hmdb51; do "
        each = (
            [line]
            if not line.startswith(loop)
            else [line[len(loop) : -len("; done")].replace("$d", d) for d in ("ucf101", "hmdb51")]
        )
        readme |= {command for one in each for command in one.split(" && ") if command}
    for command in readme:
        args = shlex.split(command.replace("$W", "/work"))
        assert args[0] == "memdpc"
        _parses(args[1:])
    # the same commands as `memdpc recipes NAME` prints for each row (the page is a copy: it must not drift)
    printed = {
        line
        for name in PAPER
        for line in commands(load(name), "DATA", "$W")
        if line.startswith(("memdpc train", "memdpc eval"))
    }
    assert readme == printed, (sorted(readme - printed)[:3], sorted(printed - readme)[:3])


def test_memdpc_recipes_lists_every_recipe():
    out = CliRunner().invoke(main, ["recipes"], terminal_width=200).output
    assert all(name in out for name in names()) and "68.2" in out


def test_an_example_recipe_has_no_training_of_its_own_and_a_mapping_for_the_quickstart(tmp_path):
    mine = tmp_path / "mine.yaml"
    for text, message in (
        ("row: r\nexpect: {synthetic: {R@1: 1}}\nquickstart: [8]\n", "quickstart: expected a mapping"),
        (
            "row: r\nexpect: {synthetic: {R@1: 1}}\nquickstart: {pool: 8}\ntrain: {epochs: 1}\n",
            "an example recipe (quickstart) has no pretrain, train, eval or fuse section",
        ),
    ):
        mine.write_text(text)
        with pytest.raises(UserError, match=rf"{mine}: {re.escape(message)}"):
            load(mine)
