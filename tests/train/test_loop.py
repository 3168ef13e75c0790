"""End-to-end training runs on real shards: learning, exact resume after SIGKILL, SIGINT and SIGTERM (real
processes, both loaders, torchrun/gloo), what a run says at its end, refusals."""

from __future__ import annotations

import hashlib
import html
import importlib.util
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from click.testing import CliRunner

from memdpc.cli import EXIT_RESOURCE, main
from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.model import create_model
from memdpc.model.checkpoint import load_model, read_checkpoint
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.train.checkpoint import initial_model, param_digest
from memdpc.train.config import config_from_dict
from memdpc.train.knn import knn_recall
from memdpc.train.loop import State, _check_weights, _loader
from memdpc.train.metrics import StepValues, at_chance, chance_summary
from memdpc.train.prepare import val_split_warnings

from ..conftest import reference_weights, run_memdpc
from ..limits import STOP_WITHIN
from .conftest import CLIP, tb_images, tb_scalars, video_record

# A tiny network on 5×3-frame clips of 32 px; each run adds its own settings.
TINY = [
    "--stream",
    "rgb",
    "--arch",
    "dpc_r18",
    "--widths",
    "4,8,16,16",
    "--size",
    "32",
    "--num-blocks",
    "5",
    "--block-len",
    "3",
    "--pred-steps",
    "2",
    "--batch-size",
    "4",
    "--backend",
    "torch",
    "--num-workers",
    "0",
    "--no-progress",
    "--log-every",
    "1",
]
# The learning run: MemDPC at 64 px with the kNN monitor at the end.
LEARNED = [
    "--arch",
    "memdpc_r18",
    "--widths",
    "8,16,32,32",
    "--mem-size",
    "32",
    "--size",
    "64",
    "--knn-every",
    "4",
    "--log-every",
    "2",
]


def cli(*args: str):
    return CliRunner().invoke(main, ["train", *args])


