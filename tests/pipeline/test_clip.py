"""pipeline/clip.py: the clip geometry and the window rule (which source frames form a sample)."""

from __future__ import annotations

import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec


def test_paper_geometry_is_the_default():
    clip = ClipSpec()
    assert (clip.num_blocks, clip.block_len, clip.stride) == (8, 5, 3)
    assert (clip.num_frames, clip.span) == (40, 120)
    assert clip.to_dict() == {"num_blocks": 8, "block_len": 5, "stride": 3}


def test_block_k_takes_every_stride_th_frame():
    idx = ClipSpec().frame_indices(10)
    assert len(idx) == 40
    assert idx[5:10] == [25, 28, 31, 34, 37]  # block 1: start + 15 + {0, 3, 6, 9, 12}
    assert idx[-1] == 10 + 3 * 39


def test_frames_past_the_end_repeat_the_last_frame():
    clip = ClipSpec(num_blocks=2, block_len=3, stride=2)
    assert clip.frame_indices(0) == [0, 2, 4, 6, 8, 10]
    assert clip.frame_indices(0, num_available=7) == [0, 2, 4, 6, 6, 6]
    assert clip.frame_indices(3, num_available=7) == [3, 5, 6, 6, 6, 6]


@pytest.mark.parametrize(
    "n, starts",
    [
        (1, [0]),
        (119, [0]),
        (120, [0]),
        (178, [0]),
        (179, [0, 59]),
        (240, [0, 59, 118]),
        (300, [0, 59, 118, 177]),
    ],
)
def test_eval_windows_every_half_span_minus_one_while_they_fit(n, starts):
    assert ClipSpec().eval_starts(n) == starts


def test_eval_step_is_at_least_one():
    assert ClipSpec(num_blocks=1, block_len=1, stride=1).eval_starts(4) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "n, step, starts", [(50, 20, [0]), (140, 20, [0, 20]), (199, 20, [0, 20, 40, 60]), (122, 1, [0, 1, 2])]
)
def test_train_windows_every_step_while_they_fit(n, step, starts):
    assert ClipSpec().train_starts(n, step) == starts


def test_train_window_step_below_one_is_a_user_error():
    with pytest.raises(UserError, match="^--window-step must be ≥ 1, not 0$"):
        ClipSpec().train_starts(200, 0)


@pytest.mark.parametrize("field", ["num_blocks", "block_len", "stride"])
def test_non_positive_geometry_is_a_user_error(field):
    with pytest.raises(UserError, match=f"^{field} must be ≥ 1, not 0$"):
        ClipSpec(**{field: 0})
