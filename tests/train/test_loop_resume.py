"""Training stopped and resumed on real shards, in real processes: exact resume after SIGKILL, SIGINT and
SIGTERM (both loaders, torchrun with gloo ranks), one writer per run folder, and a resume only on the shards
the run was trained on."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from memdpc.cli import EXIT_RESOURCE
from memdpc.model.checkpoint import load_model, read_checkpoint
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.train.checkpoint import param_digest

from ..conftest import memdpc_command, torchrun_command
from ..limits import STOP_WITHIN
from .conftest import (
    CLIP,
    TINY,
    assert_finished,
    assert_same_training,
    children,
    cli,
    records,
    run_to_end,
    signal_when,
    start,
    start_train,
    tiny,
    train_steps,
    video_record,
)


def test_a_run_killed_before_its_first_checkpoint_starts_its_metrics_afresh(
    train_shards, tmp_path, one_thread
):
    out = tmp_path / "run"
    args = tiny(shards=str(train_shards), out=str(out), epochs=1, knn_every=1)
    assert cli(*args).exit_code == 0
    first = (out / "metrics.jsonl").read_text()
    shutil.rmtree(out / "checkpoints")  # what a kill before the first checkpoint leaves: config and metrics
    res = cli(*args)
    assert res.exit_code == 0, res.output
    assert [r["step"] for r in records(out, "knn")] == [0, 4]  # once each, not the killed attempt's again
    assert (out / "metrics.jsonl").read_text().count("\n") == first.count("\n")


@pytest.mark.slow
def test_sigkill_mid_epoch_and_resume_give_bit_identical_weights(train_shards, tmp_path):
    """Two epochs of 9 steps (batch 2), checkpoints every 2 steps, a DataLoader worker. Only steps 9 and 18 end
    an epoch, so the SIGKILL, sent when the first checkpoint appears, lands mid-epoch even on a busy machine."""
    args = tiny(
        shards=str(train_shards), epochs=2, batch_size=2, ckpt_every_steps=2, num_workers=1, val_split="none"
    )
    whole = start_train(args, tmp_path / "whole")
    killed = start_train(args, tmp_path / "killed")
    last = tmp_path / "killed" / "checkpoints" / "last.pt"
    signal_when(killed, last.exists, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    at_kill = read_checkpoint(last)
    assert at_kill["step"] < 18 and at_kill["epoch_step"] > 0, (at_kill["epoch"], at_kill["step"])
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(tmp_path / "killed")))
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    assert_finished(whole, tmp_path / "whole.log")
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
    args = tiny(shards=str(train_shards), epochs=2, batch_size=2, workers=1, val_split="none")
    whole = start_train(args, tmp_path / "whole")
    out = tmp_path / "run"
    proc = start_train(args, out)
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
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert_finished(whole, tmp_path / "whole.log")
    assert_same_training(tmp_path / "whole", out)
    assert [r["step"] for r in records(out, "train")] == list(range(1, 19))


@pytest.mark.slow
def test_a_second_train_on_a_live_runs_folder_is_refused_and_a_killed_runs_lock_is_taken_over(
    train_shards, tmp_path
):
    """Two `memdpc train` processes on one run folder: the second is refused in one line naming the first's
    process and host (exit 2) before it reads anything; once the first is killed, the same command takes its lock
    over and resumes."""
    args = tiny(shards=str(train_shards), batch_size=2, ckpt_every_steps=2)
    args += ["--val-split", "none", "--epochs", "1000", "--out", str(tmp_path / "run")]
    out, host = tmp_path / "run", socket.gethostname()
    first = start(memdpc_command("train", *args), tmp_path / "first.log")  # trains until it is killed
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "last.pt").exists():
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
            time.sleep(0.01)
        second = run_to_end(memdpc_command("train", *args))
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
    third = run_to_end(memdpc_command("train", *args, "--max-steps", str(step + 2)))
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
    args = tiny(
        shards=str(train_shards),
        epochs=2,
        batch_size=2,
        ckpt_every_steps=2,
        clips_per_video=1,
        backend=backend,
        workers=1,
        val_split="none",
    )
    whole = start_train(args, tmp_path / "whole")
    out = tmp_path / "killed"
    killed = start_train(args, out)
    last = out / "checkpoints" / "last.pt"
    signal_when(killed, last.exists, signal.SIGKILL)
    at_kill = read_checkpoint(last)
    assert at_kill["step"] < 8 and at_kill["epoch_step"] > 0, (at_kill["epoch"], at_kill["step"])
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert (
        "resuming" in resumed.stderr and "trained" in resumed.stderr and "2 epochs, 8 steps" in resumed.stderr
    )
    assert_finished(whole, tmp_path / "whole.log")
    assert_same_training(tmp_path / "whole", out)


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_train_and_agree(train_shards, tmp_path):
    out = tmp_path / "ddp"
    args = tiny(shards=str(train_shards), out=str(out), global_negatives=True, val_split="none")
    res = run_to_end(torchrun_command("train", *args, "--epochs", "2"), timeout=300)
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
    res = cli(*args, "--epochs", "3")
    assert res.exit_code == 2 and "written by 2 process(es)" in res.output


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "sig"), [("torch", signal.SIGTERM), ("dali", signal.SIGINT)])
def test_a_signal_mid_epoch_saves_last_pt_there_and_the_same_command_resumes_bit_identically(
    train_shards, tmp_path, backend, sig
):
    """Two epochs of 9 steps (batch 2) with two loader workers (DataLoader processes, or DALI threads), no
    checkpoint but the epochs'; the signal goes when step 2 is logged, so the run stops mid-epoch."""
    args = tiny(
        shards=str(train_shards), epochs=2, batch_size=2, backend=backend, workers=2, val_split="none"
    )
    whole = start_train(args, tmp_path / "whole")
    out = tmp_path / "stopped"
    proc = start_train(args, out)
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
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {last} at epoch 0, step {kept['step']}" in resumed.stderr
    assert_finished(whole, tmp_path / "whole.log")
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
    cmd = memdpc_command(
        "train",
        *tiny(
            shards=str(train_shards),
            out=str(out),
            epochs=100,
            batch_size=8,
            backend="dali",
            workers=2,
            val_split="none",
        ),
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
    args = tiny(
        widths="32,64,128,128",
        size=64,
        shards=str(train_shards),
        epochs=2,
        batch_size=2,
        workers=1,
        val_split="train",
        knn_every=1,
    )
    whole = start_train(args, tmp_path / "whole")
    out = tmp_path / "stopped"
    proc = start_train(args, out)
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
    resumed = run_to_end(memdpc_command("train", *args, "--out", str(out)))
    assert resumed.returncode == 0, resumed.stderr
    assert_finished(whole, tmp_path / "whole.log")
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
    args = tiny(
        widths="64,128,256,256",
        size=160,
        shards=str(train_shards),
        batch_size=1,
        val_split="train",
        knn_every=1,
    )
    proc = start_train(args, out)
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
    args = tiny(
        widths="64,128,256,256",
        size=224,
        shards=str(train_shards),
        batch_size=1,
        workers=1,
        init_only=True,
        bn_from_data=True,
    )
    proc = start_train(args, out)
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
        args = tiny(
            shards=str(train_shards), out=str(out), epochs=2, batch_size=2, workers=1, val_split="none"
        )
        return torchrun_command("train", *args)

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
    resumed = run_to_end(torchrun(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    assert_same_training(tmp_path / "whole", out)


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
    run = tiny(shards=str(shards), out=str(out))
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