def subprocess_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "memdpc.cli", "train", *args]


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """A real process, its stdout and stderr going to ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=subprocess_env(), stdout=f, stderr=subprocess.STDOUT)


def train_steps(run: Path) -> int:
    """The train records a running run (logging every step) has written so far, complete lines only."""
    path = run / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return sum('"kind": "train"' in line for line in lines)


def children(pid: int) -> list[str]:
    """The child processes of ``pid`` (Linux)."""
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def signal_when(proc: subprocess.Popen, ready, sig: int) -> float:
    """Send ``sig`` to ``proc`` as soon as ``ready()`` holds; return the seconds from the signal to the exit."""
    deadline = time.monotonic() + 240
    while not ready():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the signal"
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.005)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 60 s after {signal.Signals(sig).name}") from None
    return time.monotonic() - sent


def assert_same_training(a: Path, b: Path) -> None:
    """The two runs' last checkpoints hold the same step, bit-identical weights and optimiser state, and the
    same RNG states."""
    ca, cb = (read_checkpoint(run / "checkpoints" / "last.pt") for run in (a, b))
    assert (ca["epoch"], ca["step"], ca["epoch_step"]) == (cb["epoch"], cb["step"], cb["epoch_step"])
    assert ca["model"].keys() == cb["model"].keys()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    opt_a, opt_b = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert all(torch.equal(opt_a[i][k], opt_b[i][k]) for i in opt_a for k in ("exp_avg", "exp_avg_sq"))
    for ra, rb in zip(ca["rng"], cb["rng"], strict=True):
        assert (
            torch.equal(ra["now"]["torch"], rb["now"]["torch"]) and ra["now"]["python"] == rb["now"]["python"]
        )


@pytest.fixture(scope="module")
def learned_run(train_shards, tmp_path_factory) -> Path:
    """A 4-epoch MemDPC run at 64 px (in process, one thread), with the kNN monitor at the end."""
    out = tmp_path_factory.mktemp("learned") / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(out), "--epochs", "4")
    finally:
        torch.set_num_threads(before)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.slow
def test_short_run_lowers_the_loss_and_records_everything(learned_run, train_shards):
    train = records(learned_run, "train")
    per_epoch = [sum(r["loss"] for r in train if r["epoch"] == e) for e in range(4)]
    assert per_epoch[-1] < per_epoch[0] * 0.97, per_epoch
    r = train[-1]
    for key in (
        "loss",
        "top1",
        "top5",
        "loss_f",
        "top1_f",
        "top5_f",
        "content_share",
        "lr",
        "clips_per_s",
        "data_wait",
    ):
        assert key in r
    assert all(0 <= v["content_share"] <= 1 for v in records(learned_run, "val"))
    assert r["lr"] == 1e-3 and r["clips_per_s"] > 0 and 0 <= r["data_wait"] <= 1
    first, knn = records(learned_run, "knn")  # at initialisation and after epoch 4
    assert first["step"] == 0 and knn["step"] == 16
    # the monitor's R@1 is that of the weights it ran on (the initial weights, the epoch's last.pt), recomputed here
    config = config_from_dict(
        dict(
            shards=str(train_shards),
            out="unused",
            backend="torch",
            size=64,
            num_blocks=5,
            block_len=3,
            batch_size=4,
            num_workers=0,
        )
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    loaders = [_loader(config, env, split, CLIP, train=False) for split in ("train", "test")]
    last, _ = load_model(learned_run / "checkpoints" / "last.pt")
    assert knn["r1"] == knn_recall(last, *loaders, env.device, config.knn_max_batches)
    run_config = config_from_dict(
        dict(
            **{
                **config.to_dict(),
                "arch": "memdpc_r18",
                "widths": [8, 16, 32, 32],
                "mem_size": 32,
                "pred_steps": 2,
            }
        )
    )
    assert first["r1"] == knn_recall(initial_model(run_config), *loaders, env.device, config.knn_max_batches)
    assert knn["r1"] * 3 == pytest.approx(round(knn["r1"] * 3))  # a recall over the 3 test videos
    assert len(records(learned_run, "val")) == 4
    ckpt = read_checkpoint(learned_run / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"], ckpt["epoch_step"], ckpt["stream"]) == (4, 16, 0, "rgb")
    assert (learned_run / "checkpoints" / "best.pt").is_file()
    assert "mem_size: 32" in (learned_run / "config.yaml").read_text()
    tb = tb_scalars(learned_run / "tb")
    for kind in ("train", "val", "knn"):
        for key in {k for r in records(learned_run, kind) for k in r} - {"kind", "epoch", "step"}:
            steps, values = zip(*[(r["step"], r[key]) for r in records(learned_run, kind)], strict=True)
            tb_steps, tb_values = zip(*tb[f"{kind}/{key}"], strict=True)
            assert tb_steps == steps and tb_values == pytest.approx(values, rel=1e-6), (kind, key)
    model, _ = load_model(learned_run / "checkpoints" / "best.pt")
    assert model.config["name"] == "memdpc_r18" and model.features(torch.randn(1, 5, 3, 3, 64, 64)).shape == (
        1,
        32,
    )


@pytest.mark.slow
def test_each_epoch_shows_clips_of_its_first_batch_in_tensorboard(learned_run):
    per_epoch = read_checkpoint(learned_run / "checkpoints" / "last.pt")["step"] // 4  # 4 epochs
    images = tb_images(learned_run / "tb")
    assert sorted(images) == ["clips/0", "clips/1"]
    assert [step for step, _ in images["clips/0"]] == [e * per_epoch + 1 for e in range(4)]  # each first step
    _, image = images["clips/0"][0]
    assert image.shape[1] >= 480 and image.std() > 10  # 3 frames a row, enlarged; real frames, not blank


def test_a_run_killed_before_its_first_checkpoint_starts_its_metrics_afresh(
    train_shards, tmp_path, one_thread
):
    out = tmp_path / "run"
    args = (*TINY, "--shards", str(train_shards), "--out", str(out), "--epochs", "1", "--knn-every", "1")
    assert cli(*args).exit_code == 0
    first = (out / "metrics.jsonl").read_text()
    shutil.rmtree(out / "checkpoints")  # what a kill before the first checkpoint leaves: config and metrics
    res = cli(*args)
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in records(out, "knn")] == [0, 4]  # once each, not the killed attempt's again
    assert (out / "metrics.jsonl").read_text().count("\n") == first.count("\n")


@pytest.mark.slow
def test_best_by_knn_keeps_the_best_monitored_epoch_and_stops_early(train_shards, tmp_path, one_thread):
    out = tmp_path / "run"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "8",
        "--lr",
        "0.01",
        "--knn-every",
        "1",
        "--best-by",
        "knn",
        "--early-stop",
        "2",
    )
    assert res.exit_code == 0, res.output
    knn = records(out, "knn")
    assert knn[0]["step"] == 0  # the initial weights' value: logged, not a candidate for best.pt
    best, best_at, stale, stopped = -1.0, None, 0, None
    for epoch, r in enumerate(knn[1:]):  # what the loop must have decided, from what it logged
        best, best_at, stale = (r["r1"], r, 0) if r["r1"] > best else (best, best_at, stale + 1)
        if stale == 2:
            stopped = epoch
            break
    assert stopped is not None and len(knn) == stopped + 2  # no epoch trained after the stop
    assert read_checkpoint(out / "checkpoints" / "best.pt")["step"] == best_at["step"]
    assert read_checkpoint(out / "checkpoints" / "last.pt")["stale"] == 2
    assert "early stop: no new best knn for 2 epochs" in res.output
    first = knn[1]["r1"]  # after epoch 0
    ahead = (
        "no later epoch did better"
        if best_at is knn[1]
        else f"{best - first:.3f} above epoch 0's {first:.3f}"
    )
    assert (
        f"best: {out / 'checkpoints' / 'best.pt'} (epoch {best_at['epoch']}, kNN R@1 {best:.3f}; {ahead})"
        in res.output
    )


@pytest.mark.slow
def test_sigkill_mid_epoch_and_resume_give_bit_identical_weights(train_shards, tmp_path):
    """Two epochs of 9 steps (batch 2), checkpoints every 2 steps, a DataLoader worker. Only steps 9 and 18 end
    an epoch, so the SIGKILL, sent when the first checkpoint appears, lands mid-epoch even on a busy machine."""
    args = [
        *TINY,
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--ckpt-every-steps",
        "2",
        "--num-workers",
        "1",
        "--val-split",
        "none",
    ]
    with open(tmp_path / "whole.log", "w") as log:
        whole = subprocess.Popen(
            train_cmd(*args, "--out", str(tmp_path / "whole")),
            env=subprocess_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    killed = subprocess.Popen(
        train_cmd(*args, "--out", str(tmp_path / "killed")),
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last = tmp_path / "killed" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 240
    while not last.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    at_kill = read_checkpoint(last)
    assert at_kill["step"] < 18 and at_kill["epoch_step"] > 0, (at_kill["epoch"], at_kill["step"])
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(tmp_path / "killed")),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    a = read_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    b = read_checkpoint(last)
    assert a["step"] == b["step"] == 18
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not torch.equal(a["model"]["backbone.conv1.weight"], at_kill["model"]["backbone.conv1.weight"])
    opt_a, opt_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(opt_a[i]["exp_avg_sq"], opt_b[i]["exp_avg_sq"]) for i in opt_a)
    # the metrics of the resumed run continue without duplicates
    steps = [r["step"] for r in records(tmp_path / "killed", "train")]
    assert steps == list(range(1, 19))


@pytest.mark.slow
def test_a_loader_worker_killed_mid_epoch_stops_the_run_with_a_checkpoint_that_resumes_bit_identically(
    train_shards, tmp_path
):
    """SIGKILL, as the out-of-memory killer sends it, to the DataLoader worker once step 2 is logged: the run
    stops between two steps with one line naming the worker, the signal and a hint (exit 74), keeps last.pt
    there, and the same command resumes to the weights of an undisturbed run."""
    args = [
        *TINY,
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--workers",
        "1",
        "--val-split",
        "none",
    ]
    whole = start(train_cmd(*args, "--out", str(tmp_path / "whole")), tmp_path / "whole.log")
    out = tmp_path / "run"
    proc = start(train_cmd(*args, "--out", str(out)), tmp_path / "run.log")
    deadline = time.monotonic() + 240
    while train_steps(out) < 2 or not (workers := children(proc.pid)):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
        time.sleep(0.005)
    os.kill(int(workers[0]), signal.SIGKILL)
    assert proc.wait(timeout=120) == EXIT_RESOURCE, (tmp_path / "run.log").read_text()
    log = (tmp_path / "run.log").read_text()
    last = out / "checkpoints" / "last.pt"
    kept = read_checkpoint(last)
    assert kept["epoch"] == 0 and 2 <= kept["step"] == kept["epoch_step"] < 9, log
    assert (
        f"stopped: a data loader worker (pid {workers[0]}) was killed by SIGKILL — out of memory? try fewer "
        f"--workers; kept {last} (epoch 0, step {kept['step']}); the same command resumes" in log
    )
    assert "Traceback" not in log
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    assert_same_training(tmp_path / "whole", out)
    assert [r["step"] for r in records(out, "train")] == list(range(1, 19))


@pytest.mark.slow
def test_a_second_train_on_a_live_runs_folder_is_refused_and_a_killed_runs_lock_is_taken_over(
    train_shards, tmp_path
):
    """Two `memdpc train` processes on one run folder: the second is refused in one line naming the first's
    process and host (exit 2) before it reads anything; once the first is killed, the same command takes its lock
    over and resumes."""
    args = [*TINY, "--shards", str(train_shards), "--batch-size", "2", "--ckpt-every-steps", "2"]
    args += ["--val-split", "none", "--epochs", "1000", "--out", str(tmp_path / "run")]
    out, host = tmp_path / "run", socket.gethostname()
    first = start(train_cmd(*args), tmp_path / "first.log")  # trains until it is killed
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "last.pt").exists():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.01)
        second = subprocess.run(
            train_cmd(*args), env=subprocess_env(), capture_output=True, text=True, timeout=240
        )
        assert first.poll() is None, "the first run should still be training"
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert (
        f"Error: {out}: another training run is writing there (process {first.pid} on {host}, since "
        in second.stderr
    ), second.stderr
    assert "resuming" not in second.stderr  # refused before it read anything of the run
    step = read_checkpoint(out / "checkpoints" / "last.pt")["step"]
    third = subprocess.run(
        train_cmd(*args, "--max-steps", str(step + 2)),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert third.returncode == 0, third.stderr
    assert f"note: took over {out / 'train.lock'} from process {first.pid} on {host}" in third.stderr
    assert (
        f"resuming {out / 'checkpoints' / 'last.pt'}" in third.stderr and f"{step + 2} steps" in third.stderr
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_one_clip_per_video_resumes_after_sigkill_with_the_very_batches_of_the_epoch(
    train_shards, tmp_path, backend
):
    """One window of each of the 9 training videos per epoch (of their 18): 4 steps of batch 2, checkpoints every
    2 steps; the SIGKILL, sent when the first checkpoint appears, lands mid-epoch, and the resumed run draws the
    epoch's windows again and skips the consumed batches: its weights equal those of an uninterrupted run."""
    args = [
        *TINY,
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--ckpt-every-steps",
        "2",
        "--clips-per-video",
        "1",
        "--backend",
        backend,
        "--workers",
        "1",
        "--val-split",
        "none",
    ]
    whole = start(train_cmd(*args, "--out", str(tmp_path / "whole")), tmp_path / "whole.log")
    out = tmp_path / "killed"
    killed = start(train_cmd(*args, "--out", str(out)), tmp_path / "killed.log")
    last = out / "checkpoints" / "last.pt"
    signal_when(killed, last.exists, signal.SIGKILL)
    at_kill = read_checkpoint(last)
    assert at_kill["step"] < 8 and at_kill["epoch_step"] > 0, (at_kill["epoch"], at_kill["step"])
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (
        "resuming" in resumed.stderr and "trained" in resumed.stderr and "2 epochs, 8 steps" in resumed.stderr
    )
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    assert_same_training(tmp_path / "whole", out)


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_train_and_agree(train_shards, tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "memdpc.cli",
        "train",
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "2",
        "--global-negatives",
        "--val-split",
        "none",
    ]
    res = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    # 18 clips in 5 shards: rank 0 reads 10, rank 1 reads 8 -> 2 full batches of 4 per rank and epoch
    assert ckpt["step"] == 4
    model, _ = load_model(out / "checkpoints" / "last.pt")
    digest = param_digest(model)
    assert ckpt["rank_digests"] == [digest, digest]
    assert records(out, "train")[0]["top1"] <= 1
    # the run resumes only with the same number of processes
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "3",
        "--global-negatives",
        "--val-split",
        "none",
    )
    assert res.exit_code == 2 and "written by 2 process(es)" in res.output


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "sig"), [("torch", signal.SIGTERM), ("dali", signal.SIGINT)])
def test_a_signal_mid_epoch_saves_last_pt_there_and_the_same_command_resumes_bit_identically(
    train_shards, tmp_path, backend, sig
):
    """Two epochs of 9 steps (batch 2) with two loader workers (DataLoader processes, or DALI threads), no
    checkpoint but the epochs'; the signal goes when step 2 is logged, so the run stops mid-epoch."""
    args = [
        *TINY,
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--backend",
        backend,
        "--workers",
        "2",
        "--val-split",
        "none",
    ]
    whole = start(train_cmd(*args, "--out", str(tmp_path / "whole")), tmp_path / "whole.log")
    out = tmp_path / "stopped"
    proc = start(train_cmd(*args, "--out", str(out)), tmp_path / "stopped.log")
    took = signal_when(proc, lambda: train_steps(out) >= 2, sig)
    log = (tmp_path / "stopped.log").read_text()
    assert proc.returncode == 128 + sig and took < STOP_WITHIN, (took, log)
    last = out / "checkpoints" / "last.pt"
    kept = read_checkpoint(last)
    assert kept["epoch"] == 0 and 2 <= kept["step"] == kept["epoch_step"] < 9, log  # where it stopped
    assert (
        f"interrupted ({sig.name}): kept {last} (epoch 0, step {kept['step']}); the same command resumes"
        in log
    )
    assert [r["step"] for r in records(out, "train")] == list(range(1, kept["step"] + 1))
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {last} at epoch 0, step {kept['step']}" in resumed.stderr
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    assert_same_training(tmp_path / "whole", out)
    assert read_checkpoint(last)["step"] == 18
    assert [r["step"] for r in records(out, "train")] == list(range(1, 19))


