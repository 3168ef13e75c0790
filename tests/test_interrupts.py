"""interrupts.py: signals become Interrupted, are remembered through swallowed raises, and wait in deferred
blocks; each case runs in a real child process that signals itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(body: str) -> subprocess.CompletedProcess:
    code = "import os, signal\nfrom memdpc import interrupts\ninterrupts.install()\n" + textwrap.dedent(body)
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
                interrupts.clear()
                os.kill(os.getpid(), signal.SIGTERM)
                print("and still")
        except interrupts.Interrupted as e:
            print("raised at the end", e)
    """)
    assert res.stdout.splitlines() == ["still running True", "and still", "raised at the end SIGTERM"], res.stderr


def test_plain_keyboard_interrupt_counts_as_sigint():
    from memdpc import interrupts

    e = interrupts.as_interrupted(KeyboardInterrupt())
    assert (str(e), e.exit_code) == ("SIGINT", 130)
