"""Sharding: real frame archives in, real tar shards out, read back with tarfile, webdataset and DALI."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import pytest
from rich.console import Console

from memdpc.cli import EXIT_RESOURCE
from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.manifest import shard_paths, verify_shards
from memdpc.pipeline.shard import THROTTLE_ENV, run_shard, shard_stream
from memdpc.pipeline.shard_plan import ShardSettings, usable_frames
from memdpc.pipeline.shard_set import open_split
from memdpc.preprocess.archive import archive_path, read_archive, write_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import hold_out, write_index

from ..conftest import jpeg, run_memdpc
from ..limits import STOP_WITHIN

CLIP = ClipSpec()
NF = CLIP.num_frames


def read_samples(tar_path: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of a shard: key → {extension: bytes}, in tar order."""
    out: dict[str, dict[str, bytes]] = {}
    raw = tar_path.read_bytes()
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            header = raw[m.offset : m.offset + 512]
            assert header[257:263] == b"ustar\x00" and header[156:157] == b"0"  # plain USTAR file, no PAX
            key, ext = m.name.split(".", 1)
            out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def all_samples(shard_dir: Path, stream: str, split: str) -> dict[str, dict[str, bytes]]:
    out = {}
    for tar, _ in shard_paths(shard_dir, open_split(shard_dir, stream, split).manifest):
        out.update(read_samples(tar))
    return out


