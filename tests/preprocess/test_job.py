"""preprocess/job.py: what the per-video and the batched preprocessing share: the choice of this part's videos,
and the per-video pieces (metadata, flow JPEGs with their measured storage error, progress events, FFmpeg's
messages, failure reasons). Real files, real videos, real JPEGs."""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace

import numpy as np
import pytest

from memdpc.preprocess.archive import ArchiveWriter, archive_path, read_archive
from memdpc.preprocess.decode import DecodeSpec, StderrCapture, VideoStream
from memdpc.preprocess.encode import (
    FLOW_ENCODING,
    FLOW_ENCODING_YCC,
    code_error,
    decode_rgb,
)
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import texture
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import (
    MAX_MESSAGES,
    TICK,
    FlowWriter,
    Ticker,
    archive_meta,
    commit_archives,
    encode_flow,
    failure_reason,
    kept_messages,
    new_entry,
    process_video,
    select_part,
)
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.video_index import VideoRecord

from .conftest import texture_image

REC = VideoRecord("v_a", "/data/v_a.avi", 0, "A", "train")


def _records(n: int) -> list[VideoRecord]:
    return [VideoRecord(f"v{i}", f"/v{i}.avi", 0, "A", "train") for i in range(n)]


def test_parts_are_disjoint_and_cover_the_index():
    recs = _records(9)
    for n in (1, 2, 4, 11):
        parts = [select_part(recs, (i, n)) for i in range(n)]
        ids = [r.id for p in parts for r in p]
        assert sorted(ids) == sorted(r.id for r in recs) and len(ids) == len(set(ids))
    assert [r.id for r in select_part(recs, (1, 4))] == ["v1", "v5"]


def test_new_entry():
    assert new_entry(REC) == {"id": "v_a", "path": "/data/v_a.avi", "status": "done", "streams": {}}


@pytest.mark.parametrize(
    "error, reason",
    [
        (RuntimeError("decode failed\n  at frame 3\nno more frames"), "no more frames"),
        (ValueError("  one line  "), "one line"),
        (KeyError(), "KeyError()"),
    ],
)
def test_failure_reason_is_the_last_line(error, reason):
    assert failure_reason(error) == reason


@pytest.mark.parametrize("encoding", [FLOW_ENCODING, FLOW_ENCODING_YCC], ids=lambda e: e.name)
def test_encode_flow_measures_the_jpeg_code_error(encoding):
    codes = texture_image(0)
    codes[..., 2] = 128  # flow's third channel: a constant, which planes images give back as such
    data, mean, mx = encode_flow(codes, encoding)
    decoded = decode_rgb(data)
    assert decoded.shape == codes.shape
    diff = np.abs(decoded.astype(int) - codes.astype(int))
    assert (mean, mx) == (pytest.approx(diff.mean()), diff.max())
    assert 0 < mean < 2  # quality 100, no subsampling: nearly lossless, but not exactly


@pytest.fixture
def video(tmp_path) -> VideoStream:
    path = tmp_path / "v_a.avi"
    write_video(path, np.stack([texture_image(k) for k in range(3)]), 25.0, "mjpg")
    return VideoStream(path, DecodeSpec(size=0))


def test_archive_meta_of_each_stream(video):
    cfg = PreprocessConfig(out="o", flow_backend="opencv", third_channel=0)
    rgb = archive_meta(REC, "rgb", cfg, video, (16, 16))
    stat = video.path.stat()
    assert rgb == {
        "video_id": "v_a",
        "stream": "rgb",
        "fps": 25.0,
        "height": 16,
        "width": 16,
        "source": "/data/v_a.avi",
        "source_size": stat.st_size,
        "source_mtime_ns": stat.st_mtime_ns,
        "source_sha256": hashlib.sha256(video.path.read_bytes()).hexdigest(),
        "source_fps": 25.0,
        "decode": {"size": 256, "square": 0, "fps": 0.0},
        "encoding": "jpeg-q90-420",
    }
    flow = archive_meta(REC, "flow", cfg, video, (16, 16))
    assert flow["encoding"] == "jpeg-q100-planes"
    assert flow["flow"] == {
        "backend": "opencv",
        "pairs": "frame k -> k+1",
        "channels": ["x", "y", "third"],
        "bound": 20.0,
        "mapping": "round((clip(f, -20, 20) + 20) * 255 / 40)",
        "third_channel": 0,
        "tvl1": TVL1Params().to_dict(),
    }


# ------------------------------------------------------------------------ progress and messages
def test_ticker_sends_start_then_units_a_few_times_a_second():
    events = []
    ticker = Ticker(lambda *e: events.append(e), "v_a", 12)
    ticker.add()
    ticker.add(2)
    assert events == [("start", "v_a", 12)]  # within TICK: kept
    time.sleep(TICK)
    ticker.add()
    assert events[1:] == [("units", "v_a", 4)]
    ticker.add(5)
    ticker.flush()
    ticker.flush()
    assert events[2:] == [("units", "v_a", 5)]


