"""Preprocessing runs end to end: real videos, real OpenCV TV-L1, real process pools, Dask and SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.errors import UserError
from memdpc.preprocess import run
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import decode_rgb
from memdpc.preprocess.example_layout import write_video
from memdpc.preprocess.run import PreprocessConfig, preprocess, run_preprocess
from memdpc.preprocess.synthetic import texture
from memdpc.preprocess.tvl1_params import TVL1Params
from memdpc.preprocess.video_index import VideoRecord, read_index, write_index

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


def archives(out: Path, stream: str) -> dict[str, tuple[dict, list[bytes]]]:
    return {p.stem: read_archive(p) for p in sorted((out / stream).glob("[!.]*.tar"))}


def test_rgb_and_flow_from_one_decode_then_resume_skips(index, tmp_path):
    recs = read_index(index)
    report = preprocess(index, tmp_path, "rgb,flow", size=0, workers=2, tvl1=FAST, progress=False)
    assert report["summary"]["done"] == len(recs) == 9 and not report["failures"]
    rgb, flow = archives(tmp_path, "rgb"), archives(tmp_path, "flow")
    assert set(rgb) == set(flow) == {r.id for r in recs}
    for r in recs:
        (mr, fr), (mf, ff) = rgb[r.id], flow[r.id]
        assert (len(fr), len(ff)) == (30, 29) and (mr["num_frames"], mf["num_frames"]) == (30, 29)
        assert (mr["fps"], mr["height"], mr["width"], mr["stream"]) == (25.0, 32, 32, "rgb")
        assert mr["encoding"] == "jpeg-q90-420" and mf["encoding"] == "jpeg-q100-444"
        assert mf["flow"]["third_channel"] == 128 and mf["flow"]["tvl1"]["scales"] == 2
        assert mf["code_error"]["mean_abs"] <= 0.5
    entry = next(v for v in report["videos"] if v["id"] == recs[0].id)
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
    saved = json.loads((tmp_path / "preprocess-report.json").read_text())
    assert saved["summary"] == report["summary"]

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.tar")}
    again = preprocess(index, tmp_path, "rgb,flow", size=0, tvl1=FAST, progress=False)
    assert again["summary"]["skipped"] == 9 and again["summary"]["done"] == 0
    assert stamps == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.tar")}


def test_adding_a_stream_later_decodes_only_what_is_missing(index, tmp_path):
    preprocess(index, tmp_path, "rgb", size=16, part="0/3", progress=False)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "rgb").glob("*.tar")}
    report = preprocess(index, tmp_path, "rgb,flow", size=16, part="0/3", tvl1=FAST, progress=False)
    assert report["summary"]["done"] == 3
    assert all(v["streams"] == {"flow": 29} for v in report["videos"])
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "rgb").glob("*.tar")}


def translation_video(path: Path, dx: int, dy: int, n: int = 4, size: int = 64) -> Path:
    tex = texture(np.random.default_rng(3), size, size)
    write_video(path, np.stack([np.roll(tex, (k * dy, k * dx), axis=(0, 1)) for k in range(n)]), 25.0, "mjpg")
    return path


def test_known_translation_through_the_cli(tmp_path):
    video = translation_video(tmp_path / "shift.avi", dx=3, dy=-2)
    write_index([VideoRecord("shift", str(video), 0, "Shift", "train")], tmp_path / "i.jsonl")
    res = CliRunner().invoke(
        main,
        [
            "preprocess",
            "flow",
            str(tmp_path / "i.jsonl"),
            "--out",
            str(tmp_path / "o"),
            "--size",
            "0",
            "--third-channel",
            "0",
            "--flow-encoding",
            "rgb",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "flow: native on cpu" in res.output  # --flow-backend auto, without CUDA
    meta, data = read_archive(archive_path(tmp_path / "o", "flow", "shift"))
    assert len(data) == meta["num_frames"] == 3  # 4 frames -> 3 flows
    assert meta["encoding"] == "jpeg-q90-rgb" and meta["code_error"]["mean_abs"] < 0.2
    assert not (tmp_path / "o" / "rgb").exists()
    for d in data:
        codes = decode_rgb(d).astype(int)
        inner = codes[12:-12, 12:-12]
        assert abs(np.median(inner[..., 0]) - round((3 + 20) * 255 / 40)) <= 1
        assert abs(np.median(inner[..., 1]) - round((-2 + 20) * 255 / 40)) <= 1
        assert (codes[..., 2] == 0).all()  # the third channel, exact in a JPEG without colour transform


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
    args = [
        "preprocess",
        "frames",
        str(bad_index),
        "--out",
        str(out),
        "--streams",
        "rgb,flow",
        "--size",
        "0",
        *FAST_FLAGS,
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    report = json.loads((out / "preprocess-report.json").read_text())
    status = {v["id"]: v["status"] for v in report["videos"]}
    assert list(status.values()) == ["done", "failed", "failed", "failed", "failed", "done"]
    reasons = {f["id"]: f["reason"] for f in report["failures"]}
    assert "decoded only" in reasons["cut"] and "cannot open" in reasons["text"]
    assert "cannot open" in reasons["zero"] and "not found" in reasons["gone"]
    assert "failed cut" in res.output
    for s in ("rgb", "flow"):
        assert sorted(p.name for p in (out / s).iterdir()) == sorted(
            f"{v}.tar" for v, st in status.items() if st == "done"
        )

    strict = CliRunner().invoke(main, [*args, "--strict"])  # done videos are skipped, failures again
    assert strict.exit_code == 1

    kept = CliRunner().invoke(main, [*args, "--keep-partial", "--report", str(tmp_path / "r.json")])
    assert kept.exit_code == 0
    entry = next(v for v in json.loads((tmp_path / "r.json").read_text())["videos"] if v["id"] == "cut")
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
    res = CliRunner().invoke(main, ["preprocess", "flow", str(index), "--out", str(tmp_path / "o"), *flags])
    assert res.exit_code == 2 and message in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_unusable_flow_device_fails_before_any_work(index, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available: the option is usable here")
    args = [
        "preprocess",
        "flow",
        str(index),
        "--out",
        str(tmp_path / "o"),
        "--flow-backend",
        "torch",
        "--device",
        "cuda",
    ]
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
        [
            MEMDPC,
            "preprocess",
            "flow",
            str(index),
            "--out",
            str(out),
            "--flow-backend",
            backend,
            "--device",
            "cuda",
        ],
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
        assert report["flow"] == {"backend": "native", "devices": ["cpu"], "note": None}
        assert (
            read_archive(archive_path(tmp_path, "flow", report["videos"][0]["id"]))[0]["flow"]["backend"]
            == "native"
        )
    assert report["config"]["flow_backend"] == "auto"  # as asked; "flow" says what it became
    assert "flow" not in preprocess(index, tmp_path, "rgb", size=16, part="0/9", progress=False)


def test_part_partitions_are_disjoint_and_cover(index, tmp_path):
    recs = read_index(index)
    done = []
    for i in range(3):
        report = preprocess(index, tmp_path, "rgb", size=16, part=f"{i}/3", progress=False)
        done.append({v["id"] for v in report["videos"] if v["status"] == "done"})
        assert (tmp_path / f"preprocess-report-part{i}of3.json").is_file()
    assert sum(map(len, done)) == 9 and set.union(*done) == {r.id for r in recs}
    assert set(archives(tmp_path, "rgb")) == {r.id for r in recs}


def test_kill_and_resume(index, tmp_path, kill_midway):
    """SIGKILL a run (and its workers) mid-way: no half-written archive under a final name; a re-run
    finishes the rest and the output is complete and correct."""
    out = tmp_path / "out"
    cmd = [
        MEMDPC,
        "preprocess",
        "flow",
        str(index),
        "--out",
        str(out),
        "--streams",
        "rgb,flow",
        "--size",
        "0",
        "--workers",
        "1",
        *FAST_FLAGS,
    ]
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
    assert report["summary"]["skipped"] == len(complete) and report["summary"]["done"] == 9 - len(complete)
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
    assert report["summary"]["done"] == 3 and not report["failures"]
    flow = archives(tmp_path, "flow")
    assert len(flow) == 3 and all(m["num_frames"] == 29 for m, _ in flow.values())


def test_unreachable_dask_scheduler_is_a_user_error(index, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(run, "DASK_CONNECT_TIMEOUT", 1)
    cfg = PreprocessConfig(out=str(tmp_path), dask="tcp://127.0.0.1:9", part=(0, 9))
    with pytest.raises(UserError, match="cannot connect"):
        run_preprocess(read_index(index), cfg, progress=False)
