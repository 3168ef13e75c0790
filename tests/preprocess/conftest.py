"""Shared helpers of the preprocessing tests: a real ``memdpc preprocess`` process killed, or stopped by a
signal, mid-run; a real short video with a run's config, and the archives such a run writes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memdpc.preprocess.archive import archive_path, write_archive
from memdpc.preprocess.decode import VideoStream
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import texture
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import archive_meta
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.video_index import VideoRecord

CHEAP = TVL1Params(scales=1, warps=1, outer_iterations=1, inner_iterations=5)  # a TV-L1 fast enough for tests


def _wait_for_first_flow_archive(proc: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 120
    while not list((out / "flow").glob("[!.]*.tar")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.01)


def _kill_after_first_flow_archive(cmd: list[str], out: Path) -> None:
    """Run ``cmd`` (a ``memdpc preprocess`` command writing to ``out``) and SIGKILL it, with every process
    it started, as soon as its first flow archive appears under a final name."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_first_flow_archive(proc, out)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def kill_midway() -> Callable[[list[str], Path], None]:
    return _kill_after_first_flow_archive


@dataclass
class Stopped:
    returncode: int
    seconds: float  # from the signal to the process's exit
    stderr: str


def _signal_after_first_flow_archive(cmd: list[str], out: Path, sig: signal.Signals) -> Stopped:
    """Run ``cmd`` in a session of its own and, once its first flow archive is there, send it ``sig`` as a
    terminal's Ctrl-C does (SIGINT: to the whole process group, workers included) or a scheduler does
    (SIGTERM: to the process only)."""
    env = {**os.environ, "COLUMNS": "200"}  # the last progress line printed whole
    proc = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        _wait_for_first_flow_archive(proc, out)
        t = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        return Stopped(proc.returncode, time.monotonic() - t, err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def stop_midway() -> Callable[[list[str], Path, signal.Signals], Stopped]:
    return _signal_after_first_flow_archive


# ------------------------------------------------------------------------------ a video and its archives
def texture_image(seed: int) -> np.ndarray:
    """A 16×16 textured image (uint8, 3 channels): a frame, or a flow code image."""
    return texture(np.random.default_rng(seed), 16, 16)


@pytest.fixture
def clip(tmp_path) -> tuple[VideoRecord, PreprocessConfig]:
    """A real 3-frame video, its record and a run configuration writing to ``tmp_path/out``."""
    path = tmp_path / "src" / "v_a.avi"
    write_video(path, np.stack([texture_image(k) for k in range(3)]), 25.0, "mjpg")
    cfg = PreprocessConfig(
        out=str(tmp_path / "out"), streams=("rgb", "flow"), flow_backend="opencv", device="cpu", tvl1=CHEAP
    )
    return VideoRecord("v_a", str(path), 0, "A", "train"), cfg


def made_with(rec: VideoRecord, stream: str, cfg: PreprocessConfig) -> None:
    """The archive of ``rec`` a run of ``cfg`` writes: its real ``meta.json`` (frames do not matter here)."""
    src = VideoStream(rec.path, cfg.decode)
    write_archive(
        archive_path(cfg.out, stream, rec.id), [b"jpeg"], archive_meta(rec, stream, cfg, src, (16, 16))
    )
