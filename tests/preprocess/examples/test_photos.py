from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples import photos
from memdpc.preprocess.examples.photos import (
    PHOTO_CLASSES,
    PHOTO_FILES,
    PhotoConfig,
    load_photos,
    make_photos,
)

from ...conftest import decode_video

SMALL = PhotoConfig(videos_per_class=3, frames=6, size=32)


@pytest.fixture(scope="module")
def small_photos(tmp_path_factory) -> Path:
    return make_photos(tmp_path_factory.mktemp("photos") / "p", SMALL)


def test_every_photograph_reads_as_colour():
    imgs = load_photos()
    assert len(imgs) == len(PHOTO_FILES)
    assert all(img.ndim == 3 and img.shape[2] == 3 and min(img.shape[:2]) >= 256 for img in imgs)


def test_videos_decode_to_stated_frames_and_size(small_photos):
    videos = sorted(small_photos.glob("UCF-101/*/*.avi"))
    assert len(videos) == 3 * len(PHOTO_CLASSES)
    for v in videos:
        frames = decode_video(v)
        assert frames.shape == (6, 32, 32, 3)
        assert frames.std() > 10  # a photograph, not a blank frame


def test_index_reads_photos_as_ucf101(small_photos):
    records = build_index(small_photos, "ucf101", 1)
    assert len(records) == 3 * len(PHOTO_CLASSES)
    assert [r.label_name for r in records if r.split == "test"] == list(PHOTO_CLASSES)  # group 1 of each


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    cfg = PhotoConfig(videos_per_class=1, frames=4, size=32, num_classes=2, seed=3)
    a, b = make_photos(tmp_path / "a", cfg), make_photos(tmp_path / "b", cfg)
    c = make_photos(tmp_path / "c", PhotoConfig(**{**cfg.__dict__, "seed": 4}))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 2 + 7  # two videos, classInd and three train/test pairs
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    rel = next(p.relative_to(a) for p in a.rglob("*.avi"))
    assert (a / rel).read_bytes() != (c / rel).read_bytes()


@pytest.mark.parametrize(
    "cfg, message",
    [
        (PhotoConfig(num_classes=len(PHOTO_CLASSES) + 1), "--classes must be between 1 and"),
        (PhotoConfig(frames=1), "--frames ≥ 2"),
        (PhotoConfig(codec="h264"), "unknown codec 'h264'"),
    ],
)
def test_bad_config_is_a_user_error(tmp_path, cfg, message):
    with pytest.raises(UserError, match=message):
        make_photos(tmp_path / "x", cfg)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args", [["--classes", "7"], ["--frames", "1"], ["--size", "8"]])
def test_bad_options_exit_2_with_one_line(tmp_path, args):
    res = CliRunner().invoke(main, ["data", "photos", str(tmp_path / "x"), *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert len([line for line in res.output.splitlines() if line.startswith("Error:")]) == 1
    assert not (tmp_path / "x").exists()


def test_without_scikit_image_exit_2_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(photos, "find_spec", lambda name: None)
    res = CliRunner().invoke(main, ["data", "photos", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    error = res.output.strip().splitlines()[-1]
    assert "scikit-image is not installed" in error and 'pip install "memdpc[photos]"' in error
    assert not (tmp_path / "x").exists()


def test_cli_writes_the_family_and_says_what_next(tmp_path):
    res = CliRunner().invoke(
        main,
        ["data", "photos", str(tmp_path / "p"), "--videos-per-class", "1", "--frames", "3", "--classes", "2"],
    )
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # rich wraps long lines at the terminal's width
    assert (
        f"wrote 2 classes × 1 videos to {tmp_path / 'p'} next: memdpc index {tmp_path / 'p'} --layout ucf101"
        == said
    )
    assert len(list((tmp_path / "p").glob("UCF-101/*/*.avi"))) == 2


def _colour_histogram(video: np.ndarray) -> np.ndarray:
    return (
        np.concatenate([np.histogram(video[..., c], bins=8, range=(0, 256))[0] for c in range(3)])
        / video[..., 0].size
    )


def _motion_statistics(video: np.ndarray) -> np.ndarray:
    """Farneback flow of every other frame pair, summarised without any appearance: the share of the frame
    that moves, how uniform the flow is (a pan), its radial (zoom) and tangential (roll) parts, and how
    coherent the moving pixels are (one patch, or two passing each other)."""
    grey = [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in video]
    n = video.shape[1]
    y, x = np.mgrid[:n, :n] - (n - 1) / 2
    r = np.hypot(x, y) + 1e-6
    stats = []
    for a, b in zip(grey[:-1:2], grey[1::2], strict=True):
        flow = cv2.calcOpticalFlowFarneback(a, b, None, 0.5, 3, 9, 3, 5, 1.1, 0)
        mag = np.hypot(flow[..., 0], flow[..., 1]) + 1e-6
        moving = mag > 0.5
        radial = (flow[..., 0] * x + flow[..., 1] * y) / r
        tangential = (flow[..., 1] * x - flow[..., 0] * y) / r
        coherent = np.hypot(*flow[moving].mean(0)) / mag[moving].mean() if moving.any() else 0.0
        stats.append(
            [
                moving.mean(),
                np.hypot(*flow.reshape(-1, 2).mean(0)) / mag.mean(),
                abs(radial.mean()) / mag.mean(),
                abs(tangential.mean()) / mag.mean(),
                coherent,
            ]
        )
    return np.mean(stats, 0)


def _nearest_centroid_accuracy(features: np.ndarray, labels: np.ndarray) -> float:
    """Leave-one-out accuracy of a nearest-centroid classifier on standardised features."""
    z = (features - features.mean(0)) / (features.std(0) + 1e-9)
    right = 0
    for k in range(len(labels)):
        rest = np.arange(len(labels)) != k
        centroids = np.stack([z[rest & (labels == c)].mean(0) for c in range(len(PHOTO_CLASSES))])
        right += np.argmin(((centroids - z[k]) ** 2).sum(1)) == labels[k]
    return right / len(labels)


def test_appearance_does_not_tell_the_class_but_motion_does(tmp_path):
    """On 6 videos per class read back from the files, colour histograms classify at about chance (1/6;
    measured 0.11) while five flow statistics classify most videos (measured 0.83)."""
    root = make_photos(tmp_path / "p", PhotoConfig(videos_per_class=6, frames=16, size=48))
    records = build_index(root, "ucf101", 1)
    videos = [decode_video(Path(r.path)) for r in records]
    labels = np.array([r.label for r in records])
    appearance = _nearest_centroid_accuracy(np.array([_colour_histogram(v) for v in videos]), labels)
    motion = _nearest_centroid_accuracy(np.array([_motion_statistics(v) for v in videos]), labels)
    assert appearance <= 1 / 3, appearance
    assert motion >= 2 / 3, motion
