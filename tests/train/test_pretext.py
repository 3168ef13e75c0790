"""A checkpoint's pretext score on a split is the validation the training loop logged for the same weights."""

from __future__ import annotations

import json

import pytest

from memdpc.train.config import config_from_dict
from memdpc.train.loop import train
from memdpc.train.pretext import pretext_scores

from ..conftest import TINY_TRAIN

TINY = {**TINY_TRAIN, "arch": "memdpc_r18", "mem_size": 16, "batch_size": 2, "epochs": 1, "val_split": "test"}


def test_the_score_is_the_validation_the_loop_logged(train_shards, tmp_path, one_thread):
    config = config_from_dict(dict(shards=str(train_shards), out=str(tmp_path / "run"), **TINY))
    run = train(config)
    (val,) = [
        r
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if (r := json.loads(line))["kind"] == "val"
    ]
    scores = pretext_scores(run / "checkpoints" / "last.pt", config, "test")
    assert scores["batches"] == 3  # 6 test clips, batches of 2
    assert scores["loss"] == pytest.approx(val["loss"], rel=1e-5)
    assert scores["top1"] == pytest.approx(val["top1"], rel=1e-5)
    assert scores["chance"] == pytest.approx(val["chance"], rel=1e-6)
