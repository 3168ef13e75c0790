"""pictures.py: grids, enlargement, captions, clips as the model reads them (flow in colour), and real PNG and GIF
files read back with Pillow."""

from __future__ import annotations

import numpy as np
from PIL import Image

from memdpc.preprocess.flow.backends import flow_to_codes
from memdpc.viz.pictures import (
    GAP,
    caption,
    clip_picture,
    enlarge,
    grid,
    legend_picture,
    visible,
    write_gif,
    write_png,
)


def frames(n: int, h: int = 4, w: int = 6) -> np.ndarray:
    return np.stack([np.full((h, w, 3), 10 * i, np.uint8) for i in range(n)])


def test_grid_lays_frames_out_row_by_row_on_white():
    out = grid(frames(5), columns=2)
    assert out.shape == (3 * 4 + 2 * GAP, 2 * 6 + GAP, 3)
    assert out[0, 0, 0] == 0 and out[0, 6 + GAP, 0] == 10 and out[4 + GAP, 0, 0] == 20  # frames 0, 1, 2
    assert (out[2 * (4 + GAP) :, 6 + GAP :] == 255).all()  # no sixth frame: white
    assert (out[4, :] == 255).all()  # the gap between rows


def test_enlarge_by_whole_factors_only():
    assert enlarge(frames(1)[0], min_width=20).shape == (16, 24, 3)  # × 4
    assert enlarge(frames(1, 10, 600)[0]).shape == (10, 600, 3)  # wide enough already


def test_caption_puts_dark_text_in_a_band_above():
    image = np.zeros((40, 300, 3), np.uint8)
    out = caption(
        image, ["a title", "a second line, long enough to be wrapped to the width of the picture " * 2]
    )
    band = out[: out.shape[0] - 40]
    assert out.shape[1] == 300 and band.shape[0] > 3 * 16  # wrapped onto more lines
    assert (band < 128).any() and band.mean() > 200  # dark text on white
    assert (out[-40:] == 0).all()  # the picture below, untouched
    assert caption(image, []) is image


def test_flow_is_seen_in_colour_rgb_as_it_is():
    rgb = frames(2)
    assert visible(rgb, "rgb") == (rgb, None)
    codes = flow_to_codes(np.tile(np.array([2.0, 0.0], np.float32), (2, 4, 6, 1)))  # rightward: code 140
    seen, note = visible(codes, "flow")
    assert (seen == [255, 0, 0]).all() and "full colour = 1.96 px" in note  # 140 · 40/255 − 20
    seen, note = visible(codes, "flow", max_flow=2 * (140 * 40 / 255 - 20))
    assert seen[0, 0, 0].tolist() == [255, 127, 127] and "(given)" in note


def test_a_flow_clip_is_blocks_by_frames_in_colour_under_its_scale():
    codes = flow_to_codes(np.tile(np.array([0.0, -2.0], np.float32), (6, 8, 8, 1)))  # upward, 2 blocks × 3
    picture = clip_picture(codes, "flow", num_blocks=2, title=["key_00000"])
    factor = -(-480 // (3 * 8 + 2 * GAP))
    body = picture[-(2 * 8 + GAP) * factor :]
    assert body.shape[1] == (3 * 8 + 2 * GAP) * factor
    r, g, b = body[0, 0]
    assert b == 255 and g == 0 and 60 < r < 120  # blue-violet: up
    assert (picture[: picture.shape[0] - body.shape[0]] < 128).any()  # the caption's text


def test_png_and_gif_read_back(tmp_path):
    image = np.random.default_rng(0).integers(0, 255, (10, 12, 3), dtype=np.uint8)
    png = write_png(tmp_path / "a.png", image)
    assert (np.asarray(Image.open(png)) == image).all()
    clip = [np.full((8, 8, 3), (255 * (i % 2), 0, 0), np.uint8) for i in range(6)]
    gif = write_gif(tmp_path / "a.gif", clip, fps=20)
    with Image.open(gif) as im:
        assert im.n_frames == 6 and im.info["duration"] == 50 and im.info["loop"] == 0
        im.seek(1)
        assert np.asarray(im.convert("RGB"))[0, 0].tolist() == [255, 0, 0]
    assert not list(tmp_path.glob(".tmp-*"))


def test_the_legend_names_the_directions():
    picture = legend_picture()
    assert picture.shape[1] >= 320 and (picture == 255).mean() > 0.3
    assert ((picture[..., 0] > 200) & (picture[..., 1] < 60) & (picture[..., 2] < 60)).any()  # red: right
