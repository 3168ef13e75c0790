"""The batched flow stage with real videos, real OpenCV, real archives and the real torch TV-L1 on the CPU:
cross-video batches equal the per-video path byte for byte, bad videos, resume, splitting on out-of-memory,
several device processes, progress events, and SIGINT/SIGTERM stopping a real run within seconds."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from memdpc.common.errors import ResourceFault, UserError
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import texture
from memdpc.preprocess.flow.backends import TorchTVL1, TritonTVL1, resolve_backend
from memdpc.preprocess.flow.batched import HOST_NICENESS, DeviceStage, run_batched
from memdpc.preprocess.flow.tvl1_params import TESTED_OPENCV, TVL1Params
from memdpc.preprocess.job import process_video
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.report import read_report
from memdpc.preprocess.run import run_preprocess
from memdpc.preprocess.video_index import VideoRecord, write_index

from ...limits import STOP_WITHIN

MEMDPC = str(Path(sys.executable).parent / "memdpc")
CHEAP = TVL1Params(scales=2, warps=1, outer_iterations=2, inner_iterations=5)
CHEAP_FLAGS = ["--scales", "2", "--warps", "1", "--outer-iterations", "2", "--inner-iterations", "5"]


def wide_video(path: Path, n: int, seed: int, width: int = 48) -> Path:
    """A texture ``width`` wide and 32 high drifting right (48×32: a second frame size next to the tiny
    dataset's 32×32)."""
    tex = texture(np.random.default_rng(seed), 32, width)
    write_video(path, np.stack([np.roll(tex, 2 * k, axis=1) for k in range(n)]), 25.0, "mjpg")
    return path


@pytest.fixture(scope="module")
def records(tiny_dataset, tmp_path_factory) -> list[VideoRecord]:
    """Three 32×32 videos of 30 frames and two 48×32 ones of 12 and 7 frames, interleaved."""
    tiny = build_index(tiny_dataset, "ucf101", 1)[:3]
    folder = tmp_path_factory.mktemp("wide")
    wide = [
        VideoRecord(f"wide{i}", str(wide_video(folder / f"wide{i}.avi", n, i)), 0, "Wide", "train")
        for i, n in enumerate((12, 7))
    ]
    return [tiny[0], wide[0], tiny[1], wide[1], tiny[2]]


def config(out: Path, **kw) -> PreprocessConfig:
    fields = dict(
        streams=("rgb", "flow"), decode=DecodeSpec(size=0), tvl1=CHEAP, flow_backend="torch", device="cpu"
    )
    return PreprocessConfig(out=str(out), **{**fields, **kw})


@pytest.fixture(scope="module")
def reference(records, tmp_path_factory) -> Path:
    """The archives of the per-video path (one FlowStage per video, torch backend on the CPU)."""
    out = tmp_path_factory.mktemp("reference")
    for rec in records:
        assert process_video(rec, config(out))["status"] == "done"
    return out


def tars(out: Path) -> dict[str, bytes]:
    """Every file under ``out/rgb`` and ``out/flow`` (temporary ones included) by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for s in ("rgb", "flow") for p in (out / s).glob("*.tar")}


class RecordingTVL1(TorchTVL1):
    """The real torch backend, noting the shape of every batch it is given; ``batch_size`` pairs of 32×32
    frames per batch (a budget of pixels: fewer pairs of larger frames)."""

    def __init__(self, batch_size: int, params: TVL1Params = CHEAP) -> None:
        super().__init__(params, "cpu")
        self.batch_pixels, self.calls = batch_size * 32 * 32, []
        self.entered = threading.Event()

    def device_codes(self, prev: torch.Tensor, nxt: torch.Tensor, third: int, checkpoint=lambda: None):
        self.calls.append(tuple(prev.shape))
        self.entered.set()
        return super().device_codes(prev, nxt, third, checkpoint)


class SmallCard(RecordingTVL1):
    """The real torch backend refusing batches of more than ``fits`` pairs, as a card with too little
    memory does (the error a CPU run can raise, or the message of ``torch.cuda.OutOfMemoryError``)."""

    def __init__(self, batch_size: int, fits: int, error: type[Exception]) -> None:
        super().__init__(batch_size)
        self.fits, self.error, self.refused = fits, error, []

    def device_codes(self, prev: torch.Tensor, nxt: torch.Tensor, third: int, checkpoint=lambda: None):
        if len(prev) > self.fits:
            self.refused.append(tuple(prev.shape))
            raise self.error("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().device_codes(prev, nxt, third, checkpoint)


def run_stage(
    backend, records: list[VideoRecord], cfg: PreprocessConfig, threads: int = 2
) -> dict[str, dict]:
    entries: list[dict] = []
    DeviceStage(backend, cfg, threads).run(records, entries.append)
    return {e["id"]: e for e in entries}


@pytest.mark.parametrize("batch_size", [4, 64])
def test_cross_video_batches_equal_the_per_video_path(records, reference, tmp_path, batch_size):
    backend = RecordingTVL1(batch_size)
    entries = run_stage(backend, records, config(tmp_path))
    assert {k: e["status"] for k, e in entries.items()} == {r.id: "done" for r in records}
    assert tars(tmp_path) == tars(reference)  # byte for byte, RGB and flow, meta.json included
    sizes = {shape[1:] for shape in backend.calls}
    assert sizes == {(32, 32), (32, 48)}  # bucketed by frame size
    assert sum(shape[0] for shape in backend.calls) == 3 * 29 + 11 + 6
    if batch_size == 64:  # a full batch and a partial one per frame size: pairs of several videos each
        assert sorted(backend.calls) == [(17, 32, 48), (23, 32, 32), (64, 32, 32)]
    else:  # 4 pairs of 32×32 frames hold the pixels of 2 pairs of 32×48 ones (4096 // 1536)
        assert max(shape[0] for shape in backend.calls if shape[1:] == (32, 32)) == 4
        assert max(shape[0] for shape in backend.calls if shape[1:] == (32, 48)) == 2
    entry = entries[records[0].id]
    assert entry["streams"] == {"rgb": 30, "flow": 29} and entry["num_frames"] == 30
    assert set(entry["stages"]) == {"decode", "flow", "encode"} and entry["flow_code_error"]["max_abs"] >= 0


def counting_loads(stage: DeviceStage) -> list[int]:
    """Count the batches ``stage`` loads onto its device (its real :class:`Transfers`, observed)."""
    loads, load = [0], stage.transfers.load

    def counted(pairs):
        batch = load(pairs)
        loads[0] += 1
        return batch

    stage.transfers.load = counted
    return loads


class Slow(RecordingTVL1):
    """The real torch backend, which also notes how many batches were loaded when each call ends; the
    first call lasts at least half a second (the next batch has long been decoded by then)."""

    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size)
        self.loads, self.loaded_by_the_end = [0], []

    def device_codes(self, prev, nxt, third, checkpoint=lambda: None):
        codes = super().device_codes(prev, nxt, third, checkpoint)
        if len(self.calls) == 1:
            time.sleep(0.5)
        self.loaded_by_the_end.append(self.loads[0])
        return codes


@pytest.mark.parametrize("pipelined", [True, False], ids=["double-buffered", "sequential"])
def test_the_double_buffered_stage_loads_the_next_batch_while_computing_and_writes_the_same_archives(
    records, reference, tmp_path, pipelined
):
    backend = Slow(16)
    stage = DeviceStage(backend, config(tmp_path), threads=2, pipelined=pipelined)
    backend.loads = counting_loads(stage)
    entries: list[dict] = []
    stage.run(records, entries.append)
    assert all(e["status"] == "done" for e in entries) and len(entries) == len(records)
    assert tars(tmp_path) == tars(reference)  # byte for byte, either way
    assert len(backend.calls) == backend.loads[0] > 2
    if pipelined:  # the second batch was on the device before the first was done
        assert backend.loaded_by_the_end[0] >= 2
    else:  # one batch at a time
        assert backend.loaded_by_the_end == list(range(1, len(backend.calls) + 1))
    assert stage.stats["batches"] == len(backend.calls) and stage.stats["pairs"] == sum(PAIRS)
    assert stage.stats["device_busy_seconds"] >= 0.5


def test_waiting_frame_sizes_are_bounded(records, reference, tmp_path):
    """One decode thread: at most one frame size waits without a video of its own being decoded; the
    older one goes to the device as a partial batch instead of waiting for the end of the run."""
    backend = RecordingTVL1(64)
    entries = run_stage(backend, records, config(tmp_path), threads=1)
    assert all(e["status"] == "done" for e in entries.values())
    assert tars(tmp_path) == tars(reference)
    assert backend.calls == [(29, 32, 32), (11, 32, 48), (29, 32, 32), (6, 32, 48), (29, 32, 32)]


def test_run_preprocess_takes_the_batched_path_for_torch(records, reference, tmp_path):
    report = run_preprocess(records, config(tmp_path), progress=False)
    stage, opencv = report.flow.pop("stage"), report.flow.pop("opencv")
    assert report.flow == {"backend": "torch", "devices": ["cpu"], "note": None}
    assert opencv == {"version": cv2.__version__, "tested": list(TESTED_OPENCV), "note": None}
    assert set(stage) == {"cpu"} and stage["cpu"]["pairs"] == sum(PAIRS) and stage["cpu"]["batches"] >= 2
    assert 0 < stage["cpu"]["device_busy_seconds"] < report.summary.seconds
    assert report.summary.done == len(records) and not report.failures
    assert tars(tmp_path) == tars(reference)
    assert all(set(v) >= {"stages", "seconds", "cpu_seconds", "fps", "streams"} for v in report.videos)


@pytest.fixture(scope="module")
def cut(records, tmp_path_factory) -> VideoRecord:
    """The first half of the bytes of a 30-frame video: it decodes partway, then stops."""
    path = tmp_path_factory.mktemp("cut") / "cut.avi"
    data = Path(records[0].path).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return VideoRecord("cut", str(path), 0, "X", "train")


@pytest.mark.parametrize("keep_partial", [False, True])
def test_a_video_failing_halfway_loses_no_pair_of_its_batch_mates(
    records, reference, cut, tmp_path, keep_partial
):
    """One decode thread: the cut video's pairs share batches of 8 with the tails and heads of the
    videos before and after it (29 pairs per video)."""
    ref = tmp_path / "ref"
    expected = process_video(cut, config(ref, keep_partial=keep_partial))
    assert expected["status"] == ("partial" if keep_partial else "failed")
    assert 0 < expected["num_frames"] < 30 if keep_partial else "decoded only" in expected["reason"]
    good = [records[0], records[2]]
    backend = RecordingTVL1(8)
    out = tmp_path / "out"
    entries = run_stage(backend, [good[0], cut, good[1]], config(out, keep_partial=keep_partial), threads=1)
    got = tars(out)
    for rec in good:
        assert entries[rec.id]["status"] == "done"
        for s in ("rgb", "flow"):
            name = str(archive_path("", s, rec.id))
            assert got.pop(name) == tars(reference)[name]
    pairs = sum(shape[0] for shape in backend.calls)
    assert pairs > 2 * 29 and all(shape[0] == 8 for shape in backend.calls[:-1])  # mixed batches
    if keep_partial:
        assert entries["cut"]["status"] == "partial" and entries["cut"]["reason"] == expected["reason"]
        assert got == tars(ref)  # what decoded, as the per-video path keeps it
    else:
        assert entries["cut"]["status"] == "failed" and entries["cut"]["reason"] == expected["reason"]
        assert entries["cut"]["streams"] == {} and got == {}  # nothing under a final or temporary name


class Gated(RecordingTVL1):
    """The real torch backend, holding its first batch on the device until ``gate`` opens and the next
    batch is loaded onto the device (or 30 s)."""

    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size)
        self.gate, self.loads, self.held = threading.Event(), [0], False

    def device_codes(self, prev, nxt, third, checkpoint=lambda: None):
        if not self.calls:
            deadline = time.monotonic() + 30
            while not (self.gate.is_set() and self.loads[0] >= 2) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.held = self.gate.is_set() and self.loads[0] >= 2
        return super().device_codes(prev, nxt, third, checkpoint)


def test_a_video_failing_while_its_pairs_are_in_flight_loses_no_other_videos_pair(
    records, reference, cut, tmp_path
):
    """One decode thread, batches of 15: the second batch, the last 14 pairs of the first video and the
    first pair of the cut one (which has 2), is handed on as the cut video's pair fills it, before its
    decoding fails. The device holds the first batch until the video after the cut one opens, i.e. the cut
    one has failed, and the second batch is on the device. Both good videos' archives are those of the
    per-video path, and nothing of the cut one is left."""
    good = [records[0], records[2]]
    backend = Gated(15)

    def progress(kind, video_id, n):
        if kind == "start" and video_id == good[1].id:
            backend.gate.set()

    stage = DeviceStage(backend, config(tmp_path), threads=1, progress=progress)
    backend.loads = counting_loads(stage)
    entries: list[dict] = []
    stage.run([good[0], cut, good[1]], entries.append)
    assert backend.held and backend.calls[:2] == [(15, 32, 32)] * 2
    status = {e["id"]: e["status"] for e in entries}
    assert status == {good[0].id: "done", "cut": "failed", good[1].id: "done"}
    assert tars(tmp_path) == {k: v for k, v in tars(reference).items() if any(r.id in k for r in good)}


@pytest.mark.skipif(sys.platform != "linux", reason="threads have a CPU priority of their own on Linux")
def test_the_host_threads_yield_the_cpu_to_the_device_thread(records, tmp_path):
    """Decoding, loading and encoding run at a lower CPU priority than the device thread, whose launches
    keep a GPU busy."""
    nice = {}

    def mine() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    class Noting(RecordingTVL1):
        def device_codes(self, prev, nxt, third, checkpoint=lambda: None):
            nice["device"] = mine()
            return super().device_codes(prev, nxt, third, checkpoint)

    def progress(kind, video_id, n):
        nice["decode" if kind == "start" else "encode"] = mine()

    stage = DeviceStage(Noting(16), config(tmp_path), threads=1, progress=progress)
    stage.run(records[:2], lambda entry: None)
    assert nice["device"] == os.getpriority(os.PRIO_PROCESS, 0)  # as this process
    assert nice["decode"] == nice["encode"] == min(19, nice["device"] + HOST_NICENESS)


def test_unreadable_and_one_frame_videos_are_reported(records, tmp_path):
    (tmp_path / "text.avi").write_text("not a video\n" * 100)
    one = wide_video(tmp_path / "one.avi", 1, 0)
    bad = [
        VideoRecord("text", str(tmp_path / "text.avi"), 0, "X", "train"),
        VideoRecord("one", str(one), 0, "X", "train"),
        VideoRecord("gone", str(tmp_path / "gone.avi"), 0, "X", "train"),
    ]
    entries = run_stage(RecordingTVL1(8), [*bad, records[1]], config(tmp_path / "out"))
    assert {k: e["status"] for k, e in entries.items()} == {
        "text": "failed",
        "one": "failed",
        "gone": "failed",
        "wide0": "done",
    }
    assert "cannot open" in entries["text"]["reason"] and "not found" in entries["gone"]["reason"]
    assert "only one frame" in entries["one"]["reason"]
    assert sorted(tars(tmp_path / "out")) == ["flow/wide0.tar", "rgb/wide0.tar"]


def test_resume_skips_finished_videos_and_clears_stale_temporaries(records, reference, tmp_path):
    out = tmp_path / "out"
    for s in ("rgb", "flow"):
        (out / s).mkdir(parents=True)
    for rec in records[:2]:  # finished by an earlier run
        for s in ("rgb", "flow"):
            archive_path(out, s, rec.id).write_bytes(archive_path(reference, s, rec.id).read_bytes())
    archive_path(out, "rgb", records[2].id).write_bytes(
        archive_path(reference, "rgb", records[2].id).read_bytes()
    )
    stale = out / "flow" / f".tmp-999999-{records[2].id}.tar"  # left by a killed run
    stale.write_bytes(b"half an archive")
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/[!.]*.tar")}
    report = run_preprocess(records, config(out), progress=False)
    status = {v["id"]: v["status"] for v in report.videos}
    assert status == {r.id: "skipped" if r in records[:2] else "done" for r in records}
    assert next(v for v in report.videos if v["id"] == records[2].id)["streams"] == {"flow": 29}
    assert not stale.exists() and tars(out) == tars(reference)
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished archives untouched


def test_kill_and_resume(records, reference, tmp_path, kill_midway):
    """SIGKILL a batched run mid-way: no archive under a final name is incomplete; a re-run completes the
    rest. Four copies of each video (under other ids) make the run long enough to be caught."""
    copies = [replace(r, id=f"{r.id}-{k}") for k in range(4) for r in records]
    write_index(copies, tmp_path / "index.jsonl")
    out = tmp_path / "out"
    cmd = [MEMDPC, "preprocess", "flow", str(tmp_path / "index.jsonl"), "--out", str(out), "--size", "0"]
    cmd += [
        "--streams",
        "rgb,flow",
        "--flow-backend",
        "torch",
        "--device",
        "cpu",
        "--threads",
        "1",
        *CHEAP_FLAGS,
    ]
    kill_midway(cmd, out)
    done = {p.stem for p in (out / "flow").glob("[!.]*.tar")}
    assert done and len(done) < len(copies), "the kill should land mid-run"
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/[!.]*.tar")}
    subprocess.run(cmd, check=True, capture_output=True)
    assert not list(out.rglob(".tmp-*"))
    for copy in copies:
        for s in ("rgb", "flow"):
            meta, frames = read_archive(archive_path(out, s, copy.id))
            ref_meta, ref_frames = read_archive(archive_path(reference, s, copy.id.rsplit("-", 1)[0]))
            assert frames == ref_frames and {**meta, "video_id": ref_meta["video_id"]} == ref_meta
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # finished archives were not redone


@pytest.mark.parametrize("error", [RuntimeError, MemoryError])
def test_a_batch_too_large_for_the_device_is_split_and_retried(records, reference, tmp_path, error):
    card = SmallCard(8, fits=3, error=error)
    entries = run_stage(card, records, config(tmp_path))
    assert all(e["status"] == "done" for e in entries.values()) and len(entries) == len(records)
    assert tars(tmp_path) == tars(reference)  # no pair lost or changed
    # 8 → 4 → 2 at 32×32 and 5 → 2 at 32×48 (the same pixels), once per frame size, then kept
    assert sorted(shape[0] for shape in card.refused) == [4, 5, 8]
    assert {shape[1:] for shape in card.refused} == {(32, 32), (32, 48)}
    assert max(shape[0] for shape in card.calls) == 2
    assert sum(shape[0] for shape in card.calls) == 3 * 29 + 11 + 6


def test_a_pair_too_large_even_alone_is_a_user_error(records, tmp_path):
    with pytest.raises(UserError, match="--size: one 32×32 frame pair does not fit"):
        run_stage(SmallCard(8, fits=0, error=RuntimeError), records[:1], config(tmp_path))
    assert tars(tmp_path) == {}  # the video in flight left no temporary archive


def test_one_process_per_device_and_the_entries_merged(records, reference, tmp_path):
    """Two device processes (both on the CPU here): the videos are divided between them; their progress
    events reach this thread."""
    cfg = config(tmp_path, threads=1)
    events, threads = [], set()
    entries = list(run_batched(cfg, records, ["cpu", "cpu"], _collect(events, threads)))
    assert sorted(e["id"] for e in entries) == sorted(r.id for r in records)
    assert all(e["status"] == "done" for e in entries)
    assert tars(tmp_path) == tars(reference)
    assert threads == {threading.get_ident()} and sum(n for k, _, n in events if k == "units") == sum(PAIRS)


def test_a_full_disk_stops_the_batched_run_with_whole_archives_and_the_rerun_completes_them(
    records, reference, small_disk
):
    """The archives on a real file system with 40 % of their space: the fault of the output stops the batched
    stage and the run, the videos in flight removed; what is there is whole, and once space is freed the same
    run writes the rest as the per-video path writes them."""
    need = sum(map(len, tars(reference).values()))
    small_disk.resize(int(0.4 * need))
    cfg = config(small_disk.path / "out", threads=1)
    with pytest.raises(ResourceFault, match=r"no space left on the file system of .*/(rgb|flow), writing "):
        run_preprocess(records, cfg, progress=False)
    kept = tars(small_disk.path / "out")
    assert all(data == tars(reference)[name] for name, data in kept.items())  # no temporary archive either
    small_disk.resize(2 * need + (1 << 20))
    assert run_preprocess(records, cfg, progress=False).summary.done == len(records) - len(kept) // 2
    assert tars(small_disk.path / "out") == tars(reference)


def test_a_device_process_sends_its_fault_of_the_output_to_the_run(records, reference, small_disk):
    """Two device processes (both on the CPU here): the one that meets the full disk sends the fault itself, not
    a text of it, so the run stops as for a full disk in its own process."""
    small_disk.resize(int(0.4 * sum(map(len, tars(reference).values()))))
    with pytest.raises(
        ResourceFault, match=r"no space left on the file system of .*/(rgb|flow), writing "
    ) as e:
        list(run_batched(config(small_disk.path / "out", threads=1), records, ["cpu", "cpu"]))
    assert e.value.disk and e.value.remedy == "free space there"


def test_an_unexpected_error_stops_the_run_cleanly(records, tmp_path):
    class Broken(RecordingTVL1):
        def device_codes(self, prev, nxt, third, checkpoint=lambda: None):
            raise ValueError("kernel bug")

    with pytest.raises(ValueError, match="kernel bug"):
        run_stage(Broken(8), records, config(tmp_path))
    assert tars(tmp_path) == {}  # the videos in flight left no temporary archive


@pytest.mark.gpu
def test_on_the_gpu_cross_video_batches_equal_the_per_video_path(records, tmp_path):
    """The auto choice on a CUDA machine, and the batched path against one video at a time on the GPU."""
    cfg = config(tmp_path / "batched", flow_backend="auto", device="cuda:0")
    report = run_preprocess(records, cfg, progress=False)
    assert report.flow["backend"] in ("triton", "torch") and report.flow["devices"] == ["cuda:0"]
    assert report.summary.done == len(records)
    if report.flow["backend"] == "torch":
        assert "Triton" in report.flow["note"]
        ref = config(tmp_path / "ref", device="cuda:0")
        assert all(process_video(rec, ref)["status"] == "done" for rec in records)
        assert tars(tmp_path / "batched") == tars(tmp_path / "ref")


@pytest.mark.gpu
def test_on_the_gpu_the_double_buffered_stage_writes_the_sequential_stages_archives(records, tmp_path):
    """Pinned memory, copies on their own streams and two batches in flight (batches of 8 pairs): the same
    bytes as one batch at a time, and the device's busy time measured by its events."""
    name = resolve_backend("auto", "cuda:0")[0]
    backend = (TritonTVL1 if name == "triton" else TorchTVL1)(CHEAP, "cuda:0")
    backend.batch_pixels = 8 * 32 * 32
    stats = {}
    for pipelined in (True, False):
        cfg = config(tmp_path / str(pipelined), streams=("flow",))
        stage = DeviceStage(backend, cfg, 4, pipelined=pipelined)
        stage.run(records, lambda entry: None)
        stats[pipelined] = stage.stats
    assert tars(tmp_path / "True") == tars(tmp_path / "False") != {}
    assert stats[True]["pairs"] == stats[False]["pairs"] == sum(PAIRS) and stats[True]["batches"] > 4
    assert all(0 < s["device_busy_seconds"] for s in stats.values())


@pytest.mark.slow
def test_the_triton_kernels_in_the_batched_run_give_the_torch_paths_archives(records, reference, tmp_path):
    """The GPU path as a whole with the fused kernels (here in Triton's interpreter): the same flow
    images as the per-video torch path, and the report names the backend. One short video of each frame
    size (the interpreter takes seconds a pair)."""
    square = VideoRecord(
        "square", str(wide_video(tmp_path / "square.avi", 5, 9, width=32)), 0, "Square", "train"
    )
    assert process_video(square, config(tmp_path / "reference", streams=("flow",)))["status"] == "done"
    subset = [square, records[3]]
    out = tmp_path / "out"
    report = run_preprocess(subset, config(out, streams=("flow",), flow_backend="triton"), progress=False)
    assert report.flow["backend"] == "triton" and report.summary.done == 2
    for rec, ref in ((square, tmp_path / "reference"), (records[3], reference)):
        meta, frames = read_archive(archive_path(out, "flow", rec.id))
        ref_meta, ref_frames = read_archive(archive_path(ref, "flow", rec.id))
        assert frames == ref_frames and meta["flow"]["backend"] == "triton"


def _collect(events: list, threads: set):
    def progress(kind, video_id, n):
        events.append((kind, video_id, n))
        threads.add(threading.get_ident())

    return progress


PAIRS = (29, 11, 29, 6, 29)  # of the five records


def test_progress_events_count_every_pair(records, tmp_path):
    """Each video opens with the pairs its header promises, then all its pairs arrive, in this thread."""
    events, threads = [], set()
    entries = list(run_batched(config(tmp_path, threads=1), records, ["cpu"], _collect(events, threads)))
    assert threads == {threading.get_ident()}
    pairs = {e["id"]: e["streams"]["flow"] for e in entries}
    assert (
        {v: n for k, v, n in events if k == "start"}
        == pairs
        == dict(zip([r.id for r in records], PAIRS, strict=True))
    )
    assert sum(n for k, _, n in events if k == "units") == sum(PAIRS)


def test_abort_leaves_a_batch_within_one_solver_iteration(records, tmp_path):
    """The default TV-L1 on the CPU takes many seconds for a batch of 64 pairs; abort() ends the run within
    a fraction of that, with no temporary archive left."""
    backend = RecordingTVL1(64, TVL1Params())
    stage = DeviceStage(backend, config(tmp_path), threads=1)
    aborted = []

    def abort_in_the_first_batch() -> None:
        backend.entered.wait(60)
        time.sleep(0.2)
        aborted.append(time.monotonic())
        stage.abort()

    threading.Thread(target=abort_in_the_first_batch).start()
    with pytest.raises(Exception, match="aborted"):
        stage.run(records, lambda entry: None)
    assert time.monotonic() - aborted[0] < STOP_WITHIN and len(backend.calls) == 1
    assert tars(tmp_path) == {}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_batched_run_within_seconds_and_the_same_command_resumes(
    records, reference, tmp_path, stop_midway, sig
):
    copies = [replace(r, id=f"{r.id}-{k}") for k in range(4) for r in records]
    write_index(copies, tmp_path / "index.jsonl")
    out = tmp_path / "out"
    cmd = [
        MEMDPC,
        "preprocess",
        "flow",
        str(tmp_path / "index.jsonl"),
        "--out",
        str(out),
        "--size",
        "0",
        "--streams",
        "rgb,flow",
        "--flow-backend",
        "torch",
        "--device",
        "cpu",
        "--threads",
        "1",
        *CHEAP_FLAGS,
    ]
    stopped = stop_midway(cmd, out, sig)
    assert stopped.returncode == 128 + sig and stopped.seconds < STOP_WITHIN, stopped.stderr
    assert "Traceback" not in stopped.stderr and "terminate called" not in stopped.stderr
    note = re.search(
        rf"interrupted \({sig.name}\): (\d+) of 20 videos done; the same command resumes", stopped.stderr
    )
    assert note, stopped.stderr
    assert not list(out.rglob(".tmp-*"))
    done = {p.stem for p in (out / "flow").glob("*.tar")} & {p.stem for p in (out / "rgb").glob("*.tar")}
    assert 0 < len(done) < 20
    report = read_report(out)
    assert report.runs[-1]["interrupted"] == sig.name
    assert {vid for vid, v in report.entries("flow").items() if v["status"] == "done"} <= done
    subprocess.run(cmd, check=True, capture_output=True)
    for copy in copies:
        for s in ("rgb", "flow"):
            frames = read_archive(archive_path(out, s, copy.id))[1]
            assert frames == read_archive(archive_path(reference, s, copy.id.rsplit("-", 1)[0]))[1]


def test_ffmpeg_messages_go_to_the_report_of_the_run(records, tmp_path, capfd):
    """Decode threads share the process's stderr: what FFmpeg and OpenCV print is the run's, in the report."""
    (tmp_path / "text.avi").write_text("not a video\n" * 100)
    text = VideoRecord("text", str(tmp_path / "text.avi"), 0, "X", "train")
    report = run_preprocess([text, records[1]], config(tmp_path / "out"), progress=False)
    assert [v["status"] for v in report.videos] == ["failed", "done"]
    assert any("VIDEOIO(FFMPEG)" in line for line in report.messages)
    assert "VIDEOIO" not in capfd.readouterr().err
