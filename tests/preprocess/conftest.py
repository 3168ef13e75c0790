"""Shared helpers of the preprocessing tests."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest


def _kill_after_first_flow_archive(cmd: list[str], out: Path) -> None:
    """Run ``cmd`` (a ``memdpc preprocess`` command writing to ``out``) and SIGKILL it, with every process
    it started, as soon as its first flow archive appears under a final name."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "flow").glob("[!.]*.tar")) and time.monotonic() < deadline:
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def kill_midway() -> Callable[[list[str], Path], None]:
    return _kill_after_first_flow_archive