@pytest.mark.slow
def test_sigint_while_dali_tears_its_pipeline_down_is_never_swallowed(train_shards, tmp_path):
    """Epochs of two steps (batch 8): DALI tears a pipeline down and builds the next one every second step.
    Each SIGINT goes the moment an epoch's last step is logged, into that shutdown, six times in a row (each run
    resuming the one before): every one stops the run within seconds with 130 and says what it kept. Before,
    such a signal was often lost: "Exception ignored in … KeyboardInterrupt" and training went
    on to the end, or TensorBoard's writer hung on close."""
    out = tmp_path / "run"
    cmd = train_cmd(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "100",
        "--batch-size",
        "8",
        "--backend",
        "dali",
        "--workers",
        "2",
        "--val-split",
        "none",
    )
    last = out / "checkpoints" / "last.pt"
    for trial in range(6):
        epoch_end = (train_steps(out) // 2 + 1) * 2  # the next one: the records so far are what last.pt holds
        log = tmp_path / f"{trial}.log"
        proc = start(cmd, log)
        took = signal_when(proc, lambda end=epoch_end: train_steps(out) >= end, signal.SIGINT)
        text = log.read_text()
        assert proc.returncode == 130 and took < STOP_WITHIN, (trial, took, text)
        assert "Exception ignored" not in text and "Traceback" not in text, text
        kept = read_checkpoint(last)
        assert kept["step"] >= epoch_end and train_steps(out) == kept["step"], text
        assert (
            f"interrupted (SIGINT): kept {last} (epoch {kept['epoch']}, step {kept['step']}); the same "
            "command resumes" in text
        )


@pytest.mark.slow
def test_a_stop_in_the_validation_and_knn_passes_resumes_into_that_epoch_end(train_shards, tmp_path):
    """SIGTERM goes when, after epoch 0's last step, a new loader worker process appears: the validation pass
    (over the 18 training clips, then the kNN monitor's over them twice) is under way. The run abandons the
    passes, records neither, and keeps last.pt at that step, with the RNG state before them (their loaders drew
    from it); the same command does that epoch's end again, and everything equals an uninterrupted run: weights,
    optimiser, RNG states, every record's value."""
    args = [
        *TINY,
        "--widths",
        "32,64,128,128",
        "--size",
        "64",
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--workers",
        "1",
        "--val-split",
        "train",
        "--knn-every",
        "1",
    ]
    whole = start(train_cmd(*args, "--out", str(tmp_path / "whole")), tmp_path / "whole.log")
    out = tmp_path / "stopped"
    proc = start(train_cmd(*args, "--out", str(out)), tmp_path / "stopped.log")
    seen: set[str] = set()  # the loader workers of the first kNN pass and of epoch 0's training

    def validating() -> bool:
        now = set(children(proc.pid))
        if train_steps(out) < 9:
            seen.update(now)
            return False
        return bool(now - seen)

    took = signal_when(proc, validating, signal.SIGTERM)
    log = (tmp_path / "stopped.log").read_text()
    assert proc.returncode == 143 and took < STOP_WITHIN, (took, log)
    kept = read_checkpoint(out / "checkpoints" / "last.pt")
    assert (kept["epoch"], kept["step"], kept["epoch_step"]) == (0, 9, 9), log  # the epoch's end not done
    assert records(out, "val") == [] and [r["step"] for r in records(out, "knn")] == [0]
    assert "epoch 0:" not in log
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    assert_same_training(tmp_path / "whole", out)
    for kind in ("train", "val", "knn"):
        mine, theirs = records(out, kind), records(tmp_path / "whole", kind)
        keys = {"kind", "epoch", "step", "loss", "top1", "r1"}  # not the timings
        assert [{k: v for k, v in r.items() if k in keys} for r in mine] == [
            {k: v for k, v in r.items() if k in keys} for r in theirs
        ], kind
    assert [r["step"] for r in records(out, "val")] == [9, 18]


@pytest.mark.slow
def test_sigint_in_the_first_knn_pass_stops_at_once_and_keeps_nothing(train_shards, tmp_path):
    """The kNN monitor's pass over the initial weights (the paper's encoder at 160 px, one clip per batch, the 18
    training clips as both sets: 36 batches, several seconds) starts once metrics.jsonl exists; a SIGINT then
    stops the run within seconds, with no checkpoint and no record, and says the same command starts again."""
    out = tmp_path / "run"
    proc = start(
        train_cmd(
            *TINY,
            "--widths",
            "64,128,256,256",
            "--size",
            "160",
            "--shards",
            str(train_shards),
            "--out",
            str(out),
            "--batch-size",
            "1",
            "--val-split",
            "train",
            "--knn-every",
            "1",
        ),
        tmp_path / "run.log",
    )
    took = signal_when(proc, lambda: (out / "metrics.jsonl").exists(), signal.SIGINT)
    log = (tmp_path / "run.log").read_text()
    assert proc.returncode == 130 and took < STOP_WITHIN, (took, log)
    assert "interrupted (SIGINT): no checkpoint yet; the same command starts again" in log
    assert (out / "metrics.jsonl").read_text() == "" and not (out / "checkpoints" / "last.pt").exists()


@pytest.mark.slow
def test_sigint_while_init_only_reads_batchnorm_statistics_writes_nothing(train_shards, tmp_path):
    """--init-only --bn-from-data with a loader worker: the SIGINT goes when the worker process appears (the pass
    over the 18 training clips, one per batch through the paper's encoder at 224 px, several seconds of work, has
    begun); the command stops within seconds, writes no init.pt, and says so."""
    out = tmp_path / "run"
    proc = start(
        train_cmd(
            *TINY,
            "--widths",
            "64,128,256,256",
            "--size",
            "224",
            "--shards",
            str(train_shards),
            "--out",
            str(out),
            "--batch-size",
            "1",
            "--workers",
            "1",
            "--init-only",
            "--bn-from-data",
        ),
        tmp_path / "run.log",
    )
    took = signal_when(proc, lambda: children(proc.pid), signal.SIGINT)
    log = (tmp_path / "run.log").read_text()
    assert proc.returncode == 130 and took < STOP_WITHIN, (took, log)
    init = out / "checkpoints" / "init.pt"
    assert f"interrupted (SIGINT): {init} not written; the same command starts again" in log
    assert not init.exists() and "Traceback" not in log


@pytest.mark.slow
def test_torchrun_sigterm_stops_both_ranks_at_one_step_and_the_rerun_is_bit_identical(train_shards, tmp_path):
    """torchrun forwards SIGTERM to both ranks and their loader workers; the ranks agree on one step, save
    last.pt together and stop within seconds. torchrun itself then reports the signal it got, with a traceback,
    and fails (its own behaviour). Run again, training ends bit-identical to an uninterrupted torchrun run."""

    def torchrun(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "memdpc.cli",
            "train",
            *TINY,
            "--shards",
            str(train_shards),
            "--out",
            str(out),
            "--epochs",
            "2",
            "--batch-size",
            "2",
            "--workers",
            "1",
            "--val-split",
            "none",
        ]

    whole = start(torchrun(tmp_path / "whole"), tmp_path / "whole.log")
    out = tmp_path / "stopped"
    proc = start(torchrun(out), tmp_path / "stopped.log")
    took = signal_when(proc, lambda: train_steps(out) >= 2, signal.SIGTERM)
    log = (tmp_path / "stopped.log").read_text()
    # torchrun waits for both ranks' exits, then shuts its agent down: seconds more than one process
    assert proc.returncode != 0 and took < 2 * STOP_WITHIN, (
        took,
        log,
    )  # torchrun's own report: 1 with torch 2.13
    last = out / "checkpoints" / "last.pt"
    kept = read_checkpoint(last)
    assert kept["world_size"] == 2 and 2 <= kept["step"] < 8, log  # 4 steps per epoch and rank
    assert (
        f"interrupted (SIGTERM): kept {last} (epoch {kept['epoch']}, step {kept['step']}); the same command "
        "resumes" in log
    )
    assert "interrupted (SIGTERM): rank 1 stopped with rank 0" in log
    resumed = subprocess.run(torchrun(out), env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    assert_same_training(tmp_path / "whole", out)


def test_the_run_ends_by_naming_what_it_wrote(train_shards, tmp_path, one_thread):
    out = tmp_path / "run"
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(out), "--epochs", "2")
    assert res.exit_code == 0, res.output
    val = records(out, "val")
    best = min(val, key=lambda r: r["loss"])
    ahead = (
        "no later epoch did better"
        if best["epoch"] == 0
        else f"{val[0]['loss'] - best['loss']:.4f} below epoch 0's {val[0]['loss']:.4f}"
    )
    flat = [r for r in val if at_chance(r)]  # tiny and short: it may not have left chance
    warning = [f"warning: {chance_summary(val)}"] if flat else []
    ckpts = out / "checkpoints"
    assert res.output.splitlines()[-5 - len(warning) :] == [
        f"trained {out}: 2 epochs, 8 steps",
        f"best: {ckpts / 'best.pt'} (epoch {best['epoch']}, val loss {best['loss']:.4f}; {ahead})",
        *warning,
        f"last: {ckpts / 'last.pt'}",
        f"metrics: {out / 'metrics.jsonl'}; tensorboard --logdir {out / 'tb'}",
        f"next: memdpc eval retrieve {ckpts / 'best.pt'} --shards {train_shards} --out EVAL_DIR",
    ]
    assert read_checkpoint(ckpts / "best.pt")["best_epoch"] == best["epoch"]
    init = tmp_path / "init" / "checkpoints" / "init.pt"
    res = cli(
        *TINY, "--shards", str(train_shards), "--out", str(tmp_path / "init"), "--init-only", "--seed", "3"
    )
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-2:] == [
        f"wrote {init} (untrained, seed 3)",
        f"next: memdpc eval retrieve {init} --shards {train_shards} --out EVAL_DIR",
    ]


