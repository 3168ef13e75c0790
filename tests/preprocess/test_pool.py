"""preprocess/pool.py: worker processes that leave SIGINT to the parent from their start, and the per-video
pool: entries and progress events from real spawned workers, a stop that ends them within seconds, and a worker
killed (twice) that takes nothing but its own video with it."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import replace

import pytest

from memdpc.preprocess.archive import read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.pool import pool_results, spawn_context

from ..limits import STOP_WITHIN

CHEAP = TVL1Params(scales=1, warps=1, outer_iterations=2, inner_iterations=5)


def _report_sigint(queue) -> None:
    queue.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGINT)  # ignored: the process goes on
    queue.put("went on")


def test_spawned_processes_ignore_sigint_from_their_start():
    ctx = spawn_context()
    queue = ctx.SimpleQueue()
    handler = signal.getsignal(signal.SIGINT)
    p = ctx.Process(target=_report_sigint, args=(queue,))
    p.start()
    assert signal.getsignal(signal.SIGINT) is handler  # this process's own handler is back
    assert queue.get() is True and queue.get() == "went on"
    p.join(30)
    assert p.exitcode == 0


@pytest.fixture(scope="module")
def records(tiny_dataset):
    return build_index(tiny_dataset, "ucf101", 1)  # 9 videos of 30 frames, 32×32


def config(out, **kw) -> PreprocessConfig:
    return PreprocessConfig(
        out=str(out),
        streams=("flow",),
        decode=DecodeSpec(size=0),
        tvl1=CHEAP,
        flow_backend="opencv",
        device="cpu",
        workers=2,
        **kw,
    )


def test_entries_and_progress_events_of_every_video(records, tmp_path):
    events, threads = [], set()

    def progress(*event):
        events.append(event)
        threads.add(threading.get_ident())

    entries = list(pool_results(config(tmp_path), records, progress))
    assert sorted(e["id"] for e in entries) == sorted(r.id for r in records)
    assert all(e["status"] == "done" and e["streams"] == {"flow": 29} for e in entries)
    assert threads == {threading.get_ident()}  # handed over from the workers
    assert {v: n for k, v, n in events if k == "start"} == {r.id: 29 for r in records}
    units = {r.id: sum(n for k, v, n in events if k == "units" and v == r.id) for r in records}
    assert units == {r.id: 29 for r in records}


def test_leaving_early_cancels_the_queue_and_ends_the_workers(records, tmp_path):
    """The default TV-L1 takes long per video: closing the generator after the first video must not wait for
    the other eight."""
    results = pool_results(replace(config(tmp_path), tvl1=TVL1Params()), records, lambda *e: None)
    first = next(results)
    t = time.monotonic()
    results.close()
    assert time.monotonic() - t < STOP_WITHIN
    written = set((tmp_path / "flow").glob("[!.]*.tar"))
    time.sleep(1.5)  # a worker still running would add archives meanwhile
    assert set((tmp_path / "flow").glob("[!.]*.tar")) == written and len(written) < len(records)
    assert read_archive(tmp_path / "flow" / f"{first['id']}.tar")[0]["num_frames"] == 29


def test_a_video_whose_worker_dies_twice_fails_with_the_signal_and_the_other_videos_are_kept(
    records, tmp_path
):
    """SIGKILL to the worker writing one video's archive (its temporary name holds the worker's process id), on
    its first try and on its second, alone: that video is reported failed with the signal and a hint; the other
    videos (one of them in the other worker at the first kill) are done once each, as an undisturbed pool does."""
    three, target = records[:3], records[0].id
    cfg = replace(config(tmp_path / "out"), tvl1=TVL1Params())  # the default TV-L1: seconds per video
    killed: list[int] = []

    def progress(kind, video, n):
        held = list((tmp_path / "out" / "flow").glob(f".tmp-*-{target}.tar"))
        if kind == "units" and video == target and held:
            pid = int(held[0].name.split("-")[1])
            if pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    entries = {e["id"]: e for e in pool_results(cfg, three, progress)}
    assert len(killed) == 2 and sorted(entries) == sorted(r.id for r in three)
    assert entries[target] == {
        "id": target,
        "path": records[0].path,
        "status": "failed",
        "reason": "its worker was killed by SIGKILL twice, the second time alone — out of memory? try fewer "
        "--workers",
        "streams": {},
    }
    reference = {
        e["id"]: e for e in pool_results(replace(cfg, out=str(tmp_path / "ref")), three[1:], progress)
    }
    for rec in three[1:]:
        assert entries[rec.id]["status"] == "done" and "retried" not in entries[rec.id]
        assert (tmp_path / "out" / "flow" / f"{rec.id}.tar").read_bytes() == (
            tmp_path / "ref" / "flow" / f"{rec.id}.tar"
        ).read_bytes()
    assert reference.keys() == {r.id for r in three[1:]}
    assert sorted(p.name for p in (tmp_path / "out" / "flow").iterdir()) == sorted(
        f"{r.id}.tar" for r in three[1:]
    )
