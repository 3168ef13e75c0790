"""Oops per-time-step labels from the failure time, and oversampling of the transitional class."""

from __future__ import annotations

import numpy as np

from memdpc.eval.oops_labels import block_times, oversample, step_labels
from memdpc.pipeline.clip import ClipSpec


def test_block_times_follow_the_clip_geometry():
    t = block_times(start=30, fps=30.0)
    # block 0: frames 30..42 -> [1.0, 1.5); block 7: frames 135..147 -> [4.5, 5.0): blocks tile the window
    np.testing.assert_allclose(t[0], [1.0, 1.5])
    np.testing.assert_allclose(t[7], [4.5, 5.0])
    np.testing.assert_allclose(t[1:, 0], t[:-1, 1])


def test_labels_from_the_failure_time():
    # fps 15: block k spans [k, k + 1) seconds for start 0; a failure exactly at a border lies in the later block
    assert step_labels(0, 15.0, failure_time=3.0).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert step_labels(0, 15.0, failure_time=3.2).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert step_labels(0, 15.0, failure_time=3.95).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert step_labels(0, 15.0, failure_time=100.0).tolist() == [0] * 8
    assert step_labels(0, 15.0, failure_time=-1.0).tolist() == [2] * 8
    spec = ClipSpec(num_blocks=4, block_len=2, stride=1)  # blocks of 2 frames: [0,2) [2,4) [4,6) [6,8) / fps
    assert step_labels(0, 1.0, 4.0, spec).tolist() == [0, 0, 1, 2]
    assert step_labels(0, 1.0, 3.5, spec).tolist() == [0, 1, 2, 2]
    assert step_labels(0, 1.0, 4.5, spec).tolist() == [0, 0, 1, 2]


def test_oversampling_balances_the_rare_class_and_keeps_every_sample():
    labels = np.array([0] * 20 + [1] * 3 + [2] * 12)
    idx = oversample(labels, seed=0)
    counts = np.bincount(labels[idx])
    assert counts.tolist() == [20, 12, 12]
    assert set(idx.tolist()) == set(range(len(labels)))
    np.testing.assert_array_equal(idx, oversample(labels, seed=0))
    assert not np.array_equal(idx, oversample(labels, seed=1))
    balanced = np.array([0, 1, 2])
    assert sorted(oversample(balanced).tolist()) == [0, 1, 2]
