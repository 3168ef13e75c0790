"""`memdpc eval classify`: a converted reference classifier scored as it is, without training."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.distenv import DistEnv
from memdpc.common.settings import from_flat
from memdpc.eval.data import EvalData
from memdpc.eval.features import run_windows
from memdpc.eval.results import load_result
from memdpc.model import checkpoint as mc
from memdpc.model import create_model

from .conftest import NUM_CLASSES, REFERENCE_WIDTHS

pytestmark = pytest.mark.slow
OPTS = ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu"]


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_converted_classifier_gives_the_logits_of_its_weights_loaded_directly(
    eval_data, released, tmp_path
):
    src, weights = released["classifier"]
    res = _cli("convert", src, tmp_path / "lc.pt", "--stream", "rgb", "--size", "32")
    assert res.exit_code == 0 and f"next: memdpc eval classify {tmp_path / 'lc.pt'}" in res.output, res.output
    res = _cli("eval", "classify", tmp_path / "lc.pt", "--shards", eval_data.shards, "--out", tmp_path, *OPTS)
    assert res.exit_code == 0 and "top1" in res.output, res.output
    result, arrays = load_result(tmp_path / "classify-rgb.json")
    assert result["kind"] == "classify" and result["config"]["size"] == 32 and arrays["probs"].shape == (6, 3)

    clf = create_model("classifier_r18", widths=REFERENCE_WIDTHS, num_classes=NUM_CLASSES)
    clf.load_state_dict(weights)
    data = from_flat(
        EvalData,
        dict(shards=eval_data.shards, stream="rgb", size=32, batch_size=4, backend="torch", num_workers=0),
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    windows = run_windows(clf.eval(), data, "test", env)
    assert arrays["keys"].tolist() == windows.keys
    np.testing.assert_array_equal(arrays["logits"], windows.values)
    assert windows.values.std(axis=0).min() > 0  # logits that differ between windows: the check can fail


def test_a_pretrained_model_or_another_class_count_is_refused(eval_data, released, tmp_path):
    _cli("convert", released["memdpc"][0], tmp_path / "rgb.pt", "--stream", "rgb")
    res = _cli(
        "eval", "classify", tmp_path / "rgb.pt", "--shards", eval_data.shards, "--out", tmp_path, *OPTS
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert (
        f"{tmp_path / 'rgb.pt'}: holds a pretrained memdpc_r18 model, not a finetuned classifier"
        in res.output
    )
    clf = create_model("classifier_r18", widths=REFERENCE_WIDTHS, num_classes=5)
    mc.write_checkpoint(mc.serialize(mc.build_checkpoint(clf, "rgb", "converted")), tmp_path / "five.pt")
    res = _cli(
        "eval", "classify", tmp_path / "five.pt", "--shards", eval_data.shards, "--out", tmp_path, *OPTS
    )
    assert (
        res.exit_code == 2 and "five.pt: a classifier of 5 classes, but the test shards have 3" in res.output
    )
