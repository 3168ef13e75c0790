"""Preprocessing runs end to end: real videos, real OpenCV TV-L1, real process pools, Dask, reruns with
other settings, SIGKILL, SIGINT and SIGTERM; faults of a part of a run: a full disk (a real tmpfs), a worker
killed, two runs on one folder at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import EXIT_RESOURCE, main
from memdpc.common.errors import UserError
from memdpc.common.progress import progress_bar
from memdpc.preprocess import run
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import decode_rgb
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import texture
from memdpc.preprocess.flow.tvl1_params import TVL1Params, opencv_record
from memdpc.preprocess.report import read_report
from memdpc.preprocess.run import PreprocessConfig, preprocess, run_preprocess
from memdpc.preprocess.video_index import VideoRecord, read_index, write_index

from ..limits import STOP_WITHIN

MEMDPC = str(Path(sys.executable).parent / "memdpc")
FAST = {
    "scales": 2,
    "warps": 1,
    "outer_iterations": 2,
    "inner_iterations": 5,
}  # cheap TV-L1 for plumbing tests
FAST_FLAGS = ["--scales", "2", "--warps", "1", "--outer-iterations", "2", "--inner-iterations", "5"]


@pytest.fixture(scope="module")
def index(tiny_dataset, tmp_path_factory) -> Path:
    """The 9 tiny videos (30 frames, 32×32) of the session dataset as one index."""
    recs = build_index(tiny_dataset, "ucf101", 1)
    path = tmp_path_factory.mktemp("index") / "index.jsonl"
    write_index(recs, path)
    return path


def preprocess_args(verb: str, index: Path, out: Path, *options: str) -> list[str]:
    """``memdpc preprocess VERB INDEX --out OUT OPTIONS``: the arguments after ``memdpc``."""
    return ["preprocess", verb, str(index), "--out", str(out), *options]


def archives(out: Path, stream: str) -> dict[str, tuple[dict, list[bytes]]]:
    return {p.stem: read_archive(p) for p in sorted((out / stream).glob("[!.]*.tar"))}


def test_rgb_and_flow_from_one_decode_then_resume_skips(index, tmp_path):
    recs = read_index(index)
    report = preprocess(index, tmp_path, "rgb,flow", size=0, workers=2, tvl1=FAST, progress=False)
    assert report.summary.done == len(recs) == 9 and not report.failures
    rgb, flow = archives(tmp_path, "rgb"), archives(tmp_path, "flow")
    assert set(rgb) == set(flow) == {r.id for r in recs}
    for r in recs:
        (mr, fr), (mf, ff) = rgb[r.id], flow[r.id]
        assert (len(fr), len(ff)) == (30, 29) and (mr["num_frames"], mf["num_frames"]) == (30, 29)
        assert (mr["fps"], mr["height"], mr["width"], mr["stream"]) == (25.0, 32, 32, "rgb")
        assert mr["encoding"] == "jpeg-q90-420" and mf["encoding"] == "jpeg-q100-planes"
        assert mf["flow"]["third_channel"] == 128 and mf["flow"]["tvl1"]["scales"] == 2
        assert mf["code_error"]["mean_abs"] <= 0.1
    entry = next(v for v in report.videos if v["id"] == recs[0].id)
    assert entry["streams"] == {"rgb": 30, "flow": 29} and set(entry["stages"]) == {
        "decode",
        "flow",
        "encode",
    }
    cap = cv2.VideoCapture(recs[0].path)
    first = cap.read()[1]
    assert (
        np.abs(decode_rgb(rgb[recs[0].id][1][0])[..., ::-1].astype(int) - first).mean() < 10
    )  # JPEG q90 of a 32² texture
    saved = read_report(tmp_path / "preprocess-report.jsonl")
    assert saved.runs[-1]["summary"] == asdict(report.summary)  # the typed summary is the recorded one
    assert (saved.runs[-1]["started"], saved.runs[-1]["finished"]) == (report.started, report.finished)
    # one entry per video, describing both its archives: this run's, as returned
    assert {vid: (by["rgb"], by["flow"]) for vid, by in saved.videos.items()} == {
        v["id"]: ({**v, "run": saved.runs[-1]["run"]},) * 2 for v in report.videos
    }

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.tar")}
    again = preprocess(index, tmp_path, "rgb,flow", size=0, tvl1=FAST, progress=False)
    assert again.summary.skipped == 9 and again.summary.done == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.tar")}


def test_adding_a_stream_later_decodes_only_what_is_missing(index, tmp_path):
    preprocess(index, tmp_path, "rgb", size=16, part="0/3", progress=False)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "rgb").glob("*.tar")}
    report = preprocess(index, tmp_path, "rgb,flow", size=16, part="0/3", tvl1=FAST, progress=False)
    assert report.summary.done == 3
    assert all(v["streams"] == {"flow": 29} for v in report.videos)
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "rgb").glob("*.tar")}


def translation_video(path: Path, dx: int, dy: int, n: int = 4, size: int = 64) -> Path:
    tex = texture(np.random.default_rng(3), size, size)
    write_video(path, np.stack([np.roll(tex, (k * dy, k * dx), axis=(0, 1)) for k in range(n)]), 25.0, "mjpg")
    return path


@pytest.mark.parametrize("encoding, name", [("rgb", "jpeg-q90-rgb"), ("planes", "jpeg-q100-planes")])
def test_known_translation_through_the_cli(tmp_path, encoding, name):
    video = translation_video(tmp_path / "shift.avi", dx=3, dy=-2)
    write_index([VideoRecord("shift", str(video), 0, "Shift", "train")], tmp_path / "i.jsonl")
    options = ["--size", "0", "--third-channel", "0", "--flow-encoding", encoding]
    res = CliRunner().invoke(main, preprocess_args("flow", tmp_path / "i.jsonl", tmp_path / "o", *options))
    assert res.exit_code == 0, res.output
    assert "flow: native on cpu" in res.output  # --flow-backend auto, without CUDA
    meta, data = read_archive(archive_path(tmp_path / "o", "flow", "shift"))
    assert len(data) == meta["num_frames"] == 3  # 4 frames -> 3 flows
    assert meta["encoding"] == name and meta["code_error"]["mean_abs"] < 0.2
    assert meta["flow"]["third_channel"] == 0
    assert not (tmp_path / "o" / "rgb").exists()
    for d in data:
        codes = decode_rgb(d, meta["flow"]["third_channel"]).astype(int)
        inner = codes[12:-12, 12:-12]
        assert abs(np.median(inner[..., 0]) - round((3 + 20) * 255 / 40)) <= 1
        assert abs(np.median(inner[..., 1]) - round((-2 + 20) * 255 / 40)) <= 1
        assert (codes[..., 2] == 0).all()  # exact in a JPEG without colour transform; planes do not store it


@pytest.fixture
def bad_index(tiny_dataset, tmp_path) -> Path:
    good = build_index(tiny_dataset, "ucf101", 1)[:2]
    data = Path(good[0].path).read_bytes()
    (tmp_path / "cut.avi").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.avi").write_text("not a video\n" * 100)
    (tmp_path / "zero.mp4").write_bytes(b"")
    bad = [
        VideoRecord(n, str(tmp_path / f), 0, "X", "train")
        for n, f in (("cut", "cut.avi"), ("text", "text.avi"), ("zero", "zero.mp4"), ("gone", "gone.avi"))
    ]
    write_index([good[0], *bad, good[1]], tmp_path / "index.jsonl")
    return tmp_path / "index.jsonl"


def test_bad_videos_are_reported_and_skipped(bad_index, tmp_path):
    out = tmp_path / "out"
    args = preprocess_args("frames", bad_index, out, "--streams", "rgb,flow", "--size", "0", *FAST_FLAGS)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    entries = read_report(out).entries("flow")
    status = {vid: v["status"] for vid, v in entries.items()}
    assert list(status.values()) == ["done", "failed", "failed", "failed", "failed", "done"]
    assert entries == read_report(out).entries("rgb")
    reasons = {vid: v["reason"] for vid, v in entries.items() if v["status"] == "failed"}
    assert "decoded only" in reasons["cut"] and "cannot open" in reasons["text"]
    assert "cannot open" in reasons["zero"] and "not found" in reasons["gone"]
    assert "failed cut" in res.output
    for s in ("rgb", "flow"):
        assert sorted(p.name for p in (out / s).iterdir()) == sorted(
            f"{v}.tar" for v, st in status.items() if st == "done"
        )

    strict = CliRunner().invoke(main, [*args, "--strict"])  # done videos are skipped, failures again
    assert strict.exit_code == 1

    kept = CliRunner().invoke(main, [*args, "--keep-partial", "--report", str(tmp_path / "r.jsonl")])
    assert kept.exit_code == 0
    entry = read_report(tmp_path / "r.jsonl").entries("rgb")["cut"]
    meta, frames = read_archive(archive_path(out, "rgb", "cut"))
    assert entry["status"] == "partial" and 0 < len(frames) == entry["streams"]["rgb"] < 30
    assert "decoded only" in meta["partial"]
    assert read_archive(archive_path(out, "flow", "cut"))[0]["num_frames"] == len(frames) - 1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--quality", "0"], "--quality"),
        (["--flow-quality", "101"], "--flow-quality"),
        (["--size", "-1"], "--size"),
        (["--part", "2/2"], "--part"),
        (["--part", "one/two"], "--part"),
        (["--streams", "rgb,depth"], "--streams"),
        (["--tau", "0.5"], "--tau"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_out_of_range_options_fail_before_any_work(index, tmp_path, flags, message):
    res = CliRunner().invoke(main, preprocess_args("flow", index, tmp_path / "o", *flags))
    assert res.exit_code == 2 and message in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_unusable_flow_device_fails_before_any_work(index, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available: the option is usable here")
    args = preprocess_args("flow", index, tmp_path / "o", "--flow-backend", "torch", "--device", "cuda")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and "no CUDA device" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_cuda_without_cuda_is_a_one_line_error(index, tmp_path, backend):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available: the option is usable here")
    out = tmp_path / "o"
    res = subprocess.run(
        [MEMDPC, *preprocess_args("flow", index, out, "--flow-backend", backend, "--device", "cuda")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2 and "--device cuda: no CUDA device is available" in res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


def test_auto_is_the_default_and_the_report_names_what_ran(index, tmp_path):
    torch = pytest.importorskip("torch")
    assert PreprocessConfig(out="").flow_backend == PreprocessConfig(out="").device == "auto"
    report = preprocess(index, tmp_path, "flow", size=16, part="0/9", tvl1=FAST, progress=False)
    if not torch.cuda.is_available():
        assert report.flow == {
            "backend": "native",
            "devices": ["cpu"],
            "note": None,
            "opencv": opencv_record(),
        }
        assert (
            read_archive(archive_path(tmp_path, "flow", report.videos[0]["id"]))[0]["flow"]["backend"]
            == "native"
        )
    assert report.config.flow_backend == "auto"  # as asked; "flow" says what it became
    assert preprocess(index, tmp_path, "rgb", size=16, part="0/9", progress=False).flow is None


def test_a_frames_run_then_a_flow_run_into_one_folder_leave_a_report_of_both_streams(index, tmp_path):
    preprocess(index, tmp_path, "rgb", size=16, part="0/3", progress=False)
    preprocess(index, tmp_path, "flow", size=16, part="0/3", tvl1=FAST, progress=False)
    report = read_report(tmp_path)
    assert [r["config"]["streams"] for r in report.runs] == [["rgb"], ["flow"]]
    frames, flow = (r["run"] for r in report.runs)
    assert list(report.videos) == [r.id for r in read_index(index)[0::3]]
    for by in report.videos.values():
        assert (by["rgb"]["streams"], by["rgb"]["run"]) == ({"rgb": 30}, frames)
        assert (by["flow"]["streams"], by["flow"]["run"]) == ({"flow": 29}, flow)


def test_part_partitions_are_disjoint_and_cover(index, tmp_path):
    recs = read_index(index)
    done = []
    for i in range(3):
        report = preprocess(index, tmp_path, "rgb", size=16, part=f"{i}/3", progress=False)
        done.append({v["id"] for v in report.videos if v["status"] == "done"})
        assert (tmp_path / f"preprocess-report-part{i}of3.jsonl").is_file()
    assert sum(map(len, done)) == 9 and set.union(*done) == {r.id for r in recs}
    assert set(archives(tmp_path, "rgb")) == {r.id for r in recs}


def test_kill_and_resume(index, tmp_path, kill_midway):
    """SIGKILL a run (and its workers) mid-way: no half-written archive under a final name; a re-run
    finishes the rest and the output is complete and correct."""
    out = tmp_path / "out"
    options = ["--streams", "rgb,flow", "--size", "0", "--workers", "1", *FAST_FLAGS]
    cmd = [MEMDPC, *preprocess_args("flow", index, out, *options)]
    kill_midway(cmd, out)
    final = {s: {p.stem for p in (out / s).glob("[!.]*.tar")} for s in ("rgb", "flow")}
    complete = final["rgb"] & final["flow"]
    assert final["flow"] and len(complete) < 9, "the kill should land mid-run"
    for s in ("rgb", "flow"):
        for p in (out / s).glob("*.tar"):
            if p.name.startswith("."):  # a temporary archive of a video in progress: never complete
                assert p.stem.split("-", 2)[2] not in final[s]
            else:
                assert read_archive(p)[0]["num_frames"] in (29, 30)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/[!.]*.tar")}

    report = preprocess(index, out, "rgb,flow", size=0, tvl1=FAST, progress=False)
    assert report.summary.skipped == len(complete) and report.summary.done == 9 - len(complete)
    assert not [p for p in out.rglob(".tmp-*")]
    rgb, flow = archives(out, "rgb"), archives(out, "flow")
    assert len(rgb) == len(flow) == 9
    assert all(len(rgb[k][1]) == 30 and len(flow[k][1]) == 29 for k in rgb)
    assert all(stamps[p] == p.stat().st_mtime_ns for p in stamps)  # finished videos were not redone


def test_dask_local_cluster(index, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cl:
        cfg = PreprocessConfig(
            out=str(tmp_path),
            streams=("rgb", "flow"),
            decode=DecodeSpec(size=0),
            tvl1=TVL1Params(**FAST),
            dask=cl.scheduler_address,
            part=(0, 3),
        )
        report = run_preprocess(read_index(index), cfg, progress=False)
    assert report.summary.done == 3 and not report.failures
    flow = archives(tmp_path, "flow")
    assert len(flow) == 3 and all(m["num_frames"] == 29 for m, _ in flow.values())


def test_unreachable_dask_scheduler_is_a_user_error(index, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(run, "DASK_CONNECT_TIMEOUT", 1)
    cfg = PreprocessConfig(out=str(tmp_path), dask="tcp://127.0.0.1:9", part=(0, 9))
    with pytest.raises(UserError, match="cannot connect"):
        run_preprocess(read_index(index), cfg, progress=False)


# ------------------------------------------------------------------------ reruns with other settings
@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> tuple[Path, Path]:
    """Six 41-frame 64×48 videos, and the index of six other videos of the same file names in another folder (so
    the same ids): (index, other folder's index). With ``--scales 1 --warps 1`` a video's flow takes most of a
    second, so a run of them can be stopped midway."""
    root = tmp_path_factory.mktemp("clips")
    recs, others = [], []
    for i in range(6):
        for folder, seed in (("a", i), ("b", 100 + i)):
            tex = texture(np.random.default_rng(seed), 48, 64)
            frames = np.stack([np.roll(tex, (k, 2 * k), axis=(0, 1)) for k in range(41)])
            write_video(root / folder / f"clip{i}.avi", frames, 25.0, "mjpg")
        path = root / "a" / f"clip{i}.avi"
        recs.append(VideoRecord(f"clip{i}", str(path), 0, "A", "train"))
        others.append(VideoRecord(f"clip{i}", str(root / "b" / path.name), 0, "A", "train"))
    write_index(recs, root / "a.jsonl")
    write_index(others, root / "b.jsonl")
    return root / "a.jsonl", root / "b.jsonl"


SMALL = [
    "--part",
    "0/3",
    "--scales",
    "1",
    "--warps",
    "1",
    "--outer-iterations",
    "2",
    "--inner-iterations",
    "5",
]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MEMDPC, *args], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}
    )


def _run(*args: str) -> tuple[int, str]:
    """The CLI in this process: (exit code, what it printed)."""
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.output


@pytest.mark.parametrize(
    "first, then, difference",
    [
        (["--size", "32"], ["--square", "32"], "--size 32 → --square 32"),
        (["--size", "32"], ["--size", "24"], "--size 32 → --size 24"),
        (["--size", "32"], ["--size", "32", "--warps", "2"], "--warps 1 → --warps 2"),
    ],
    ids=["square", "size", "tv-l1"],
)
def test_a_rerun_with_other_settings_is_refused_then_rewritten_with_overwrite(
    clips, tmp_path, first, then, difference
):
    index, out = clips[0], tmp_path / "out"
    args = preprocess_args("flow", index, out, "--streams", "rgb,flow", *SMALL)
    assert _run(*args, *first)[0] == 0
    before = {p: p.read_bytes() for p in out.glob("*/*.tar")}
    report = (out / "preprocess-report-part0of3.jsonl").read_text()
    assert len(before) == 4  # clip0 and clip3, rgb and flow

    code, output = _run(*args, *then)
    assert code == 2 and "Traceback" not in output
    n = 4 if "--warps" not in difference else 2  # TV-L1 options shape the flow archives only
    example = re.escape(str(out / ("flow" if n == 2 else "rgb") / "clip0.tar"))
    assert re.search(
        rf"Error: {n} archives in {re.escape(str(out))} were made with other settings or from another source, "
        rf"e\.g\. {example} \({re.escape(difference)}\); rerun with --overwrite to rewrite them",
        output,
    ), output
    assert {p: p.read_bytes() for p in out.glob("*/*.tar")} == before  # nothing touched
    assert (out / "preprocess-report-part0of3.jsonl").read_text() == report

    code, output = _run(*args, *then, "--overwrite")
    assert code == 0, output
    after = read_report(out / "preprocess-report-part0of3.jsonl")
    assert after.runs[-1]["summary"]["done"] == 2
    assert all(
        v["status"] == "done" and v["run"] == after.runs[-1]["run"] for v in after.entries("flow").values()
    )
    changed = {p for p, data in before.items() if p.read_bytes() != data}
    assert len(changed) == n
    meta = read_archive(out / "flow" / "clip0.tar")[0]
    if "--square" in then:
        assert (meta["height"], meta["width"], meta["decode"]["square"]) == (32, 32, 32)
    assert _run(*args, *then)[0] == 0  # the same settings now: a cheap skip
    assert read_report(out / "preprocess-report-part0of3.jsonl").runs[-1]["summary"]["skipped"] == 2


def test_an_index_of_another_folder_whose_ids_collide_is_refused(clips, tmp_path):
    index, other = clips
    out = tmp_path / "out"
    args = ["preprocess", "frames", "--out", str(out), "--size", "32", *SMALL[:2]]
    assert _run(*args, str(index))[0] == 0
    code, output = _run(*args, str(other))
    a, b = (Path(read_index(i)[0].path) for i in (index, other))
    assert (
        code == 2
        and f"2 archives in {out} were made with other settings or from another source, e.g. " in output
    )
    assert f"(source {a} → {b})" in output
    assert _run(*args, str(other), "--overwrite")[0] == 0
    assert read_archive(out / "rgb" / "clip0.tar")[0]["source"] == str(b)


def test_a_rerun_that_only_skips_keeps_the_report_of_the_run_that_did_the_work(bad_index, tmp_path):
    out = tmp_path / "out"
    args = preprocess_args("frames", bad_index, out, "--size", "0")
    assert CliRunner().invoke(main, args).exit_code == 0
    first = read_report(out).entries("rgb")
    assert [v["status"] for v in first.values()] == ["done", "failed", "failed", "failed", "failed", "done"]
    assert CliRunner().invoke(main, args).exit_code == 0  # the good videos skip, the bad ones fail again
    report = read_report(out)
    second, run = report.entries("rgb"), report.runs[-1]
    assert (run["summary"]["skipped"], run["summary"]["failed"], run["summary"]["done"]) == (2, 4, 0)
    kept = {vid: v for vid, v in second.items() if v["status"] != "failed"}
    assert kept == {
        vid: v for vid, v in first.items() if v["status"] == "done"
    }  # frame counts, stages, seconds
    assert [vid for vid, v in second.items() if v["run"] == run["run"]] == ["cut", "text", "zero", "gone"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_rerun_with_nothing_left_to_do_skips_every_video(tiny_dataset, tmp_path, workers):
    write_index(build_index(tiny_dataset, "ucf101", 1)[:3], tmp_path / "index.jsonl")
    args = preprocess_args(
        "frames", tmp_path / "index.jsonl", tmp_path / "out", "--size", "0", "--workers", workers
    )
    path, lines = tmp_path / "out" / "preprocess-report.jsonl", []
    for _ in range(2):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        lines.append(len(path.read_text().splitlines()))
    report = read_report(path)
    assert (report.runs[-1]["summary"]["skipped"], report.runs[-1]["summary"]["done"]) == (3, 0)
    first = report.runs[0]["run"]
    assert [(v["status"], v["run"]) for v in report.entries("rgb").values()] == [("done", first)] * 3
    assert lines == [1 + 3 + 1, 1 + 3 + 1 + 2]  # the rerun adds its start and its end, nothing else


def test_a_report_of_another_kind_is_named_not_appended_to(tiny_dataset, tmp_path):
    write_index(build_index(tiny_dataset, "ucf101", 1)[:1], tmp_path / "index.jsonl")
    report = tmp_path / "out" / "preprocess-report.jsonl"
    report.parent.mkdir()
    report.write_text("{half a report")
    res = CliRunner().invoke(
        main, preprocess_args("frames", tmp_path / "index.jsonl", tmp_path / "out", "--size", "0")
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert f"{report}: not a preprocess report of this memdpc version (one JSON line per event" in " ".join(
        res.output.split()
    )
    assert (
        report.read_text() == "{half a report" and not (tmp_path / "out" / "rgb").exists()
    )  # before any work


# ------------------------------------------------------------------------ interrupts
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_workers_within_seconds_and_the_same_command_resumes(
    clips, tmp_path, stop_midway, sig
):
    """SIGINT as a terminal's Ctrl-C sends it (to the workers too), SIGTERM to the parent only: queued videos
    are cancelled, the workers terminated, finished archives kept, the report written; then the same
    command does the rest."""
    out = tmp_path / "out"
    options = ["--streams", "rgb,flow", "--size", "0", "--workers", "2", "--scales", "1", "--warps", "1"]
    cmd = [MEMDPC, *preprocess_args("flow", clips[0], out, *options)]
    stopped = stop_midway(cmd, out, sig)
    assert stopped.returncode == 128 + sig and stopped.seconds < STOP_WITHIN, stopped.stderr
    assert "Traceback" not in stopped.stderr and "Aborted" not in stopped.stderr
    note = re.search(
        rf"interrupted \({sig.name}\): (\d) of 6 videos done; the same command resumes; report: "
        rf"{re.escape(str(out / 'preprocess-report.jsonl'))}",
        stopped.stderr,
    )
    assert note, stopped.stderr
    final = {s: {p.stem for p in (out / s).glob("*.tar")} for s in ("rgb", "flow")}
    assert not [p for p in out.rglob(".tmp-*")]  # the stopped videos' temporary archives are gone
    complete = final["rgb"] & final["flow"]
    assert final["flow"] and len(complete) < 6, "queued videos were not cancelled"
    for s in ("rgb", "flow"):
        for video in final[s]:
            assert read_archive(archive_path(out, s, video))[0]["num_frames"] == (41 if s == "rgb" else 40)
    report = read_report(out)
    done = {vid for vid, v in report.entries("flow").items() if v["status"] == "done"}
    stopped_run = report.runs[-1]
    assert stopped_run["interrupted"] == sig.name and len(done) == int(note[1]) and done <= complete
    assert stopped_run["summary"]["pending"] == 6 - len(done)
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*.tar")}

    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    report = read_report(out)
    run = report.runs[-1]
    assert run["summary"]["skipped"] == len(complete) and run["summary"]["done"] == 6 - len(complete)
    # the stopped run's entries are kept; a video a worker finished as the run stopped is found done (skipped):
    # the report has no entry of it, its archives their meta.json; one with a single stream's archive written as
    # the run stopped gets the other's from the resumed run, whose entry describes that stream alone
    assert "interrupted" not in run

    def done_by(r: dict) -> set[str]:
        return {
            vid
            for vid, by in report.videos.items()
            if any(e["run"] == r["run"] and e["status"] == "done" for e in by.values())
        }

    assert done_by(stopped_run) == done
    assert done_by(run) == {f"clip{i}" for i in range(6)} - complete
    assert all(read_archive(archive_path(out, "flow", f"clip{i}"))[0]["num_frames"] == 40 for i in range(6))
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # kept, not redone


# ------------------------------------------------------------------------ progress and messages
def _progress_lines(videos: int) -> int:
    """The Python lines the progress bar of a run of ``videos`` videos runs (rich's own included): each video
    opened, written in two steps and finished, as a worker's events and then its entry reach the run."""
    lines = 0

    def trace(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return trace

    with progress_bar("{task.fields[info]}", disable=True) as bar:
        tracker = run._Tracker(bar, PreprocessConfig(out="", streams=("rgb", "flow")), 0, videos)
        before = sys.gettrace()
        sys.settrace(trace)
        try:
            for i in range(videos):
                tracker.event("start", f"v{i}", 8)
                tracker.event("units", f"v{i}", 4)
                tracker.event("units", f"v{i}", 4)
                tracker.finish({"id": f"v{i}", "status": "done", "streams": {"rgb": 9, "flow": 8}})
        finally:
            sys.settrace(before)
        assert bar.tasks[0].completed == bar.tasks[0].total == videos
    return lines


def test_the_progress_of_a_video_costs_the_same_however_many_videos_the_run_has():
    """4× the videos, 4× the work (16× where every event summed over the videos opened so far)."""
    few, many = _progress_lines(300), _progress_lines(1200)
    assert many < 4.5 * few, (few, many)


def test_the_bar_counts_the_pairs_of_one_long_video(clips, tmp_path):
    first = read_index(clips[0])[0]
    write_index([first], tmp_path / "one.jsonl")
    res = _cli(*preprocess_args("flow", tmp_path / "one.jsonl", tmp_path / "o", "--size", "0", *SMALL[2:]))
    assert res.returncode == 0, res.stderr
    assert re.search(r"preprocess flow .*1/1 videos · 40 pairs · [\d.]+ pairs/s", res.stderr), res.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ffmpeg_messages_go_to_the_report_not_the_terminal(bad_index, clips, tmp_path, workers):
    """A truncated MJPEG file (FFmpeg's decoder warns) and a text file named .avi (OpenCV's VIDEOIO warns)."""
    data = Path(read_index(clips[0])[0].path).read_bytes()
    (tmp_path / "cut.avi").write_bytes(data[: len(data) // 2])
    records = [*read_index(bad_index), VideoRecord("mjpeg_cut", str(tmp_path / "cut.avi"), 0, "X", "train")]
    write_index(records, tmp_path / "index.jsonl")
    out = tmp_path / "out"
    res = _cli(*preprocess_args("frames", tmp_path / "index.jsonl", out, "--size", "0", "--workers", workers))
    assert res.returncode == 0, res.stderr
    assert "WARN" not in res.stderr and "VIDEOIO" not in res.stderr and "@ 0x" not in res.stderr
    messages = {vid: v.get("messages", []) for vid, v in read_report(out).entries("rgb").items()}
    assert any(line.startswith("[mjpeg @ 0x") for line in messages["mjpeg_cut"]), messages
    assert any("VIDEOIO(FFMPEG)" in line for line in messages["text"])
    assert messages["gone"] == []  # never opened
    assert "FFmpeg/OpenCV messages about " in res.stdout
    assert (
        f"wrote the archives of 2 videos in {out / 'rgb'}; report {out / 'preprocess-report.jsonl'}"
        in res.stdout
    )
    # every video of class X failed: shard would refuse the split, and the next step says so
    assert "next: not memdpc shard yet, which would refuse the splits that lost a class: " in res.stdout
    assert "train has no video of class 'X' left (its 5 videos failed)" in res.stdout


# ------------------------------------------------------------------------ faults of a part of a run
def _two_workers(index: Path, out: Path) -> list[str]:
    """A ``memdpc preprocess flow`` command of two worker processes (the arguments after ``memdpc``)."""
    return preprocess_args(
        "flow", index, out, "--streams", "rgb,flow", "--size", "0", "--workers", "2", *FAST_FLAGS
    )


@pytest.fixture(scope="module")
def undisturbed(index, tmp_path_factory) -> Path:
    """The archives of an undisturbed run of :func:`_two_workers`, which the runs with faults must equal."""
    out = tmp_path_factory.mktemp("undisturbed") / "out"
    res = _cli(*_two_workers(index, out))
    assert res.returncode == 0, res.stderr
    return out


def _assert_same_archives(out: Path, ref: Path) -> None:
    """Every archive of ``ref`` in ``out``, byte for byte, and nothing else (no temporary archive)."""
    names = sorted(p.relative_to(ref) for p in ref.rglob("*.tar"))
    assert sorted(p.relative_to(out) for p in out.rglob("*.tar")) == names
    for name in names:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


@pytest.mark.slow
def test_a_full_disk_stops_the_run_in_one_line_and_the_same_command_resumes_to_the_same_archives(
    index, undisturbed, small_disk
):
    """The output on a real file system with 40 % of the space the run needs: the run warns at its start, stops
    at the first write that does not fit (exit 74; an archive's, or a line of the report's) with one line, keeps
    the finished archives and nothing half-written; once space is freed, the same command finishes with the archives of an undisturbed run."""
    need = sum(p.stat().st_size for p in undisturbed.rglob("*.tar"))
    small_disk.resize(int(0.4 * need))
    out = small_disk.path / "out"
    stopped = _cli(*_two_workers(index, out))
    assert stopped.returncode == EXIT_RESOURCE, stopped.stderr
    assert "Traceback" not in stopped.stderr and "next:" not in stopped.stdout
    warning = re.search(
        r"warning: this run's archives will take about (\S+ \S*B) in .* only (\S+ \S*B)", stopped.stderr
    )
    assert warning, stopped.stderr
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("stopped:")]
    report = out / "preprocess-report.jsonl"
    line = re.fullmatch(
        rf"stopped: no space left on the file system of {re.escape(str(out))}(?:/rgb|/flow)?, writing "
        rf"\S+\.(?:tar|jsonl) "
        rf"\(\d[\d.]* k?B free there now\); (\d) of 9 videos done, their archives kept; free space there, then "
        rf"the same command resumes; report: {re.escape(str(report))}",
        lines[0] if len(lines) == 1 else "",
    )
    assert line, stopped.stderr
    assert not list(out.rglob(".tmp-*"))
    recorded = read_report(report).runs[-1]
    assert recorded["stopped"].startswith("no space left") and recorded["summary"]["done"] == int(line[1]) < 9
    for p in out.rglob("*.tar"):  # what is there is whole: the undisturbed run's bytes
        assert p.read_bytes() == (undisturbed / p.relative_to(out)).read_bytes()

    small_disk.resize(2 * need + (1 << 20))
    resumed = _cli(*_two_workers(index, out))
    assert resumed.returncode == 0, resumed.stderr
    assert "stopped" not in read_report(report).runs[-1]
    _assert_same_archives(out, undisturbed)


@pytest.mark.slow
def test_a_worker_killed_mid_video_is_replaced_and_the_run_finishes_with_the_same_archives(
    index, undisturbed, tmp_path
):
    """SIGKILL, as the out-of-memory killer sends it, to the worker writing the first temporary flow archive (its
    name holds the worker's process id): the other worker goes on, a new one takes its place, the video is done
    again once the others are, alone, and the archives are those of an undisturbed run."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [MEMDPC, *_two_workers(index, out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 120
        while not (held := list(out.glob("flow/.tmp-*.tar"))):
            assert proc.poll() is None and time.monotonic() < deadline, "no worker ever wrote a flow archive"
            time.sleep(0.01)
        pid, video = re.fullmatch(r"\.tmp-(\d+)-(.+)\.tar", held[0].name).groups()
        os.kill(int(pid), signal.SIGKILL)
        mid_video = held[0].exists()  # else it was renamed just before: then the second try finds it done
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    report = read_report(out)
    summary = report.runs[-1]["summary"]
    assert summary["done"] + summary["skipped"] == 9 and not summary["failed"]
    retried = {vid: v["retried"] for vid, v in report.entries("flow").items() if "retried" in v}
    if mid_video:
        why = "its first worker was killed by SIGKILL — out of memory? try fewer --workers"
        assert retried == {video: why}
        assert f"note: {video}: {why}; done on a second try, alone" in err
    _assert_same_archives(out, undisturbed)


@pytest.mark.slow
def test_two_runs_on_one_folder_at_once_write_the_archives_of_one(index, undisturbed, tmp_path):
    """The same command twice, the second started while the first writes: the second leaves the first's
    temporary archives alone (a live writer holds them), both finish, and the archives are those of one run."""
    out = tmp_path / "out"
    first = subprocess.Popen(
        [MEMDPC, *_two_workers(index, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("flow/.tmp-*.tar")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    second = subprocess.Popen(
        [MEMDPC, *_two_workers(index, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    for proc in (first, second):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()
    report = read_report(out)
    assert len(report.runs) == 2 and not any(r["summary"]["failed"] for r in report.runs)
    _assert_same_archives(out, undisturbed)
