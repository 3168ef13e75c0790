"""Streaming video decode: one frame at a time (memory independent of video length), resized, and
optionally resampled to another frame rate.

OpenCV's FFmpeg backend reads the codecs the supported datasets use (UCF101/HMDB51 xvid ``.avi``,
Kinetics h264 ``.mp4``, ``.webm`` VP8/VP9). Problems with a video raise :class:`DecodeError`, whose message
is the reason recorded in the run report; the run itself goes on with the other videos. What FFmpeg and
OpenCV print about a video (warnings on a broken file) is kept for the report by :class:`StderrCapture`
instead of reaching the terminal.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from memdpc.common.digest import file_sha256
from memdpc.common.errors import UserError

__all__ = ["DecodeError", "DecodeSpec", "PartialVideo", "StderrCapture", "VideoStream", "read_header"]

MAX_FPS = 1000.0  # a header claiming more than this is treated as a missing frame rate


class DecodeError(Exception):
    """A video that cannot be decoded (fully); the message is the reason, for the run report."""


class PartialVideo(DecodeError):
    """The video decoded only partway: fewer frames than its header promises."""


@dataclass(frozen=True)
class DecodeSpec:
    """How frames come out of the decoder.

    ``size``: resize so the short side is this many pixels, keeping the aspect ratio (0: keep the size).
    ``square``: resize to ``square`` × ``square`` instead (0: off). ``fps``: resample to this frame rate
    by taking the source frame nearest to each output time (0: the native rate).
    """

    size: int = 256
    square: int = 0
    fps: float = 0.0

    def validate(self) -> None:
        if self.size < 0 or self.square < 0:
            raise UserError(f"--size and --square must be ≥ 0 (0 = off), not {self.size} and {self.square}")
        if not (self.fps == 0 or 0 < self.fps <= MAX_FPS) or math.isnan(self.fps):
            raise UserError(f"--fps must be 0 (native) or in (0, {MAX_FPS:g}], not {self.fps}")

    def out_size(self, width: int, height: int) -> tuple[int, int]:
        """Output (width, height) for a source frame of ``width`` × ``height``."""
        if self.square:
            return self.square, self.square
        if not self.size:
            return width, height
        scale = self.size / min(width, height)
        return max(1, round(width * scale)), max(1, round(height * scale))


def _open(path: Path) -> cv2.VideoCapture:
    if not path.exists():
        raise DecodeError("file not found")
    if not path.is_file():
        raise DecodeError("not a regular file")
    if not os.access(path, os.R_OK):
        raise DecodeError("permission denied")
    cap = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    if not cap.isOpened():
        raise DecodeError("not a readable video (FFmpeg cannot open it)")
    return cap


class VideoStream:
    """Decoded BGR uint8 frames of one video, one at a time.

    Iterating yields (H, W, 3) frames; at the end it raises :class:`DecodeError` when nothing decoded and
    :class:`PartialVideo` when decoding stopped before the frame count in the header (a truncated or
    corrupt file) — after yielding what did decode, so a caller may keep it. ``seconds`` accumulates the
    time spent decoding and resizing, ``num_decoded`` counts source frames. ``file_size`` and
    ``file_mtime_ns`` identify the file as it was opened, ``file_sha256`` its bytes (read when first asked, once
    the video is decoded: from the page cache); ``source_size`` is the header's (width, height).
    """

    def __init__(self, path: str | os.PathLike, spec: DecodeSpec = DecodeSpec()) -> None:
        self.path, self.spec = Path(path), spec
        self.seconds, self.num_decoded = 0.0, 0
        self._cap = _open(self.path)
        stat = self.path.stat()
        self.file_size, self.file_mtime_ns = stat.st_size, stat.st_mtime_ns
        self.source_fps = float(self._cap.get(cv2.CAP_PROP_FPS) or 0.0)
        if not (0 < self.source_fps <= MAX_FPS):  # also rejects NaN
            self._cap.release()
            raise DecodeError(f"frame rate is 0 or missing in the file (header says {self.source_fps:g})")
        self.expected_frames = int(self._cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        self.source_size = (
            int(self._cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
            int(self._cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        )
        self.fps = spec.fps or self.source_fps

    @functools.cached_property
    def file_sha256(self) -> str:
        return file_sha256(self.path)

    def seek(self, index: int) -> None:
        """Start reading at source frame ``index`` instead of the first (for sampling a video, not for a whole
        pass: frame rate resampling and the completeness check count from the start)."""
        self._cap.set(cv2.CAP_PROP_POS_FRAMES, index)

    def decodes(self, index: int) -> bool:
        """Whether source frame ``index`` decodes, reached by one seek (a look into the file, not a pass over it:
        iterate a fresh stream for the frames)."""
        self.seek(index)
        return bool(self._cap.read()[0])

    def close(self) -> None:
        """Release the file (iterating to the end releases it too)."""
        self._cap.release()

    @property
    def expected_output(self) -> int:
        """The frames iteration should yield, by the header's frame count (an estimate: headers of some
        containers are)."""
        return max(0, round(self.expected_frames * self.fps / self.source_fps))

    def _read(self) -> Iterator[np.ndarray]:
        try:
            while True:
                t = time.perf_counter()
                ok, frame = self._cap.read()
                if not ok:
                    return
                self.num_decoded += 1
                frame = self._resize(frame)
                self.seconds += time.perf_counter() - t
                yield frame
        finally:
            self._cap.release()

    def _resize(self, frame: np.ndarray) -> np.ndarray:
        h, w = frame.shape[:2]
        ow, oh = self.spec.out_size(w, h)
        if (ow, oh) == (w, h):
            return frame
        interp = cv2.INTER_AREA if ow * oh < w * h else cv2.INTER_LINEAR
        return cv2.resize(frame, (ow, oh), interpolation=interp)

    def __iter__(self) -> Iterator[np.ndarray]:
        ratio = self.source_fps / self.fps
        j = 0  # next output frame; it takes source frame round(j * ratio)
        for i, frame in enumerate(self._read()):
            while math.floor(j * ratio + 0.5) == i:
                yield frame
                j += 1
        self._check_complete()

    def _check_complete(self) -> None:
        if self.num_decoded == 0:
            raise DecodeError("no frames could be decoded (empty, truncated or corrupt file)")
        # Container frame counts of .webm/.mkv are estimated from the duration: allow one frame of slack.
        if self.num_decoded < self.expected_frames - 1:
            raise PartialVideo(
                f"decoded only {self.num_decoded} of {self.expected_frames} frames (truncated or corrupt file)"
            )


def read_header(
    path: str | os.PathLike, spec: DecodeSpec = DecodeSpec(), *, end: bool = False
) -> VideoStream:
    """``path`` as a run will read it, from its header: a frame rate (:class:`VideoStream`'s check) and a frame
    size; with ``end``, also the frame that a run's completeness check needs last (one before the header's count,
    the slack it allows), reached by one seek, so that a file cut short fails here as it would fail the run. A
    file damaged in its middle passes: nothing else is decoded. The file is released again; :class:`DecodeError`
    (or ``OSError``) says what is wrong."""
    src = VideoStream(path, spec)
    try:
        w, h = src.source_size
        if w <= 0 or h <= 0:
            raise DecodeError("no frame size in the file's header")
        if end:
            last = max(src.expected_frames - 2, 0)
            if not src.decodes(last):
                raise DecodeError(
                    f"frame {last + 1} of the {src.expected_frames} its header promises does not decode "
                    "(truncated or corrupt file)"
                )
    finally:
        src.close()
    return src


class StderrCapture:
    """Keep what C libraries (FFmpeg, OpenCV's logger) write to this process's stderr, for the report.

    Within the block, file descriptor 2 goes to a temporary file, so ``[ WARN:0@…] … VIDEOIO(FFMPEG)`` lines
    and FFmpeg's decoder messages stay off the terminal; Python's ``sys.stderr`` (progress bars, warnings,
    tracebacks) keeps writing where it did. :meth:`take` returns the lines written since the last take.
    Processes started within the block inherit the capture. A block left by an error (not an interrupt)
    passes what was not taken on to the terminal: it may explain the error.
    """

    def __enter__(self) -> StderrCapture:
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._read = 0
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self._python = None
        if _fileno(sys.stderr) == 2:  # Python's stderr was fd 2: keep it on the terminal
            self._python = sys.stderr
            sys.stderr = open(  # noqa: SIM115 (closed in __exit__)
                os.dup(self._saved),
                "w",
                buffering=1,
                encoding=self._python.encoding,
                errors=self._python.errors,
            )
        return self

    def take(self) -> list[str]:
        """The non-empty lines written to fd 2 since the last call."""
        fd = self._file.fileno()
        data = os.pread(fd, os.fstat(fd).st_size - self._read, self._read)
        self._read += len(data)
        return [line for line in data.decode(errors="replace").splitlines() if line.strip()]

    def __exit__(self, exc_type, exc, tb) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        if self._python is not None:
            sys.stderr.close()
            sys.stderr = self._python
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            sys.stderr.write("".join(line + "\n" for line in self.take()))
        self._file.close()


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None