@pytest.fixture(scope="module")
def long_shards(long_archives, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("long_shards")
    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            shard_stream(
                long_archives.root,
                long_archives.records,
                stream,
                out,
                split,
                ShardSettings(max_count=3, seed=1),
            )
    return out


@pytest.mark.parametrize("stream", ["rgb", "flow"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_samples_hold_the_source_frames_at_the_stated_indices(long_archives, long_shards, stream, split):
    samples = all_samples(long_shards, stream, split)
    assert samples
    for key, parts in samples.items():
        info = json.loads(parts["json"])
        assert key == f"{info['video_id']}_{info['start']:05d}" and info["stream"] == stream
        _, frames = read_archive(archive_path(long_archives.root, stream, info["video_id"]))
        indices = CLIP.frame_indices(info["start"], usable_frames(stream, len(frames)))
        assert sorted(parts) == sorted([f"f{j:02d}.jpg" for j in range(NF)] + ["cls", "json"])
        for j, i in enumerate(indices):
            got = cv2.imdecode(np.frombuffer(parts[f"f{j:02d}.jpg"], np.uint8), cv2.IMREAD_COLOR)
            want = cv2.imdecode(np.frombuffer(frames[i], np.uint8), cv2.IMREAD_COLOR)
            np.testing.assert_array_equal(got, want)
            assert parts[f"f{j:02d}.jpg"] == frames[i]  # copied, never re-encoded
        assert struct.unpack("<i", parts["cls"])[0] == info["label"]


def test_windows_follow_the_clip_rule_and_streams_share_keys(long_archives, long_shards):
    for split, starts in (("train", lambda n: CLIP.train_starts(n, 20)), ("test", CLIP.eval_starts)):
        want = {
            f"{r.id}_{s:05d}"
            for r in long_archives.records
            if r.split == split
            for s in starts(r.num_frames - 1)
        }
        rgb, flow = all_samples(long_shards, "rgb", split), all_samples(long_shards, "flow", split)
        assert set(rgb) == set(flow) == want
    # a 200-frame video: 4 train windows; the 150-frame one: eval windows 0 only (149 − 120 < 59)
    assert {k for k in all_samples(long_shards, "rgb", "train") if "MoveLeft_g00" in k} == {
        f"v_MoveLeft_g00_{s:05d}" for s in (0, 20, 40, 60)
    }


def test_short_videos_are_padded_or_dropped(long_archives, tmp_path):
    pad = all_samples(long_shards_for(long_archives, tmp_path / "pad", "pad"), "rgb", "test")
    short_key = "v_MoveRight_g03_00000"  # 60 frames → 59 usable
    info = json.loads(pad[short_key]["json"])
    assert info["start"] == 0
    _, frames = read_archive(archive_path(long_archives.root, "rgb", "v_MoveRight_g03"))
    assert pad[short_key]["f19.jpg"] == frames[57]
    for j in range(20, NF):  # 3·j > 58: padded with the last usable frame
        assert pad[short_key][f"f{j:02d}.jpg"] == frames[58]
    drop_dir = long_shards_for(long_archives, tmp_path / "drop", "drop")
    assert short_key not in all_samples(drop_dir, "rgb", "test")
    assert open_split(drop_dir, "rgb", "test").manifest["num_short"] == 2


def test_short_videos_are_named_with_the_clip_stride_that_fits_them(long_archives, tiny_archives, tmp_path):
    """Videos shorter than one window are said to be, with the --clip-stride that would fit them (the paper's
    stride on short clips pads every window)."""
    what = "of the 4 videos are shorter than one window (120 frames: 8 blocks × 5 frames, --clip-stride 3)"
    report = run_shard(long_archives.root, long_archives.records, "rgb", tmp_path / "a", "test")
    assert (
        f"2 {what}: their windows repeat their last frame (--short pad); --clip-stride 1 fits every one of them, "
        "or --short drop leaves them out"
    ) in report.warnings
    report = run_shard(
        long_archives.root, long_archives.records, "rgb", tmp_path / "b", "test", ShardSettings(short="drop")
    )
    assert f"2 {what}: left out (--short drop); a smaller --clip-stride keeps them" in report.warnings
    report = run_shard(tiny_archives.root, tiny_archives.records, "rgb", tmp_path / "c", "train")
    assert (
        "all 6 videos are shorter than one window (120 frames: 8 blocks × 5 frames, --clip-stride 3): their "
        "windows repeat their last frame (--short pad); the shortest has 29 frames, fewer than one window's 40 "
        "frames even at --clip-stride 1, or --short drop leaves them out"
    ) in report.warnings
    report = run_shard(
        long_archives.root,
        long_archives.records,
        "rgb",
        tmp_path / "d",
        "test",
        ShardSettings(clip=ClipSpec(stride=1)),
    )
    assert not any("shorter than one window" in w for w in report.warnings)


def not_short(warnings: list[str]) -> list[str]:
    """The warnings but the one about videos shorter than one window (its own test above)."""
    return [w for w in warnings if "shorter than one window" not in w]


def long_shards_for(archives, out: Path, short: str) -> Path:
    shard_stream(archives.root, archives.records, "rgb", out, "test", ShardSettings(short=short))
    return out


def test_counts_match_manifest_and_verify_passes(tiny_shards, tiny_archives):
    for stream in ("rgb", "flow"):
        for split, n in (("train", 6), ("test", 3)):
            m = open_split(tiny_shards, stream, split).manifest
            per_shard = [len(read_samples(t)) for t, _ in shard_paths(tiny_shards, m)]
            assert per_shard == [s["num_samples"] for s in m["shards"]]
            assert sum(per_shard) == m["num_samples"] == n and m["num_videos"] == n
            assert m["classes"] == ["MoveRight", "MoveLeft", "MoveUp"] and m["frame_size"] == [32, 32]
            assert m["clip"] == CLIP.to_dict() and m["encoding"] == "jpeg"
    results = verify_shards(tiny_shards)
    assert len(results) == 4 and all(not r.problems for r in results)


def test_mixed_frame_sizes_are_recorded_per_sample_and_summarised(mixed_shards, mixed_archives):
    """Videos of three frame sizes (as preprocess's short-side --size gives for several aspect ratios): each
    sample's JSON holds its frame size, the manifest lists every size with its video and sample counts, and
    the one-size field is None."""
    sizes = {
        r.id: tuple(
            read_archive(archive_path(mixed_archives.root, "rgb", r.id))[0][k] for k in ("height", "width")
        )
        for r in mixed_archives.records
    }
    for stream in ("rgb", "flow"):
        m = open_split(mixed_shards, stream, "train").manifest
        assert m["frame_size"] is None
        assert m["frame_sizes"] == [
            {"height": 40, "width": 40, "videos": 2, "samples": 2},
            {"height": 48, "width": 64, "videos": 2, "samples": 2},
            {"height": 64, "width": 36, "videos": 2, "samples": 2},
        ]
        samples = all_samples(mixed_shards, stream, "train")
        for parts in samples.values():
            info = json.loads(parts["json"])
            h, w = cv2.imdecode(np.frombuffer(parts["f00.jpg"], np.uint8), cv2.IMREAD_COLOR).shape[:2]
            assert (info["height"], info["width"]) == (h, w) == sizes[info["video_id"]]
        test = open_split(mixed_shards, stream, "test").manifest
        assert [(s["height"], s["width"]) for s in test["frame_sizes"]] == [(48, 64), (64, 36)]
    assert not any(r.problems for r in verify_shards(mixed_shards))


def test_one_frame_size_is_also_the_manifests_frame_size(tiny_shards):
    m = open_split(tiny_shards, "rgb", "train").manifest
    assert m["frame_size"] == [32, 32]
    assert m["frame_sizes"] == [{"height": 32, "width": 32, "videos": 6, "samples": 6}]


def test_index_files_equal_wds2idx_output(tiny_shards, long_shards, tmp_path):
    tool = Path(sys.executable).parent / "wds2idx"
    # every long shard (both streams and splits) and the tiny RGB train shards: ~15 runs of the tool
    for idx in sorted(long_shards.glob("*/*.idx")) + sorted(tiny_shards.glob("rgb/train-*.idx")):
        ref = tmp_path / "ref.idx"
        subprocess.run([str(tool), str(idx.with_suffix(".tar")), str(ref)], check=True, capture_output=True)
        assert idx.read_bytes() == ref.read_bytes(), idx


def test_webdataset_reads_every_shard(tiny_shards):
    import webdataset as wds

    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            m = open_split(tiny_shards, stream, split).manifest
            for (tar, _), entry in zip(shard_paths(tiny_shards, m), m["shards"], strict=True):
                ds = wds.WebDataset(str(tar), shardshuffle=False, empty_check=False)
                samples = list(ds)
                assert len(samples) == entry["num_samples"]
                for s in samples:
                    assert sum(k.endswith(".jpg") for k in s) == NF
                    img = cv2.imdecode(np.frombuffer(s["f39.jpg"], np.uint8), cv2.IMREAD_COLOR)
                    assert img.shape == (32, 32, 3)
                    assert struct.unpack("<i", s["cls"])[0] == json.loads(s["json"])["label"]


def _dali_reader(paths: list[tuple[Path, Path]]):
    """A DALI CPU pipeline over the shards: raw f00, decoded f39, cls and json of one sample per run."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        outs = fn.readers.webdataset(
            paths=[str(t) for t, _ in paths],
            index_paths=[str(i) for _, i in paths],
            ext=[f"f{i:02d}.jpg" for i in range(NF)] + ["cls", "json"],
            missing_component_behavior="error",
        )
        return outs[0], fn.decoders.image(outs[NF - 1], device="cpu"), outs[NF], outs[NF + 1]

    return pipe()


def test_dali_cpu_pipeline_reads_every_shard(tiny_shards):
    for stream in ("rgb", "flow"):
        for split in ("train", "test"):
            m = open_split(tiny_shards, stream, split).manifest
            expected = all_samples(tiny_shards, stream, split)
            p = _dali_reader(shard_paths(tiny_shards, m))
            p.build()
            seen = set()
            for _ in range(m["num_samples"]):
                f00, f39, cls, info = (o.as_array()[0] for o in p.run())
                info = json.loads(bytes(info))
                key = f"{info['video_id']}_{info['start']:05d}"
                seen.add(key)
                assert bytes(f00) == expected[key]["f00.jpg"]
                assert f39.shape == (32, 32, 3)
                assert struct.unpack("<i", bytes(cls))[0] == info["label"]
            assert seen == set(expected)


def test_same_seed_gives_identical_shards_and_train_is_shuffled(long_archives, tmp_path):
    def run(out, seed):
        shard_stream(
            long_archives.root,
            long_archives.records,
            "rgb",
            out,
            "train",
            ShardSettings(max_count=3, seed=seed),
        )
        return {p.name: p.read_bytes() for p in sorted((out / "rgb").iterdir())}

    a, b, c = run(tmp_path / "a", 5), run(tmp_path / "b", 5), run(tmp_path / "c", 6)
    assert a == b
    assert a != c
    keys = [k for t in sorted((tmp_path / "a" / "rgb").glob("*.tar")) for k in read_samples(t)]
    videos = [k.rsplit("_", 1)[0] for k in keys]
    assert videos != sorted(videos) and len(set(videos[:3])) > 1  # mixed across videos, not index order


def test_max_size_bounds_every_shard(long_archives, tmp_path):
    m = load_manifest_of(long_archives, tmp_path, max_size=200_000)
    assert len(m["shards"]) > 1
    for s in m["shards"]:
        assert s["bytes"] <= 200_000 or s["num_samples"] == 1
        assert (tmp_path / "rgb" / s["name"]).stat().st_size == s["bytes"]


def load_manifest_of(archives, out, **kw):
    shard_stream(archives.root, archives.records, "rgb", out, "train", ShardSettings(**kw))
    return open_split(out, "rgb", "train").manifest


def _cli(*args: str, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from memdpc.cli import main; main()", "shard", *args]
    return subprocess.Popen(
        cmd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


@pytest.fixture(scope="module")
def flow_train_ref(long_archives, tmp_path_factory) -> Path:
    """flow/train shards of ``long_archives`` with --max-count 2 (5 shards), written without interruption from
    its index file (as the command line's runs below: the manifest records the index it was given)."""
    out = tmp_path_factory.mktemp("ref")
    run_shard(long_archives.root, long_archives.index, "flow", out, "train", ShardSettings(max_count=2))
    return out / "flow"


KILL_ARGS = ("--stream", "flow", "--max-count", "2")


def _wait_for_shards(out: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while len(list(out.glob("flow/train-*.tar"))) < n and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)


def _assert_same_files(out: Path, ref: Path) -> None:
    files = sorted(p.name for p in ref.iterdir())
    assert files == sorted(p.name for p in (out / "flow").iterdir())  # no temporary files left behind
    for name in files:
        assert (out / "flow" / name).read_bytes() == (ref / name).read_bytes(), name


@pytest.mark.slow
def test_kill_and_resume_gives_the_same_shards(long_archives, flow_train_ref, tmp_path):
    args = [str(long_archives.root), "--index", str(long_archives.index), *KILL_ARGS]
    out = tmp_path / "killed"
    proc = _cli(*args, "--out", str(out), env={THROTTLE_ENV: "0.3"})
    _wait_for_shards(out, 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in out.glob("flow/train-*.tar"))
    assert 2 <= len(done) < 5 and not (out / "flow" / "manifest-train.json").exists()
    resumed = _cli(*args, "--out", str(out))
    assert resumed.wait(timeout=120) == 0, resumed.stderr.read()
    assert "kept" in resumed.stdout.read().decode()
    _assert_same_files(out, flow_train_ref)


@pytest.mark.slow
def test_a_full_disk_stops_in_one_line_keeps_whole_shards_and_the_same_command_resumes(
    long_archives, flow_train_ref, small_disk
):
    """The shards on a real file system with 40 % of their space: a warning at the start (the plan knows every
    shard's size), one line and exit 74 at the first write that does not fit, whole shards kept with their
    index and checksum and nothing else; once space is freed the same command writes the shards of an
    undisturbed run. (Shard has no worker processes: a killed shard run is killed whole, as tested above.)"""
    need = sum(p.stat().st_size for p in flow_train_ref.iterdir())
    small_disk.resize(int(0.4 * need))
    out = small_disk.path / "shards"
    args = [str(long_archives.root), "--index", str(long_archives.index), *KILL_ARGS, "--out", str(out)]
    proc = _cli(*args, env={"COLUMNS": "200"})
    assert proc.wait(timeout=120) == EXIT_RESOURCE
    err = proc.stderr.read().decode()
    assert "Traceback" not in err and "warning: the flow/train shards still to write take" in err, err
    lines = [line for line in err.splitlines() if line.startswith("stopped:")]
    line = re.fullmatch(
        rf"stopped: no space left on the file system of {re.escape(str(out / 'flow'))}, writing \S+ "
        r"\(\d[\d.]* k?B free there now\); (\d) of 5 shards of flow/train written, kept; free space there, then "
        r"the same command resumes",
        lines[0] if len(lines) == 1 else "",
    )
    assert line, err
    written = sorted(p.name for p in out.glob("flow/train-*.tar"))
    assert len(written) == int(line[1]) < 5 and not (out / "flow" / "manifest-train.json").exists()
    kept = sorted(p.name for p in (out / "flow").iterdir())
    assert kept == sorted(
        ["plan-train.json"] + [n.replace(".tar", ext) for n in written for ext in (".tar", ".idx", ".sha256")]
    )
    for name in kept:
        assert (out / "flow" / name).read_bytes() == (flow_train_ref / name).read_bytes(), name
    small_disk.resize(2 * need + (1 << 20))
    resumed = _cli(*args)
    assert resumed.wait(timeout=120) == 0, resumed.stderr.read()
    _assert_same_files(out, flow_train_ref)


@pytest.mark.slow
def test_sigint_and_sigterm_stop_within_seconds_say_what_was_kept_and_the_rerun_completes(
    long_archives, flow_train_ref, tmp_path
):
    args = [str(long_archives.root), "--index", str(long_archives.index), *KILL_ARGS, "--out", str(tmp_path)]
    for sig, code, at_least in ((signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 3)):
        proc = _cli(*args, env={THROTTLE_ENV: "0.3"})
        _wait_for_shards(tmp_path, at_least, proc)
        sent = time.time()
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == code and time.time() - sent < STOP_WITHIN
        done = len(list(tmp_path.glob("flow/train-*.tar")))
        assert at_least <= done < 5 and not (tmp_path / "flow" / "manifest-train.json").exists()
        err = proc.stderr.read().decode()
        note = f"interrupted ({sig.name}): {done} of 5 shards of flow/train written; the same command resumes"
        assert note in err
        assert "Traceback" not in err
    resumed = _cli(*args)
    assert resumed.wait(timeout=120) == 0, resumed.stderr.read()
    _assert_same_files(tmp_path, flow_train_ref)


def test_resume_keeps_complete_shards_and_rewrites_damaged_ones(long_archives, tmp_path):
    settings = ShardSettings(max_count=2)
    first = run_shard(long_archives.root, long_archives.records, "rgb", tmp_path, "train", settings)
    tars = sorted((tmp_path / "rgb").glob("*.tar"))
    originals = [t.read_bytes() for t in tars]
    tars[0].write_bytes(originals[0][:-2000])  # truncated
    flipped = bytearray(originals[1])
    flipped[3000] ^= 0xFF  # same size and layout, damaged JPEG data: caught by the .sha256 file
    tars[1].write_bytes(bytes(flipped))
    tars[2].unlink()  # missing
    again = run_shard(long_archives.root, long_archives.records, "rgb", tmp_path, "train", settings)
    assert (again.written, again.kept, again.rewritten) == (3, first.shards - 3, 2)
    assert [t.read_bytes() for t in tars] == originals
    assert not any(r.problems for r in verify_shards(tmp_path))


def test_refuses_an_output_folder_of_another_configuration(long_archives, tmp_path):
    shard_stream(long_archives.root, long_archives.records, "rgb", tmp_path, "train", ShardSettings(seed=0))
    with pytest.raises(UserError, match="another configuration.*seed"):
        shard_stream(
            long_archives.root, long_archives.records, "rgb", tmp_path, "train", ShardSettings(seed=1)
        )
    with pytest.raises(UserError, match="another configuration.*input"):
        shard_stream(
            long_archives.root, long_archives.records[1:], "rgb", tmp_path, "train", ShardSettings(seed=0)
        )
    foreign = tmp_path / "foreign"
    (foreign / "rgb").mkdir(parents=True)
    (foreign / "rgb" / "train-000000.tar").write_bytes(b"")
    with pytest.raises(UserError, match="without a memdpc plan"):
        shard_stream(long_archives.root, long_archives.records, "rgb", foreign, "train")


def _copy_archives(archives, tmp_path: Path) -> Path:
    root = tmp_path / "archives"
    for stream in ("rgb", "flow"):
        (root / stream).mkdir(parents=True)
        for p in (archives.root / stream).glob("*.tar"):
            (root / stream / p.name).write_bytes(p.read_bytes())
    return root


def test_bad_archives_are_skipped_and_reported_or_refused_with_strict(long_archives, tmp_path):
    root = _copy_archives(long_archives, tmp_path)
    test_ids = [r.id for r in long_archives.records if r.split == "test"]
    archive_path(root, "rgb", test_ids[0]).unlink()  # missing
    data = archive_path(root, "rgb", test_ids[1]).read_bytes()
    archive_path(root, "rgb", test_ids[1]).write_bytes(data[: len(data) // 2])  # truncated
    archive_path(root, "rgb", test_ids[2]).write_bytes(b"not a tar at all" * 100)  # corrupt
    report = run_shard(
        root, long_archives.records, "rgb", tmp_path / "out", "test", allow_missing_classes=True
    )  # one class is left without samples
    reasons = {s["video_id"]: s["reason"] for s in report.skipped}
    assert set(reasons) == set(test_ids[:3])
    assert "not written yet" in reasons[test_ids[0]]
    assert reasons[test_ids[1]] and reasons[test_ids[2]]
    m = open_split(tmp_path / "out", "rgb", "test").manifest
    assert m["num_videos"] == 1 and m["skipped"] == report.skipped
    with pytest.raises(UserError, match=test_ids[0]):
        run_shard(root, long_archives.records, "rgb", tmp_path / "strict", "test", strict=True)


def test_archive_with_fewer_frames_than_the_index_is_skipped(long_archives, tmp_path):
    records = [r for r in long_archives.records if r.split == "test"]
    records[0].num_frames += 5
    try:
        report = run_shard(long_archives.root, records, "flow", tmp_path, "test")
    finally:
        records[0].num_frames -= 5
    assert [s["video_id"] for s in report.skipped] == [records[0].id]
    assert "index says" in report.skipped[0]["reason"]


def test_cli_shards_verifies_and_reports_user_errors(tiny_archives, tmp_path):
    from click.testing import CliRunner

    from memdpc.cli import main

    runner = CliRunner(env={"COLUMNS": "200"})
    out = tmp_path / "shards"
    args = ["shard", str(tiny_archives.root), "--index", str(tiny_archives.index), "--out", str(out)]
    res = runner.invoke(main, [*args, "--stream", "rgb", "--split", "test", "--max-count", "2"])
    assert res.exit_code == 0, res.output
    assert "samples/s" in res.output and "skipped" in res.output
    res = runner.invoke(main, ["shard", "--verify", str(out)])
    assert res.exit_code == 0 and "ok" in res.output
    tar = out / "rgb" / "test-000001.tar"
    data = bytearray(tar.read_bytes())
    data[1000] ^= 0xFF
    tar.write_bytes(bytes(data))
    res = runner.invoke(main, ["shard", "--verify", str(out)])
    assert res.exit_code == 1 and "SHA-256" in res.output
    res = runner.invoke(main, [*args, "--stream", "rgb", "--split", "test", "--max-count", "3"])
    assert res.exit_code == 2 and "another configuration" in res.output and "Traceback" not in res.output
    res = runner.invoke(main, ["shard", str(tiny_archives.root), "--stream", "rgb"])
    assert res.exit_code == 2 and "--index" in res.output


def test_split_all_takes_every_video_with_train_windows(long_archives, tmp_path):
    shard_stream(
        long_archives.root, long_archives.records, "flow", tmp_path, "all", ShardSettings(window_step=30)
    )
    samples = all_samples(tmp_path, "flow", "all")
    want = {f"{r.id}_{s:05d}" for r in long_archives.records for s in CLIP.train_starts(r.num_frames - 1, 30)}
    assert set(samples) == want
    assert {json.loads(p["json"])["split"] for p in samples.values()} == {"train", "test"}
    m = open_split(tmp_path, "flow", "all").manifest
    assert m["windows"]["mode"] == "train" and m["windows"]["window_step"] == 30


def test_cli_index_line_without_label_is_a_one_line_error(tiny_archives, tmp_path):
    from click.testing import CliRunner

    from memdpc.cli import main

    lines = tiny_archives.index.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["label"]
    index = tmp_path / "index.jsonl"
    index.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    args = [
        "shard",
        str(tiny_archives.root),
        "--index",
        str(index),
        "--stream",
        "rgb",
        "--out",
        str(tmp_path),
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and f"{index}:2" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "rgb").exists()


def test_cli_clip_geometry_options_reach_the_samples(tiny_archives, tmp_path):
    from click.testing import CliRunner

    from memdpc.cli import main

    out = tmp_path / "shards"
    args = [
        "shard",
        str(tiny_archives.root),
        "--index",
        str(tiny_archives.index),
        "--out",
        str(out),
        "--stream",
        "rgb",
        "--split",
        "test",
        "--blocks",
        "4",
        "--block-len",
        "3",
        "--clip-stride",
        "1",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    manifest = open_split(out, "rgb", "test").manifest
    assert manifest["clip"] == {"num_blocks": 4, "block_len": 3, "stride": 1}
    with tarfile.open(out / "rgb" / manifest["shards"][0]["name"]) as tar:
        names = tar.getnames()
    key = names[0].split(".")[0]
    assert sorted(n for n in names if n.startswith(key + ".f")) == [f"{key}.f{i:02d}.jpg" for i in range(12)]


def _run_cli(*args: str):
    from click.testing import CliRunner

    from memdpc.cli import main

    return CliRunner(env={"COLUMNS": "300"}).invoke(main, ["shard", *map(str, args)])


def test_a_class_left_without_samples_is_refused_before_anything_is_written_or_allowed_with_a_warning(
    tiny_archives, tmp_path
):
    """The test split's videos of two classes: one failed in preprocess, one not written yet (preprocess still
    running). shard refuses (exit 2, no shard, no "next"); --allow-missing-classes writes the others and says
    what is missing, each video told apart by why."""
    root = _copy_archives(tiny_archives, tmp_path)
    failed, pending, kept = [r for r in tiny_archives.records if r.split == "test"]
    for r in (failed, pending):
        archive_path(root, "rgb", r.id).unlink()
    videos = [
        {"id": failed.id, "status": "failed", "reason": "moov atom not found"},
        {"id": kept.id, "status": "done"},
    ]
    (root / "preprocess-report.json").write_text(json.dumps({"videos": videos}))
    out = tmp_path / "shards"
    args = [root, "--index", tiny_archives.index, "--stream", "rgb", "--out", out, "--split", "test"]
    res = run_memdpc("shard", *args)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"Error: {tiny_archives.index}: rgb/test would have no samples of 2 classes: {failed.label_name}, "
        f"{pending.label_name} (their 2 videos: 1 failed in preprocess; 1 not written yet (preprocess not run on "
        f"them, or still running); e.g. {failed.id}: failed in preprocess: moov atom not found); shard once "
        "preprocess has written them (a held-out split: see preprocess's summary to draw it again), or add "
        "--allow-missing-classes to shard without them"
    )
    assert "next:" not in res.stdout + res.stderr
    assert not (out / "rgb").exists() or not any((out / "rgb").iterdir())

    res = run_memdpc("shard", *args, "--allow-missing-classes")
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if "shorter than one window" not in line]
    expected = [
        "skipped 2 videos: 1 failed in preprocess; 1 not written yet (preprocess not run on them, or still "
        "running)",
        f"skipped {failed.id}: failed in preprocess: moov atom not found",
        f"skipped {pending.id}: {archive_path(root, 'rgb', pending.id)}: not written yet (preprocess not run on "
        "it, or still running)",
        f"warning: 1 of the 3 test videos has no rgb archive yet (preprocess not run on them, or still running; "
        f"e.g. {pending.id}): these shards leave them out; once preprocess has finished, run the same command "
        "with --overwrite",
        f"warning: rgb/test has no samples of 2 classes with training videos: {failed.label_name}, "
        f"{pending.label_name} (retrieval and the kNN monitor on this split leave them out)",
        f"wrote {out / 'rgb' / 'manifest-test.json'} (1 sample of 1 video in 1 shard)",
        "next: the same command with --split train",
    ]
    assert lines[-len(expected) :] == expected
    manifest = open_split(out, "rgb", "test").manifest
    kinds = [(s["video_id"], s["kind"]) for s in manifest["skipped"]]
    assert kinds == [(failed.id, "failed"), (pending.id, "not-written")]


def test_a_class_without_training_samples_is_refused_and_a_video_left_out_of_a_kept_class_is_a_warning(
    tiny_archives, tmp_path
):
    root = _copy_archives(tiny_archives, tmp_path)
    gone = [r for r in tiny_archives.records if r.split == "train" and r.label == 2]
    archive_path(root, "flow", gone[0].id).unlink()  # one of the class's two: the class keeps samples
    report = run_shard(root, tiny_archives.records, "flow", tmp_path / "one", "train")
    assert not_short(report.warnings) == [
        f"1 of the 6 train videos has no flow archive yet (preprocess not run on them, or still running; e.g. "
        f"{gone[0].id}): these shards leave them out; once preprocess has finished, run the same command with "
        "--overwrite",
    ]
    archive_path(root, "flow", gone[1].id).unlink()
    with pytest.raises(
        UserError, match=rf"flow/train would have no samples of 1 class: {gone[0].label_name} "
    ):
        run_shard(root, tiny_archives.records, "flow", tmp_path / "shards", "train")
    assert not (tmp_path / "shards" / "flow").exists()
    report = run_shard(
        root, tiny_archives.records, "flow", tmp_path / "shards", "train", allow_missing_classes=True
    )
    assert not_short(report.warnings)[1:] == [f"1 class has no samples in flow/train: {gone[0].label_name}"]
    train = f"memdpc train --stream flow --shards {tmp_path / 'shards'} --out runs/flow"
    assert report.next_step == (
        f"the same command with --split test (evaluation tests on it; train validates on it), then {train}"
    )


def test_the_next_step_is_a_split_of_the_index_not_sharded_yet(tiny_archives, tmp_path):
    """Only splits the index has; val (held out by memdpc index --val-per-class) before test; then training."""
    out = tmp_path / "shards"
    train = f"memdpc train --stream rgb --shards {out} --out runs/rgb"
    with_val = hold_out(tiny_archives.records, val_per_class=1)
    no_test = [r for r in with_val if r.split != "test"]
    assert run_shard(tiny_archives.root, no_test, "rgb", out, "train").next_step == (
        f"the same command with --split val (train validates on it), then {train}"
    )
    assert run_shard(tiny_archives.root, with_val, "rgb", out, "val").next_step == (
        f"the same command with --split test (evaluation tests on it), then {train}"
    )
    assert run_shard(tiny_archives.root, no_test, "rgb", out, "val").next_step == train


def _shard_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_archives_changed_since_the_plan_are_refused_and_overwrite_rewrites_the_split(
    long_archives, tmp_path
):
    root = _copy_archives(long_archives, tmp_path)
    test = [r for r in long_archives.records if r.split == "test"]
    out = tmp_path / "shards"
    run_shard(root, long_archives.records, "rgb", out, "test", ShardSettings(max_count=1))
    before = _shard_files(out / "rgb")
    meta, frames = read_archive(archive_path(root, "rgb", test[1].id))  # preprocess again, at another quality
    lower = [jpeg(cv2.imdecode(np.frombuffer(f, np.uint8), cv2.IMREAD_COLOR), quality=50) for f in frames]
    write_archive(archive_path(root, "rgb", test[1].id), lower, meta)
    res = _run_cli(
        root,
        "--index",
        long_archives.index,
        "--stream",
        "rgb",
        "--out",
        out,
        "--split",
        "test",
        "--max-count",
        "1",
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.splitlines()[-1] == (
        f"Error: {out / 'rgb'}: 1 of the 4 archives of its test shards changed since they were planned (e.g. "
        f"{test[1].id}: its archive was rewritten since); add --overwrite to rewrite the test shards, or use "
        "another --out"
    )
    assert _shard_files(out / "rgb") == before  # refused: nothing touched
    again = run_shard(
        root, long_archives.records, "rgb", out, "test", ShardSettings(max_count=1), overwrite=True
    )
    assert (again.kept, again.written) == (0, 4)
    run_shard(root, long_archives.records, "rgb", tmp_path / "fresh", "test", ShardSettings(max_count=1))
    assert _shard_files(out / "rgb") == _shard_files(tmp_path / "fresh" / "rgb") != before
    # an archive written since (sharded while preprocess still ran), then other options: fewer shards, no leftovers
    archive_path(root, "rgb", test[0].id).rename(tmp_path / "later.tar")
    run_shard(root, long_archives.records, "rgb", out, "test", ShardSettings(max_count=1), overwrite=True)
    (tmp_path / "later.tar").rename(archive_path(root, "rgb", test[0].id))
    with pytest.raises(UserError, match=f"e.g. {test[0].id}: its archive was written since"):
        run_shard(root, long_archives.records, "rgb", out, "test", ShardSettings(max_count=1))
    run_shard(root, long_archives.records, "rgb", out, "test", ShardSettings(max_count=3), overwrite=True)
    run_shard(root, long_archives.records, "rgb", tmp_path / "fresh3", "test", ShardSettings(max_count=3))
    assert _shard_files(out / "rgb") == _shard_files(tmp_path / "fresh3" / "rgb")
    assert not any(r.problems for r in verify_shards(out))


def test_progress_counts_frames(long_archives, tmp_path):
    console = Console(file=io.StringIO(), width=200)
    report = run_shard(
        long_archives.root,
        long_archives.records,
        "flow",
        tmp_path,
        "train",
        ShardSettings(max_count=2),
        console=console,
    )
    total = report.samples * NF
    assert "flow/train: write shards" in console.file.getvalue()
    assert f" {total}/{total} frames · " in console.file.getvalue() and "frames/s" in console.file.getvalue()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda t: (t / "nope", t / "index.jsonl"), "{root}: frame archive folder not found; give the --out"),
        (lambda t: (t, t / "clip.mp4"), "{index}: is a video file, not a video index;"),
        (lambda t: (t, t), "{index}: is a folder, not a video index; `memdpc index {index} --layout folder`"),
    ],
    ids=["missing archive folder", "video as index", "folder as index"],
)
def test_cli_mistakes_are_one_line_errors_with_the_next_step(tiny_archives, tmp_path, make, message):
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)))
    (tmp_path / "index.jsonl").write_text(tiny_archives.index.read_text())
    root, index = make(tmp_path)
    res = _run_cli(root, "--index", index, "--stream", "rgb", "--out", tmp_path / "shards")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.splitlines()[-1].startswith("Error: " + message.format(root=root, index=index))
    assert not (tmp_path / "shards").exists()


