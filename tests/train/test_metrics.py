from __future__ import annotations

import json
import time

import pytest
import torch

from memdpc.train.knn import recall_at_1
from memdpc.train.metrics import Meter, MetricsLogger, truncate_jsonl


def test_meter_means_and_rates():
    m = Meter()
    m.add({"loss": 2.0, "top1": 0.0}, clips=4, wait=0.0)
    time.sleep(0.02)
    m.add({"loss": 4.0, "top1": 1.0}, clips=4, wait=0.01)
    assert m.means() == {"loss": 3.0, "top1": 0.5}
    rates = m.rates(world_size=2)
    assert 0 < rates["data_wait"] < 1 and rates["clips_per_s"] > 0


def test_logger_writes_jsonl_and_tensorboard(tmp_path):
    log = MetricsLogger(tmp_path, enabled=True, progress=False)
    log.log({"kind": "train", "epoch": 0, "step": 1, "loss": 2.5})
    log.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["loss"] == 2.5
    assert any((tmp_path / "tb").iterdir())
    MetricsLogger(tmp_path / "other", enabled=False, progress=False).log({"kind": "train", "step": 1})
    assert not (tmp_path / "other").exists()


def test_truncate_drops_records_after_the_resumed_step_and_cut_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"kind": "train", "step": s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"kind": "tr')  # a line cut by a kill
    truncate_jsonl(path, 2)
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2]


def test_recall_at_1():
    train_x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    train_y = torch.tensor([0, 1, 2])
    test_x = torch.tensor([[0.9, 0.1], [0.1, 0.9], [-1.0, 0.1]])
    assert recall_at_1(train_x, train_y, test_x, torch.tensor([0, 1, 2])) == 1.0
    assert recall_at_1(train_x, train_y, test_x, torch.tensor([1, 1, 1])) == pytest.approx(1 / 3)
