"""preprocess/job.py: what the per-video and the batched preprocessing share: the run's configuration and
its validation, the choice of this part's videos, and the per-video pieces (missing archives, metadata,
flow JPEGs with their measured storage error, failure reasons). Real files, real videos, real JPEGs."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.atomic import tmp_name
from memdpc.errors import UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path, read_archive
from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.encode import FLOW_ENCODING, JpegEncoding, code_error, decode_rgb
from memdpc.preprocess.example_layout import write_video
from memdpc.preprocess.job import (
    FlowWriter,
    PreprocessConfig,
    archive_meta,
    commit_archives,
    encode_flow,
    failure_reason,
    missing_streams,
    new_entry,
    parse_part,
    select_part,
)
from memdpc.preprocess.synthetic import texture
from memdpc.preprocess.tvl1_params import TVL1Params
from memdpc.preprocess.video_index import VideoRecord

REC = VideoRecord("v_a", "/data/v_a.avi", 0, "A", "train")


def _records(n: int) -> list[VideoRecord]:
    return [VideoRecord(f"v{i}", f"/v{i}.avi", 0, "A", "train") for i in range(n)]


def _codes(seed: int) -> np.ndarray:
    return texture(np.random.default_rng(seed), 16, 16)


def test_defaults_are_valid_and_the_report_is_named_by_part(tmp_path):
    cfg = PreprocessConfig(out=str(tmp_path))
    cfg.validate()
    assert (cfg.streams, cfg.flow_backend, cfg.device, cfg.tvl1) == (("rgb",), "auto", "auto", TVL1Params())
    assert cfg.report_path == tmp_path / "preprocess-report.json"
    assert (
        PreprocessConfig(out=str(tmp_path), part=(2, 4)).report_path
        == tmp_path / "preprocess-report-part2of4.json"
    )
    assert (
        PreprocessConfig(out=str(tmp_path), report="/r.json", part=(2, 4)).report_path.as_posix() == "/r.json"
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"streams": ()}, "--streams must list distinct streams from rgb, flow, not ()"),
        ({"streams": ("rgb", "rgb")}, "--streams must list distinct streams"),
        ({"streams": ("depth",)}, "--streams must list distinct streams"),
        ({"decode": DecodeSpec(size=-1)}, "--size and --square must be ≥ 0"),
        ({"rgb_encoding": JpegEncoding(0)}, "--quality must be between 1 and 100, not 0"),
        ({"flow_encoding": JpegEncoding(101)}, "--flow-quality must be between 1 and 100, not 101"),
        ({"third_channel": 64}, "--third-channel must be 0 or 128, not 64"),
        ({"tvl1": TVL1Params(tau=1.0)}, "TV-L1 option(s) out of range: --tau"),
        ({"flow_backend": "cupy"}, "unknown --flow-backend 'cupy' (choose from auto, "),
        ({"workers": 0}, "--workers must be ≥ 1, not 0"),
        ({"threads": -1}, "--threads must be ≥ 0 (0: one per CPU core), not -1"),
        ({"part": (3, 3)}, "--part I/N needs N ≥ 1 and 0 ≤ I < N, not 3/3"),
    ],
)
def test_each_bad_option_is_refused_with_its_name(kw, message):
    with pytest.raises(UserError) as e:
        PreprocessConfig(out="o", **kw).validate()
    assert str(e.value).startswith(message)


def test_parse_part():
    assert parse_part("1/3") == (1, 3)
    assert parse_part(" 0 / 1 ") == (0, 1)
    for bad in ("3/3", "-1/2", "0/0", "1", "a/b"):
        with pytest.raises(UserError, match="--part"):
            parse_part(bad)


def test_parts_are_disjoint_and_cover_the_index():
    recs = _records(9)
    for n in (1, 2, 4, 11):
        parts = [select_part(recs, (i, n)) for i in range(n)]
        ids = [r.id for p in parts for r in p]
        assert sorted(ids) == sorted(r.id for r in recs) and len(ids) == len(set(ids))
    assert [r.id for r in select_part(recs, (1, 4))] == ["v1", "v5"]


def test_new_entry():
    assert new_entry(REC) == {"id": "v_a", "path": "/data/v_a.avi", "status": "done", "streams": {}}


def test_missing_streams_lists_absent_archives_and_clears_only_this_videos_temporaries(tmp_path):
    cfg = PreprocessConfig(out=str(tmp_path), streams=("rgb", "flow"))
    assert missing_streams(REC, cfg) == ["rgb", "flow"]  # no folders yet
    done = archive_path(tmp_path, "rgb", REC.id)
    done.parent.mkdir()
    done.write_bytes(b"")
    (tmp_path / "flow").mkdir()
    mine = tmp_path / "flow" / ".tmp-12345-v_a.tar"
    others = [tmp_name(archive_path(tmp_path, "flow", "v_ab")), tmp_path / "flow" / ".tmp-x-v_a.tar"]
    for p in (mine, *others):
        p.write_bytes(b"half")
    assert missing_streams(REC, cfg) == ["flow"]
    assert not mine.exists() and all(p.exists() for p in others) and done.exists()


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


def test_encode_flow_measures_the_jpeg_code_error():
    codes = _codes(0)
    data, mean, mx = encode_flow(codes, FLOW_ENCODING)
    decoded = decode_rgb(data)
    assert decoded.shape == codes.shape
    diff = np.abs(decoded.astype(int) - codes.astype(int))
    assert (mean, mx) == (pytest.approx(diff.mean()), diff.max())
    assert 0 < mean < 2  # quality 100, no subsampling: nearly lossless, but not exactly


@pytest.fixture
def video(tmp_path) -> VideoStream:
    path = tmp_path / "v_a.avi"
    write_video(path, np.stack([_codes(k) for k in range(3)]), 25.0, "mjpg")
    return VideoStream(path, DecodeSpec(size=0))


def test_archive_meta_of_each_stream(video):
    cfg = PreprocessConfig(out="o", flow_backend="opencv", third_channel=0)
    rgb = archive_meta(REC, "rgb", cfg, video, (16, 16))
    assert rgb == {"video_id": "v_a", "stream": "rgb", "fps": 25.0, "height": 16, "width": 16,
                   "source": "/data/v_a.avi", "source_fps": 25.0, "decode": {"size": 256, "square": 0, "fps": 0.0},
                   "encoding": "jpeg-q90-420"}  # fmt: skip
    flow = archive_meta(REC, "flow", cfg, video, (16, 16))
    assert flow["encoding"] == "jpeg-q100-444"
    assert flow["flow"] == {
        "backend": "opencv",
        "pairs": "frame k -> k+1",
        "channels": ["x", "y", "third"],
        "bound": 20.0,
        "mapping": "round((clip(f, -20, 20) + 20) * 255 / 40)",
        "third_channel": 0,
        "tvl1": TVL1Params().to_dict(),
    }


def test_flow_writer_sums_the_error_of_every_image(tmp_path):
    codes = [_codes(k) for k in range(3)]
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
    frames = [cfg.rgb_encoding.encode_bgr(_codes(k)) for k in range(3)]
    with (
        ArchiveWriter(archive_path(tmp_path, "rgb", REC.id)) as rgb,
        ArchiveWriter(archive_path(tmp_path, "flow", REC.id)) as fw,
    ):
        for f in frames:
            rgb.add(f)
        flow = FlowWriter(fw, cfg.flow_encoding)
        flow.add([_codes(10), _codes(11)])
        commit_archives(REC, cfg, video, (16, 16), {"rgb": rgb, "flow": fw}, flow, result)
    assert result["streams"] == {"rgb": 3, "flow": 2}
    assert result["flow_code_error"] == flow.error()
    rgb_meta, rgb_frames = read_archive(archive_path(tmp_path, "rgb", REC.id))
    flow_meta, flow_frames = read_archive(archive_path(tmp_path, "flow", REC.id))
    assert rgb_frames == frames and len(flow_frames) == 2
    assert rgb_meta == {
        **archive_meta(REC, "rgb", cfg, video, (16, 16)),
        "num_frames": 3,
        **({"partial": partial} if partial else {}),
    }
    assert flow_meta == {**archive_meta(REC, "flow", cfg, video, (16, 16)), "code_error": flow.error(), "num_frames": 2,
                         **({"partial": partial} if partial else {})}  # fmt: skip