def test_shards_of_another_split_cut_from_archives_of_other_settings_are_a_warning(long_archives, tmp_path):
    root = _copy_archives(long_archives, tmp_path)
    for r in long_archives.records:
        for stream in ("rgb", "flow"):
            meta, frames = read_archive(archive_path(root, stream, r.id))
            size = 16 if r.split == "test" or stream == "flow" else 32  # rgb/train from a --size 32 rerun
            write_archive(archive_path(root, stream, r.id), frames, {**meta, "decode": {"size": size}})
    out = tmp_path / "shards"
    assert not_short(run_shard(root, long_archives.records, "rgb", out, "test").warnings) == []
    assert not_short(run_shard(root, long_archives.records, "flow", out, "train").warnings) == []
    assert not_short(run_shard(root, long_archives.records, "rgb", out, "train").warnings) == [
        f"the rgb/test shards in {out} were cut from archives of other settings (--size 16, these --size 32): "
        "shard rgb/test again with --overwrite",
        f"the flow/train shards in {out} were cut from archives of other settings (--size 16, these --size 32): "
        "shard flow/train again with --overwrite",
    ]


def test_a_damaged_plan_file_is_named(tiny_archives, tmp_path):
    out = tmp_path / "shards"
    run_shard(tiny_archives.root, tiny_archives.records, "rgb", out, "test")
    plan = out / "rgb" / "plan-test.json"
    plan.write_text("{cut")
    with pytest.raises(UserError) as e:
        run_shard(tiny_archives.root, tiny_archives.records, "rgb", out, "test")
    assert str(e.value) == (
        f"{plan}: unreadable plan of the test shards in {out / 'rgb'}; add --overwrite to "
        "rewrite the test shards, or use another --out"
    )
    run_shard(tiny_archives.root, tiny_archives.records, "rgb", out, "test", overwrite=True)
    assert json.loads(plan.read_text())["config"]["split"] == "test"


