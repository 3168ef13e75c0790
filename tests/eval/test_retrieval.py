"""`memdpc eval retrieve` (eval/retrieval.py) on real shards with a real (one-step) pretrained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.eval.features import load_windows, video_mean
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate
from memdpc.model.retrieval import retrieve

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_retrieval_matches_recomputation_from_cached_features(eval_data, checkpoints, tmp_path):
    path = evaluate(
        "retrieve", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, plot=True, **COMMON
    )
    result, arrays = load_result(path)
    assert result["kind"] == "retrieval" and result["stream"] == "rgb" and result["split"] == "test"
    assert result["counts"] == {"videos": 6, "classes": 3, "smallest_class": 2, "gallery": 6}
    feats = {}
    for split in ("train", "test"):
        with np.load(tmp_path / f"features-rgb-{split}.npz") as z:
            windows = load_windows(tmp_path / f"features-rgb-{split}.npz", str(z["fingerprint"]))
        feats[split] = video_mean(windows)
    metrics, neighbours = retrieve(
        [feats["test"][2]], [feats["train"][2]], feats["test"][1], feats["train"][1]
    )
    # R@k for k below the gallery's 6 videos; R@10 and up cannot mean anything there
    assert result["metrics"] == {k: v if int(k[2:]) < 6 else None for k, v in metrics.items()}
    assert sorted(result["undefined"]) == ["R@10", "R@20", "R@50"] and sorted(result["intervals"]) == [
        "R@1",
        "R@5",
    ]
    np.testing.assert_array_equal(arrays["neighbours"], neighbours)
    np.testing.assert_allclose(np.linalg.norm(arrays["query"], axis=1), 1, atol=1e-5)
    for png in ("retrieval-rgb.png", "memory-norms-rgb.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
