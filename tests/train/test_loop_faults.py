"""A training run refuses bad shards in one line, and stops on a fault with a checkpoint that resumes: shards
of the other stream or damaged, a NaN loss, non-finite weights, a full disk."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from memdpc.cli import EXIT_RESOURCE
from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.model import create_model
from memdpc.model.checkpoint import read_checkpoint
from memdpc.train.parts import State
from memdpc.train.reading import check_weights

from ..conftest import memdpc_command
from .conftest import (
    TINY,
    assert_finished,
    assert_same_training,
    cli,
    records,
    run_to_end,
    start_train,
    tiny,
)


def test_wrong_stream_shards_are_refused(train_shards, tmp_path):
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "r"), "--stream", "flow")
    assert res.exit_code == 2
    assert f"{train_shards}: holds rgb shards, not flow shards (--stream flow)" in res.output
    fake = tmp_path / "shards"  # a flow folder whose manifests say rgb
    (fake / "flow").mkdir(parents=True)
    for m in (train_shards / "rgb").glob("manifest-*.json"):
        shutil.copy(m, fake / "flow" / m.name)
    res = cli(*TINY, "--shards", str(fake), "--out", str(tmp_path / "r"), "--stream", "flow")
    assert res.exit_code == 2 and "manifest-train.json: not a flow/train shard manifest" in res.output
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_damaged_shard_is_a_one_line_error(train_shards, tmp_path, backend):
    """Frames that no longer decode (shards damaged after sharding): a real run with a loader worker stops with
    one line naming the shard (torch) or its folder and the command that finds it (DALI), exit 2."""
    shards = tmp_path / "shards"
    shutil.copytree(train_shards, shards)
    for tar in (shards / "rgb").glob("train-*.tar"):
        tar.write_bytes(tar.read_bytes().replace(b"\xff\xd8\xff", b"\0\0\0"))  # no JPEG starts any more
    args = tiny(backend=backend, num_workers=1, shards=str(shards), out=str(tmp_path / "r"))
    res = run_to_end(memdpc_command("train", *args), timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    rgb, root = re.escape(str(shards / "rgb")), re.escape(str(shards))
    expected = {
        "torch": rf"Error: {rgb}/train-\d+\.tar: sample \w+: f\d\d\.jpg is not a decodable JPEG "
        rf".*--verify {root}`",
        "dali": rf"Error: {rgb}: a frame of these shards is not a decodable JPEG .*--verify {root}`",
    }
    assert re.search(expected[backend], res.stderr.splitlines()[-1]), res.stderr[-2000:]


def diverging(shards: Path, out: Path, **settings):
    """``memdpc train`` of the tiny network on ``shards`` into ``out`` (in this process) at a learning rate of
    1e30 (1e29 at the end of its schedule), without validation: its loss is NaN from step 2 on."""
    return cli(
        *tiny(shards=str(shards), out=str(out), lr="1e30", lr_min="1e29", val_split="none", **settings)
    )


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(train_shards, tmp_path, one_thread):
    out = tmp_path / "nan"
    res = diverging(train_shards, out, ckpt_every_steps=1)
    assert res.exit_code == 2
    assert (
        "loss is not finite (nan) at epoch 0, step 2: training stopped; the last good checkpoint is"
        in res.output
    )
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["step"] == 1
    assert records(out, "train")[-1]["step"] == 1


def test_nan_loss_between_reads_is_found_before_the_next_save(train_shards, tmp_path, one_thread):
    """Read every 5 steps, saved every 3: the NaN of step 2 is noticed by the read before the save of step 3,
    named with its own step, and no checkpoint is written from the weights it left."""
    out = tmp_path / "nan"
    res = diverging(train_shards, out, log_every=5, ckpt_every_steps=3)
    assert res.exit_code == 2
    assert (
        "loss is not finite (nan) at epoch 0, step 2: training stopped; no checkpoint had been written yet"
        in res.output
    )
    assert not (out / "checkpoints" / "last.pt").exists() and records(out, "train") == []


def test_non_finite_weights_are_never_saved(tmp_path):
    model = create_model(
        "dpc_r18", widths=(4, 8, 16, 16), input_size=32, num_blocks=5, block_len=3, pred_steps=2
    )
    p = SimpleNamespace(env=DistEnv(0, 1, 0, torch.device("cpu")), run_dir=tmp_path)
    check_weights(p, State(step=7), model)  # finite: no error
    with torch.no_grad():
        model.backbone.conv1.weight[0, 0, 0, 0, 0] = float("inf")
    with pytest.raises(
        UserError,
        match="the weights are not finite after epoch 0, step 7: training stopped; no "
        "checkpoint had been written yet",
    ):
        check_weights(p, State(step=7), model)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_the_resume_is_bit_identical(
    train_shards, small_disk, tmp_path
):
    """The run folder on a real file system with room for one and a half checkpoints: the second save does not
    fit, the run stops with one line (exit 74) keeping the first checkpoint whole; once space is freed the same
    command resumes from it and ends as an undisturbed run does, bit for bit."""
    args = tiny(shards=str(train_shards), epochs=2, batch_size=2, ckpt_every_steps=2, val_split="none")
    assert_finished(start_train(args, tmp_path / "whole"), tmp_path / "whole.log")
    checkpoint = (tmp_path / "whole" / "checkpoints" / "last.pt").stat().st_size
    rest = sum(p.stat().st_size for p in (tmp_path / "whole").rglob("*") if p.parent.name != "checkpoints")
    small_disk.resize(int(1.5 * checkpoint) + rest)
    out = small_disk.path / "run"
    last = out / "checkpoints" / "last.pt"
    stopped = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert stopped.returncode == EXIT_RESOURCE, stopped.stderr
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("stopped:")]
    assert len(lines) == 1 and re.fullmatch(
        rf"stopped: no space left on the file system of {re.escape(str(last.parent))}, writing last\.pt "
        rf"\(\d[\d.]* [kM]?B free there now\); kept {re.escape(str(last))} \(epoch 0, step 2\); free space "
        "there, then the same command resumes",
        lines[0],
    ), stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert [p.name for p in last.parent.iterdir()] == ["last.pt"] and read_checkpoint(last)["step"] == 2
    small_disk.resize(4 * checkpoint + 2 * rest)
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {last} at epoch 0, step 2" in resumed.stderr
    assert_same_training(tmp_path / "whole", out)
    assert [r["step"] for r in records(out, "train")] == list(range(1, 19))