def test_an_index_naming_other_files_for_the_archives_ids_is_refused_naming_both(tiny_dataset, tmp_path):
    """``shard FRAMES --index OTHER.jsonl``: an index of another folder whose ids are those of the archives (other
    videos of the same names: here copies with one byte changed) is refused as preprocess refuses it, naming both
    files; the right one shards."""
    records = build_index(tiny_dataset, "ucf101", 1)
    write_index(records, tmp_path / "index.jsonl")
    preprocess(tmp_path / "index.jsonl", tmp_path / "frames", "rgb", size=32, workers=1, progress=False)
    other = build_index(shutil.copytree(tiny_dataset, tmp_path / "copy"), "ucf101", 1)
    for rec in other:
        body = bytearray(Path(rec.path).read_bytes())
        body[-1] ^= 1
        Path(rec.path).write_bytes(bytes(body))
    write_index(other, tmp_path / "other.jsonl")
    assert [r.id for r in other] == [r.id for r in records]
    with pytest.raises(UserError, match=r"made with other settings or from another source"):
        preprocess(tmp_path / "other.jsonl", tmp_path / "frames", "rgb", size=32, workers=1, progress=False)
    out = tmp_path / "shards"
    res = _run_cli(tmp_path / "frames", "--index", tmp_path / "other.jsonl", "--stream", "rgb", "--out", out)
    first, mine = next(r for r in other if r.split == "train"), next(r for r in records if r.split == "train")
    assert res.exit_code == 2 and res.output.splitlines()[-1] == (
        f"Error: {tmp_path / 'other.jsonl'}: the archives of 6 of its 6 train videos were made from other files "
        f"than it names (e.g. {archive_path(tmp_path / 'frames', 'rgb', first.id)} from {mine.path}, but the index "
        f"names {first.path} for {first.id}); give the index those archives were made with, or preprocess this "
        "one into another frames folder"
    )
    assert not out.exists()  # refused before anything was written
    res = _run_cli(tmp_path / "frames", "--index", tmp_path / "index.jsonl", "--stream", "rgb", "--out", out)
    assert res.exit_code == 0, res.output
    assert open_split(out, "rgb", "train").manifest["provenance"]["index"]["path"] == str(
        tmp_path / "index.jsonl"
    )


