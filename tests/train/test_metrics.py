from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import torch

from memdpc.pipeline.augment import AugmentSpec, normalise
from memdpc.preprocess.flow.backends import flow_to_codes
from memdpc.train import metrics
from memdpc.train.metrics import (
    CLIPS_SHOWN,
    DATA_BN,
    KNN_BASELINE,
    Meter,
    MetricsLogger,
    at_chance,
    chance_note,
    chance_summary,
    monitor_summary,
    truncate_jsonl,
)

from .conftest import tb_images, tb_scalars


def test_meter_means_and_rates(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(metrics, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    m = Meter()
    m.add({"loss": 2.0, "top1": 0.0}, clips=4, wait=0.0)
    m.add({"loss": 4.0, "top1": 1.0}, clips=4, wait=0.5)
    now[0] = 102.0
    assert m.means() == {"loss": 3.0, "top1": 0.5}
    assert m.rates(world_size=2) == {"clips_per_s": 8.0, "data_wait": 0.25}  # 8 clips × 2 ranks in 2 s
    m.add({"loss": 0.0}, clips=0, wait=5.0)
    assert m.rates(world_size=1)["data_wait"] == 1.0  # capped at the wall time
    m.reset()
    now[0] = 103.0
    assert m.means() == {} and m.rates(world_size=1) == {"clips_per_s": 0.0, "data_wait": 0.0}


def test_logger_writes_jsonl_and_tensorboard(tmp_path):
    log = MetricsLogger(tmp_path, enabled=True, progress=False)
    log.log({"kind": "train", "epoch": 0, "step": 1, "loss": 2.5, "top1": 0.25})
    log.log({"kind": "val", "epoch": 0, "step": 1, "loss": 3.0})
    log.log({"kind": "train", "epoch": 1, "step": 2, "loss": 1.5, "top1": 0.5})
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["loss"] for ln in lines] == [2.5, 3.0, 1.5]
    assert tb_scalars(tmp_path / "tb") == {
        "train/loss": [(1, 2.5), (2, 1.5)],
        "train/top1": [(1, 0.25), (2, 0.5)],
        "val/loss": [(1, 3.0)],
    }
    MetricsLogger(tmp_path / "other", enabled=False, progress=False).log({"kind": "train", "step": 1})
    assert not (tmp_path / "other").exists()


def test_truncate_drops_records_after_the_resumed_step_and_cut_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"kind": "train", "step": s}) for s in (1, 2, 3, 4)]
    path.write_text("\n".join(lines) + '\n{"kind": "tr')  # a line cut by a kill
    truncate_jsonl(path, 2)
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2]


def test_logger_shows_a_few_clips_as_images_flow_in_colour(tmp_path):
    """A batch as the loaders hand it over (normalised), of flow moving right: red images, one per clip shown."""
    spec = AugmentSpec()
    codes = flow_to_codes(np.tile(np.array([3.0, 0.0], np.float32), (3, 6, 16, 16, 1)))  # 3 clips × 6 frames
    batch = normalise(torch.from_numpy(codes), num_blocks=2, spec=spec)  # (3, 2, 3, 3, 16, 16)
    log = MetricsLogger(tmp_path, enabled=True, progress=False)
    log.clips(batch, ["a_00000", "b_00000", "c_00000"], spec, "flow", step=7)
    log.close()
    images = tb_images(tmp_path / "tb")
    assert sorted(images) == [f"clips/{i}" for i in range(CLIPS_SHOWN)]
    step, image = images["clips/0"][0]
    assert step == 7 and image.shape[1] >= 480  # 3 frames of a block in a row, enlarged
    red = (image[..., 0] > 240) & (image[..., 1] < 15) & (image[..., 2] < 15)
    assert red.mean() > 0.5  # the frames: rightward, full colour; the rest is the caption
    MetricsLogger(tmp_path / "other", enabled=False, progress=False).clips(batch, ["a"], spec, "flow", step=1)
    assert not (tmp_path / "other").exists()


def test_a_loss_within_one_percent_of_its_chance_level_is_at_chance_and_the_summary_counts_those_epochs():
    def val(epoch: int, loss: float, chance: float | None = 2.1972) -> dict:
        return {
            "kind": "val",
            "epoch": epoch,
            "step": epoch,
            "loss": loss,
            **({"chance": chance} if chance is not None else {}),
        }

    assert (
        at_chance(val(0, 2.1972)) and at_chance(val(0, 2.1972 * 0.991)) and at_chance(val(0, 2.1972 * 1.009))
    )
    assert not at_chance(val(0, 2.1972 * 0.98)) and not at_chance(val(0, 2.1972 * 1.02))
    assert at_chance({"kind": "val", "loss": 0.0, "chance": 0.0})  # one candidate: a loss of 0 means nothing
    assert not at_chance(val(0, 2.1972, chance=None))  # a run from before the model gave its chance
    note = chance_note(2.1972)
    assert note.startswith("at chance: within 1% of 2.1972, the loss of a uniform guess")
    assert chance_summary([val(0, 2.1972), val(1, 2.19)]) == f"the val loss was {note}, in every epoch (2)"
    train = {"kind": "train", "epoch": 1, "step": 1, "loss": 2.1972, "chance": 2.1972}
    assert (
        chance_summary([val(0, 2.1972), train, val(1, 1.5)]) == f"the val loss was {note}, in 1 of 2 epochs"
    )
    assert chance_summary([val(0, 1.5), val(1, 1.2)]) is None


def _knn(epoch: int, step: int, r1: float) -> dict:
    return {"kind": "knn", "epoch": epoch, "step": step, "r1": r1}


def test_the_monitor_summary_names_the_untrained_the_data_bn_the_best_and_the_last_r1():
    bn = {"kind": KNN_BASELINE, "epoch": 0, "step": 0, "baseline": DATA_BN, "r1": 0.7}
    rising = [_knn(0, 0, 0.5), bn, _knn(0, 10, 0.6), _knn(1, 20, 0.8), _knn(2, 30, 0.7)]
    line, worse = monitor_summary(rising)
    assert line == (
        "kNN monitor R@1: untrained 0.500, untrained with the data's BatchNorm statistics 0.700; trained: "
        "best 0.800 (epoch 1), last 0.700 (epoch 2)"
    )
    assert worse is None
    falling = [
        _knn(0, 0, 0.83),
        _knn(0, 10, 0.9),
        _knn(1, 20, 0.5),
        _knn(2, 30, 0.9),
        _knn(3, 40, 0.6),
        _knn(4, 50, 0.17),
    ]
    line, worse = monitor_summary(falling)
    assert "best 0.900 (epoch 0), last 0.170 (epoch 4)" in line and "BatchNorm" not in line
    assert worse.startswith(
        "the kNN monitor's last R@1 (0.170) is below the untrained encoder's (0.830), and has been since step 40 "
        "(epoch 3): pretraining made the features worse"
    )
    assert monitor_summary([_knn(0, 0, 0.5)]) == (None, None)  # no trained epoch yet
    assert monitor_summary([]) == (None, None)  # no monitor
