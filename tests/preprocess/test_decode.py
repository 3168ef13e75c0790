"""Streaming decode on real video files of the codecs users have (xvid, MJPEG, MPEG-4, VP8 webm), the
source file's identity and promised frames, and FFmpeg's messages kept off the terminal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.decode import DecodeError, DecodeSpec, PartialVideo, VideoStream, read_header
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import render_video

N = 20


def frames(h: int = 32, w: int = 48) -> np.ndarray:
    """(N, h, w, 3) frames: a rendered scene cropped to a non-square size."""
    return render_video("MoveRight", max(h, w), N, np.random.default_rng(0))[:, :h, :w]


def write(path: Path, video: np.ndarray, fourcc: str, fps: float = 25.0) -> Path:
    h, w = video.shape[1:3]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
    assert writer.isOpened()
    for f in video:
        writer.write(f)
    writer.release()
    return path


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    v = frames()
    return {
        "xvid": write(d / "a.avi", v, "XVID"),
        "mjpg": write(d / "b.avi", v, "MJPG"),
        "mp4v": write(d / "c.mp4", v, "mp4v"),
        "vp8": write(d / "d.webm", v, "VP80"),
    }


@pytest.mark.parametrize("codec", ["xvid", "mjpg", "mp4v", "vp8"])
def test_decodes_every_frame_at_native_size_and_rate(videos, codec):
    src = VideoStream(videos[codec], DecodeSpec(size=0))
    out = list(src)
    assert len(out) == N and src.num_decoded == N
    assert out[0].shape == (32, 48, 3) and out[0].dtype == np.uint8
    assert src.fps == src.source_fps == pytest.approx(25.0)
    assert np.abs(out[5].astype(int) - frames()[5]).mean() < 12  # lossy codecs, same picture


def test_resize_short_side_keeps_aspect(videos):
    assert {f.shape for f in VideoStream(videos["mjpg"], DecodeSpec(size=16))} == {(16, 24, 3)}
    assert {f.shape for f in VideoStream(videos["mjpg"], DecodeSpec(size=64))} == {(64, 96, 3)}


def test_square_resize(videos):
    assert {f.shape for f in VideoStream(videos["mjpg"], DecodeSpec(size=16, square=20))} == {(20, 20, 3)}


def test_fps_resampling_takes_nearest_source_frames(videos):
    native = list(VideoStream(videos["mjpg"], DecodeSpec(size=0)))
    half = VideoStream(videos["mjpg"], DecodeSpec(size=0, fps=12.5))
    out = list(half)
    assert half.fps == 12.5 and len(out) == N // 2
    assert all(np.array_equal(a, b) for a, b in zip(out, native[::2], strict=True))
    double = list(VideoStream(videos["mjpg"], DecodeSpec(size=0, fps=50)))
    assert len(double) == 2 * N - 1  # the last output time within the video is (2N - 2) / 50
    assert np.array_equal(double[3], native[2])  # t = 3/50 is nearest to source frame 1.5 → 2 (half up)


def test_spec_validation():
    for bad in (DecodeSpec(size=-1), DecodeSpec(square=-5), DecodeSpec(fps=-1), DecodeSpec(fps=float("nan"))):
        with pytest.raises(UserError):
            bad.validate()
    assert DecodeSpec(size=256).out_size(320, 240) == (341, 256)
    assert DecodeSpec(size=256).out_size(240, 320) == (256, 341)


def test_missing_unreadable_and_non_video_files(tmp_path):
    with pytest.raises(DecodeError, match="not found"):
        VideoStream(tmp_path / "nope.avi")
    with pytest.raises(DecodeError, match="not a regular file"):
        VideoStream(tmp_path)
    (tmp_path / "notes.avi").write_text("this is not a video\n" * 50)
    with pytest.raises(DecodeError, match="cannot open"):
        VideoStream(tmp_path / "notes.avi")
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(DecodeError, match="cannot open"):
        VideoStream(tmp_path / "empty.mp4")


def test_truncated_file_yields_what_decodes_then_reports_partial(videos, tmp_path):
    data = videos["mjpg"].read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    src = VideoStream(cut, DecodeSpec(size=0))
    got = []
    with pytest.raises(PartialVideo, match=f"of {N} frames"):
        for f in src:
            got.append(f)
    assert 0 < len(got) < N


@pytest.mark.parametrize("codec", ["xvid", "mjpg", "mp4v", "vp8"])
def test_read_header_checks_the_header_and_with_end_the_frame_near_the_end_it_promises(
    videos, codec, tmp_path
):
    src = read_header(videos[codec], DecodeSpec(size=0), end=True)  # every codec the datasets use: it reads
    assert (src.source_size, src.expected_frames) == ((48, 32), N)
    data = videos["mjpg"].read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    assert read_header(cut).expected_frames == N  # the header alone reads
    with pytest.raises(DecodeError, match=f"frame {N - 1} of the {N} its header promises does not decode"):
        read_header(cut, end=True)
    (tmp_path / "notes.avi").write_text("this is not a video\n")
    with pytest.raises(DecodeError, match="cannot open"):
        read_header(tmp_path / "notes.avi", end=True)


def test_memory_is_streamed(tmp_path):
    """Frames come one at a time: the stream holds no list of frames (a 200-frame video, a generator)."""
    path = tmp_path / "long.avi"
    write_video(path, np.repeat(frames()[:1], 200, axis=0), 25.0, "mjpg")
    src = VideoStream(path, DecodeSpec(size=0))
    it = iter(src)
    next(it)
    assert src.num_decoded == 1
    assert sum(1 for _ in it) == 199


def test_the_file_opened_and_the_frames_its_header_promises(videos):
    stat = videos["mjpg"].stat()
    src = VideoStream(videos["mjpg"], DecodeSpec(size=0))
    assert (src.file_size, src.file_mtime_ns, src.expected_output) == (stat.st_size, stat.st_mtime_ns, N)
    assert VideoStream(videos["mjpg"], DecodeSpec(size=0, fps=12.5)).expected_output == N // 2
    assert src.source_size == (48, 32)
    src.close()


@pytest.mark.parametrize("codec", ["xvid", "mjpg", "mp4v", "vp8"])
def test_seek_starts_reading_at_a_source_frame(videos, codec):
    whole = list(VideoStream(videos[codec], DecodeSpec(size=0)))
    src = VideoStream(videos[codec], DecodeSpec(size=0))
    src.seek(12)
    first = next(iter(src))
    src.close()
    assert np.array_equal(first, whole[12])


def _capture(body: str) -> subprocess.CompletedProcess:
    code = "import os, sys, cv2\nfrom memdpc.preprocess.decode import StderrCapture\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_stderr_capture_keeps_what_c_libraries_print_and_lets_python_through(tmp_path):
    """In a real process whose stderr is fd 2: OpenCV's and FFmpeg's lines are taken, Python's own go on."""
    (tmp_path / "text.avi").write_text("not a video\n" * 100)
    res = _capture(f"""
        with StderrCapture() as stderr:
            os.write(2, b"from C\\n")
            print("from Python", file=sys.stderr, flush=True)
            cv2.VideoCapture("{tmp_path / "text.avi"}", cv2.CAP_FFMPEG)
            print(repr(stderr.take()[:2]))
            print(stderr.take())
        os.write(2, b"after\\n")
    """)
    assert res.stderr == "from Python\nafter\n"
    taken, again = res.stdout.splitlines()
    assert taken.startswith("['from C', \"[ WARN:") and "VIDEOIO(FFMPEG)" in taken and again == "[]"


def test_stderr_capture_shows_what_was_not_taken_when_the_block_fails():
    res = _capture("""
        try:
            with StderrCapture():
                os.write(2, b"why it failed\\n")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
        try:
            with StderrCapture():
                os.write(2, b"noise of an interrupted run\\n")
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
    """)
    assert res.stderr == "why it failed\n"
