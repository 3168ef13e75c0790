"""interrupts.py: signals become Interrupted, are remembered through swallowed raises, and wait in deferred
blocks; each case runs in a real child process that signals itself."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import time

import pytest

from memdpc.common import interrupts

from ..limits import STOP_WITHIN


def _run(body: str) -> subprocess.CompletedProcess:
    code = (
        "import os, signal\nfrom memdpc.common import interrupts\ninterrupts.install()\n"
        + textwrap.dedent(body)
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_signal_raises_interrupted_with_its_exit_code(sig, code):
    res = _run(f"""
        try:
            os.kill(os.getpid(), signal.{sig})
        except interrupts.Interrupted as e:
            print(e, e.exit_code, e.keep("kept a").keep("kept b").notes)
    """)
    assert res.stdout.strip().split(maxsplit=2) == [sig, str(code), "['kept a', 'kept b']"], res.stderr


def test_a_raise_swallowed_by_a_finaliser_is_raised_again_by_check():
    res = _run("""
        class Pipeline:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)  # the raise lands here: Python prints it and goes on
        Pipeline()
        print("went on")
        try:
            interrupts.check()
        except interrupts.Interrupted as e:
            print("check raised", e)
    """)
    assert res.stdout.splitlines() == ["went on", "check raised SIGTERM"]
    assert "Exception ignored" in res.stderr


def test_deferred_only_remembers_until_check_or_the_end_of_the_block():
    res = _run("""
        try:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                print("still running", interrupts.received() == signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)
                print("and still")
        except interrupts.Interrupted as e:
            print("raised at the end", e)
    """)
    assert res.stdout.splitlines() == ["still running True", "and still", "raised at the end SIGTERM"], (
        res.stderr
    )


def test_plain_keyboard_interrupt_counts_as_sigint():
    e = interrupts.as_interrupted(KeyboardInterrupt())
    assert (str(e), e.exit_code) == ("SIGINT", 130)


def _worker(ready) -> None:
    interrupts.leave_signals_to_parent()
    ready.set()
    time.sleep(60)


def test_a_worker_leaves_signals_to_its_parent_and_ends_on_the_parents_sigterm():
    """A scheduler's SIGTERM and a terminal's SIGINT reach the worker too: it stays (its parent stops it);
    the parent's own SIGTERM (Process.terminate) ends it at once, with exit status 0."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    worker = ctx.Process(target=_worker, args=(ready,))
    worker.start()
    assert ready.wait(60)
    for sig in ("INT", "TERM"):  # from another process, as a terminal or a scheduler sends them
        subprocess.run(["kill", f"-{sig}", str(worker.pid)], check=True)
    worker.join(1.0)
    assert worker.is_alive()
    started = time.monotonic()
    worker.terminate()
    worker.join(10)
    assert worker.exitcode == 0 and time.monotonic() - started < STOP_WITHIN
