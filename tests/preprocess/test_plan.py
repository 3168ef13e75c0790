"""``memdpc preprocess --dry-run`` on a user's messy folder: nothing written, and what it counts is what the run
then does (videos, frames, sizes, failures, the archives already there); its disk estimate is near what the
run writes; archives made with other settings are refused as the run refuses them."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.common.wording import size_text
from memdpc.preprocess import plan as plan_module
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.plan import choose_flow, disk_estimate, plan_preprocess
from memdpc.preprocess.run import PreprocessConfig, run_preprocess
from memdpc.preprocess.video_index import read_index, write_index

from .test_run import FAST as FAST_TVL1
from .test_run import FAST_FLAGS

FAST = TVL1Params(**FAST_TVL1)


@pytest.fixture(scope="module")
def messy_index(messy_folder, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "index.jsonl"
    write_index(build_index(messy_folder, "folder"), path)
    return path


def tree(root: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*")} if root.exists() else {}


def test_the_plan_writes_nothing_and_counts_what_the_run_then_does(messy_index, tmp_path, monkeypatch):
    out = tmp_path / "frames"
    cfg = PreprocessConfig(
        out=str(out),
        streams=("rgb", "flow"),
        decode=DecodeSpec(size=32),
        tvl1=FAST,
        flow_backend="opencv",
        workers=2,
    )
    records = read_index(messy_index)
    plan = plan_preprocess(records, cfg)
    backend = choose_flow(cfg).backend
    at_start = disk_estimate(records, cfg, backend)  # what the run compares with the free space at its start
    monkeypatch.setattr(plan_module, "ESTIMATE_VIDEOS", 6)
    sampled = disk_estimate(records, cfg, backend)  # from 6 of the 15 headers
    assert not out.exists()
    assert plan.videos == len(records) == 15 and plan.finished == 0 and plan.backend == "opencv"
    assert [Path(p).name for p, _ in plan.unreadable] == ["broken.avi"]  # cut.avi's header opens

    report = run_preprocess(records, cfg, progress=False)
    failed = {Path(f["path"]).name for f in report.failures}
    assert failed == {"broken.avi", "cut.avi"}  # cut.avi fails when decoded, as the plan cannot know
    headers = {h.id: h for h in plan.todo}
    done = [v for v in report.videos if v["status"] == "done"]
    assert len(done) == len(headers) - 1 == 13
    for v in done:  # frames, pairs and sizes by the headers are those written
        h = headers[v["id"]]
        assert (h.frames, h.frames - 1, h.size) == (
            v["streams"]["rgb"],
            v["streams"]["flow"],
            (v["width"], v["height"]),
        )
    assert len({h.size for h in plan.todo}) > 2  # landscape, portrait and square
    written = {s: sum(p.stat().st_size for p in (out / s).glob("*.tar")) for s in ("rgb", "flow")}
    cut = headers[next(v["id"] for v in report.videos if v["path"].endswith("cut.avi"))]
    for s in ("rgb", "flow"):  # JPEG sizes vary with the content: the first video stands for all
        estimate = plan.stream_bytes(s) * (
            1 - cut.frames * cut.pixels / sum(h.frames * h.pixels for h in plan.todo)
        )
        assert 0.5 < estimate / written[s] < 2, (s, estimate, written[s])
    assert (at_start.videos, at_start.todo, at_start.low, at_start.high) == (
        15,
        15,
        at_start.bytes,
        at_start.bytes,
    )
    assert 0.5 < at_start.bytes / sum(written.values()) < 2 and at_start.warning() is None  # room enough here
    assert (sampled.videos, sampled.todo) == (6, 15) and sampled.low < sampled.bytes < sampled.high
    warning = replace(sampled, free=1000).warning()
    assert warning.startswith(
        f"this run's archives will take about {size_text(sampled.bytes)} in {out} (95 % "
    )
    assert "from the headers of 6 of the 15 videos" in warning and "only 1.0 kB is free there" in warning
    assert (
        math.isfinite(plan.wall_s)
        and 0 < plan.wall_s <= plan.work_s
        and plan.parallel == min(2, plan.parallel)
    )
    lines = plan.lines()
    assert (
        lines[0].endswith("(a dry run: nothing written)")
        and lines[-1] == "next: the same command without --dry-run"
    )
    assert any(line.startswith("time: about ") and "an estimate on this machine" in line for line in lines)

    before = tree(out)
    again = plan_preprocess(records, cfg)  # a rerun would redo only the failed ones
    assert again.finished == 13 and [h.id for h in again.todo] == [cut.id]
    assert tree(out) == before
    with pytest.raises(UserError, match="made with other settings") as refused:
        plan_preprocess(records, replace(cfg, decode=DecodeSpec(size=24)))
    with pytest.raises(UserError) as run_refused:
        run_preprocess(records, replace(cfg, decode=DecodeSpec(size=24)), progress=False)
    assert str(refused.value) == str(run_refused.value)
    assert tree(out) == before


def test_the_cli_prints_the_plan_and_writes_nothing(messy_index, tmp_path):
    out = tmp_path / "frames"
    res = CliRunner().invoke(
        main,
        [
            "preprocess",
            "flow",
            str(messy_index),
            "--out",
            str(out),
            "--size",
            "32",
            "--flow-backend",
            "opencv",
            *FAST_FLAGS,
            "--dry-run",
        ],
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"plan of preprocess flow into {out} (a dry run: nothing written)"
    assert lines[1].startswith(
        "videos: 15: 14 to do, 1 unreadable (the run records them as failed): broken.avi: "
    )
    assert lines[2].startswith("frames: ") and "flow pairs; frame sizes " in lines[2]
    assert lines[3] == "flow: TV-L1 opencv, one video per process on cpu, 1 process"
    assert lines[4].startswith("disk: about ") and "(flow " in lines[4]
    assert not out.exists()
    res = CliRunner().invoke(
        main, ["preprocess", "flow", str(tmp_path / "none.jsonl"), "--out", str(out), "--dry-run"]
    )
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "none.jsonl" in res.output
    res = CliRunner().invoke(
        main, ["preprocess", "flow", str(messy_index), "--out", str(out), "--size", "-1", "--dry-run"]
    )
    assert res.exit_code == 2 and "--size" in res.output and not out.exists()
    res = CliRunner().invoke(
        main,
        [
            "preprocess",
            "flow",
            str(messy_index),
            "--out",
            str(out),
            "--flow-backend",
            "opencv",
            "--device",
            "cpu,cpu",
            "--dry-run",
        ],
    )  # refused as the run refuses it
    assert (
        res.exit_code == 2
        and "several devices need the batched flow stage" in res.output
        and not out.exists()
    )


def test_a_stream_added_later_is_the_only_one_planned(messy_index, tmp_path):
    """As the run decodes once more only for the missing archives, the plan counts only those."""
    cfg = PreprocessConfig(out=str(tmp_path), streams=("rgb",), decode=DecodeSpec(size=32), part=(0, 5))
    records = read_index(messy_index)
    run_preprocess(records, cfg, progress=False)
    both = replace(cfg, streams=("rgb", "flow"), tvl1=FAST, flow_backend="opencv")
    plan = plan_preprocess(records, both)
    assert plan.finished == 0 and len(plan.todo) == 3 and all(h.streams == ("flow",) for h in plan.todo)
    assert plan.stream_bytes("rgb") == 0 and plan.stream_bytes("flow") > 0
    assert plan_preprocess(records, cfg).todo == []
    assert plan_preprocess(records, cfg).lines()[-1] == (
        "nothing to convert: the same command without --dry-run writes the report"
    )
