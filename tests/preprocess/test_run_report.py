"""What a preprocess run returns: a typed report whose summary counts its own entries, whose pairs are the flow
images in its archives, and whose failures name their split and class (real videos, one of them broken)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.report import read_report
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.run_report import RunReport, RunSummary
from memdpc.preprocess.video_index import write_index

FAST = {"scales": 2, "warps": 1, "outer_iterations": 2, "inner_iterations": 5}


def test_a_run_returns_its_summary_pairs_and_failures_typed(tiny_dataset, tmp_path):
    recs = build_index(tiny_dataset, "ucf101", 1)
    broken = tmp_path / Path(recs[0].path).name
    broken.write_bytes(Path(recs[0].path).read_bytes()[:300])  # a video cut short: its header only
    recs[0] = replace(recs[0], path=str(broken))
    index = tmp_path / "index.jsonl"
    write_index(recs, index)
    out = tmp_path / "frames"
    report = preprocess(index, out, "rgb,flow", size=0, tvl1=FAST, progress=False)

    assert isinstance(report, RunReport) and isinstance(report.config, PreprocessConfig)
    assert Path(report.config.out) == out and report.config.streams == ("rgb", "flow")
    s = report.summary
    assert (s.done, s.failed, s.skipped, s.pending, s.videos) == (len(recs) - 1, 1, 0, 0, len(recs))
    assert s.written == s.done + s.partial == len(recs) - 1
    assert [(f["id"], f["split"], f["label_name"]) for f in report.failures] == [
        (recs[0].id, recs[0].split, recs[0].label_name)
    ]
    on_disk = sum(len(read_archive(archive_path(out, "flow", r.id))[1]) for r in recs[1:])
    assert report.pairs() == on_disk > 0
    assert report.flow is not None and report.flow["backend"] in ("native", "opencv")
    assert read_report(out).runs[-1]["summary"] == asdict(s)  # what it returns is what it recorded

    again = preprocess(index, out, "rgb,flow", size=0, tvl1=FAST, progress=False)
    assert (again.summary.skipped, again.summary.done, again.summary.failed) == (len(recs) - 1, 0, 1)
    assert again.pairs() == 0  # nothing written: the skipped videos' archives were an earlier run's


def test_a_summary_counts_entries_by_status_and_sums_their_stages():
    entries = [
        {"status": "done", "num_frames": 30, "stages": {"decode": 0.5, "flow": 2.0}},
        {"status": "partial", "num_frames": 10, "stages": {"decode": 0.25}},
        {"status": "skipped"},
        {"status": "failed", "reason": "unreadable"},
    ]
    s = RunSummary.of(entries, seconds=4.0, pending=3)
    assert (s.done, s.partial, s.skipped, s.failed, s.pending, s.videos) == (1, 1, 1, 1, 3, 4)
    assert (s.frames, s.frames_per_s, s.written) == (40, 10.0, 2)
    assert s.stage_seconds == {"decode": 0.75, "flow": 2.0, "encode": 0.0}
    assert RunSummary.of([], seconds=0.0, pending=0).frames_per_s == 0.0