def test_a_validation_loss_at_chance_is_flagged_in_the_epoch_lines_the_summary_and_the_report(
    blank_shards, tmp_path
):
    """Flat grey videos: every target looks alike, so the validation loss is the loss of a uniform guess in
    every epoch, and each place that shows it says so. The summary also names the loader `auto` chose."""
    out = tmp_path / "run"
    args = [*TINY, "--shards", str(blank_shards), "--out", str(out), "--epochs", "2", "--backend", "auto"]
    res = subprocess.run(train_cmd(*args), env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    val = records(out, "val")
    # 6 test clips in batches of 4 and 2, each clip's 2 predicted steps on a 1×1 map, one direction
    chance = (math.log(4 * 2) + math.log(2 * 2)) / 2
    assert [r["chance"] for r in val] == [pytest.approx(chance)] * 2
    assert all(abs(r["loss"] - chance) <= 0.01 * chance for r in val)
    note = (
        f"at chance: within 1% of {chance:.4f}, the loss of a uniform guess among the batch's candidates (ln of "
        "their number, summed over directions): nothing learnt"
    )
    lines = res.stderr.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(line.endswith(f" — {note}") for line in epochs)
    assert f"warning: the val loss was {note}, in every epoch (2)" in lines
    dali = importlib.util.find_spec("nvidia.dali") is not None
    assert (
        f"loader: {'dali' if dali else 'torch'} (auto: nvidia-dali is {'' if dali else 'not '}installed)"
        in lines
    )

    res = run_memdpc("report", tmp_path)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert (
        f'<p class="missing">run: {html.escape(f"the val loss was {note}, in every epoch (2)")}</p>' in page
    )


def test_train_spells_options_as_the_other_verbs_do(train_shards, tmp_path):
    """--blocks as `memdpc shard` says it (and --workers as eval and quickstart do), the field names still
    accepted: the last spelling given wins, as for one option."""
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "r"), "--blocks", "4")
    assert res.exit_code == 2 and "clips of 5×3 frames, but the config asks for 4×3" in res.output
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "r"),
        "--blocks",
        "4",
        "--num-blocks",
        "5",
        "--workers",
        "1",
        "--epochs",
        "1",
        "--val-split",
        "none",
    )
    assert res.exit_code == 0, res.output
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["num_workers"] == 1


