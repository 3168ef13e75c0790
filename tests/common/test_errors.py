"""errors.py: which write errors are the run's (a resource fault) rather than one input's, on a real small file
system; the one line a fault prints (the free space there now, what was kept); a fault crosses processes."""

from __future__ import annotations

import errno
import multiprocessing
import pickle
import signal

import pytest

from memdpc.common.errors import ResourceFault, output_faults, resource_fault, worker_death


def test_a_full_disk_is_a_fault_of_the_output_naming_it_and_its_free_space(small_disk):
    small_disk.resize(64 * 1024)
    out = small_disk.path / "out" / "flow"
    out.mkdir(parents=True)
    target = out / "v1.tar"
    with pytest.raises(ResourceFault) as caught, output_faults(target), open(target, "wb") as f:
        f.write(bytes(200 * 1024))  # more than the disk holds
    fault = caught.value
    assert fault.disk and fault.folder == str(out)
    assert str(fault) == f"no space left on the file system of {out}, writing v1.tar"
    target.unlink()  # space freed: the line says what is free now
    fault.keep("3 of 9 videos done").keep(fault.resumes)
    line = fault.line()
    assert line.startswith(f"no space left on the file system of {out}, writing v1.tar (")
    assert "kB free there now); 3 of 9 videos done; free space there, then the same command resumes" in line
    assert "\n" not in line


def test_a_read_only_output_is_a_fault_too(small_disk):
    (small_disk.path / "runs").mkdir()
    small_disk.remount("ro")
    target = small_disk.path / "runs" / "last.pt"
    with pytest.raises(ResourceFault, match=r"runs is on a read-only file system, writing last\.pt"):
        with output_faults(target):
            target.write_bytes(b"x")


def test_permission_errors_of_an_input_stay_the_inputs():
    """Reading a video the run may not read fails that video, not the run: the error names the input."""
    out = "/data/archives/flow/v1.tar"
    of_input = OSError(errno.EACCES, "Permission denied", "/videos/v1.avi")
    of_output = OSError(errno.EACCES, "Permission denied", "/data/archives/flow/.tmp-12-v1.tar")
    assert resource_fault(of_input, out) is None
    assert resource_fault(of_output, out).remedy == "make it writable"
    assert resource_fault(OSError(errno.EIO, "Input/output error"), out) is None


def _send(queue) -> None:
    queue.put(
        ResourceFault("no space left on the file system of /x", "/x", "free space there").keep("kept 3")
    )


def test_a_fault_crosses_processes_with_its_notes():
    """A worker process sends its fault to the run's process (pickled, as a pool's pipe does)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    p = ctx.Process(target=_send, args=(queue,))
    p.start()
    fault = queue.get()
    p.join(30)
    assert isinstance(fault, ResourceFault) and (fault.what, fault.folder, fault.notes) == (
        "no space left on the file system of /x",
        "/x",
        ["kept 3"],
    )
    assert pickle.loads(pickle.dumps(fault)).resumes == "free space there, then the same command resumes"


def test_how_a_worker_died_in_words():
    assert worker_death(-signal.SIGKILL) == "killed by SIGKILL — out of memory? try fewer --workers"
    assert worker_death(-signal.SIGSEGV, " twice") == "killed by SIGSEGV twice"
    assert worker_death(3) == "exited with code 3"
