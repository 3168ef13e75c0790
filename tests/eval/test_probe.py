"""`memdpc eval probe` (eval/probe.py) on real shards with real (one-step) pretrained checkpoints, and the late
fusion of its two streams."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate, fuse

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_probe_ten_crop_and_fusion_of_two_streams(eval_data, checkpoints, tmp_path):
    # ten crops for RGB, one for flow: fusion needs the same videos, not the same test protocol
    paths = {
        s: evaluate(
            "probe",
            checkpoints[s],
            shards=eval_data.shards,
            out=tmp_path,
            head="mlp",
            crops=k,
            fit={"epochs": 3},
            plot=s == "rgb",
            **COMMON,
        )
        for s, k in (("rgb", 10), ("flow", 1))
    }
    (rgb, a_rgb), (_, a_flow) = load_result(paths["rgb"]), load_result(paths["flow"])
    assert rgb["kind"] == "probe-mlp" and a_rgb["probs"].shape == (6, 3)
    np.testing.assert_allclose(a_rgb["probs"].sum(axis=1), 1, atol=1e-5)
    with np.load(tmp_path / "features-rgb-test-crops10.npz") as z:
        assert z["values"].shape[:2] == (12, 10)  # every test window, ten crops
    out = fuse(paths["rgb"], paths["flow"], out=tmp_path / "fused.json")
    fused, a_fused = load_result(out)
    np.testing.assert_array_equal(a_rgb["video_ids"], a_flow["video_ids"])
    np.testing.assert_allclose(a_fused["probs"], (a_rgb["probs"] + a_flow["probs"]) / 2, atol=1e-6)
    assert fused["stream"] == "rgb+flow" and (tmp_path / "probe-mlp-rgb-confusion.png").is_file()
