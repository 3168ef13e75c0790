"""SIGINT and SIGTERM, handled alike by every verb: stop within seconds, say what was kept, exit 128 + signal.

The command line calls :func:`install`; from then on both signals raise :class:`Interrupted` (a
``KeyboardInterrupt``, so no ``except Exception`` swallows it) in the main thread. A verb catches it where it
knows what it has kept, adds that and the way on (:meth:`Interrupted.keep`: "8 of 13 videos done; the same
command resumes") and re-raises; the command line prints the notes and exits 130 (SIGINT) or 143 (SIGTERM).

A raise can land in a finaliser, where Python only prints "Exception ignored in: …" and goes on. The signal is
therefore also remembered, and :func:`check` raises it again at the next safe point, so an interrupt is never
lost. Inside :func:`deferred` the handlers only remember the signal: code that must not stop halfway (an
optimiser step, a checkpoint) calls :func:`check` between units of work instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A verb stopped by SIGINT or SIGTERM; ``notes`` say what was kept and how to go on."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.notes: list[str] = []

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as shells report a process stopped by that signal."""
        return 128 + self.signum

    def keep(self, note: str) -> Interrupted:
        """Add what was kept (or how to go on) to the message the command line prints; returns self."""
        self.notes.append(note)
        return self


_state = {"received": None, "deferred": 0}


def _handler(signum: int, frame) -> None:
    _state["received"] = signum
    if not _state["deferred"]:
        raise Interrupted(signum)


def install() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` (a no-op outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in SIGNALS:
        signal.signal(s, _handler)


def received() -> int | None:
    """The last signal received since :func:`install`, or None."""
    return _state["received"]


def check() -> None:
    """Raise :class:`Interrupted` if a signal has arrived: call it at safe points of long work."""
    if _state["received"] is not None:
        raise Interrupted(_state["received"])


def as_interrupted(e: KeyboardInterrupt) -> Interrupted:
    """``e`` as :class:`Interrupted`: a plain ``KeyboardInterrupt`` (no handler installed) is a SIGINT."""
    return e if isinstance(e, Interrupted) else Interrupted(signal.SIGINT)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within the block the handlers only remember the signal; the block polls :func:`check`. A signal that
    arrived inside is raised when the block ends."""
    _state["deferred"] += 1
    try:
        yield
    finally:
        _state["deferred"] -= 1
    if not _state["deferred"]:
        check()


def leave_signals_to_parent() -> None:
    """For worker processes (a pool's initializer, a DataLoader's ``worker_init_fn``, a spawned process's first
    call): leave SIGINT and SIGTERM to the parent, which stops its workers itself.

    A terminal's Ctrl-C, and a scheduler's SIGTERM (SLURM, torchrun), reach every process of the group; a worker
    that raised or died of them would print a traceback or break its pool, and the parent would fail with that
    instead of stopping where it can. SIGINT is ignored. A SIGTERM from the parent itself
    (``Process.terminate``: the pool's or loader's shutdown) still ends the worker at once; telling the senders
    apart needs ``sigwaitinfo``: SIGTERM is blocked in this thread (a worker's only one so far, so in every thread
    it starts) and a daemon thread waits for it. A worker whose parent dies is ended by its pool or loader (their
    pipes close)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != parent:
            pass
        os._exit(0)

    threading.Thread(target=wait, name="sigterm", daemon=True).start()
