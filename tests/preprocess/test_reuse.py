"""preprocess/reuse.py: what a rerun may reuse of an earlier run's archives, report lines and temporary archives,
and why not: the settings compared, the archives made otherwise and how they differ, what a job still has to
write, the command that remakes an archive, the temporaries removed and those left, the run's one check of
every video and its report lines. Real videos, real archives, real reports."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.atomic import tmp_name
from memdpc.common.errors import UserError
from memdpc.preprocess.archive import ArchiveWriter, archive_path, read_archive, write_archive
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import FLOW_ENCODING_RGB, JpegEncoding
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.report import ReportWriter, read_report
from memdpc.preprocess.reuse import (
    DECODE_SETTINGS,
    Rerun,
    Verdict,
    archive_differences,
    archive_settings,
    missing_streams,
    remake_command,
    remove_temporaries,
    setting_options,
    verdict,
)
from memdpc.preprocess.video_index import VideoRecord, write_index

from .conftest import CHEAP, made_with, texture_image


# ------------------------------------------------------------------------------- the settings compared
def test_the_settings_compared_are_those_that_change_the_frames_named_by_their_options():
    cfg = PreprocessConfig(out="o")
    rgb, flow = (setting_options(archive_settings(s, cfg)) for s in ("rgb", "flow"))
    assert rgb == {
        "frame size": (("size", 256), "--size 256"),
        "fps": (0.0, "--fps 0"),
        "encoding": ("jpeg-q90-420", "--quality 90"),
    }
    assert set(DECODE_SETTINGS) <= rgb.keys() & flow.keys()  # a video's two streams share them
    assert flow["encoding"] == ("jpeg-q100-planes", "--flow-encoding planes --flow-quality 100")
    assert flow["third channel"] == (128, "--third-channel 128") and flow["tvl1 lambda_"] == (
        0.15,
        "--lambda 0.15",
    )
    assert archive_settings("flow", cfg)["flow"]["backend"] == "auto"  # recorded, not compared
    assert not any("backend" in name for name in flow)


# ------------------------------------------------------------------------------------------- archives
@pytest.mark.parametrize(
    "stream, before, after, difference",
    [
        (
            "rgb",
            {"decode": DecodeSpec(size=64)},
            {"decode": DecodeSpec(square=64)},
            "--size 64 → --square 64",
        ),
        ("flow", {"decode": DecodeSpec(square=64)}, {"decode": DecodeSpec(size=0)}, "--square 64 → --size 0"),
        ("rgb", {}, {"decode": DecodeSpec(fps=12.5)}, "--fps 0 → --fps 12.5"),
        ("rgb", {}, {"rgb_encoding": JpegEncoding(75)}, "--quality 90 → --quality 75"),
        (
            "flow",
            {},
            {"flow_encoding": FLOW_ENCODING_RGB},
            "--flow-encoding planes --flow-quality 100 → --flow-encoding rgb --flow-quality 90",
        ),
        ("flow", {}, {"third_channel": 0}, "--third-channel 128 → --third-channel 0"),
        ("flow", {}, {"tvl1": replace(CHEAP, scales=3)}, "--scales 1 → --scales 3"),
        ("flow", {}, {"tvl1": replace(CHEAP, lambda_=0.1)}, "--lambda 0.15 → --lambda 0.1"),
        (
            "flow",
            {},
            {"tvl1": replace(CHEAP, inner_iterations=30)},
            "--inner-iterations 5 → --inner-iterations 30",
        ),
    ],
)
def test_archive_differences_name_the_options_that_differ(clip, stream, before, after, difference):
    rec, cfg = clip
    made_with(rec, stream, replace(cfg, **before))
    assert archive_differences(rec, stream, replace(cfg, **before)) == []
    assert archive_differences(rec, stream, replace(cfg, **after)) == [difference]


@pytest.mark.parametrize(
    "kw",
    [
        {"decode": DecodeSpec(size=128, square=64)},  # --size does nothing beside --square
        {"flow_backend": "torch", "device": "cpu"},  # every backend computes the same TV-L1
        {"workers": 4, "threads": 2, "keep_partial": True, "part": (1, 2), "strict": True},
    ],
)
def test_settings_that_do_not_change_an_archive_are_not_differences(clip, kw):
    rec, cfg = clip
    made_with(rec, "flow", replace(cfg, decode=DecodeSpec(square=64)))
    assert archive_differences(rec, "flow", replace(cfg, **{"decode": DecodeSpec(square=64), **kw})) == []


def test_an_archive_of_another_source_file_differs_and_one_of_the_same_bytes_elsewhere_does_not(
    clip, tmp_path
):
    """A video at another path is the archive's source where it holds its bytes (the folder moved or copied):
    the frames would be the same."""
    rec, cfg = clip
    made_with(rec, "rgb", cfg)
    elsewhere = tmp_path / "other" / "v_a.avi"
    elsewhere.parent.mkdir()
    body = bytearray(Path(rec.path).read_bytes())
    elsewhere.write_bytes(bytes(body))  # a copy: another modification time, the same bytes
    assert archive_differences(replace(rec, path=str(elsewhere)), "rgb", cfg) == []
    body[-1] ^= 1
    elsewhere.write_bytes(bytes(body))  # another folder's video with the same id and size
    assert archive_differences(replace(rec, path=str(elsewhere)), "rgb", cfg) == [
        f"source {rec.path} → {elsewhere}"
    ]


def test_a_source_file_changed_since_differs_and_one_gone_does_not(clip):
    rec, cfg = clip
    made_with(rec, "rgb", cfg)
    stat = os.stat(rec.path)
    os.utime(rec.path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))  # touched, same bytes
    assert archive_differences(rec, "rgb", cfg) == []  # the SHA-256 of its bytes says it is the same file
    body = bytearray(Path(rec.path).read_bytes())
    body[-1] ^= 1
    Path(rec.path).write_bytes(bytes(body))  # the same size, another byte
    (edited,) = archive_differences(rec, "rgb", cfg)
    assert edited.startswith(f"{rec.path} changed since (modified ") and ", content: SHA-256 " in edited
    with open(rec.path, "ab") as f:
        f.write(b"more")  # rewritten: another size too
    (rewritten,) = archive_differences(rec, "rgb", cfg)
    assert f"size {stat.st_size} → {stat.st_size + 4} bytes, modified " in rewritten
    os.unlink(rec.path)  # the videos were deleted after preprocessing: the archive is all there is
    assert archive_differences(rec, "rgb", cfg) == []


def test_an_older_or_unreadable_archive(clip):
    rec, cfg = clip
    path = archive_path(cfg.out, "rgb", rec.id)
    write_archive(
        path, [b"jpeg"], {"fps": 25.0, "stream": "rgb"}
    )  # settings not recorded: nothing to compare
    assert archive_differences(rec, "rgb", cfg) == []
    path.write_bytes(b"not a tar" * 200)
    (problem,) = archive_differences(rec, "rgb", cfg)
    assert problem.startswith("unreadable frame archive")


def test_a_verdict_names_the_missing_archives_and_how_the_others_differ(clip):
    rec, cfg = clip
    assert verdict(rec, cfg) == Verdict(rec, ("rgb", "flow"), ()) and not verdict(rec, cfg).done
    made_with(rec, "rgb", cfg)
    made_with(rec, "flow", replace(cfg, third_channel=0))
    other = verdict(rec, cfg)
    assert other == Verdict(rec, (), (("flow", ("--third-channel 0 → --third-channel 128",)),))
    assert not other.done
    made_with(rec, "flow", cfg)
    assert verdict(rec, cfg) == Verdict(rec, (), ()) and verdict(rec, cfg).done


def test_missing_streams_are_absent_archives_and_with_overwrite_those_made_otherwise(tmp_path, clip):
    rec, cfg = clip
    assert missing_streams(rec, cfg) == ["rgb", "flow"]  # no folders yet
    for stream in ("rgb", "flow"):
        made_with(rec, stream, cfg)
    assert missing_streams(rec, cfg) == missing_streams(rec, replace(cfg, overwrite=True)) == []
    other = replace(cfg, decode=DecodeSpec(square=64))
    assert missing_streams(rec, other) == []  # a run refuses them before (Rerun.check); this only lists work
    assert missing_streams(rec, replace(other, overwrite=True)) == ["rgb", "flow"]
    assert missing_streams(rec, replace(cfg, tvl1=TVL1Params(), overwrite=True)) == ["flow"]


def test_remake_command_writes_an_archive_again_as_it_was_made(clip, tmp_path):
    """The command shard names for an archive whose source file changed since: run, it writes the archive over
    the one there (--overwrite) from the file as it is now, with the settings the archive was made with (those
    other than the defaults given as options)."""
    rec, cfg = clip
    made = replace(cfg, decode=DecodeSpec(square=32), rgb_encoding=JpegEncoding(75))
    made_with(rec, "rgb", made)
    write_video(Path(rec.path), np.stack([texture_image(k) for k in (7, 8, 9, 10)]), 25.0, "mjpg")
    assert archive_differences(rec, "rgb", made) != []  # the file changed since
    index = tmp_path / "index.jsonl"
    write_index([rec], index)
    command = remake_command(str(index), cfg.out, rec.id)
    assert command == (
        f"memdpc preprocess frames {index} --out {cfg.out} --streams rgb --square 32 --quality 75 --overwrite"
    )
    res = CliRunner().invoke(main, command.split()[1:])
    assert res.exit_code == 0, res.output
    meta = read_archive(archive_path(cfg.out, "rgb", rec.id))[0]
    assert archive_differences(rec, "rgb", made) == [] and (meta["height"], meta["num_frames"]) == (32, 4)
    assert remake_command(str(index), cfg.out, "v_none").endswith("--streams rgb --overwrite")


# -------------------------------------------------------------------------------- temporary archives
def test_remove_temporaries_of_these_videos_only(tmp_path):
    (tmp_path / "flow").mkdir()
    done = archive_path(tmp_path, "flow", "v_a")
    mine = [tmp_path / "flow" / ".tmp-12345-v_a.tar", tmp_path / "flow" / ".tmp-7-v_b.tar"]
    others = [tmp_name(archive_path(tmp_path, "flow", "v_ab")), tmp_path / "flow" / ".tmp-x-v_a.tar", done]
    for p in (*mine, *others):
        p.write_bytes(b"half")
    assert remove_temporaries(tmp_path, ("rgb", "flow"), {"v_a", "v_b"}) == 2  # no rgb folder: nothing there
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)


def test_remove_temporaries_leaves_those_a_live_writer_holds(tmp_path):
    """The same command run twice on one folder: the second run's start leaves the first's archives in
    progress alone (their writer holds a lock on them), and the first commits them."""
    with ArchiveWriter(archive_path(tmp_path, "flow", "v_a")) as writer:
        writer.add(b"frame")
        assert remove_temporaries(tmp_path, ("flow",), {"v_a"}) == 0
        writer.commit({"stream": "flow"})
    assert read_archive(archive_path(tmp_path, "flow", "v_a"))[1] == [b"frame"]


# ------------------------------------------------------------------------------------------------ a run
@pytest.fixture
def three(clip) -> tuple[PreprocessConfig, VideoRecord, VideoRecord, VideoRecord]:
    """The clip's config and three videos of its file: one with both archives of the config, one with its rgb
    archive only, one whose flow archive was made with another third channel."""
    rec, cfg = clip
    done, half, other = (replace(rec, id=i) for i in ("v_done", "v_half", "v_other"))
    for r, stream, made in (
        (done, "rgb", cfg),
        (done, "flow", cfg),
        (half, "rgb", cfg),
        (other, "rgb", cfg),
        (other, "flow", replace(cfg, third_channel=0)),
    ):
        made_with(r, stream, made)
    return cfg, done, half, other


def test_a_run_checks_every_video_once_and_refuses_archives_made_otherwise(three):
    cfg, done, half, other = three
    stale = Path(tmp_name(archive_path(cfg.out, "flow", half.id)))
    stale.write_bytes(b"half an archive")  # a killed run's
    rerun = Rerun.check([done, half], cfg)
    assert (rerun.done, rerun.todo) == ([done], [half])
    with pytest.raises(UserError) as e:
        Rerun.check([done, half, other], cfg)
    assert str(e.value) == (
        f"1 archive in {cfg.out} was made with other settings or from another source, e.g. "
        f"{archive_path(cfg.out, 'flow', other.id)} (--third-channel 0 → --third-channel 128); rerun with "
        "--overwrite to rewrite them, or choose another --out"
    )
    rewrite = Rerun.check([done, half, other], replace(cfg, overwrite=True))
    assert (rewrite.done, rewrite.todo) == ([done], [half, other])
    assert stale.exists()  # the check touches nothing


def test_a_run_clears_the_temporaries_of_its_videos_to_do_only(three):
    cfg, done, half, other = three
    rerun = Rerun.check([done, half], cfg)
    left = {v: Path(tmp_name(archive_path(cfg.out, "flow", v))) for v in (done.id, half.id, "v_other_part")}
    for p in left.values():
        p.write_bytes(b"half an archive")
    assert rerun.clear_temporaries(finished={half.id}) == 0  # as it stops: the videos it finished are not its
    assert rerun.clear_temporaries() == 1  # as it starts
    assert {v for v, p in left.items() if p.exists()} == {done.id, "v_other_part"}


def test_report_lines_for_videos_converted_or_failed_and_none_for_one_skipped(clip):
    """An earlier frames run wrote the rgb archive; a frames-and-flow run then fails on the flow: its line names
    the flow stream alone, so the rgb archive is still described by the line of the run that wrote it."""
    rec, cfg = clip
    report = Path(cfg.out) / "preprocess-report.jsonl"
    with ReportWriter(report, {"config": {"streams": ["rgb"]}}) as log:
        log.video({"id": rec.id, "status": "done", "streams": {"rgb": 3}})
    made_with(rec, "rgb", cfg)
    rerun = Rerun.check([rec], cfg)
    failed = {"id": rec.id, "status": "failed", "reason": "no flow"}
    skipped = {"id": rec.id, "status": "skipped"}
    converted = {"id": rec.id, "status": "done", "streams": {"flow": 2}}
    assert (rerun.tried(failed), rerun.tried(converted)) == (["flow"], [])
    assert [rerun.gets_line(e) for e in (failed, skipped, converted)] == [True, False, True]
    with ReportWriter(report, {"config": {"streams": list(cfg.streams)}}) as log:
        for entry in (failed, skipped):
            if rerun.gets_line(entry):
                log.video(entry, rerun.tried(entry))
    merged = read_report(cfg.out)
    assert merged.entries("rgb")[rec.id]["status"] == "done"
    assert merged.entries("flow")[rec.id]["reason"] == "no flow"
