"""eval/data.py: what every ``memdpc eval`` verb evaluates on, and the name its results give the dataset."""

from __future__ import annotations

from memdpc.eval.data import EvalData
from memdpc.pipeline.backends import LoaderSettings


def test_the_dataset_is_named_after_the_shard_folder_unless_given(tmp_path):
    shards = tmp_path / "ucf101-shards"
    assert EvalData(LoaderSettings(shards, "rgb")).dataset_name == "ucf101-shards"
    assert (
        EvalData(LoaderSettings(tmp_path / "ucf101-shards" / ".." / "hmdb", "rgb")).dataset_name == "hmdb"
    )  # the resolved folder
    assert EvalData(LoaderSettings(shards, "rgb"), dataset="ucf101").dataset_name == "ucf101"
