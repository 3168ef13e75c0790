import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.synthetic import CLASSES, SyntheticConfig, make_synthetic

from ...conftest import decode_video


def test_videos_decode_to_stated_frames_and_size(tiny_dataset):
    videos = sorted(tiny_dataset.glob("UCF-101/*/*.avi"))
    assert len(videos) == 9
    for v in videos:
        assert decode_video(v).shape == (30, 32, 32, 3)


def test_index_reads_synthetic_as_ucf101(tiny_dataset):
    records = build_index(tiny_dataset, "ucf101", 1)
    assert len(records) == 9
    assert {r.label_name for r in records} == set(CLASSES[:3])
    assert sum(r.split == "test" for r in records) == 3  # group 1 of each class
    assert all("." not in r.id for r in records)


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    cfg = SyntheticConfig(videos_per_class=1, frames=8, size=32, num_classes=2, seed=3)
    a, b = make_synthetic(tmp_path / "a", cfg), make_synthetic(tmp_path / "b", cfg)
    c = make_synthetic(tmp_path / "c", SyntheticConfig(**{**cfg.__dict__, "seed": 4}))
    for rel in (p.relative_to(a) for p in a.rglob("*") if p.is_file()):
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    rel = next(p.relative_to(a) for p in a.rglob("*.avi"))
    assert (a / rel).read_bytes() != (c / rel).read_bytes()


def test_appearance_does_not_give_class_but_motion_does():
    """Mean colour is no better than chance across classes, while frame differences show the motion."""
    from memdpc.preprocess.examples.synthetic import render_video

    rng = np.random.default_rng(0)
    right = [render_video("MoveRight", 48, 12, rng) for _ in range(6)]
    left = [render_video("MoveLeft", 48, 12, rng) for _ in range(6)]
    mean_r = np.mean([v.mean() for v in right])
    mean_l = np.mean([v.mean() for v in left])
    spread = np.std([v.mean() for v in right + left])
    assert abs(mean_r - mean_l) < 2 * spread
    # motion: the phase correlation shift of the object region points the right way on average
    flows = []
    for v, sign in [(x, 1) for x in right] + [(x, -1) for x in left]:
        g = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY).astype(np.float32) for f in v]
        tv = cv2.optflow.DualTVL1OpticalFlow_create()
        flow = tv.calc(g[4].astype(np.uint8), g[5].astype(np.uint8), None)
        strong = np.abs(flow[..., 0]) > 0.5
        flows.append(sign * flow[..., 0][strong].mean())
    assert np.mean(flows) > 0.3


@pytest.mark.parametrize("args", [["--classes", "11"], ["--frames", "1"], ["--size", "-4"]])
def test_bad_options_exit_2(tmp_path, args):
    res = CliRunner().invoke(main, ["data", "synthetic", str(tmp_path / "x"), *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "x").exists()


def test_appearance_narrows_to_a_pair_of_opposite_motions():
    """The mean colour of a video finds its pair of classes (scene and object tints) far above chance (1/5)."""
    from memdpc.preprocess.examples.synthetic import CLASSES, render_video

    rng = np.random.default_rng(5)
    colours = np.array([render_video(c, 48, 2, rng).mean((0, 1, 2)) for c in CLASSES for _ in range(6)])
    pairs = np.repeat(np.arange(len(CLASSES)) // 2, 6)
    found = 0
    for k in range(len(colours)):  # leave-one-out nearest pair centroid
        rest = np.arange(len(colours)) != k
        centroids = np.stack([colours[rest & (pairs == p)].mean(0) for p in range(5)])
        found += np.argmin(((centroids - colours[k]) ** 2).sum(1)) == pairs[k]
    assert found / len(colours) > 0.6


def test_each_pair_of_classes_has_its_own_object_shape():
    from memdpc.preprocess.examples.synthetic import PAIR_SHAPES, _shape_mask

    masks = {s: _shape_mask(np.random.default_rng(0), 32, s) > 0.5 for s in PAIR_SHAPES}
    for a in PAIR_SHAPES:
        for b in PAIR_SHAPES:
            if a < b:
                iou = (masks[a] & masks[b]).sum() / (masks[a] | masks[b]).sum()
                assert iou < 0.85, (a, b, iou)
    assert [s for s, m in masks.items() if not m[16, 16]] == ["ring"]  # only the ring is hollow
