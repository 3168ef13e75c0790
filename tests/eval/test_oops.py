"""`memdpc eval oops` (eval/oops.py) on real shards with a real (one-step) pretrained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.eval.oops_labels import step_labels
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate
from memdpc.eval.shard_meta import window_info
from memdpc.pipeline.clip import ClipSpec

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


@pytest.mark.parametrize("mode", ["frozen", "finetune"])
def test_oops_step_labels_and_metrics(eval_data, checkpoints, tmp_path, mode):
    path = evaluate(
        "oops",
        checkpoints["rgb"],
        shards=eval_data.shards,
        out=tmp_path,
        index=eval_data.index,
        mode=mode,
        fit={"epochs": 2},
        **COMMON,
    )
    result, arrays = load_result(path)
    assert result["kind"] == f"oops-{mode}" and result["classes"][1] == "transitional"
    info = window_info(eval_data.shards, "rgb", "test")
    times = {r.id: r.extra["t"] for r in eval_data.records}
    spec = ClipSpec(5, 3, 1)
    for key, labels in zip(arrays["keys"], arrays["labels"], strict=True):
        w = info[str(key)]
        assert labels.tolist() == step_labels(w["start"], w["fps"], times[w["video_id"]], spec)[1:].tolist()
    assert result["counts"]["steps"] == 12 * 4 and result["counts"]["videos"] == 6
    assert result["counts"]["windows"] == len(arrays["keys"])
    assert arrays["pred"].shape == arrays["labels"].shape
    pred, labels = (
        arrays["pred"].reshape(-1),
        arrays["labels"].reshape(-1),
    )  # the metrics are those of the arrays
    assert result["metrics"]["accuracy"] == pytest.approx(np.mean(pred == labels))
    assert result["metrics"]["recall_transitional"] == pytest.approx(np.mean(pred[labels == 1] == 1))
