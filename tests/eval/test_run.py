"""eval/run.py: what ``evaluate`` and ``fuse`` add around the tasks — the fit settings given over the task's
defaults, the stream check before any work, the fused result's default place, what an interrupt kept
(real `memdpc eval finetune` processes with loader workers, signalled), and a full disk (a real tmpfs)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import EXIT_RESOURCE, main
from memdpc.common.errors import UserError
from memdpc.eval.fit import PROBE_FIT
from memdpc.eval.outputs import checkpoint_source
from memdpc.eval.results import load_result, save_result
from memdpc.eval.run import evaluate, fuse
from memdpc.pipeline.provenance import manifest_identity
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings

from ..conftest import files_opened, memdpc_command, subprocess_env
from ..limits import STOP_WITHIN
from .conftest import CLIP

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_fit_settings_override_the_task_defaults(eval_data, checkpoints, tmp_path):
    path = evaluate(
        "probe",
        checkpoints["rgb"],
        shards=eval_data.shards,
        out=tmp_path,
        fit={"epochs": 1, "lr": 0.01},
        **COMMON,
    )
    config = load_result(path)[0]["config"]
    assert (config["epochs"], config["lr"], config["lr_min"]) == (1, 0.01, pytest.approx(0.001))
    assert (config["batch_size"], config["patience"]) == (PROBE_FIT.batch_size, PROBE_FIT.patience)


def test_checkpoint_of_the_wrong_stream_is_refused(eval_data, checkpoints, tmp_path):
    with pytest.raises(UserError, match="trained on the rgb stream, not flow"):
        evaluate(
            "retrieve", checkpoints["rgb"], stream="flow", shards=eval_data.shards, out=tmp_path, **COMMON
        )
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_an_unknown_task_is_refused_before_any_work(eval_data, checkpoints, tmp_path):
    with pytest.raises(UserError, match="unknown evaluation task 'retrieval'; choose one of retrieve, probe"):
        evaluate("retrieval", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path / "x", **COMMON)
    assert not (tmp_path / "x").exists()


def test_fused_result_goes_beside_the_first_by_default(tmp_path):
    arrays = {"video_ids": np.array(["v1", "v2"]), "labels": np.array([0, 1])}
    paths = [
        save_result(
            tmp_path / s / "probe-linear.json",
            {
                "kind": "probe-linear",
                "stream": s,
                "dataset": "syn",
                "split": "test",
                "classes": ["a", "b"],
            },
            {**arrays, "probs": np.eye(2, dtype=np.float32)},
        )
        for s in ("rgb", "flow")
    ]
    out = fuse(*paths)
    assert out == tmp_path / "rgb" / "fusion-classify-rgb+flow.json"
    assert load_result(out)[0]["stream"] == "rgb+flow"


def _finetune_cmd(eval_data, checkpoint, out, epochs: int, backend: str) -> list[str]:
    return memdpc_command(
        "eval",
        "finetune",
        str(checkpoint),
        "--shards",
        str(eval_data.shards),
        "--out",
        str(out),
        "--epochs",
        str(epochs),
        "--backend",
        backend,
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--device",
        "cpu",
    )


@pytest.mark.parametrize(
    "sig, to_group, backend",
    [
        (signal.SIGINT, True, "torch"),  # Ctrl-C in a terminal: the whole process group, loader workers too
        (signal.SIGTERM, True, "torch"),  # a scheduler's pre-emption, which signals every process of the job
        (signal.SIGTERM, False, "dali"),  # kill PID; DALI's pipelines are built and torn down every epoch
    ],
)
def test_a_signal_stops_finetune_within_seconds_says_what_was_kept_and_the_rerun_resumes(
    eval_data, checkpoints, tmp_path, sig, to_group, backend
):
    out = tmp_path / "out"
    env = subprocess_env()
    proc = subprocess.Popen(
        _finetune_cmd(eval_data, checkpoints["rgb"], out, 500, backend),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    state = out / "finetune-rgb.state.pt"
    deadline = time.monotonic() + 120
    while not state.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)  # into the next epoch, with its loader workers running
    sent = time.monotonic()
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + sig, err
    assert took < STOP_WITHIN, took
    assert "Traceback" not in err and "Exception ignored" not in err, err
    note = re.search(
        rf"interrupted \({sig.name}\): finetune state kept at {re.escape(str(state))}, epoch (\d+) of "
        r"500; the same command resumes",
        err,
    )
    assert note, err
    with pytest.raises(ProcessLookupError):  # no loader worker left behind
        for _ in range(50):
            os.killpg(proc.pid, 0)
            time.sleep(0.1)
    kept = int(note.group(1))
    assert [p.name for p in out.iterdir()] == ["finetune-rgb.state.pt"]  # no temporary file left
    rerun = subprocess.run(
        _finetune_cmd(eval_data, checkpoints["rgb"], out, kept + 1, backend),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming {state}: epoch {kept} of {kept + 1} done" in rerun.stderr
    assert len(load_result(out / "finetune-rgb.json")[0]["train_loss"]) == kept + 1


def test_results_record_their_shards_and_caches_of_other_shards_or_checkpoints_are_not_reused(
    eval_data, checkpoints, other_rgb, tmp_path
):
    shards, out = tmp_path / "shards", tmp_path / "eval"
    shutil.copytree(eval_data.shards, shards)
    caches = {split: out / f"features-rgb-{split}.npz" for split in ("train", "test")}

    def retrieve(checkpoint) -> tuple[dict, dict[str, int]]:
        path = evaluate("retrieve", checkpoint, shards=shards, out=out, overwrite=True, **COMMON)
        return load_result(path)[0], {s: p.stat().st_mtime_ns for s, p in caches.items()}

    result, made = retrieve(checkpoints["rgb"])
    assert result["shards"] == {s: manifest_identity(shards, "rgb", s) for s in ("train", "test")}
    assert retrieve(checkpoints["rgb"])[1] == made  # the same checkpoint and shards: both caches reused
    test = [r for r in eval_data.records if r.split == "test"]
    for_one_less = [r for r in eval_data.records if r is not test[0]]
    run_shard(
        eval_data.shards.parent / "archives",
        for_one_less,
        "rgb",
        shards,
        "test",
        ShardSettings(clip=CLIP, max_count=4),
        overwrite=True,
    )
    result, now = retrieve(checkpoints["rgb"])  # test re-sharded: its cache made anew, the train one reused
    assert (now["train"], now["test"] != made["test"]) == (made["train"], True)
    assert result["counts"]["videos"] == len(test) - 1
    assert result["shards"]["test"] == manifest_identity(shards, "rgb", "test")
    result, other = retrieve(other_rgb)  # another checkpoint: neither cache reused
    assert other["train"] != now["train"] and other["test"] != now["test"]
    assert result["source"] == checkpoint_source(other_rgb)


def test_a_full_disk_stops_eval_in_one_line_with_nothing_half_written_and_the_rerun_finishes(
    eval_data, checkpoints, small_disk, tmp_path
):
    """`memdpc eval retrieve` with its --out on a real file system with 40 % of the space its files take: one
    line and exit 74 at the first write that does not fit, every file there whole (no temporary left); once space
    is freed the same command writes the results of an undisturbed run."""
    args = ["eval", "retrieve", str(checkpoints["rgb"]), "--shards", str(eval_data.shards)]
    args += ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu", "--out"]
    ref = tmp_path / "ref"
    assert CliRunner().invoke(main, [*args, str(ref)]).exit_code == 0
    files = {p.name: p for p in ref.iterdir()}
    small_disk.resize(int(0.4 * sum(p.stat().st_size for p in files.values())))
    out = small_disk.path / "eval"
    stopped = CliRunner().invoke(main, [*args, str(out)])
    assert stopped.exit_code == EXIT_RESOURCE, stopped.output
    line = re.search(
        rf"stopped: no space left on the file system of {re.escape(str(out))}, writing (\S+) \([^)]* free there "
        r"now\); (.*)",
        stopped.output,
    )
    assert line and re.search(r"free space there, then the same command (resumes|starts again)$", line[2]), (
        stopped.output
    )
    assert "Traceback" not in stopped.output and not list(out.glob(".tmp-*"))
    assert line[1] not in {p.name for p in out.iterdir()}  # the file that did not fit is not there at all
    for p in out.iterdir():  # what is there is whole
        assert p.name in files and p.stat().st_size == files[p.name].stat().st_size
    small_disk.resize(4 * sum(p.stat().st_size for p in files.values()) + (1 << 20))
    assert CliRunner().invoke(main, [*args, str(out)]).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(files)
    result, arrays = load_result(out / "retrieval-rgb.json")
    expected, expected_arrays = load_result(ref / "retrieval-rgb.json")
    assert result["metrics"] == expected["metrics"] and result["files"] == expected["files"]
    assert arrays.keys() == expected_arrays.keys()
    assert all(np.array_equal(arrays[k], expected_arrays[k]) for k in arrays)


def test_an_evaluation_reads_its_checkpoint_and_each_manifest_once(eval_data, checkpoints, tmp_path):
    """The checkpoint is read once and handed down (its default size, the model, the results' digest); each
    manifest once (its clips, classes, shards, the results' record of it). Both copied here: a manifest is read
    once per process, and these are new to it."""
    shards, checkpoint = tmp_path / "shards", tmp_path / "last.pt"
    shutil.copytree(eval_data.shards, shards)
    shutil.copy(checkpoints["flow"], checkpoint)
    path, opened = files_opened(
        lambda: evaluate(
            "probe", checkpoint, shards=shards, out=tmp_path / "eval", fit={"epochs": 1}, **COMMON
        )
    )
    assert load_result(path)[0]["source"] == checkpoint_source(checkpoint)
    flow = (shards / "flow").resolve()
    read = Counter(p.resolve() for p in opened if p.name.startswith("manifest-") or p.suffix == ".pt")
    assert read == {flow / "manifest-test.json": 1, flow / "manifest-train.json": 1, checkpoint.resolve(): 1}
