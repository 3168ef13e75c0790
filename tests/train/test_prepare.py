"""train/prepare.py: the checks before training starts, on real shards (``train_shards``: rgb, 5×3 clips)
and real run directories: which manifests are used, wrong-stream or wrong-geometry shards, a missing
validation split, a run directory of another config, the checkpoint a run resumes from, the warnings
about a validation split that measures little, and the run directory's lock (real processes)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memdpc.common.errors import UserError
from memdpc.pipeline.shard_set import open_split
from memdpc.train.config import TrainConfig, config_from_dict
from memdpc.train.prepare import (
    CONFIG_NAME,
    augment_spec,
    check_run_dir,
    check_shards,
    clear_run,
    hold_run_dir,
    resolve_val_split,
    val_split_warnings,
    videos_by_class,
)

GEOMETRY = {"num_blocks": 5, "block_len": 3}


def _config(shards: Path | str, out: Path | str = "", **kw) -> TrainConfig:
    return config_from_dict(dict(shards=str(shards), out=str(out), **{**GEOMETRY, **kw}))


def test_the_augmentation_takes_every_flow_setting_of_the_config():
    spec = augment_spec(
        _config("s", jitter_flow=False, crop_size=0, flow_shift=10, flow_gain=1.5, flow_reverse=0.5)
    )
    assert (spec.jitter_flow, spec.crop_size, spec.flow_shift, spec.flow_gain, spec.flow_reverse) == (
        False,
        None,
        10,
        1.5,
        0.5,
    )
    with pytest.raises(UserError, match="flow_reverse"):
        _config("s", flow_reverse=1.5)
    assert augment_spec(_config("s")).colour_per == "frame"  # the paper's
    assert augment_spec(_config("s", colour_per="clip")).colour_per == "clip"


def test_the_train_and_validation_manifests(train_shards):
    manifests = check_shards(_config(train_shards))
    assert {role: (s.path, s.sha256) for role, s in manifests.items()} == {
        role: (s.path, s.sha256)
        for role, s in (
            ("train", open_split(train_shards, "rgb", "train")),
            ("val", open_split(train_shards, "rgb", "test")),
        )
    }
    assert set(check_shards(_config(train_shards, val_split="none"))) == {"train"}


def test_no_shard_folder_is_a_user_error():
    with pytest.raises(
        UserError, match=r"^no shard folder given: pass --shards DIR \(written by `memdpc shard`\)$"
    ):
        check_shards(config_from_dict(GEOMETRY))


def test_shards_of_the_other_stream_are_named(train_shards):
    with pytest.raises(UserError) as e:
        check_shards(_config(train_shards, stream="flow"))
    assert str(e.value) == (
        f"{train_shards}: holds rgb shards, not flow shards (--stream flow); pass --stream rgb or the flow shards"
    )


def test_a_folder_without_any_shards_names_the_missing_manifest(tmp_path):
    with pytest.raises(UserError, match="manifest-train.json: shard manifest not found"):
        check_shards(_config(tmp_path))


def test_clips_of_another_geometry_are_refused(train_shards):
    with pytest.raises(UserError) as e:
        check_shards(_config(train_shards, num_blocks=8, block_len=5))
    assert str(e.value) == (
        f"{train_shards / 'rgb' / 'manifest-train.json'}: clips of 5×3 frames, but the config asks for 8×5"
    )


def test_a_missing_validation_split_says_how_to_go_without(train_shards, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(train_shards, shards)
    (shards / "rgb" / "manifest-test.json").unlink()
    with pytest.raises(
        UserError,
        match=r"manifest-test.json: no validation shards; shard that split or pass --val-split none",
    ):
        check_shards(_config(shards))
    assert set(check_shards(_config(shards, val_split="none"))) == {"train"}


def test_no_run_directory_is_a_user_error():
    with pytest.raises(UserError, match=r"^no run directory given: pass --out RUN_DIR$"):
        check_run_dir(TrainConfig())


def test_a_file_in_place_of_the_run_directory_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(UserError, match=f"^{tmp_path / 'run'}: exists and is not a directory$"):
        check_run_dir(_config("s", tmp_path / "run"))


def test_a_new_or_empty_run_directory_starts_fresh(tmp_path):
    assert check_run_dir(_config("s", tmp_path / "new")) is None
    assert not (tmp_path / "new").exists()  # checking creates nothing
    (tmp_path / "run").mkdir()
    assert check_run_dir(_config("s", tmp_path / "run")) is None


def test_the_run_resumes_from_its_last_checkpoint_or_the_one_given(tmp_path):
    last = tmp_path / "checkpoints" / "last.pt"
    last.parent.mkdir()
    last.write_bytes(b"")
    assert check_run_dir(_config("s", tmp_path)) == last
    assert check_run_dir(_config("s", tmp_path, resume="/elsewhere/best.pt")) == Path("/elsewhere/best.pt")


def test_the_recorded_config_must_match_outside_the_restart_free_settings(tmp_path):
    config = _config("s", tmp_path)
    (tmp_path / CONFIG_NAME).write_text(yaml.safe_dump(config.to_dict()))
    assert check_run_dir(config) is None
    assert check_run_dir(_config("other", tmp_path, epochs=5, num_workers=0)) is None  # restart-free
    with pytest.raises(UserError) as e:
        check_run_dir(_config("s", tmp_path, lr=0.01, seed=3))
    assert str(e.value) == (
        f"{tmp_path / CONFIG_NAME}: this run directory holds a different config (lr: 0.001 → 0.01; seed: 0 → 3); "
        "choose another --out, or repeat its settings to resume it"
    )


def test_overwrite_starts_afresh_whatever_the_run_directory_holds(tmp_path):
    """--overwrite resumes nothing and takes another config; it removes the checkpoints, the metrics and the
    TensorBoard logs, after saying which, and nothing else."""
    (tmp_path / CONFIG_NAME).write_text(yaml.safe_dump(_config("s", tmp_path).to_dict()))
    for name in ("checkpoints/last.pt", "checkpoints/best.pt", "metrics.jsonl", "tb/events.out", "notes.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    assert check_run_dir(_config("s", tmp_path, lr=0.01), overwrite=True) is None
    with pytest.raises(
        UserError, match="^--overwrite starts .* afresh; --resume x.pt goes on from a checkpoint"
    ):
        check_run_dir(_config("s", tmp_path, resume="x.pt"), overwrite=True)
    said = []
    clear_run(tmp_path, said.append)
    assert said == [
        f"--overwrite: removing checkpoints/best.pt, checkpoints/last.pt, metrics.jsonl, tb from {tmp_path} to "
        "start the run afresh"
    ]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "checkpoints",
        CONFIG_NAME,
        "notes.txt",
    ]
    clear_run(tmp_path, said.append)  # nothing left to remove: nothing said
    assert len(said) == 1


def test_an_unreadable_recorded_config_is_a_user_error(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("lr: [unclosed")
    with pytest.raises(UserError, match=f"^{tmp_path / CONFIG_NAME}: unreadable \\("):
        check_run_dir(_config("s", tmp_path))


def test_an_empty_recorded_config_counts_as_the_defaults(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("")
    assert check_run_dir(config_from_dict(dict(out=str(tmp_path)))) is None
    with pytest.raises(UserError, match=r"different config \(block_len: 5 → 3; num_blocks: 8 → 5\)"):
        check_run_dir(_config("s", tmp_path))


def test_videos_by_class_reads_the_labels_of_a_split(val_shards):
    assert videos_by_class(val_shards, "rgb", "val") == {0: {"v_MoveRight_g03"}, 1: {"v_MoveLeft_g03"}}
    every = videos_by_class(val_shards, "rgb", "train")
    assert every == {
        c: {f"v_{name}_g{g:02d}" for g in range(3)}
        for c, name in enumerate(("MoveRight", "MoveLeft", "MoveUp"))
    }
    # with `until`, reading stops at the first window of the last class missing: fewer videos, every class
    first = videos_by_class(val_shards, "rgb", "train", until={0, 1, 2})
    assert first.keys() == {0, 1, 2} and sum(map(len, first.values())) < 9
    assert all(videos <= every[c] for c, videos in first.items())


def test_a_validation_split_missing_a_class_or_with_few_videos_is_warned_about(val_shards):
    where = val_shards / "rgb" / "manifest-val.json"
    assert val_split_warnings(_config(val_shards, val_split="val", knn_every=1)) == [
        f"{where}: the val split holds no video of 1 of the 3 classes of the train split (MoveUp); the kNN "
        "monitor's R@1 leaves them out",
        f"{where}: the val split holds only 2 videos, each 50 % of it; the kNN monitor's R@1 "
        "rests on them alone (hold out more videos, e.g. memdpc index … --val-per-class 2, and shard that split "
        "again)",
    ]
    by_knn = val_split_warnings(_config(val_shards, val_split="val", knn_every=1, best_by="knn"))
    assert [w.split("; ")[1].split(" leaves")[0].split(" rests")[0] for w in by_knn] == [
        "the kNN monitor's R@1, which chooses best.pt,"
    ] * 2
    # the test split holds a video of every class, but only three videos
    assert [
        w.split(": ", 1)[1].split(";")[0] for w in val_split_warnings(_config(val_shards, val_split="test"))
    ] == ["the test split holds only 3 videos, each 33 % of it"]
    assert (
        "the validation loss, which chooses best.pt, rests"
        in val_split_warnings(_config(val_shards, val_split="test"))[0]
    )
    assert val_split_warnings(_config(val_shards, val_split="none")) == []
    # a video of every class, but fewer than FEW_VAL_VIDEOS
    assert val_split_warnings(_config(val_shards, val_split="train", train_split="test")) == [
        f"{val_shards / 'rgb' / 'manifest-train.json'}: the train split holds only 9 videos, each 11 % of it; the "
        "validation loss, which chooses best.pt, rests on them alone (hold out more videos, e.g. memdpc index … "
        "--val-per-class 2, and shard that split again)"
    ]


def test_auto_validates_on_the_val_split_where_the_shards_hold_one_else_on_test(train_shards, val_shards):
    assert (
        resolve_val_split(_config(val_shards)).val_split == "val"
    )  # held out by memdpc index --val-per-class
    assert resolve_val_split(_config(train_shards)).val_split == "test"
    assert resolve_val_split(_config(val_shards, val_split="test")).val_split == "test"  # asked for: kept
    assert resolve_val_split(_config(val_shards, val_split="none")).val_split == "none"


def test_auto_keeps_the_split_a_run_started_with(train_shards, val_shards, tmp_path):
    """A run started on shards without val validates on test; once a val split is sharded beside them, the
    same command still resumes it (on test) instead of refusing it as another config; started afresh
    (``--overwrite``), it validates on val."""
    run = tmp_path / "run"
    started = resolve_val_split(_config(train_shards, run))
    run.mkdir()
    (run / CONFIG_NAME).write_text(f"val_split: {started.val_split}\n")
    assert resolve_val_split(_config(val_shards, run)).val_split == "test"
    assert resolve_val_split(_config(val_shards, run), fresh=True).val_split == "val"  # --overwrite: afresh


def test_a_missing_shard_index_is_named_before_training(val_shards, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(val_shards, shards)
    (shards / "rgb" / "val-000000.idx").unlink()
    with pytest.raises(UserError, match=r"val-000000\.idx: missing; shard that split again$"):
        val_split_warnings(_config(shards, val_split="val"))


def test_a_run_directory_held_by_a_live_run_is_refused_naming_its_process_and_host(tmp_path):
    held = hold_run_dir(_config("", tmp_path / "run"))
    try:
        with pytest.raises(UserError) as refused:
            hold_run_dir(_config("", tmp_path / "run"))
    finally:
        held.release()
    assert str(refused.value).startswith(
        f"{tmp_path / 'run'}: another training run is writing there (process {os.getpid()} on "
        f"{socket.gethostname()}, since "
    )
    assert str(refused.value).endswith("); wait for it to end, or give another --out")
    again = hold_run_dir(_config("", tmp_path / "run"))  # let go of: free, and nobody to name
    assert again.took_over is None and again.note is None
    again.release()


def _killed_holding_the_lock(run: Path, then: str = "") -> str:
    """The process id of a process SIGKILLed while it holds ``run``'s lock, after running ``then`` (Python
    lines)."""
    code = (
        "import os, signal, sys, time; from memdpc.train.config import config_from_dict; "
        "from memdpc.train.prepare import hold_run_dir\n"
        f"lock = hold_run_dir(config_from_dict(dict(out=sys.argv[1])))\n{then}"
        "print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    return killed.stdout.strip()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    pid = _killed_holding_the_lock(tmp_path / "run")
    lock = hold_run_dir(_config("", tmp_path / "run"))
    try:
        assert lock.took_over.startswith(f"process {pid} on {socket.gethostname()}, since ")
        assert (
            lock.note == f"took over {lock.path} from {lock.took_over}, which ended without letting go of it"
        )
    finally:
        lock.release()


def test_a_killed_runs_lock_its_forked_workers_still_hold_is_taken_over_once_they_end(tmp_path):
    """A run SIGKILLed while its loader workers live: they share its flock until they see their parent gone
    (here: a forked child that keeps it 2 s); the next run waits for them instead of refusing a dead process."""
    child = "if os.fork() == 0:\n    os.close(1); os.close(2); time.sleep(2); os._exit(0)\n"
    pid = _killed_holding_the_lock(tmp_path / "run", then=child)
    lock = hold_run_dir(_config("", tmp_path / "run"))
    try:
        assert lock.took_over.startswith(f"process {pid} on {socket.gethostname()}, since ")
    finally:
        lock.release()


def test_a_run_directory_made_only_for_the_lock_goes_with_it(tmp_path):
    """A run refused after taking the lock (its shards missing, say) leaves no folder behind."""
    hold_run_dir(_config("", tmp_path / "new" / "run")).release()
    assert list((tmp_path / "new").iterdir()) == []
    (tmp_path / "kept").mkdir()
    hold_run_dir(_config("", tmp_path / "kept")).release()
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["train.lock"]  # a folder it did not make
