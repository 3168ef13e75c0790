"""Window and crop averaging: every window exactly once, softmax averaged over windows then crops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memdpc.common.errors import UserError
from memdpc.eval.multicrop import VideoAccumulator


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_ten_crop_and_window_average_uses_every_window_once():
    rng = np.random.default_rng(0)
    windows = {"a": 3, "b": 1, "c": 2}  # windows per video
    crops, classes = 10, 4
    logits = {f"{v}_{w:05d}": rng.normal(size=(crops, classes)) for v, n in windows.items() for w in range(n)}
    acc = VideoAccumulator()
    keys = list(logits)
    # batches of 2, and the last batch padded by repeating its sample (as DALI's pad_last_batch does)
    keys_padded = keys + [keys[-1]]
    for i in range(0, len(keys_padded), 2):
        ks = keys_padded[i : i + 2]
        acc.add(
            ks, [k.split("_")[0] for k in ks], [7] * len(ks), torch.tensor(np.stack([logits[k] for k in ks]))
        )
    ids, labels, probs, counts = acc.video_probs()
    assert ids == ["a", "b", "c"] and counts.tolist() == [3, 1, 2] and labels.tolist() == [7, 7, 7]
    for vid, p in zip(ids, probs, strict=True):
        per_window = np.stack([_softmax(logits[k]) for k in keys if k.startswith(vid)])  # (W, K, C)
        np.testing.assert_allclose(p, per_window.mean(axis=0).mean(axis=0), atol=1e-6)
        np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)


def test_one_crop_logits_and_a_window_added_again_counts_once():
    acc = VideoAccumulator()
    acc.add(["v_00000"], ["v"], [0], torch.tensor([[0.0, 0.0]]))
    acc.add(["v_00059", "v_00000"], ["v", "v"], [0, 0], torch.tensor([[np.log(3.0), 0.0], [5.0, 0.0]]))
    _, _, probs, counts = acc.video_probs()
    assert counts.tolist() == [2]
    np.testing.assert_allclose(probs[0], [(0.5 + 0.75) / 2, (0.5 + 0.25) / 2], atol=1e-6)


def test_an_empty_split_is_refused():
    with pytest.raises(UserError, match="empty"):
        VideoAccumulator().video_probs()
