"""pipeline/shard_plan.py: which samples exist and which shard holds each, planned from the archives' headers.

On the session's ``long_archives`` (MoveRight, MoveLeft × 200, 150, 121 and 60 frames; g00, g02 train,
g01, g03 test) with the paper's clip (120-frame span): train windows every ``window_step`` on the n−1
frames with a flow partner, shuffled by seed; eval windows in index order; short videos padded or dropped;
the cut by count and size; and the one-line errors of bad options, labels, ids and archives.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard_plan import (
    FAILED,
    NOT_WRITTEN,
    UNUSABLE,
    ShardSettings,
    archive_digest,
    class_names,
    make_plan,
    sample_bytes,
    scan_archive,
    usable_frames,
)
from memdpc.preprocess.archive import (
    FRAME_BYTES,
    META,
    archive_path,
    frame_name,
    read_archive,
    recorded_frames,
    write_archive,
)
from memdpc.preprocess.report import ReportWriter
from memdpc.preprocess.video_index import VideoRecord

CLIP = ClipSpec()


def _keys(plan) -> list[str]:
    return [s.key for sh in plan.shards for s in sh.samples]


def _index_order(archives, split: str, starts) -> list[str]:
    return [f"{r.id}_{s:05d}" for r in archives.records if r.split == split for s in starts(r.num_frames - 1)]


def test_usable_frames_are_those_with_a_flow_partner():
    assert usable_frames("rgb", 200) == 199  # n frames: n − 1 flows
    assert usable_frames("flow", 199) == 199


@pytest.mark.parametrize("stream", ["rgb", "flow"])
def test_train_windows_every_step_on_the_usable_frames(long_archives, stream):
    plan = make_plan(
        long_archives.root, long_archives.records, stream, "train", ShardSettings(window_step=20)
    )
    want = _index_order(long_archives, "train", lambda n: CLIP.train_starts(n, 20))
    assert sorted(_keys(plan)) == sorted(want)
    assert sorted(k for k in want if "_g00_" in k) == [
        f"v_{c}_g00_{s:05d}" for c in ("MoveLeft", "MoveRight") for s in (0, 20, 40, 60)
    ]
    assert plan.config["windows"] == {
        "mode": "train",
        "window_step": 20,
        "short": "pad",
        "rule": "starts on the n-1 frames that have a flow partner",
    }


def test_train_samples_are_shuffled_by_seed(long_archives):
    base = _index_order(long_archives, "train", lambda n: CLIP.train_starts(n, 20))
    plans = {
        seed: make_plan(long_archives.root, long_archives.records, "rgb", "train", ShardSettings(seed=seed))
        for seed in (0, 1)
    }
    for seed, plan in plans.items():
        assert _keys(plan) == [base[i] for i in np.random.default_rng(seed).permutation(len(base))]
    again = make_plan(long_archives.root, long_archives.records, "rgb", "train", ShardSettings(seed=0))
    assert _keys(again) == _keys(plans[0]) and again.fingerprint() == plans[0].fingerprint()
    assert _keys(plans[1]) != _keys(plans[0])
    assert plans[1].fingerprint()["samples_sha256"] != plans[0].fingerprint()["samples_sha256"]


def test_eval_windows_in_index_order_and_short_videos_padded(long_archives):
    plan = make_plan(
        long_archives.root, long_archives.records, "rgb", "test", ShardSettings(window_step=7)
    )  # unused for eval
    assert _keys(plan) == _index_order(long_archives, "test", CLIP.eval_starts)
    assert _keys(plan) == [f"v_{c}_g{g:02d}_00000" for c in ("MoveRight", "MoveLeft") for g in (1, 3)]
    assert plan.short == 2 and plan.config["windows"]["mode"] == "eval"
    assert plan.config["windows"]["window_step"] is None
    short = next(s for sh in plan.shards for s in sh.samples if "_g03_" in s.key)  # 60 frames: 59 usable
    assert (
        short.usable == 59 and short.indices[:20] == list(range(0, 58, 3)) and short.indices[20:] == [58] * 20
    )


def test_short_videos_are_dropped_on_request(long_archives):
    plan = make_plan(long_archives.root, long_archives.records, "flow", "test", ShardSettings(short="drop"))
    assert _keys(plan) == ["v_MoveRight_g01_00000", "v_MoveLeft_g01_00000"]
    assert plan.short == 2 and set(plan.sources) == {"v_MoveRight_g01", "v_MoveLeft_g01"}


def test_shards_are_cut_by_count_and_by_size(long_archives):
    plan = make_plan(long_archives.root, long_archives.records, "rgb", "train", ShardSettings(max_count=3))
    assert [len(sh.samples) for sh in plan.shards] == [3, 3, 3, 1]
    assert [sh.name for sh in plan.shards] == [f"train-{k:06d}.tar" for k in range(4)]
    assert plan.num_samples == 10
    for sh in plan.shards:
        body = sum(sample_bytes(s, plan.sources[s.video_id]) for s in sh.samples) + 1024  # + the end blocks
        assert sh.bytes == body + (-body % 10240)  # padded to whole 10 KiB records
    one = make_plan(long_archives.root, long_archives.records, "rgb", "train", ShardSettings(max_size=1))
    assert [len(sh.samples) for sh in one.shards] == [
        1
    ] * 10  # a sample larger than max_size is a shard alone


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"stream": "depth"}, "unknown stream 'depth' (choose from rgb, flow)"),
        ({"short": "keep"}, "short must be one of pad, drop, not 'keep'"),
        ({"max_count": 0}, "max_count must be ≥ 1, not 0"),
        ({"max_size": 0}, "max_size must be ≥ 1, not 0"),
        ({"window_step": 0}, "window_step must be ≥ 1, not 0"),
        (
            {"split": "val"},
            "video index: no videos in split 'val' (it has test: 4, train: 4); "
            "`memdpc index … --val-per-class N` holds some out",
        ),
    ],
)
def test_bad_options_are_one_line_user_errors(long_archives, kw, message):
    """A stream or split is the plan's to refuse; a setting, the settings' own (before any archive is read)."""
    args = {"stream": "rgb", "split": "train", **kw}
    stream, split = args.pop("stream"), args.pop("split")
    with pytest.raises(UserError) as e:
        make_plan(long_archives.root, long_archives.records, stream, split, ShardSettings(**args))
    assert str(e.value) == message


def test_class_names_are_indexed_by_label():
    recs = [
        VideoRecord("a", "/a", 2, "C", "train"),
        VideoRecord("b", "/b", 0, "A", "train"),
        VideoRecord("c", "/c", 2, "C", "test"),
    ]
    assert class_names(recs, "index.jsonl") == ["A", "", "C"]
    assert class_names([replace(r, label=-1) for r in recs], "index.jsonl") == []


def test_missing_or_conflicting_labels_are_refused(long_archives):
    recs = [replace(r) for r in long_archives.records]
    recs[0].label = -1
    with pytest.raises(
        UserError, match=f"^index.jsonl: video '{recs[0].id}' has no label \\(-1\\) while others do$"
    ):
        class_names(recs, "index.jsonl")
    recs = [replace(r) for r in long_archives.records]
    recs[0].label_name = "Other"
    with pytest.raises(
        UserError, match=r"^video index: label 0 is both 'Other' and 'MoveRight' \(v_MoveRight_g01\)$"
    ):
        make_plan(long_archives.root, recs, "rgb", "train")


def test_an_id_unusable_as_a_key_is_refused(long_archives):
    recs = [replace(long_archives.records[0], id="v.1"), *long_archives.records[1:]]
    with pytest.raises(
        UserError,
        match=r"^video index: video id 'v\.1' is not usable as a WebDataset key \(no dots or slashes; at most \d+ characters\)$",
    ):
        make_plan(long_archives.root, recs, "rgb", "train")


def test_scan_archive_reads_the_frame_table(long_archives):
    src = scan_archive(archive_path(long_archives.root, "rgb", "v_MoveLeft_g03"))
    assert src.num_frames == 60 == src.meta["num_frames"] and src.meta["stream"] == "rgb"
    with open(src.path, "rb") as f:
        f.seek(int(src.offsets[5]))
        data = f.read(int(src.sizes[5]))
    assert data[:2] == b"\xff\xd8" and data[-2:] == b"\xff\xd9"  # one whole JPEG


def test_an_archive_is_scanned_from_its_meta_json_alone_or_by_its_headers_to_the_same_frames(
    long_archives, tmp_path
):
    """An archive records its frames' sizes in meta.json: shard reads nothing else of it. One whose sizes are
    not recorded (an earlier version's) or do not add up is read by its headers, to the same frame table and
    identity."""
    path = archive_path(long_archives.root, "rgb", "v_MoveLeft_g03")
    meta, frames = read_archive(path)
    fast = scan_archive(path)
    assert recorded_frames(path) is not None  # read from meta.json alone
    assert FRAME_BYTES not in fast.meta and fast.meta == {k: v for k, v in meta.items() if k != FRAME_BYTES}
    recorded = {k: v for k, v in meta.items() if k != FRAME_BYTES}
    members = {frame_name(i): f for i, f in enumerate(frames)}
    for name, extra in (("earlier", {}), ("damaged", {FRAME_BYTES: [1] * len(frames)})):
        other = {**members, META: json.dumps({**recorded, **extra}).encode()}
        slow = scan_archive(_tar(tmp_path / f"{name}.tar", other))
        assert np.array_equal(slow.offsets, fast.offsets) and np.array_equal(slow.sizes, fast.sizes)
        assert slow.meta == fast.meta and archive_digest(slow) == archive_digest(fast)


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    "members, message",
    [
        ({"000000.jpg": b"x"}, "frame archive has no meta.json (incomplete or not a memdpc archive)"),
        (
            {"000000.jpg": b"x", "notes.txt": b""},
            "unexpected member 'notes.txt' (need 000000.jpg … and meta.json)",
        ),
        (
            {"000000.jpg": b"x", "000002.jpg": b"x", META: b'{"num_frames": 2}'},
            "2 frames (not numbered 0…1), but meta.json says 2",
        ),
        (
            {"000000.jpg": b"x", META: b'{"num_frames": 3}'},
            "1 frames (not numbered 0…0), but meta.json says 3",
        ),
        ({META: b"{not json"}, "unreadable frame archive ("),
    ],
)
def test_bad_archives_are_user_errors_naming_the_file(tmp_path, members, message):
    path = _tar(tmp_path / "rgb" / "v.tar", members)
    with pytest.raises(UserError) as e:
        scan_archive(path)
    assert str(e.value).startswith(f"{path}: {message}")
    with pytest.raises(UserError, match=f"^{tmp_path / 'none.tar'}: frame archive not found$"):
        scan_archive(tmp_path / "none.tar")


def test_bad_videos_are_skipped_or_refused_with_strict(long_archives, tmp_path):
    recs = [*long_archives.records, VideoRecord("v_gone", "/v_gone.avi", 1, "MoveLeft", "test")]
    plan = make_plan(long_archives.root, recs, "rgb", "test")
    assert plan.skipped == [
        {
            "video_id": "v_gone",
            "kind": NOT_WRITTEN,
            "reason": f"{archive_path(long_archives.root, 'rgb', 'v_gone')}: not written yet (preprocess not run "
            "on it, or still running)",
        }
    ]
    assert "v_gone" not in plan.sources and plan.num_samples == 4
    with pytest.raises(UserError, match="^v_gone: .*v_gone.tar: not written yet"):
        make_plan(long_archives.root, recs, "rgb", "test", strict=True)


def _copy(archives, tmp_path: Path) -> Path:
    return shutil.copytree(archives.root, tmp_path / "frames")


def _rewrite(root: Path, stream: str, vid: str, **meta) -> None:
    """Rewrite one archive with the same frames and ``meta`` added to its ``meta.json``."""
    old, frames = read_archive(archive_path(root, stream, vid))
    write_archive(archive_path(root, stream, vid), frames, {**old, **meta})


def _report(root: Path, name: str, videos: list[dict]) -> None:
    (root / name).write_text(json.dumps({"command": "preprocess", "videos": videos}))


def test_videos_without_archive_are_told_apart_by_the_preprocess_reports(long_archives, tmp_path):
    root = _copy(long_archives, tmp_path)
    ids = [r.id for r in long_archives.records if r.split == "test"]
    for vid in ids[:3]:
        archive_path(root, "flow", vid).unlink()
    archive_path(root, "flow", ids[3]).write_bytes(b"not a tar" * 50)
    # two parts of one run: the failure in one, the other part's entry of a video whose archive is gone
    _report(
        root, "preprocess-report-part0of2.json", [{"id": ids[0], "status": "failed", "reason": "no frames"}]
    )
    _report(root, "preprocess-report-part1of2.json", [{"id": ids[1], "status": "done"}])
    # then runs of this version: an rgb run that failed on ids[1] (its flow archive is still not written)
    for vid, stream in ((ids[1], "rgb"), (ids[2], "flow"), (ids[2], "rgb")):
        with ReportWriter(root / "preprocess-report.jsonl", {"config": {"streams": [stream]}}) as log:
            log.video({"id": vid, "status": "failed", "reason": f"no {stream}"}, [stream])
    plan = make_plan(root, long_archives.records, "flow", "test")
    kinds = {s["video_id"]: (s["kind"], s["reason"]) for s in plan.skipped}
    assert kinds[ids[0]] == (FAILED, "failed in preprocess: no frames")
    assert kinds[ids[2]] == (FAILED, "failed in preprocess: no flow")
    for vid in ids[1:2]:
        path = archive_path(root, "flow", vid)
        assert kinds[vid] == (
            NOT_WRITTEN,
            f"{path}: not written yet (preprocess not run on it, or still running)",
        )
    assert kinds[ids[3]][0] == UNUSABLE and "unreadable frame archive" in kinds[ids[3]][1]
    assert plan.archives == dict.fromkeys(ids)  # none usable: all recorded as such in the plan
    (root / "preprocess-report.json").write_text("{broken")
    with pytest.raises(
        UserError, match=r"preprocess-report.json: unreadable preprocess report \(.*\); delete it"
    ):
        make_plan(root, long_archives.records, "flow", "test")


def test_archives_of_mixed_preprocess_settings_are_refused(long_archives, tmp_path):
    root = _copy(long_archives, tmp_path)
    tvl1 = {"tau": 0.25, "warps": 5}
    ids = [r.id for r in long_archives.records if r.split == "train"]
    for i, vid in enumerate(ids):  # the flow backend may differ: the backends give the same codes
        backend = ("opencv", "triton")[i % 2]
        _rewrite(root, "flow", vid, decode={"size": 16, "square": 0}, flow={"backend": backend, "tvl1": tvl1})
    plan = make_plan(root, long_archives.records, "flow", "train")
    assert plan.settings == {
        "encoding": "jpeg",
        "frame size": "--size 16",
        "fps": "--fps 0",
        "tvl1 tau": "--tau 0.25",
        "tvl1 warps": "--warps 5",
    }
    _rewrite(root, "flow", ids[2], flow={"backend": "opencv", "tvl1": {**tvl1, "warps": 3}})
    with pytest.raises(UserError) as e:
        make_plan(root, long_archives.records, "flow", "train")
    assert str(e.value) == (
        f"{root / 'flow'}: 1 of 4 archives were made with other preprocess settings than the rest (e.g. "
        f"{ids[2]}.tar with --warps 3, the rest with --warps 5); run `memdpc preprocess` again with one set of "
        "options and --overwrite"
    )


def test_settings_are_compared_as_the_options_that_give_them(long_archives, tmp_path):
    """A --fps of 25 recorded as 25 by one run and 25.0 by another is one setting, not a mix."""
    root = _copy(long_archives, tmp_path)
    for i, r in enumerate(r for r in long_archives.records if r.split == "train"):
        _rewrite(root, "rgb", r.id, decode={"size": 16, "square": 0, "fps": (25, 25.0)[i % 2]})
    assert make_plan(root, long_archives.records, "rgb", "train").settings["fps"] == "--fps 25"


def test_an_archive_digest_follows_its_frames_and_meta_not_its_place(long_archives, tmp_path):
    root = _copy(long_archives, tmp_path)
    vid = long_archives.records[0].id
    digest = archive_digest(scan_archive(archive_path(long_archives.root, "rgb", vid)))
    assert archive_digest(scan_archive(archive_path(root, "rgb", vid))) == digest  # a copy
    _rewrite(root, "rgb", vid, source="/elsewhere/v.avi")
    assert archive_digest(scan_archive(archive_path(root, "rgb", vid))) != digest
    meta, frames = read_archive(archive_path(long_archives.root, "rgb", vid))
    write_archive(archive_path(root, "rgb", vid), [frames[0] + b"\0", *frames[1:]], meta)  # one frame longer
    assert archive_digest(scan_archive(archive_path(root, "rgb", vid))) != digest


def test_an_archive_folder_that_is_missing_or_the_stream_folder_is_a_one_line_error(long_archives, tmp_path):
    recs = long_archives.records
    with pytest.raises(UserError) as e:
        make_plan(tmp_path / "nope", recs, "rgb", "train")
    assert str(e.value) == (
        f"{tmp_path / 'nope'}: frame archive folder not found; give the --out folder of `memdpc preprocess`"
    )
    with pytest.raises(UserError) as e:
        make_plan(long_archives.root / "rgb", recs, "rgb", "train")
    assert str(e.value) == (
        f"{long_archives.root / 'rgb'}: is a folder of rgb archives; give the folder that "
        f"holds it ({long_archives.root})"
    )
    with pytest.raises(UserError) as e:
        make_plan(tmp_path, recs, "flow", "train")
    assert str(e.value) == (
        f"{tmp_path}: holds no flow/ folder of frame archives; run `memdpc preprocess` with "
        f"--out {tmp_path} and --streams including flow first"
    )