def test_val_split_warnings_are_printed_once_at_the_start(val_shards, tmp_path, one_thread):
    res = cli(
        *TINY,
        "--shards",
        str(val_shards),
        "--out",
        str(tmp_path / "r"),
        "--val-split",
        "val",
        "--knn-every",
        "1",
        "--epochs",
        "1",
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[:2] == [
        f"warning: {w}"
        for w in val_split_warnings(
            config_from_dict(
                dict(shards=str(val_shards), val_split="val", knn_every=1, num_blocks=5, block_len=3)
            )
        )
    ]
    # once; the summary may add its own, of a validation loss at chance (a tiny run on 2 videos)
    assert sum(line.startswith("warning:") and "at chance" not in line for line in lines) == 2


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
    res = subprocess.run(
        train_cmd(
            *TINY,
            "--backend",
            backend,
            "--num-workers",
            "1",
            "--shards",
            str(shards),
            "--out",
            str(tmp_path / "r"),
        ),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    rgb, root = re.escape(str(shards / "rgb")), re.escape(str(shards))
    expected = {
        "torch": rf"Error: {rgb}/train-\d+\.tar: sample \w+: f\d\d\.jpg is not a decodable JPEG "
        rf".*--verify {root}`",
        "dali": rf"Error: {rgb}: a frame of these shards is not a decodable JPEG .*--verify {root}`",
    }
    assert re.search(expected[backend], res.stderr.splitlines()[-1]), res.stderr[-2000:]


@pytest.mark.slow
def test_mismatched_checkpoints_and_run_dirs_are_refused(learned_run, train_shards, tmp_path):
    last = learned_run / "checkpoints" / "last.pt"
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "a"), "--resume", str(last))
    assert res.exit_code == 2 and f"{last}: checkpoint is of another architecture" in res.output
    res = cli(
        *TINY,
        *LEARNED,
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "b"),
        "--resume",
        str(last),
        "--stream",
        "flow",
    )
    assert res.exit_code == 2 and f"{last}: checkpoint was trained on the rgb stream, not flow" in res.output
    res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(learned_run), "--lr", "0.01")
    assert res.exit_code == 2
    assert "config.yaml: this run directory holds a different config (lr: 0.001 → 0.01)" in res.output
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 64)
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "c"), "--resume", str(junk))
    assert res.exit_code == 2 and "junk.pt: not a readable checkpoint" in res.output
    res = CliRunner().invoke(
        main,
        [
            "train",
            *TINY,
            *LEARNED,
            "--shards",
            str(train_shards),
            "--out",
            str(tmp_path / "d"),
            "--init-only",
        ],
    )
    assert res.exit_code == 0, res.output
    init = tmp_path / "d" / "checkpoints" / "init.pt"
    res = cli(
        *TINY, *LEARNED, "--shards", str(train_shards), "--out", str(tmp_path / "e"), "--resume", str(init)
    )
    assert res.exit_code == 2 and f"{init}: holds weights only" in res.output


