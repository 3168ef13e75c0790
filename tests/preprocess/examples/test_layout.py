import signal
import subprocess
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.layout import CODECS, ExampleConfig, write_example, write_video

from ...conftest import decode_video, memdpc_command
from ...limits import STOP_WITHIN


@dataclass(frozen=True)
class _Config(ExampleConfig):
    num_classes: int = 2

    classes: ClassVar[tuple[str, ...]] = ("Dark", "Bright", "Unused")


def _flat(cls: str, rng: np.random.Generator) -> np.ndarray:
    """A 3-frame 16² video of one grey level: dark or bright by class, plus a little of the generator."""
    level = (40 if cls == "Dark" else 200) + int(rng.integers(0, 10))
    return np.full((3, 16, 16, 3), level, np.uint8)


@pytest.mark.parametrize("codec", list(CODECS))
def test_write_video_round_trip(tmp_path, codec):
    frames = np.stack([np.full((16, 32, 3), v, np.uint8) for v in (30, 120, 220)])
    path = tmp_path / f"v{CODECS[codec][1]}"
    write_video(path, frames, 25.0, codec)
    got = decode_video(path)
    assert len(got) == 3 and got[0].shape == (16, 32, 3)
    assert np.allclose([f.mean() for f in got], [30, 120, 220], atol=8)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_layout_and_splits_read_as_ucf101(tmp_path):
    root = write_example(tmp_path / "d", _Config(videos_per_class=4, frames=3, size=16), _flat)
    lists = root / "ucfTrainTestlist"
    assert (lists / "classInd.txt").read_text() == "1 Dark\n2 Bright\n"
    assert (lists / "testlist02.txt").read_text().split() == [
        "Dark/v_Dark_g02_c01.avi",
        "Bright/v_Bright_g02_c01.avi",
    ]  # split s tests the groups g with (g - 1) % 3 == s - 1
    for split in (1, 2, 3):
        records = build_index(root, "ucf101", split)
        assert len(records) == 8
        assert {r.label_name for r in records} == {"Dark", "Bright"}
    assert sum(r.split == "test" for r in build_index(root, "ucf101", 1)) == 4  # groups 1 and 4


def test_each_video_has_its_own_seed_and_existing_videos_are_kept(tmp_path):
    calls = []

    def render(cls, rng):
        calls.append(cls)
        return _flat(cls, rng)

    cfg = _Config(videos_per_class=2, seed=5)
    root = write_example(tmp_path / "d", cfg, render)
    video = root / "UCF-101/Bright/v_Bright_g02_c01.avi"
    expected = _flat("Bright", np.random.default_rng([5, 1, 2]))  # class index 1, group 2
    write_video(tmp_path / "expected.avi", expected, cfg.fps, cfg.codec)
    assert video.read_bytes() == (tmp_path / "expected.avi").read_bytes()
    video.unlink()
    write_example(tmp_path / "d", cfg, render)  # resumes: renders only the missing video
    assert calls == ["Dark", "Dark", "Bright", "Bright", "Bright"]


@pytest.mark.parametrize(
    "cfg, message",
    [
        (_Config(num_classes=0), "--classes must be between 1 and 3, not 0"),
        (_Config(num_classes=4), "--classes must be between 1 and 3, not 4"),
        (_Config(videos_per_class=0), "--videos-per-class ≥ 1"),
        (_Config(size=8), "--size ≥ 16"),
        (_Config(fps=0), "--fps > 0"),
        (_Config(codec="h264"), "unknown codec 'h264' \\(choose from xvid, mjpg, mp4v\\)"),
    ],
)
def test_validate_names_the_bad_option(cfg, message):
    with pytest.raises(UserError, match=message):
        cfg.validate()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_keeps_the_videos_written_and_the_same_command_resumes(tmp_path, sig, code):
    out = tmp_path / "syn"
    cmd = memdpc_command(
        "data",
        "synthetic",
        str(out),
        "--classes",
        "2",
        "--videos-per-class",
        "40",
        "--frames",
        "24",
        "--size",
        "32",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(out.rglob("v_*.avi")) and time.monotonic() < deadline:  # a video in place, not a temp file
        time.sleep(0.02)
    proc.send_signal(sig)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == code and time.monotonic() - sent < STOP_WITHIN
    kept = len(list(out.rglob("*.avi")))
    assert 0 < kept < 80 and not list(out.rglob(".tmp-*"))
    assert f"): {kept} of 80 videos written to {out}; the same command resumes" in " ".join(err.split())
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and len(list(out.rglob("*.avi"))) == 80
