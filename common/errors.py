"""The exception types that end a verb with one line instead of a traceback.

Library code raises :class:`UserError` for bad input (a missing file, a malformed line, an option out of
range); ``cli.py`` turns it into a one-line message and exit code 2. :class:`ResourceFault` is a fault of
the run's resources, not of one input: the output's file system full, a quota reached, the output read-only
or forbidden, a file-size limit, a worker process killed (the kernel's out-of-memory killer sends SIGKILL).
The run stops at once, keeping what it finished; ``cli.py`` prints the fault and what was kept in one line and
exits with its own code (``cli.EXIT_RESOURCE``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

from memdpc.common.wording import size_text

__all__ = [
    "RESOURCE_ERRNOS",
    "ResourceFault",
    "UserError",
    "free_bytes",
    "output_faults",
    "resource_fault",
    "worker_death",
]


class UserError(Exception):
    """A problem with the user's input: the message names the file (and line) and the problem."""


class ResourceFault(Exception):
    """The run's resources failed it (see the module docstring): ``what`` happened, in words; ``folder``, the
    output folder whose file system failed (None for a fault that is not the disk's), whose free space the
    message states; ``remedy``, what to do before the same command resumes (e.g. ``free space there``);
    ``notes``, what the run kept and how to go on (:meth:`keep`, as :class:`memdpc.common.interrupts.Interrupted`
    carries them). Picklable: a worker process sends it to the run's process."""

    def __init__(self, what: str, folder: str | None = None, remedy: str = "") -> None:
        super().__init__(what, folder, remedy)
        self.what, self.folder, self.remedy = what, folder, remedy
        self.notes: list[str] = []

    def __str__(self) -> str:
        return self.what

    @property
    def disk(self) -> bool:
        """Whether the fault is the output file system's (full, over quota, read-only, forbidden)."""
        return self.folder is not None

    @property
    def resumes(self) -> str:
        """``free space there, then the same command resumes``: the way on, for a stage's note."""
        return f"{self.remedy}, then the same command resumes" if self.remedy else "the same command resumes"

    def keep(self, note: str) -> ResourceFault:
        """Add what was kept (or how to go on) to the line the command line prints; returns self."""
        self.notes.append(note)
        return self

    def line(self) -> str:
        """The one line a user reads: the fault, the free space of its file system now, what was kept."""
        free = ""
        if self.folder is not None and (left := free_bytes(Path(self.folder))) is not None:
            free = f" ({size_text(left)} free there now)"
        return "; ".join([f"{self.what}{free}", *self.notes])


# errno → what it means for a run's output, in words, and what to do about it
RESOURCE_ERRNOS = {
    errno.ENOSPC: ("no space left on the file system of {folder}", "free space there"),
    errno.EDQUOT: (
        "disk quota exceeded on the file system of {folder}",
        "free space there or raise the quota",
    ),
    errno.EFBIG: ("file-size limit reached in {folder}", "raise the limit (ulimit -f)"),
    errno.EROFS: ("{folder} is on a read-only file system", "make it writable"),
    errno.EACCES: ("no permission to write in {folder}", "make it writable"),
    errno.EPERM: ("no permission to write in {folder}", "make it writable"),
}
# errnos that a write alone raises; the others (permissions, read-only) also come from reading an input, so
# they are the output's only when the error names a path of it
_WRITE_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system ``path`` is (or would be) on; None where that cannot be read."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def resource_fault(e: OSError, path: str | os.PathLike) -> ResourceFault | None:
    """``e``, raised while writing ``path`` (a file or a folder of the output), as a :class:`ResourceFault`;
    None when it is none (another errno, or a permission error that names a path outside the output)."""
    if e.errno not in RESOURCE_ERRNOS:
        return None
    path = Path(path)
    if e.errno not in _WRITE_ONLY and e.filename is not None:
        named = Path(os.fsdecode(e.filename))
        if named != path and named.parent != path.parent and named not in path.parents:
            return None  # an input's permissions, not the output's
    folder = path.parent
    what, remedy = RESOURCE_ERRNOS[e.errno]
    return ResourceFault(f"{what.format(folder=folder)}, writing {path.name}", str(folder), remedy)


@contextlib.contextmanager
def output_faults(path: str | os.PathLike) -> Iterator[None]:
    """Within the block, an OSError that is a fault of the output ``path`` (:func:`resource_fault`) is raised as
    a :class:`ResourceFault`; other errors pass unchanged."""
    try:
        yield
    except OSError as e:
        fault = resource_fault(e, path)
        if fault is None:
            raise
        raise fault from e


def worker_death(exitcode: int | None, note: str = "") -> str:
    """How a worker process ended, in words: ``killed by SIGKILL<note> — out of memory? try fewer --workers`` for
    SIGKILL (what the kernel's out-of-memory killer sends), ``killed by <signal><note>`` for another signal,
    else its exit code."""
    if exitcode is not None and exitcode < 0:
        oom = " — out of memory? try fewer --workers" if -exitcode == signal.SIGKILL else ""
        return f"killed by {signal.Signals(-exitcode).name}{note}{oom}"
    return f"exited with code {exitcode}{note}"