def _convert(tmp_path: Path, name: str, stream: str = "rgb", **kw) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint in the reference layout (built without convert.py), converted with `memdpc convert`."""
    weights, ref = reference_weights(name, seed=5, widths=(4, 8, 16, 16), **kw)
    torch.save(
        {"epoch": 99, "state_dict": ref, "best_acc": 0.5, "optimizer": {}, "iteration": 10},
        tmp_path / f"{name}.pth.tar",
    )
    res = CliRunner().invoke(
        main, ["convert", str(tmp_path / f"{name}.pth.tar"), str(tmp_path / f"{name}.pt"), "--stream", stream]
    )
    assert res.exit_code == 0, res.output
    return tmp_path / f"{name}.pt", weights


INIT = [*TINY, "--arch", "memdpc_r18", "--mem-size", "16", "--bidirectional", "--val-split", "none"]


@pytest.mark.slow
def test_init_starts_a_new_run_from_converted_weights(train_shards, tmp_path, one_thread):
    """The first step starts from the converted weights: undoing Adam's first update (its moments are in the
    checkpoint) gives them back, where the run's own seeded initialisation is far from them."""
    init, weights = _convert(tmp_path, "memdpc_r18", mem_size=16)
    run = tmp_path / "run"
    res = cli(
        *INIT, "--shards", str(train_shards), "--out", str(run), "--init", str(init), "--max-steps", "1"
    )
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(run / "checkpoints" / "last.pt")
    assert (ckpt["origin"], ckpt["step"], ckpt["config"]["init"]) == ("train", 1, str(init))
    model = create_model(**ckpt["model_config"])
    lr, (beta1, beta2), eps = ckpt["config"]["lr"], (0.9, 0.999), 1e-8
    state = ckpt["optimizer"]["state"]
    for i, (name, _) in enumerate(model.named_parameters()):
        after = ckpt["model"][name]
        step = (
            lr * (state[i]["exp_avg"] / (1 - beta1)) / ((state[i]["exp_avg_sq"] / (1 - beta2)).sqrt() + eps)
            if i in state
            else 0
        )
        torch.testing.assert_close(after + step, weights[name], atol=1e-6, rtol=0, msg=name)
    seeded = create_model(**ckpt["model_config"]).state_dict()
    assert all(
        not torch.allclose(seeded[k], weights[k], atol=1e-2) for k in ("memory", "backbone.conv1.weight")
    )
    # a run that resumes continues from its own checkpoint, not from --init
    res = cli(
        *INIT, "--shards", str(train_shards), "--out", str(run), "--init", str(init), "--max-steps", "2"
    )
    assert res.exit_code == 0 and "resuming" in res.output, res.output
    assert read_checkpoint(run / "checkpoints" / "last.pt")["step"] == 2


