"""Results files: JSON + npz written atomically with the scores of the arrays (a full disk, on a real tmpfs,
leaves the pair there was), read back, clear errors for bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from memdpc.common.errors import ResourceFault, UserError
from memdpc.eval.results import arrays_path, load_result, save_result
from memdpc.eval.scores import SCORE_KEYS
from memdpc.eval.stats import wilson

PROBE = {"kind": "probe-linear", "stream": "rgb", "dataset": "syn", "split": "test", "classes": ["a", "b"]}
# 4 videos: labels 0, 0, 1, 1; the first three ranked right (top-1 3 of 4)
PROBE_ARRAYS = {
    "video_ids": np.array(["v1", "v2", "v3", "v4"]),
    "labels": np.array([0, 0, 1, 1]),
    "probs": np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.7, 0.3]], np.float32),
}


def test_round_trip_with_the_scores_of_the_arrays(tmp_path):
    path = save_result(tmp_path / "r.json", PROBE, PROBE_ARRAYS)
    back, arrays = load_result(path)
    assert back["schema"] == 2 and back["counts"] == {"videos": 4, "classes": 2, "smallest_class": 2}
    assert back["metrics"] == {"top1": 0.75, "top5": None, "mean_class_top1": 0.75}
    assert back["undefined"] == {"top5": "top-5 of 2 classes: every class is among the first 5"}
    assert back["methods"] == {"top1": "wilson", "mean_class_top1": "wilson, effective n"}
    assert back["no_interval"] == {}
    assert back["intervals"]["top1"] == pytest.approx(wilson(3, 4))
    assert back["small_test_set"] == "small test set: 2 test videos in its smallest class, fewer than 5"
    assert back["interval_settings"] == {
        "confidence": 0.95,
        "bootstrap": {"resamples": 2000, "seed": 0, "over": "test videos"},
    }
    assert arrays["video_ids"].tolist() == ["v1", "v2", "v3", "v4"] and arrays_path(path).is_file()
    assert not list(tmp_path.glob(".tmp-*"))
    assert save_result(tmp_path / "again.json", PROBE, PROBE_ARRAYS).read_text() == path.read_text().replace(
        '"r.npz"', '"again.npz"'
    )  # deterministic, the bootstrap too
    with pytest.raises(ValueError, match="computed from its arrays"):
        save_result(tmp_path / "x.json", {**PROBE, "metrics": {"top1": 1.0}}, PROBE_ARRAYS)


def test_a_result_written_before_the_scores_gets_them_when_read(tmp_path):
    path = save_result(tmp_path / "r.json", PROBE, PROBE_ARRAYS)
    old = json.loads(path.read_text())
    old = {k: v for k, v in old.items() if k not in SCORE_KEYS}
    path.write_text(json.dumps({**old, "schema": 1, "metrics": {"top1": 0.75, "top5": 1.0, "videos": 4}}))
    back, _ = load_result(path)
    assert back["metrics"]["top5"] is None and back["counts"]["videos"] == 4 and "top1" in back["intervals"]


def test_no_test_video_is_refused(tmp_path):
    empty = {"video_ids": np.array([], str), "labels": np.array([], int), "probs": np.zeros((0, 2))}
    with pytest.raises(UserError, match="no test videos to score"):
        save_result(tmp_path / "r.json", PROBE, empty)
    assert not list(tmp_path.iterdir())


def test_a_full_disk_leaves_the_results_there_were_whole(small_disk):
    """Results written again (a rerun) on a real file system too small for the new arrays: the JSON and the
    npz there stay as they were, a matching pair, and no temporary is left."""
    small_disk.resize(256 * 1024)
    path = save_result(small_disk.path / "r.json", PROBE, PROBE_ARRAYS)
    before = {p.name: p.read_bytes() for p in small_disk.path.iterdir()}
    bigger = {
        **PROBE_ARRAYS,
        "features": np.ones((4, 100_000), np.float32),
    }  # an array kept beside the scores
    with pytest.raises(ResourceFault, match=r"no space left on the file system of .*, writing r\.(npz|json)"):
        save_result(path, {**PROBE, "dataset": "other"}, bigger)
    assert {p.name: p.read_bytes() for p in small_disk.path.iterdir()} == before
    assert load_result(path)[0]["dataset"] == "syn"


def test_bad_files_are_refused(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_result(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(
        UserError, match=r"bad.json: not a results file \(it looks like a text file\); give the .json"
    ):
        load_result(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"kind": "x"}))
    with pytest.raises(UserError, match=r"other.json: not a results file \(it looks like a JSON file\)"):
        load_result(tmp_path / "other.json")
    path = save_result(tmp_path / "r.json", PROBE, PROBE_ARRAYS)
    arrays_path(path).unlink()
    with pytest.raises(UserError, match="missing"):
        load_result(path)


def test_a_checkpoint_npz_or_folder_given_as_results_says_which_json_to_give(tmp_path):
    """`eval --fuse` with a checkpoint was a UnicodeDecodeError traceback."""
    ckpt = tmp_path / "best.pt"
    torch.save({"model": {"w": torch.zeros(3)}}, ckpt)
    with pytest.raises(UserError) as e:
        load_result(ckpt)
    assert str(e.value) == (
        f"{ckpt}: not a results file (it looks like a PyTorch file, such as a checkpoint); give "
        "the .json files eval wrote, e.g. eval/rgb/retrieval-rgb.json"
    )
    path = save_result(tmp_path / "finetune-rgb.json", {**PROBE, "kind": "finetune"}, PROBE_ARRAYS)
    with pytest.raises(
        UserError, match=f"finetune-rgb.npz: not a results file .*; its results file is {path}$"
    ):
        load_result(arrays_path(path))
    with pytest.raises(
        UserError, match=f"^{tmp_path} is a folder: give the .json results files eval wrote, e.g. {path}"
    ):
        load_result(tmp_path)
