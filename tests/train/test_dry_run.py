"""``memdpc train --dry-run`` on real shards: it writes nothing, and the clips and steps it counts are those a
real run then takes (every window, or one per video), from the start or from the checkpoint a run resumes."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.model.checkpoint import read_checkpoint
from memdpc.train.config import config_from_dict
from memdpc.train.dry_run import plan_run
from memdpc.train.loop import train

from ..conftest import TINY_TRAIN, memdpc_command, train_options

# 9 training videos of 2 windows each (18 clips); batch 4; validation on the 3 test videos
SMALL = {**TINY_TRAIN, "epochs": 1}


@pytest.mark.parametrize(("clips_per_video", "clips", "steps"), [(0, 18, 4), (1, 9, 2)])
def test_the_dry_runs_counts_are_those_of_the_real_epoch_and_it_writes_nothing(
    train_shards, tmp_path, one_thread, clips_per_video, clips, steps
):
    config = config_from_dict(
        dict(shards=str(train_shards), out=str(tmp_path / "run"), clips_per_video=clips_per_video, **SMALL)
    )
    plan = plan_run(config)
    assert not (tmp_path / "run").exists()
    assert (plan.videos, plan.windows, plan.clips_per_epoch, plan.steps_per_epoch) == (9, 18, clips, steps)
    assert (plan.world_size, plan.global_batch, plan.start, plan.steps) == (1, 4, (0, 0), steps)
    # on the CPU the steps timed hold 2 clips (scaled to the batch of 4): the 18 or 9 clips give 4 of them
    assert (plan.timed_batch, plan.timed_steps) == (2, 3) and plan.step_s > 0 and plan.checkpoints == 2
    assert "over 3 timed steps of 2 clips, scaled to 4 (the first " in plan.lines()[-2]
    assert plan.val_batches == 2  # the 6 test clips in batches of 4
    run = train(config)
    last = read_checkpoint(run / "checkpoints" / "last.pt")
    assert last["step"] == plan.steps_per_epoch
    assert (run / "checkpoints" / "last.pt").stat().st_size == pytest.approx(plan.checkpoint_bytes, rel=0.02)
    # resumed for two more epochs, the plan starts where the run stopped
    more = plan_run(replace(config, epochs=3))
    assert (more.start, more.steps, more.epochs_run) == ((1, steps), 2 * steps, 2)


def test_the_timing_stops_once_its_budget_is_spent(train_shards, tmp_path, one_thread, monkeypatch):
    """A dry run costs seconds: once the steps timed took the budget, no more are run (here: none left after the
    first timed one)."""
    from memdpc.train import dry_run

    monkeypatch.setattr(dry_run, "WARMUP_BUDGET_S", 0.0)
    plan = plan_run(config_from_dict(dict(shards=str(train_shards), out=str(tmp_path / "run"), **SMALL)))
    assert plan.timed_steps == 1 and plan.step_s > 0


def test_the_command_prints_the_plan_and_leaves_no_run_folder(train_shards, tmp_path):
    out = tmp_path / "run"
    args = [
        "--shards",
        train_shards,
        "--out",
        out,
        *train_options(**TINY_TRAIN),
        "--clips-per-video",
        "1",
        "--epochs",
        "50",
        "--schedule",
        "milestones",
        "--milestones",
        "30",
        "--keep-every",
        "10",
        "--dry-run",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", RANK="0", WORLD_SIZE="2")  # planning for two processes
    res = subprocess.run(
        memdpc_command("train", *args),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert not out.exists()
    text = res.stdout
    assert "an epoch takes 1 window per video, drawn anew every epoch: 9 clips" in text
    assert "world: 2 × batch 4 = global batch 8; 1 step per epoch (1 clip of each epoch left out" in text
    assert "steps: 50 in all (50 epochs)" in text and "× 0.1 at epoch 30" in text
    assert "disk: 7 checkpoints at most" in text and "an estimate on cpu (1 thread)" in text
    assert "each of the 2 processes taken to be as fast" in text


def test_a_taught_runs_plan_times_the_teachers_table_and_steps_with_the_relation_loss(
    tiny_quickstart, tmp_path, one_thread
):
    """The quickstart's RGB run taught by its flow run: the table pass is timed and added to the estimate, and
    the steps timed hold 3 clips (the fewest the relation loss compares) on the CPU."""
    flow = tiny_quickstart / "runs" / "flow" / "checkpoints" / "last.pt"
    settings = yaml.safe_load((tiny_quickstart / "runs" / "rgb" / "config.yaml").read_text())
    out = tmp_path / "taught"
    taught = plan_run(config_from_dict({**settings, "out": str(out), "teacher": str(flow)}))
    plain = plan_run(config_from_dict({**settings, "out": str(out)}))
    assert not out.exists()
    assert (taught.teacher, plain.teacher, plain.teacher_s) == (f"{flow} (flow)", None, 0.0)
    assert (taught.timed_batch, plain.timed_batch) == (3, 2) and taught.teacher_s > 0
    assert taught.wall_s - taught.teacher_s == pytest.approx(
        taught.first_step_s
        + (taught.steps - 1) * taught.step_s
        + taught.val_batch_s
        * (taught.epochs_run * taught.val_batches + taught.knn_passes * taught.knn_batches)
    )
    (line,) = [line for line in taught.lines() if line.startswith("teacher: ")]
    assert line.startswith(
        f"teacher: {flow} (flow) embeds every training video before the first step (about "
    )
    assert not [line for line in plain.lines() if line.startswith("teacher: ")]


def test_a_run_folder_of_another_config_is_refused_as_the_run_would_refuse_it(train_shards, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(json.dumps({**config_from_dict(SMALL).to_dict(), "lr": 0.5}))
    with pytest.raises(UserError, match="holds a different config"):
        plan_run(config_from_dict(dict(shards=str(train_shards), out=str(out), **SMALL)))
    res = CliRunner().invoke(
        main,
        ["train", "--init-only", "--dry-run", "--shards", str(train_shards), "--out", str(tmp_path / "x")],
    )
    assert res.exit_code == 2 and "--init-only writes one checkpoint" in res.output


def test_an_example_recipes_settings_on_ones_own_shards_are_printed_by_the_dry_run(
    direction_shards, tmp_path
):
    """``memdpc train --config example-flow-pool`` on shards of one's own (here 4 × 4-frame clips, so the clip is
    given too) plans the recipe's training: the settings that are not the paper's, and what its rule decides."""
    out = tmp_path / "run"
    args = ["--config", "example-flow-pool", "--stream", "flow", "--shards", direction_shards, "--out", out]
    res = subprocess.run(
        memdpc_command("train", *args, "--num-blocks", "4", "--block-len", "4", "--dry-run"),
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert not out.exists()
    (settings,) = [line for line in res.stdout.splitlines() if line.startswith("settings: ")]
    for setting in (
        "temperature 0.1",
        "negatives other_clips",
        "flow_shift 10.0",
        "flow_gain 1.5",
        "size 32",
    ):
        assert setting in settings, settings
    assert "(20 epochs)" in res.stdout  # the recipe's
    assert "it tells their class: the flow's global shift and gain are off" in res.stdout