def test_init_checkpoints_that_cannot_start_the_run_are_one_line_errors(train_shards, tmp_path):
    dpc, _ = _convert(tmp_path, "dpc_r18")
    clf, _ = _convert(tmp_path, "classifier_r18", num_classes=3)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(dpc.read_bytes()[:2048])
    for path, text in (
        (dpc, "checkpoint is of another architecture: name 'dpc_r18' (this run: 'memdpc_r18')"),
        (clf, "holds a finetuned classifier (classifier_r18), not a pretrained MemDPC/DPC model"),
        (cut, "not a readable checkpoint"),
    ):
        res = cli(*INIT, "--shards", str(train_shards), "--out", str(tmp_path / "run"), "--init", str(path))
        assert res.exit_code == 2 and f"{path}: {text}" in res.output and "Traceback" not in res.output, (
            res.output
        )
        assert not (tmp_path / "run").exists()
    assert INIT[:2] == ["--stream", "rgb"]  # without it, the default stream would be taken as asked for
    flow, _ = _convert(tmp_path, "memdpc_r18", stream="flow", mem_size=16)
    res = cli(*INIT[2:], "--shards", str(train_shards), "--out", str(tmp_path / "run"), "--init", str(flow))
    assert res.exit_code == 2 and f"--init {flow}: say which stream the run trains on" in res.output, (
        res.output
    )
    assert not (tmp_path / "run").exists()
    res = cli(
        *INIT,
        "--arch",
        "dpc_r18",
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "run"),
        "--resume",
        str(dpc),
    )
    assert res.exit_code == 2 and f"{dpc}: holds weights only" in res.output, res.output


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(train_shards, tmp_path, one_thread):
    out = tmp_path / "nan"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--lr",
        "1e30",
        "--lr-min",
        "1e29",
        "--ckpt-every-steps",
        "1",
        "--val-split",
        "none",
    )
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
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--lr",
        "1e30",
        "--lr-min",
        "1e29",
        "--log-every",
        "5",
        "--ckpt-every-steps",
        "3",
        "--val-split",
        "none",
    )
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
    _check_weights(p, State(step=7), model)  # finite: no error
    with torch.no_grad():
        model.backbone.conv1.weight[0, 0, 0, 0, 0] = float("inf")
    with pytest.raises(
        UserError,
        match="the weights are not finite after epoch 0, step 7: training stopped; no "
        "checkpoint had been written yet",
    ):
        _check_weights(p, State(step=7), model)


def test_metrics_are_read_only_every_log_every_steps(train_shards, tmp_path, one_thread, monkeypatch):
    """2 epochs of 4 steps, a record every 3: the device's values come to the host only at steps 3, 4 (the
    epoch's end), 6 and 8, each step once, and the records hold the same means as reading every step would."""
    reads, read = [], StepValues.read

    def counted(self):
        done = read(self)
        reads.append([values["loss"] for values, _, _ in done])
        return done

    monkeypatch.setattr(StepValues, "read", counted)
    out = tmp_path / "run"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "2",
        "--log-every",
        "3",
        "--val-split",
        "none",
    )
    assert res.exit_code == 0, res.output
    assert [len(r) for r in reads if r] == [3, 1, 2, 2]
    train = records(out, "train")
    assert [r["step"] for r in train] == [3, 6]
    losses = [loss for r in reads for loss in r]
    assert train[0]["loss"] == sum(losses[:3]) / 3 and train[1]["loss"] == sum(losses[4:6]) / 2
    assert read_checkpoint(out / "checkpoints" / "last.pt")["epoch_loss"] == [
        losses[4] + losses[5] + losses[6] + losses[7],
        4,
    ]


def test_deterministic_reruns_are_bit_identical(train_shards, tmp_path, one_thread):
    """--deterministic: two runs of one command train the very same weights, optimiser state and RNG states."""
    for name in ("a", "b"):
        res = cli(
            *TINY,
            "--shards",
            str(train_shards),
            "--out",
            str(tmp_path / name),
            "--epochs",
            "1",
            "--val-split",
            "none",
            "--deterministic",
        )
        assert res.exit_code == 0, res.output
    assert_same_training(tmp_path / "a", tmp_path / "b")


@pytest.mark.slow
def test_full_disk_while_saving_keeps_the_previous_checkpoint(
    learned_run, train_shards, tmp_path, one_thread
):
    """Resume a copy of the learned run for one more epoch under a real file-size limit (EFBIG)."""
    run = tmp_path / "run"
    shutil.copytree(learned_run, run)
    last = run / "checkpoints" / "last.pt"
    before = {p.name: p.read_bytes() for p in last.parent.iterdir()}
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before["last.pt"]) // 2, old_limit[1]))
    try:
        res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(run), "--epochs", "5")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert res.exit_code == EXIT_RESOURCE, res.output
    assert re.search(
        rf"stopped: file-size limit reached in {re.escape(str(last.parent))}, writing (best|last)\.pt "
        r"\([^)]* free there now\); "
        rf"kept {re.escape(str(last))} \(epoch 4, step \d+\); raise the limit \(ulimit -f\), then the same "
        "command resumes",
        res.output,
    ), res.output
    assert {p.name: p.read_bytes() for p in last.parent.iterdir()} == before  # no temporary left either


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_the_resume_is_bit_identical(
    train_shards, small_disk, tmp_path
):
    """The run folder on a real file system with room for one and a half checkpoints: the second save does not
    fit, the run stops with one line (exit 74) keeping the first checkpoint whole; once space is freed the same
    command resumes from it and ends as an undisturbed run does, bit for bit."""
    args = [
        *TINY,
        "--shards",
        str(train_shards),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--ckpt-every-steps",
        "2",
        "--val-split",
        "none",
    ]
    whole = start(train_cmd(*args, "--out", str(tmp_path / "whole")), tmp_path / "whole.log")
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()
    checkpoint = (tmp_path / "whole" / "checkpoints" / "last.pt").stat().st_size
    rest = sum(p.stat().st_size for p in (tmp_path / "whole").rglob("*") if p.parent.name != "checkpoints")
    small_disk.resize(int(1.5 * checkpoint) + rest)
    out = small_disk.path / "run"
    last = out / "checkpoints" / "last.pt"
    stopped = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
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
    resumed = subprocess.run(
        train_cmd(*args, "--out", str(out)), env=subprocess_env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {last} at epoch 0, step 2" in resumed.stderr
    assert_same_training(tmp_path / "whole", out)
    assert [r["step"] for r in records(out, "train")] == list(range(1, 19))


@pytest.mark.gpu
def test_gpu_run_with_bf16_and_dali(train_shards, tmp_path):
    """One GPU: DALI mixed decoding, bf16 autocast, deterministic algorithms; weights stay finite."""
    out = tmp_path / "gpu"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--device",
        "cuda",
        "--backend",
        "auto",
        "--amp",
        "bf16",
        "--deterministic",
        "--epochs",
        "2",
    )
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["step"] == 8 and all(
        torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point()
    )
    assert records(out, "val")


