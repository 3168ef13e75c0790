"""``memdpc train --teacher``: the RGB run of a real tiny quickstart taught by its flow run, and what is refused."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch
import yaml

from memdpc.common.errors import UserError
from memdpc.train.teacher import Teacher

from ..conftest import memdpc_command
from .conftest import cli, records, run_to_end, signal_when, start_train


def _rgb(tiny_quickstart, out, *args: str):
    """The quickstart's RGB training again, one epoch, into ``out``, with ``args`` over it."""
    config = tiny_quickstart / "runs" / "rgb" / "config.yaml"
    return cli("--config", str(config), "--out", str(out), "--epochs", "1", "--no-progress", *args)


def test_a_flow_run_teaches_an_rgb_run_and_a_resume_keeps_its_teacher(tiny_quickstart, tmp_path):
    flow = tiny_quickstart / "runs" / "flow" / "checkpoints" / "last.pt"
    res = _rgb(tiny_quickstart, tmp_path / "taught", "--teacher", str(flow), "--teacher-weight", "2")
    assert res.exit_code == 0, res.output
    videos = json.loads((tiny_quickstart / "shards" / "flow" / "manifest-train.json").read_text())[
        "num_videos"
    ]
    assert f"teacher: {flow} (flow), its features of {videos} training videos" in res.output
    train = records(tmp_path / "taught", "train")
    assert train and all(math.isfinite(r["relation"]) and r["relation"] > 0 for r in train)
    assert all("relation" not in r for r in records(tmp_path / "taught", "val"))  # the pretext loss alone
    recorded = yaml.safe_load((tmp_path / "taught" / "config.yaml").read_text())
    assert (recorded["teacher"], recorded["teacher_weight"]) == (str(flow), 2.0)
    # the same folder with another teacher (the RGB run itself) is another experiment
    rgb = tiny_quickstart / "runs" / "rgb" / "checkpoints" / "last.pt"
    res = _rgb(
        tiny_quickstart, tmp_path / "taught", "--teacher", str(rgb), "--teacher-weight", "2", "--epochs", "2"
    )
    assert res.exit_code == 2 and f"teacher: '{flow}' → '{rgb}'" in res.output
    untaught = _rgb(tiny_quickstart, tmp_path / "plain")
    assert untaught.exit_code == 0, untaught.output
    assert all("relation" not in r for r in records(tmp_path / "plain", "train"))


@pytest.mark.slow
def test_sigint_before_the_teachers_table_is_done_stops_before_the_first_step_and_the_same_command_starts_again(
    tiny_quickstart, tmp_path
):
    """The signal goes once the run has written its config, i.e. while it builds its loaders and the teacher's
    table (which ends with the line naming the teacher, absent here)."""
    flow = tiny_quickstart / "runs" / "flow" / "checkpoints" / "last.pt"
    config = tiny_quickstart / "runs" / "rgb" / "config.yaml"
    args = ["--config", str(config), "--epochs", "1", "--no-progress", "--teacher", str(flow)]
    out = tmp_path / "taught"
    proc = start_train(args, out)
    signal_when(proc, (out / "config.yaml").exists, signal.SIGINT)
    log = out.with_suffix(".log").read_text()
    assert proc.returncode == 130, log
    assert "interrupted (SIGINT): no checkpoint yet; the same command starts again" in log
    assert "teacher:" not in log and not records(out, "train")
    assert not (out / "checkpoints" / "last.pt").exists()
    again = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert again.returncode == 0, again.stderr
    assert "teacher:" in again.stderr and records(out, "train")


@pytest.mark.parametrize(
    "args, message",
    [
        (("--batch-size", "2"), "a teacher needs batch_size 3 or more"),
        (("--cuda-graphs",), "cuda_graphs does not go with a teacher"),
        (("--teacher-weight", "-1"), "teacher_weight must be ≥ 0, not -1.0"),
    ],
)
def test_settings_a_teacher_cannot_go_with_are_one_line_errors(tiny_quickstart, tmp_path, args, message):
    flow = tiny_quickstart / "runs" / "flow" / "checkpoints" / "last.pt"
    res = _rgb(tiny_quickstart, tmp_path / "r", "--teacher", str(flow), *args)
    assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1


def test_a_teacher_that_is_no_checkpoint_is_a_one_line_error(tiny_quickstart, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 64)
    res = _rgb(tiny_quickstart, tmp_path / "r", "--teacher", str(junk))
    assert res.exit_code == 2 and "junk.pt: not a readable checkpoint" in res.output.splitlines()[-1]
    assert sum("junk.pt" in line for line in res.output.splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before the run wrote anything


def test_a_video_the_teacher_did_not_embed_is_named():
    teacher = Teacher("flow.pt", "flow", {"a": 0, "b": 1}, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert teacher.of(["b", "a", "b"]).tolist() == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(
        UserError, match="flow.pt: video c of the training split has no windows in the flow shards"
    ):
        teacher.of(["a", "c"])