def test_an_index_that_gives_a_video_another_class_is_not_resumed_over(long_archives, tmp_path):
    out = tmp_path / "shards"
    run_shard(long_archives.root, long_archives.records, "rgb", out, "train", ShardSettings(max_count=2))
    plan = out / "rgb" / "plan-train.json"
    older = {k: v for k, v in json.loads(plan.read_text()).items() if k != "labels_sha256"}
    plan.write_text(json.dumps(older))  # a plan written before plans recorded the labels: resumed as before
    again = run_shard(
        long_archives.root, long_archives.records, "rgb", out, "train", ShardSettings(max_count=2)
    )
    assert (again.kept, again.written) == (again.shards, 0)
    assert "labels_sha256" in json.loads(plan.read_text())
    first = next(r for r in long_archives.records if r.split == "train")
    other = next(r for r in long_archives.records if r.label != first.label)
    relabelled = [
        replace(r, label=other.label, label_name=other.label_name) if r is first else r
        for r in long_archives.records
    ]
    with pytest.raises(UserError) as e:
        run_shard(long_archives.root, relabelled, "rgb", out, "train", ShardSettings(max_count=2))
    assert str(e.value) == (
        f"{out / 'rgb'}: holds train shards planned when the index gave some of their videos other classes; add "
        "--overwrite to rewrite the train shards, or use another --out"
    )
    run_shard(long_archives.root, relabelled, "rgb", out, "train", ShardSettings(max_count=2), overwrite=True)
    samples = all_samples(out, "rgb", "train")
    labels = {struct.unpack("<i", s["cls"])[0] for k, s in samples.items() if k.rsplit("_", 1)[0] == first.id}
    assert labels == {other.label}


