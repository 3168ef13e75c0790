"""report/stage_tables.py: the shard report, the verification and the preprocess report, rendered for real
(real shards of real JPEG archives, a real preprocess run, a rich ``Console(record=True)``) and read back row
by row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import verify_shards
from memdpc.pipeline.shard import ShardReport, run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import VideoRecord, write_index
from memdpc.report.stage_tables import (
    MAX_FAILURES,
    SKIPPED_LISTED,
    print_preprocess_report,
    print_shard_report,
    print_verify,
)

from ..conftest import write_jpeg_archive
from .conftest import recording_console, table_rows

CLIP = ClipSpec(num_blocks=2, block_len=2, stride=1)  # span 4 frames


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, ShardReport]:
    """rgb/train shards of 3 rendered videos (9, 9 and 3 frames: two windows each, one short video padded)
    and a video whose archive is missing (skipped)."""
    root = tmp_path_factory.mktemp("report_tables")
    records = []
    for g, n in enumerate((9, 9, 3)):
        vid = f"v_{g}"
        write_jpeg_archive(
            root / "archives", "rgb", vid, render_video(CLASSES[0], 16, n, np.random.default_rng(g)), 25.0
        )
        records.append(VideoRecord(vid, f"/nowhere/{vid}.avi", 0, CLASSES[0], "train"))
    records.append(VideoRecord("v_gone", "/nowhere/v_gone.avi", 0, CLASSES[0], "train"))
    report = run_shard(
        root / "archives",
        records,
        "rgb",
        root / "shards",
        "train",
        ShardSettings(clip=CLIP, window_step=4, max_count=2),
    )
    return root / "shards", report


def test_shard_report_row_and_skipped_videos(shards):
    _, r = shards
    assert (r.videos, r.samples, r.shards, r.short, len(r.skipped)) == (3, 5, 3, 1, 1)
    console = recording_console()
    print_shard_report(r, console)
    text = console.export_text()
    header, row = table_rows(text)
    assert header == ["videos", "samples", "shards", "GB", "samples/s", "short", "skipped"]
    assert row[:4] == ["3", "5", "3", f"{r.bytes / 1e9:.3f}"] and row[5:] == ["1", "1"]
    assert float(row[4]) == pytest.approx(r.samples / r.seconds, rel=0.05)
    title = text.split("┏")[0]  # rich wraps a title longer than the table
    assert "".join(line.strip() for line in title.splitlines()) == str(r.manifest)
    assert f"skipped v_gone: {r.skipped[0]['reason']}" in text


def test_kept_shards_are_counted_in_the_shards_cell(shards):
    _, r = shards
    console = recording_console()
    print_shard_report(ShardReport(r.manifest, 5, 3, videos=3, kept=2, seconds=1.0), console)
    assert table_rows(console.export_text())[1] == ["3", "5", "3 (2 kept)", "0.000", "5.0", "0", "0"]


def test_skipped_videos_are_counted_by_why_and_listed_up_to_a_limit_then_warnings_and_what_was_written(
    shards,
):
    _, r = shards
    failed = [
        {"video_id": f"v_f{i}", "kind": "failed", "reason": f"failed in preprocess: bad {i}"}
        for i in range(23)
    ]
    pending = [{"video_id": "v_p", "kind": "not-written", "reason": "/a/rgb/v_p.tar: not written yet"}]
    report = ShardReport(
        r.manifest,
        5,
        3,
        videos=3,
        skipped=failed + pending,
        warnings=["1 class has no samples"],
        next_step="memdpc train --stream rgb --shards s --out runs/rgb",
    )
    for next_step in (False, True):
        console = recording_console()
        print_shard_report(report, console, next_step=next_step)
        lines = console.export_text().splitlines()
        start = lines.index(
            "skipped 24 videos: 23 failed in preprocess; 1 not written yet (preprocess not run on "
            "them, or still running)"
        )
        assert lines[start + 1 : start + 2 + SKIPPED_LISTED] == [
            *(f"skipped v_f{i}: failed in preprocess: bad {i}" for i in range(SKIPPED_LISTED)),
            f"skipped … and 3 more failed in preprocess (all listed under 'skipped' in {r.manifest})",
        ]
        assert lines[start + 2 + SKIPPED_LISTED :] == [
            "skipped v_p: /a/rgb/v_p.tar: not written yet",
            "warning: 1 class has no samples",
            f"wrote {r.manifest} (5 samples of 3 videos in 3 shards)",
            *["next: memdpc train --stream rgb --shards s --out runs/rgb"] * next_step,
        ]


def test_verify_table_of_good_and_damaged_shards(shards, tmp_path):
    folder, r = shards
    console = recording_console()
    results = verify_shards(folder)
    assert print_verify(results, console) is True
    header, row = table_rows(console.export_text())
    assert header == ["manifest", "shards", "samples", "GB", "status"]
    assert row == [str(r.manifest), "3", "5", f"{r.bytes / 1e9:.3f}", "ok"]

    damaged = tmp_path / "shards"
    (damaged / "rgb").mkdir(parents=True)
    for p in (folder / "rgb").iterdir():
        (damaged / "rgb" / p.name).write_bytes(p.read_bytes())
    tar = damaged / "rgb" / "train-000001.tar"
    tar.write_bytes(tar.read_bytes()[:-1024])
    console = recording_console()
    results = verify_shards(damaged)
    assert print_verify(results, console) is False
    text = console.export_text()
    problems = results[0].problems
    assert table_rows(text)[1][-1] == f"{len(problems)} problems" and problems
    for p in problems:
        assert f"rgb/{p}" in text


def test_preprocess_report_names_what_it_wrote_what_comes_next_and_caps_the_failures(tiny_dataset, tmp_path):
    good = build_index(tiny_dataset, "ucf101", 1)[0]
    gone = [  # of the good video's class, which keeps a video
        VideoRecord(f"gone{i:02d}", str(tmp_path / f"gone{i:02d}.avi"), good.label, good.label_name, "train")
        for i in range(12)
    ]
    index, out = tmp_path / "index.jsonl", tmp_path / "out"
    write_index([good, *gone], index)
    report = preprocess(index, out, "rgb", size=0, progress=False)
    console, errors = recording_console(), recording_console()
    print_preprocess_report(report, index, console, errors)
    text = console.export_text()
    assert table_rows(text)[1][:5] == ["1", "0", "0", "12", "30"]  # done, partial, skipped, failed, frames
    assert f"wrote the archives of 1 video in {out / 'rgb'}; report {out / 'preprocess-report.jsonl'}" in text
    assert f"next: memdpc shard {out} --index {index} --stream rgb --out shards" in text
    failed = errors.export_text().splitlines()
    assert failed[:MAX_FAILURES] == [
        f"failed gone{i:02d} ({tmp_path / f'gone{i:02d}.avi'}): file not found" for i in range(MAX_FAILURES)
    ]
    assert failed[MAX_FAILURES:] == [f"… and 2 more failed videos, see {out / 'preprocess-report.jsonl'}"]


def test_preprocess_report_says_which_held_out_split_and_class_lost_a_video_and_how_to_draw_it_again(
    tiny_dataset, tmp_path
):
    good = build_index(tiny_dataset, "ucf101", 1)[:2]
    text = tmp_path / "shot-list.avi"
    text.write_text("shot list\n")
    held = [
        VideoRecord("t1", str(text), 1, "Walk", "test"),
        VideoRecord("t2", str(tmp_path / "gone.avi"), 1, "Walk", "test"),
        VideoRecord("v1", str(text), 0, "Run", "val"),
        VideoRecord(
            "x1", str(tmp_path / "gone.avi"), 0, "Run", "train"
        ),  # a training video: not a held-out loss
    ]
    index, out = tmp_path / "index.jsonl", tmp_path / "out"
    write_index([*good, *held], index)
    report = preprocess(index, out, "rgb", size=0, progress=False)
    assert [(f["id"], f["split"], f["label_name"]) for f in report.failures] == [
        ("t1", "test", "Walk"),
        ("t2", "test", "Walk"),
        ("v1", "val", "Run"),
        ("x1", "train", "Run"),
    ]
    console, errors = recording_console(), recording_console()
    print_preprocess_report(report, index, console, errors)
    assert errors.export_text().splitlines()[-1] == (
        "warning: held-out videos failed: test lost 2 videos of class 'Walk' (t1, t2); val lost 1 video of class "
        "'Run' (v1). A split that `memdpc index --test-per-class` or `--val-per-class` drew is drawn again by "
        "that command once the failed files are out of the dataset folder (or with another --seed); then run "
        "this command again (finished archives are kept)"
    )
    # every video of Walk in test, of Run in val and in train failed: shard would refuse those splits
    assert console.export_text().rstrip().splitlines()[-1] == (
        "next: not memdpc shard yet, which would refuse the splits that lost a class: test has no video of class "
        "'Walk' left (its 2 videos failed); train has no video of class 'Run' left (its one video failed); val has "
        "no video of class 'Run' left (its one video failed). Draw a held-out split again (see above), or repair "
        "or remove the failed files and index again; `memdpc shard … --allow-missing-classes` shards without those "
        "classes"
    )
    del report.failures[0]["split"]  # a report written before failures recorded their split: train's
    console, errors = recording_console(), recording_console()
    print_preprocess_report(report, index, console, errors)
    assert "test lost 1 video of class 'Walk' (t2)" in errors.export_text()
    assert "test has no video of class 'Walk' left" not in console.export_text()  # t1 is not counted


def test_the_stage_commands_tables_start_without_torch():
    """`memdpc shard` (and `--verify`) import these tables when they run: none of it imports torch, whose import
    would be most of such a command's start-up."""
    script = (
        "import sys\n"
        "import memdpc.commands.shard, memdpc.pipeline.manifest, memdpc.report.stage_tables\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
