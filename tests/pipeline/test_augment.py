"""The augmentation spec's draws: crop boxes, eval crops, per-frame colour maps, flow flip, normalisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.augment import (
    AugmentSpec,
    apply_colour,
    colour_maps,
    crop_box,
    denormalise,
    draw_crop,
    eval_boxes,
    flow_flip_map,
    normalise,
    sample_clip,
)


def apply(m: np.ndarray, rgb) -> np.ndarray:
    return m[:, :3] @ np.asarray(rgb, float) + m[:, 3]


@pytest.mark.parametrize("h, w", [(240, 320), (320, 240), (64, 64), (60, 90)])
def test_crop_box_follows_area_and_aspect_ranges_in_frames_of_any_shape(h, w):
    rng, spec = np.random.default_rng(0), AugmentSpec()
    boxes = [crop_box(h, w, draw_crop(rng, spec), spec) for _ in range(500)]
    for y, x, bh, bw in boxes:
        assert 0 <= y and y + bh <= h and 0 <= x and x + bw <= w
        assert 0.5 * 0.95 <= bh * bw / (h * w) <= 1.0
        assert 3 / 4 * 0.95 <= bw / bh <= 4 / 3 * 1.05
    areas = [bh * bw / (h * w) for _, _, bh, bw in boxes]
    assert min(areas) < 0.55 and max(areas) > 0.85  # the whole range is used (a 60 × 90 frame: up to 0.89)


@pytest.mark.parametrize("h, w, box", [(100, 300, (0, 83, 100, 133)), (300, 100, (83, 0, 133, 100))])
def test_crop_box_falls_back_to_a_centre_crop_of_the_allowed_aspect(h, w, box):
    spec = AugmentSpec(crop_area=(1.0, 1.0))
    assert crop_box(h, w, draw_crop(np.random.default_rng(0), spec), spec) == box


def test_one_draw_gives_the_same_relative_box_in_frames_of_any_size():
    """The draw does not depend on the frame size: in a frame twice as large, the box is twice as large and
    sits twice as far (up to rounding), except where a try fits one frame by a rounded pixel and not the
    other, and the next try is taken."""
    spec, rng = AugmentSpec(), np.random.default_rng(3)
    alike = 0
    for _ in range(200):
        draw = draw_crop(rng, spec)
        small, large = np.array(crop_box(120, 90, draw, spec)), np.array(crop_box(240, 180, draw, spec))
        alike += np.abs(large - 2 * small).max() <= 2
    assert alike >= 180


def test_same_seed_same_draw_and_different_seed_different_draw():
    def draw(seed):
        return sample_clip(np.random.default_rng(seed), 40, "rgb", AugmentSpec())

    a, b, c = draw(1), draw(1), draw(2)
    assert np.array_equal(a.crop, b.crop) and a.flip == b.flip and np.array_equal(a.colour, b.colour)
    assert not np.array_equal(a.crop, c.crop)


def test_eval_boxes_centre_five_and_ten():
    spec = AugmentSpec(eval_scale=0.5)
    assert eval_boxes(60, 100, 1, spec) == [((0, 20, 60, 60), False)]
    assert eval_boxes(100, 60, 1, spec) == [((20, 0, 60, 60), False)]  # portrait: the centred square too
    five = eval_boxes(60, 100, 5, spec)
    assert [b for b, _ in five] == [
        (0, 0, 30, 30),
        (0, 70, 30, 30),
        (30, 0, 30, 30),
        (30, 70, 30, 30),
        (15, 35, 30, 30),
    ]
    ten = eval_boxes(60, 100, 10, spec)
    assert [b for b, _ in ten] == [b for b, _ in five] * 2 and [f for _, f in ten] == [False] * 5 + [True] * 5
    with pytest.raises(UserError, match="crops"):
        eval_boxes(60, 100, 3, spec)


def test_colour_maps_differ_per_frame_and_stay_in_their_ranges():
    maps = colour_maps(np.random.default_rng(0), 40, "rgb", False, AugmentSpec(grey_p=0.0))
    assert maps.shape == (40, 3, 4) and maps.dtype == np.float32
    assert len({m.tobytes() for m in maps}) == 40
    grey = np.array([128.0, 128.0, 128.0])
    for m in maps:  # brightness and contrast (about 128) ∈ [0.5, 1.5], either order: grey 128 → 32..224
        assert np.all((apply(m, grey) > 32 - 1e-3) & (apply(m, grey) < 224 + 1e-3))
    assert np.ptp([apply(m, grey)[0] for m in maps]) > 50


@pytest.mark.parametrize(("span", "draws"), [("block", 4), ("clip", 1)])
def test_colour_per_block_or_clip_is_one_draw_for_each_of_its_frames(span, draws):
    maps = colour_maps(np.random.default_rng(0), 40, "rgb", False, AugmentSpec(colour_per=span), num_blocks=4)
    runs = maps.reshape(draws, 40 // draws, 3, 4)
    assert np.array_equal(
        runs, np.repeat(runs[:, :1], 40 // draws, axis=1)
    )  # alike within a block / the clip
    assert len({m.tobytes() for m in maps}) == draws
    per_frame = colour_maps(np.random.default_rng(0), 40, "rgb", False, AugmentSpec(), num_blocks=4)
    assert len({m.tobytes() for m in per_frame}) == 40  # the paper's: every frame its own


def test_colour_per_is_one_of_its_spans():
    with pytest.raises(UserError, match="colour_per must be one of frame, block, clip"):
        AugmentSpec(colour_per="video")


def test_random_grey_copies_one_channel_in_a_quarter_of_the_frames():
    spec = AugmentSpec(brightness=0, contrast=0, saturation=0, hue=0)
    maps = colour_maps(np.random.default_rng(0), 4000, "rgb", False, spec)
    out = np.stack([apply(m, [10, 100, 200]) for m in maps]).round(4)
    grey = np.all(out == out[:, :1], axis=1)
    assert 0.22 < grey.mean() < 0.28
    assert set(np.unique(out[grey][:, 0])) == {10.0, 100.0, 200.0}  # one random channel, not luma
    assert np.allclose(out[~grey], [10, 100, 200])


def test_hue_rotation_keeps_grey_and_luma():
    spec = AugmentSpec(brightness=0, contrast=0, saturation=0, grey_p=0)
    for m in colour_maps(np.random.default_rng(1), 20, "rgb", False, spec):
        assert np.allclose(apply(m, [77, 77, 77]), 77)
        assert math.isclose(apply(m, [200, 30, 90]) @ [0.299, 0.587, 0.114], 87.67, rel_tol=1e-4)


def test_flow_flip_negates_x_only():
    assert np.allclose(apply(flow_flip_map(), [0, 7, 128]), [255, 7, 128])
    spec = AugmentSpec(jitter_flow=False)
    flipped = colour_maps(np.random.default_rng(0), 3, "flow", True, spec)
    assert np.allclose([apply(m, [40, 50, 128]) for m in flipped], [[215, 50, 128]] * 3)
    assert colour_maps(np.random.default_rng(0), 3, "flow", False, spec) is None


def test_flow_motion_shifts_and_scales_each_block_as_one_and_the_third_channel_not_at_all():
    spec = AugmentSpec(jitter_flow=False, flow_shift=10.0, flow_gain=1.5)
    maps = colour_maps(np.random.default_rng(0), 40, "flow", False, spec, num_blocks=4)
    out = np.stack([apply(m, [128, 128, 77]) for m in maps])
    blocks = out.reshape(4, 10, 3)
    assert np.allclose(blocks, blocks[:, :1])  # one draw per block, every frame of it alike
    assert len({tuple(b[0, :2].round(3)) for b in blocks}) == 4
    assert np.all(np.abs(out[:, :2] - 128) <= 10 + 1e-3) and np.allclose(out[:, 2], 77)
    gains = [
        (apply(maps[k * 10], [138, 138, 0]) - apply(maps[k * 10], [128, 128, 0]))[:2] / 10 for k in range(4)
    ]
    assert all(1 / 1.5 - 1e-4 <= g[0] <= 1.5 + 1e-4 and math.isclose(g[0], g[1], rel_tol=1e-5) for g in gains)
    assert len({round(float(g[0]), 4) for g in gains}) == 4


def test_flow_reverse_runs_a_blocks_motion_backwards_and_keeps_the_other_draws():
    reversed_ = AugmentSpec(jitter_flow=False, flow_reverse=1.0)
    maps = colour_maps(np.random.default_rng(0), 40, "flow", False, reversed_, num_blocks=4)
    assert np.allclose([apply(m, [138, 100, 77]) for m in maps], [[118, 156, 77]] * 40)  # about 128, x and y
    half = AugmentSpec(jitter_flow=False, flow_reverse=0.5)
    maps = colour_maps(np.random.default_rng(1), 400, "flow", False, half, num_blocks=100)
    signs = [apply(maps[k * 4], [138, 138, 0])[0] - 128 for k in range(100)]
    assert set(np.round(signs, 4)) == {10.0, -10.0} and 30 < sum(s < 0 for s in signs) < 70
    # the reversal is drawn after the shifts and gains: the same draws, only the gains' signs flipped
    shifted = AugmentSpec(jitter_flow=False, flow_shift=10.0, flow_gain=1.5)
    plain = colour_maps(np.random.default_rng(2), 8, "flow", False, shifted, num_blocks=2)
    flipped = colour_maps(
        np.random.default_rng(2), 8, "flow", False, shifted.with_(flow_reverse=1.0), num_blocks=2
    )
    assert np.allclose(flipped[:, :2, :2], -plain[:, :2, :2])

    def shift(maps: np.ndarray) -> np.ndarray:  # a map's x and y shift: its offset less the gain's about 128
        return maps[:, :2, 3] - 128 * (1 - maps[:, [0, 1], [0, 1]])

    assert np.allclose(shift(flipped), shift(plain)) and np.abs(shift(plain)).max() > 1


def test_flow_motion_off_by_default_leaves_the_draws_as_they_were():
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    plain = colour_maps(rng_a, 8, "flow", False, AugmentSpec(), num_blocks=2)
    again = colour_maps(rng_b, 8, "flow", False, AugmentSpec(flow_shift=0.0, flow_gain=1.0), num_blocks=2)
    assert np.array_equal(plain, again) and rng_a.random() == rng_b.random()
    assert colour_maps(np.random.default_rng(0), 8, "flow", False, AugmentSpec(jitter_flow=False)) is None


def test_off_spec_draws_nothing():
    assert colour_maps(np.random.default_rng(0), 40, "rgb", True, AugmentSpec.off()) is None
    assert not AugmentSpec.off().colour_on("rgb")
    with pytest.raises(UserError, match="crop_area"):
        AugmentSpec(crop_area=(0.0, 1.0))


def test_normalise_layout_and_values():
    frames = torch.zeros(2, 40, 4, 6, 3, dtype=torch.uint8)  # (B, F, H, W, 3)
    frames[:, 7, :, :, 1] = 255  # frame 7 = block 1, position 2, green
    x = normalise(frames, 8, AugmentSpec())
    assert x.shape == (2, 8, 3, 5, 4, 6) and x.dtype == torch.float32
    assert torch.allclose(x[0, 1, 1, 2], torch.full((4, 6), (1 - 0.456) / 0.224))
    assert torch.allclose(x[0, 0, 0, 0], torch.full((4, 6), -0.485 / 0.229))


def test_denormalise_inverts_normalise():
    frames = torch.randint(0, 256, (2, 3, 40, 4, 6, 3), dtype=torch.uint8)  # (B, K, F, H, W, 3)
    assert torch.equal(denormalise(normalise(frames, 8, AugmentSpec()), AugmentSpec()), frames)


def test_apply_colour_is_cv2_transform_on_cpu_and_within_one_level_as_a_matmul():
    import cv2

    rng = np.random.default_rng(0)
    frames = torch.from_numpy(rng.integers(0, 256, (2, 40, 6, 5, 3), dtype=np.uint8))
    maps = np.stack([colour_maps(rng, 40, "rgb", False, AugmentSpec()) for _ in range(2)])
    want = np.stack(
        [
            [cv2.transform(f, m) for f, m in zip(fs, ms, strict=True)]
            for fs, ms in zip(frames.numpy(), maps, strict=True)
        ]
    )
    assert np.array_equal(apply_colour(frames, torch.from_numpy(maps)).numpy(), want)
    if torch.cuda.is_available():
        got = apply_colour(frames.cuda(), torch.from_numpy(maps)).cpu().numpy()
        assert np.abs(got.astype(int) - want).max() <= 1  # OpenCV rounds fixed-point products: ±1
