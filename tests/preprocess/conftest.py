"""Shared helpers of the preprocessing tests: a real ``memdpc preprocess`` process killed, or stopped by a
signal, mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


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
