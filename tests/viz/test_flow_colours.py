"""viz/flow_colours.py: the colour wheel on flows of known direction and speed, float and as stored (the preprocessing's own
mapping, JPEG-encoded as archives hold it), and its legend."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest

from memdpc.preprocess.encode import FLOW_ENCODING, decode_rgb
from memdpc.preprocess.flow.backends import flow_to_codes
from memdpc.viz.flow_colours import (
    FLOW_KEY,
    OUT_OF_RANGE,
    codes_colours,
    codes_to_motion,
    colour_wheel,
    flow_colours,
    legend,
)

# image coordinates: x right, y down
MOTIONS = {"right": (3.0, 0.0), "down": (0.0, 3.0), "left": (-3.0, 0.0), "up": (0.0, -3.0)}
HUES = {
    "right": (0, 5),
    "down": (45, 65),
    "left": (180, 200),
    "up": (250, 275),
}  # degrees: red, yellow, cyan, violet


def hue(rgb) -> float:
    h, _, _ = colorsys.rgb_to_hsv(*(np.asarray(rgb, float) / 255))
    return 360 * h


def field(dx: float, dy: float, size: int = 8) -> np.ndarray:
    return np.tile(np.array([dx, dy], np.float32), (size, size, 1))


@pytest.mark.parametrize("direction", MOTIONS)
def test_each_direction_has_its_hue_at_full_colour(direction):
    colours = flow_colours(field(*MOTIONS[direction]))
    lo, hi = HUES[direction]
    assert lo <= hue(colours.image[0, 0]) <= hi
    assert colours.image.max(axis=-1).min() == 255 and colours.image.min(axis=-1).max() < 60  # saturated
    assert colours.max_flow == pytest.approx(3.0) and not colours.given


@pytest.mark.parametrize("direction", MOTIONS)
def test_stored_codes_decode_to_the_same_hue(direction):
    """Codes as an archive holds them: the preprocessing's mapping, then the default flow JPEG, decoded."""
    codes = decode_rgb(FLOW_ENCODING.encode_rgb(flow_to_codes(field(*MOTIONS[direction], size=16))))
    colours = codes_colours(codes)
    lo, hi = HUES[direction]
    assert all(lo <= hue(c) <= hi for c in colours.image.reshape(-1, 3))
    assert colours.max_flow == pytest.approx(3.0, abs=20 / 255)  # within half a code step


def test_zero_motion_is_white_from_floats_and_from_the_codes_either_side_of_zero():
    assert (flow_colours(field(0, 0)).image == 255).all()
    still = flow_to_codes(field(0, 0))  # code 128, which the mapping's inverse reads as +0.08 px
    almost = flow_to_codes(field(-0.01, -0.01))  # code 127 (-0.08 px), as a flipped clip turns 128 into too
    assert (still[..., :2] == 128).all() and (almost[..., :2] == 127).all()
    for codes in (still, almost):
        assert np.abs(codes_to_motion(codes)).max() == 0
        colours = codes_colours(codes)
        assert (colours.image == 255).all() and colours.max_flow == 0 and "no motion" in colours.note
    moving = still.copy()
    moving[0, 0, 0], moving[0, 1, 0] = (
        129,
        126,
    )  # one code further right, one further left: the inverse's values
    assert codes_to_motion(moving)[0, :2, 0] == pytest.approx([1.5 * 40 / 255, -1.5 * 40 / 255], rel=1e-5)
    assert (codes_colours(moving).image[1:] == 255).all()  # everything else still white


def test_a_given_maximum_sets_the_saturation_as_stated():
    half = flow_colours(field(5, 0), max_flow=10.0)
    assert half.image[0, 0].tolist() == [255, 127, 127]  # half the speed: half way from white to red
    assert half.given and "full colour = 10 px (given)" in half.note
    assert flow_colours(field(5, 0), max_flow=5.0).image[0, 0].tolist() == [255, 0, 0]
    over = flow_colours(field(5, 0), max_flow=2.5)  # faster than the maximum: full colour, darkened
    assert over.image[0, 0].tolist() == [int(255 * OUT_OF_RANGE), 0, 0]
    with pytest.raises(ValueError):
        flow_colours(field(5, 0), max_flow=0)


def test_a_picture_of_its_own_is_scaled_to_its_99th_percentile_not_one_stray_pixel():
    flow = field(1, 0, size=20)
    flow[0, 0] = (40, 0)  # one pixel of 400 (a TV-L1 outlier)
    colours = flow_colours(flow)
    assert colours.max_flow == pytest.approx(1.0)
    assert colours.image[5, 5].tolist() == [255, 0, 0]  # the motion is drawn in full colour …
    assert colours.image[0, 0].tolist() == [int(255 * OUT_OF_RANGE), 0, 0]  # … the outlier darker
    assert "full colour = 1 px (99th percentile" in colours.note and FLOW_KEY in colours.note


def test_one_scale_for_a_whole_clip():
    clip = np.stack([field(1, 0), field(4, 0)])  # a slow frame, a fast one
    colours = flow_colours(clip, max_flow=4.0)
    slow, fast = colours.image[0, 0, 0], colours.image[1, 0, 0]
    assert fast.tolist() == [255, 0, 0] and slow[1] > 150  # the slow frame is paler on the clip's scale


def test_the_wheel_and_its_legend():
    wheel = colour_wheel()
    assert wheel.shape == (55, 3) and wheel[0].tolist() == [255, 0, 0]
    disc = legend(65)
    assert disc[32, 32].tolist() == [255, 255, 255]  # the centre: still
    assert disc[0, 0].tolist() == [255, 255, 255]  # outside the disc
    for direction, (dx, dy) in MOTIONS.items():  # the rim in each direction has that direction's hue
        y, x = 32 + int(np.sign(dy)) * 30, 32 + int(np.sign(dx)) * 30
        lo, hi = HUES[direction]
        assert lo <= hue(disc[y, x]) <= hi, direction
