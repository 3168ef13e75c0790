"""The preprocess report's lines, as runs append them and readers merge them: per stream, across the reports of
a folder in order of the runs' starts, a line cut short passed over, and the earlier one-JSON format."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.report import REPORT, ReportWriter, failed_videos, read_report


def _run(path: Path, streams: list[str], *videos: dict, end: bool = True) -> str:
    """Append one run of ``streams`` with the entries ``videos`` (a failed one tried every stream of the run)."""
    with ReportWriter(path, {"command": "preprocess", "config": {"streams": streams}}) as log:
        for v in videos:
            log.video(v, streams)
        if end:
            log.end({"summary": {"videos": len(videos)}})
    return log.run


def _done(vid: str, **frames: int) -> dict:
    return {"id": vid, "path": f"/v/{vid}.avi", "status": "done", "streams": frames}


def _failed(vid: str, reason: str) -> dict:
    return {"id": vid, "path": f"/v/{vid}.avi", "status": "failed", "reason": reason, "streams": {}}


def test_each_stream_is_described_by_the_last_run_that_wrote_it_or_failed_to(tmp_path):
    path = tmp_path / REPORT
    frames = _run(path, ["rgb"], _done("a", rgb=9), _done("b", rgb=9), _failed("c", "moov atom not found"))
    flow = _run(
        path, ["flow"], _done("a", flow=8), _failed("b", "one frame"), _failed("c", "moov atom not found")
    )
    again = _run(path, ["rgb", "flow"], _done("c", rgb=9, flow=8))
    killed = _run(path, ["flow"], _failed("b", "killed"), end=False)
    report = read_report(tmp_path)
    assert [r["run"] for r in report.runs] == [frames, flow, again, killed]
    assert [r.get("summary") for r in report.runs] == [{"videos": 3}, {"videos": 3}, {"videos": 1}, None]
    runs = {vid: {s: e["run"] for s, e in by.items()} for vid, by in report.videos.items()}
    assert runs == {
        "a": {"rgb": frames, "flow": flow},
        "b": {"rgb": frames, "flow": killed},
        "c": {"rgb": again, "flow": again},
    }
    assert report.videos["b"]["flow"]["tried"] == ["flow"]
    assert failed_videos(tmp_path, "rgb") == {} and failed_videos(tmp_path, "flow") == {"b": "killed"}
    assert failed_videos(tmp_path) == {"b": "killed"}
    assert read_report(path).videos == report.videos  # the file itself, as its folder


def test_reports_of_parts_and_of_the_earlier_format_merge_in_order_of_the_runs_starts(tmp_path):
    earlier = tmp_path / "preprocess-report.json"
    videos = [_failed("a", "old reason"), _done("b", rgb=9), {"id": "c", "status": "skipped"}]
    earlier.write_text(
        json.dumps({"command": "preprocess", "config": {"streams": ["rgb"]}, "videos": videos})
    )
    os.utime(earlier, ns=(1, 1))  # written long before the runs below
    part1 = _run(tmp_path / "preprocess-report-part1of2.jsonl", ["rgb"], _failed("b", "gone since"))
    part0 = _run(tmp_path / "preprocess-report-part0of2.jsonl", ["rgb"], _done("a", rgb=9))
    report = read_report(tmp_path)
    assert [r["run"] for r in report.runs] == [f"{1:020d}-0", part1, part0]
    assert report.runs[0]["config"] == {"streams": ["rgb"]}
    assert {vid: by["rgb"]["status"] for vid, by in report.videos.items()} == {
        "a": "done",
        "b": "failed",
        "c": "skipped",
    }
    assert failed_videos(tmp_path, "rgb") == {"b": "gone since"} and failed_videos(tmp_path, "flow") == {}


def test_a_line_cut_short_is_passed_over_and_ended_by_the_next_run(tmp_path):
    path = tmp_path / REPORT
    first = _run(path, ["rgb"], _done("a", rgb=9))
    with open(path, "ab") as f:  # a kill, or a full disk, in the middle of a line
        f.write(b'{"kind": "video", "run": "0", "id": "b", "sta')
    second = _run(path, ["rgb"], _failed("b", "no frames"))
    assert path.read_bytes().count(b"\n") == 3 + 1 + 3
    report = read_report(path)
    assert [r["run"] for r in report.runs] == [first, second]
    assert report.videos["b"]["rgb"]["reason"] == "no frames"


def test_a_file_of_another_kind_is_refused_before_anything_is_appended(tmp_path):
    index = tmp_path / "index.jsonl"
    index.write_text('{"id": "a", "path": "/v/a.avi"}\n')
    with pytest.raises(UserError, match=r"index.jsonl: not a preprocess report of this memdpc version"):
        _run(index, ["rgb"], _done("a", rgb=9))
    assert index.read_text() == '{"id": "a", "path": "/v/a.avi"}\n'
    with pytest.raises(UserError, match=r"index.jsonl: unreadable preprocess report \(.*\); delete it"):
        read_report(index)
    (tmp_path / "preprocess-report.json").write_text("{broken")
    with pytest.raises(
        UserError, match=r"preprocess-report.json: unreadable preprocess report \(.*\); delete it"
    ):
        failed_videos(tmp_path)


def test_a_report_whose_first_line_was_cut_short_is_appended_to(tmp_path):
    path = tmp_path / REPORT
    path.write_bytes(b'{"kind": "run", "run": "0000-1", "command": "prep')  # the disk filled up at once
    run = _run(path, ["rgb"], _done("a", rgb=9))
    assert [r["run"] for r in read_report(path).runs] == [run]