@pytest.mark.gpu
def test_gpu_fast_defaults_follow_the_eager_losses(train_shards, tmp_path):
    """channels_last_3d, fused Adam and cuDNN autotuning change the summation order only: over 8 steps the
    losses stay within a small tolerance of the eager reference (--no-fast)."""
    losses = {}
    for name, extra in (("fast", []), ("eager", ["--no-fast"])):
        out = tmp_path / name
        res = cli(
            *TINY,
            "--shards",
            str(train_shards),
            "--out",
            str(out),
            "--device",
            "cuda",
            "--epochs",
            "2",
            "--val-split",
            "none",
            *extra,
        )
        assert res.exit_code == 0, res.output
        losses[name] = [r["loss"] for r in records(out, "train")]
    assert len(losses["fast"]) == 8
    assert losses["fast"] == pytest.approx(losses["eager"], rel=1e-3, abs=1e-4)


@pytest.mark.gpu
def test_gpu_deterministic_reruns_with_cuda_graphs_are_bit_identical(train_shards, tmp_path):
    """--deterministic with the step in a CUDA graph (bf16): two runs of one command, the same weights."""
    for name in ("a", "b"):
        res = cli(
            *TINY,
            "--shards",
            str(train_shards),
            "--out",
            str(tmp_path / name),
            "--device",
            "cuda",
            "--epochs",
            "3",
            "--val-split",
            "none",
            "--deterministic",
            "--cuda-graphs",
            "--amp",
            "bf16",
        )
        assert res.exit_code == 0, res.output
    assert_same_training(tmp_path / "a", tmp_path / "b")


@pytest.mark.gpu
def test_gpu_bf16_training_at_the_fast_defaults_stays_finite(train_shards, tmp_path):
    out = tmp_path / "bf16"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--device",
        "cuda",
        "--amp",
        "bf16",
        "--epochs",
        "3",
        "--val-split",
        "none",
    )
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(out / "checkpoints" / "last.pt")
    assert ckpt["step"] == 12 and ckpt["config"]["fast"] is True
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values() if v.is_floating_point())
    assert all(r["loss"] == r["loss"] for r in records(out, "train"))  # no NaN


@pytest.mark.parametrize(("jitter", "crop_size"), [(True, 224), (False, 0)])
def test_augmentation_settings_reach_the_loader(train_shards, jitter, crop_size):
    config = config_from_dict(
        dict(
            shards=str(train_shards),
            out="unused",
            backend="torch",
            size=32,
            num_blocks=5,
            block_len=3,
            pred_steps=2,
            jitter_flow=jitter,
            crop_size=crop_size,
        )
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    spec = _loader(config, env, "train", ClipSpec(5, 3, stride=1), train=True).plan.spec
    assert spec.jitter_flow is jitter and spec.colour_on("flow") is jitter
    assert spec.crop_size == (crop_size or None)


def _shard_videos(shards: Path, archives: Path, val: set[tuple[int, int]]) -> None:
    """The train and val shards of the 12 videos of ``train_shards``' archives (class, video) with the videos
    ``val`` held out for validation and the rest trained on, cut anew (``--overwrite``) as a re-indexed run is."""
    records = [video_record(ci, g, "val" if (ci, g) in val else "train") for ci in range(3) for g in range(4)]
    for split in ("train", "val"):
        run_shard(
            archives,
            records,
            "rgb",
            shards,
            split,
            ShardSettings(clip=CLIP, window_step=8, max_count=4),
            overwrite=True,
        )


def test_a_run_resumes_only_on_the_shards_it_was_trained_on(train_shards, tmp_path, one_thread):
    """Re-indexed and re-sharded after a run (two training videos now validation ones): the resume is refused
    naming the change, by the run and by --dry-run; --overwrite starts afresh after saying what it removes. The
    same shards copied elsewhere still resume."""
    shards, out = tmp_path / "shards", tmp_path / "run"
    _shard_videos(shards, train_shards.parent / "archives", {(0, 3), (1, 3), (2, 3)})
    run = [*TINY, "--shards", str(shards), "--out", str(out)]
    assert cli(*run, "--epochs", "1").exit_code == 0
    last = out / "checkpoints" / "last.pt"
    recorded = read_checkpoint(last)["shards"]
    assert {role: r["sha256"] for role, r in recorded.items()} == {
        role: hashlib.sha256((shards / "rgb" / f"manifest-{role}.json").read_bytes()).hexdigest()
        for role in ("train", "val")
    }
    copied = tmp_path / "copied"
    shutil.copytree(shards, copied)
    res = cli(*TINY, "--shards", str(copied), "--out", str(out), "--epochs", "2")
    assert res.exit_code == 0 and f"resuming {last} at epoch 1" in res.output
    _shard_videos(shards, train_shards.parent / "archives", {(0, 3), (1, 3), (2, 3), (0, 2), (1, 2)})
    refusal = (
        f"Error: {last}: shards changed since this run: 2 videos moved from train to val; --overwrite starts "
        "afresh (or train on the shards it was trained on)"
    )
    for dry in ([], ["--dry-run"]):
        res = cli(*run, "--epochs", "3", *dry)
        assert res.exit_code == 2 and res.output.splitlines()[-1] == refusal, res.output
    assert read_checkpoint(last)["step"] == 8  # untouched
    res = cli(*run, "--epochs", "3", "--dry-run", "--overwrite")
    assert res.exit_code == 0, res.output
    removed = ["checkpoints/best.pt", "checkpoints/last.pt", "metrics.jsonl", "tb"]
    assert f"afresh (--overwrite removes {', '.join(str(out / p) for p in removed)} first)" in res.output
    assert last.is_file()  # a dry run writes (and removes) nothing
    res = cli(*run, "--epochs", "1", "--overwrite")
    assert res.exit_code == 0, res.output
    assert f"--overwrite: removing {', '.join(removed)} from {out} to start the run afresh" in res.output
    assert "resuming" not in res.output
    ckpt = read_checkpoint(last)
    assert (ckpt["epoch"], ckpt["step"]) == (1, 3)  # 7 training videos: 14 clips, 3 batches of 4
    assert [r["step"] for r in records(out, "train")] == [1, 2, 3]  # the old run's records are gone
    assert (
        ckpt["shards"]["train"]["sha256"]
        == hashlib.sha256((shards / "rgb" / "manifest-train.json").read_bytes()).hexdigest()
    )
