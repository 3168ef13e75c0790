"""Results files: JSON + npz written atomically (a full disk, on a real tmpfs, leaves the pair there was), read
back, clear errors for bad files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from memdpc.common.errors import ResourceFault, UserError
from memdpc.eval.results import arrays_path, load_result, save_result


def test_round_trip(tmp_path):
    result = {
        "kind": "probe-linear",
        "stream": "rgb",
        "dataset": "syn",
        "split": "test",
        "classes": ["a"],
        "metrics": {"top1": 0.5, "videos": 4},
    }
    path = save_result(tmp_path / "r.json", result, {"video_ids": np.array(["v"]), "probs": np.ones((1, 1))})
    back, arrays = load_result(path)
    assert back["metrics"] == {"top1": 0.5, "videos": 4} and back["schema"] == 1
    assert arrays["video_ids"].tolist() == ["v"] and arrays_path(path).is_file()
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_full_disk_leaves_the_results_there_were_whole(small_disk):
    """Results written again (a rerun) on a real file system too small for the new arrays: the JSON and the
    npz there stay as they were, a matching pair, and no temporary is left."""
    small_disk.resize(256 * 1024)
    result = {"kind": "probe-linear", "stream": "rgb", "dataset": "syn", "split": "test", "classes": ["a"]}
    path = save_result(
        small_disk.path / "r.json", {**result, "metrics": {"top1": 0.5}}, {"probs": np.ones(4)}
    )
    before = {p.name: p.read_bytes() for p in small_disk.path.iterdir()}
    with pytest.raises(ResourceFault, match=r"no space left on the file system of .*, writing r\.(npz|json)"):
        save_result(path, {**result, "metrics": {"top1": 0.7}}, {"probs": np.ones(100_000)})
    assert {p.name: p.read_bytes() for p in small_disk.path.iterdir()} == before
    assert load_result(path)[0]["metrics"] == {"top1": 0.5}


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
    result = {
        "kind": "finetune",
        "stream": "rgb",
        "dataset": "d",
        "split": "test",
        "classes": [],
        "metrics": {},
    }
    path = save_result(tmp_path / "r.json", result, {"labels": np.zeros(1)})
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
    result = {
        "kind": "finetune",
        "stream": "rgb",
        "dataset": "d",
        "split": "test",
        "classes": [],
        "metrics": {},
    }
    path = save_result(tmp_path / "finetune-rgb.json", result, {"labels": np.zeros(1)})
    with pytest.raises(
        UserError, match=f"finetune-rgb.npz: not a results file .*; its results file is {path}$"
    ):
        load_result(arrays_path(path))
    with pytest.raises(
        UserError, match=f"^{tmp_path} is a folder: give the .json results files eval wrote, e.g. {path}"
    ):
        load_result(tmp_path)