@pytest.mark.parametrize("streams, units", [(("rgb",), 3), (("rgb", "flow"), 2), (("flow",), 2)])
def test_process_video_sends_its_units_frames_or_pairs(clip, streams, units):
    rec, cfg = clip
    events = []
    entry = process_video(rec, replace(cfg, streams=streams), lambda *e: events.append(e))
    assert entry["status"] == "done"
    assert events[0] == ("start", "v_a", units)  # promised by the header
    assert {e[0] for e in events[1:]} == {"units"} and sum(e[2] for e in events[1:]) == units


def test_process_video_keeps_what_ffmpeg_printed_in_its_entry(clip, tmp_path, capfd):
    rec, cfg = clip
    whole = tmp_path / "whole.avi"
    write_video(whole, np.stack([texture(np.random.default_rng(k), 64, 64) for k in range(30)]), 25.0, "mjpg")
    data = whole.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])  # a JPEG frame ends early: FFmpeg's decoder says so
    text = tmp_path / "text.avi"
    text.write_text("not a video\n" * 100)
    with StderrCapture() as stderr:
        good = process_video(rec, cfg, messages=stderr.take)
        broken = process_video(replace(rec, id="cut", path=str(cut)), cfg, messages=stderr.take)
        unreadable = process_video(replace(rec, id="text", path=str(text)), cfg, messages=stderr.take)
    assert good["status"] == "done" and "messages" not in good
    assert broken["status"] == "failed" and "decoded only" in broken["reason"]
    assert any(line.startswith("[mjpeg @") for line in broken["messages"])
    assert unreadable["status"] == "failed" and any(
        "VIDEOIO(FFMPEG)" in line for line in unreadable["messages"]
    )
    assert capfd.readouterr().err == ""  # nothing reached the terminal


def test_kept_messages_are_capped():
    lines = [f"line {i}" for i in range(MAX_MESSAGES + 5)]
    assert kept_messages(lines[:MAX_MESSAGES]) == lines[:MAX_MESSAGES]
    kept = kept_messages(lines)
    assert len(kept) == MAX_MESSAGES and kept[:-1] == lines[: MAX_MESSAGES - 1]
    assert kept[-1] == "… and 6 more lines"


def test_flow_writer_sums_the_error_of_every_image(tmp_path):
    codes = [texture_image(k) for k in range(3)]
    with ArchiveWriter(tmp_path / "f.tar") as w:
        flow = FlowWriter(w, FLOW_ENCODING)
        flow.add(codes[:2])
        flow.append(*encode_flow(codes[2], FLOW_ENCODING))
        errors = [code_error(c, encode_flow(c, FLOW_ENCODING)[0]) for c in codes]
        assert flow.error() == {
            "mean_abs": round(sum(m for m, _ in errors) / 3, 4),
            "max_abs": max(x for _, x in errors),
        }
        assert w.num_frames == 3 and flow.seconds > 0
        w.commit({})


def test_empty_flow_writer_reports_zero_error(tmp_path):
    with ArchiveWriter(tmp_path / "f.tar") as w:
        assert FlowWriter(w, FLOW_ENCODING).error() == {"mean_abs": 0.0, "max_abs": 0}
        w.commit({})


@pytest.mark.parametrize("partial", [None, "stopped at frame 2"])
def test_commit_archives_writes_meta_and_records_the_counts(tmp_path, video, partial):
    cfg = PreprocessConfig(out=str(tmp_path), streams=("rgb", "flow"), flow_backend="opencv")
    result = new_entry(REC)
    if partial:
        result.update(status="partial", reason=partial)
    frames = [cfg.rgb_encoding.encode_bgr(texture_image(k)) for k in range(3)]
    with (
        ArchiveWriter(archive_path(tmp_path, "rgb", REC.id)) as rgb,
        ArchiveWriter(archive_path(tmp_path, "flow", REC.id)) as fw,
    ):
        for f in frames:
            rgb.add(f)
        flow = FlowWriter(fw, cfg.flow_encoding)
        flow.add([texture_image(10), texture_image(11)])
        commit_archives(REC, cfg, video, (16, 16), {"rgb": rgb, "flow": fw}, flow, result)
    assert result["streams"] == {"rgb": 3, "flow": 2}
    assert result["flow_code_error"] == flow.error()
    rgb_meta, rgb_frames = read_archive(archive_path(tmp_path, "rgb", REC.id))
    flow_meta, flow_frames = read_archive(archive_path(tmp_path, "flow", REC.id))
    assert rgb_frames == frames and len(flow_frames) == 2
    assert rgb_meta == {
        **archive_meta(REC, "rgb", cfg, video, (16, 16)),
        "num_frames": 3,
        "frame_bytes": [len(f) for f in frames],
        **({"partial": partial} if partial else {}),
    }
    assert flow_meta == {
        **archive_meta(REC, "flow", cfg, video, (16, 16)),
        "code_error": flow.error(),
        "num_frames": 2,
        "frame_bytes": [len(f) for f in flow_frames],
        **({"partial": partial} if partial else {}),
    }
