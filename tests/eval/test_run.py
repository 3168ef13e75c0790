"""eval/run.py: what ``evaluate`` and ``fuse`` add around the tasks — the fit settings given over the task's
defaults, the stream check before any work, the fused result's default place."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.errors import UserError
from memdpc.eval.fit import PROBE_FIT
from memdpc.eval.results import load_result, save_result
from memdpc.eval.run import evaluate, fuse

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_fit_settings_override_the_task_defaults(eval_data, checkpoints, tmp_path):
    path = evaluate("probe", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, fit={"epochs": 1, "lr": 0.01},
                    **COMMON)
    config = load_result(path)[0]["config"]
    assert (config["epochs"], config["lr"], config["lr_min"]) == (1, 0.01, pytest.approx(0.001))
    assert (config["batch_size"], config["patience"]) == (PROBE_FIT.batch_size, PROBE_FIT.patience)


def test_checkpoint_of_the_wrong_stream_is_refused(eval_data, checkpoints, tmp_path):
    with pytest.raises(UserError, match="trained on the rgb stream, not flow"):
        evaluate("retrieve", checkpoints["rgb"], stream="flow", shards=eval_data.shards, out=tmp_path, **COMMON)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_fused_result_goes_beside_the_first_by_default(tmp_path):
    arrays = {"video_ids": np.array(["v1", "v2"]), "labels": np.array([0, 1])}
    paths = [save_result(tmp_path / s / "probe-linear.json",
                         {"kind": "probe-linear", "stream": s, "dataset": "syn", "split": "test", "classes": ["a", "b"],
                          "metrics": {}}, {**arrays, "probs": np.eye(2, dtype=np.float32)}) for s in ("rgb", "flow")]
    out = fuse(*paths)
    assert out == tmp_path / "rgb" / "fusion-classify-rgb+flow.json"
    assert load_result(out)[0]["stream"] == "rgb+flow"