def test_a_video_changed_since_its_archive_was_made_is_refused_naming_the_command_that_remakes_it(
    tiny_dataset, tmp_path
):
    """A video replaced by another file at its path, or whose bytes changed at the same size, is refused in one
    line naming it and the preprocess command that remakes its archives; that very command, then the same shard
    command, go on. A video only touched (another time, the same bytes: its SHA-256 tells) is not a change."""
    data = shutil.copytree(tiny_dataset, tmp_path / "data")
    records = build_index(data, "ucf101", 1)
    write_index(records, tmp_path / "index.jsonl")
    frames, out = tmp_path / "frames", tmp_path / "shards"
    preprocess(tmp_path / "index.jsonl", frames, "rgb", size=24, workers=1, progress=False)
    train = [r for r in records if r.split == "train"]
    touched, replaced = Path(train[0].path), Path(train[1].path)
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    before = replaced.stat().st_size
    shutil.copyfile(next(r.path for r in records if r.split == "test"), replaced)
    cmd = (tmp_path / "frames", "--index", tmp_path / "index.jsonl", "--stream", "rgb", "--out", out)
    res = _run_cli(*cmd)
    remake = f"memdpc preprocess frames {tmp_path / 'index.jsonl'} --out {frames} --streams rgb --size 24 --overwrite"
    line = res.output.splitlines()[-1]
    assert res.exit_code == 2 and line.startswith(
        f"Error: {train[1].id}: {replaced} changed since its rgb archive"
    )
    assert f"(size {before} → {replaced.stat().st_size} bytes, modified " in line
    assert line.endswith(
        f"the shards would hold the old video: remake its archives with `{remake}`, then run this command again"
    )
    assert not out.exists()  # refused before anything was written
    from click.testing import CliRunner

    from memdpc.cli import main

    again = CliRunner().invoke(main, remake.split()[1:])
    assert again.exit_code == 0, again.output
    # only the replaced video is remade: the touched one holds the same bytes
    assert "wrote the archives of 1 video (and kept those of 8 videos written before)" in again.output
    assert _run_cli(*cmd).exit_code == 0
    # the same size, other bytes (a byte flipped in the middle): the digest tells
    body = bytearray(replaced.read_bytes())
    body[len(body) // 2] ^= 0xFF
    replaced.write_bytes(bytes(body))
    res = _run_cli(*cmd, "--overwrite")
    assert res.exit_code == 2 and "content: SHA-256 " in res.output.splitlines()[-1], res.output
