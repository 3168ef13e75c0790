"""eval/outputs.py: which results a task may replace (the checkpoint's bytes decide), the files it lists and
what an interrupt reports as kept; on real files."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.outputs import Outputs, checkpoint_source
from memdpc.eval.results import save_result
from memdpc.pipeline.backends import LoaderSettings

RESULT = {
    "kind": "retrieval",
    "stream": "rgb",
    "dataset": "d",
    "split": "test",
    "classes": ["a"],
}
ARRAYS = {
    "video_ids": np.array(["q"]),
    "labels": np.zeros(1, int),
    "gallery_ids": np.array(["g"]),
    "gallery_labels": np.zeros(1, int),
    "neighbours": np.zeros((1, 1), int),
}


def _results_of(out: Outputs) -> None:
    """A result of ``out`` on the test split of the shard folder beside its folder (a manifest alone will do)."""
    manifest = out.folder.parent / "shards" / "rgb" / "manifest-test.json"
    if not manifest.is_file():
        manifest.parent.mkdir(parents=True)
        manifest.write_text('{"stream": "rgb", "split": "test", "shards": []}\n')
    record = out.record(EvalData(LoaderSettings(manifest.parent.parent, "rgb")), ("test",))
    assert record["shards"] == {
        "test": {
            "manifest": str(manifest.resolve()),
            "sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        }
    }
    save_result(out.claim("retrieval-rgb.json"), {**RESULT, **record}, ARRAYS)


def test_results_are_replaced_only_by_the_same_checkpoint_bytes(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    a.write_bytes(b"weights of a")
    b.write_bytes(b"weights of b")
    assert checkpoint_source(a) == {
        "checkpoint": str(a.resolve()),
        "sha256": hashlib.sha256(b"weights of a").hexdigest(),
    }
    folder = tmp_path / "eval"
    _results_of(Outputs(folder, a))
    _results_of(Outputs(folder, a))  # the same checkpoint again
    copy = tmp_path / "copy.pt"
    copy.write_bytes(a.read_bytes())
    _results_of(Outputs(folder, copy))  # the same bytes elsewhere
    with pytest.raises(UserError) as e:
        Outputs(folder, b).claim("retrieval-rgb.json")
    assert str(e.value) == (
        f"{folder / 'retrieval-rgb.json'} holds results of another checkpoint, {copy.resolve()}; "
        f"give another --out for {b.resolve()}, or --overwrite to replace them"
    )
    _results_of(Outputs(folder, b, overwrite=True))
    b.write_bytes(b"weights of b after more training")
    with pytest.raises(UserError, match=f"holds results of {b.resolve()} as it was before it changed"):
        Outputs(folder, b).claim("retrieval-rgb.json")
    assert (
        Outputs(folder, b).claim("probe-linear-rgb.json") == folder / "probe-linear-rgb.json"
    )  # another result
    save_result(folder / "old.json", RESULT, ARRAYS)  # written before results recorded a source
    with pytest.raises(UserError, match="holds results of a checkpoint it does not record"):
        Outputs(folder, a).claim("old.json")


def test_listing_and_what_an_interrupt_kept(tmp_path):
    out = Outputs(tmp_path / "eval", tmp_path / "a.pt")
    assert out.kept() == [f"nothing written to {tmp_path / 'eval'} yet; the same command starts again"]
    out.add("features", tmp_path / "eval" / "f-train.npz", "features of train cached in f-train.npz")
    out.add("state", tmp_path / "eval" / "s.pt", "finetune state kept at s.pt, epoch 1 of 5")
    out.add(
        "state", tmp_path / "eval" / "s.pt", "finetune state kept at s.pt, epoch 2 of 5"
    )  # one file, updated
    out.add("plots", tmp_path / "eval" / "c.png")
    assert out.kept() == [
        "features of train cached in f-train.npz",
        "finetune state kept at s.pt, epoch 2 of 5",
        "the same command resumes",
    ]
    assert out.listing() == {"features": ["f-train.npz"], "state": ["s.pt"], "plots": ["c.png"]}
