"""Dataset readers on small fake trees in the official formats, and every bad-input case of the issue."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.preprocess.datasets import UNLABELLED, IndexOptions, build_index, hold_outs, index_warnings
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.video_index import VideoRecord, read_index

from ..conftest import run_memdpc


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"video")


@pytest.fixture
def ucf(tmp_path) -> Path:
    root = tmp_path / "ucf"
    lists = root / "ucfTrainTestlist"
    lists.mkdir(parents=True)
    (lists / "classInd.txt").write_text("1 ApplyEyeMakeup\n2 Archery\n")
    for s in (1, 2, 3):
        (lists / f"trainlist0{s}.txt").write_text(
            "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\nArchery/v_Archery_g08_c01.avi 2\n"
            "Archery/v_Archery_g09_c02.avi 2\n"
        )
        (lists / f"testlist0{s}.txt").write_text("ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi\n")
    for name in (
        "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01",
        "Archery/v_Archery_g08_c01",
        "Archery/v_Archery_g09_c02",
        "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01",
    ):
        _touch(root / "UCF-101" / f"{name}.avi")
    return root


def test_ucf101_index(ucf):
    records = build_index(ucf, "ucf101", 2)
    assert [(r.id, r.label, r.label_name, r.split) for r in records] == [
        ("v_ApplyEyeMakeup_g08_c01", 0, "ApplyEyeMakeup", "train"),
        ("v_Archery_g08_c01", 1, "Archery", "train"),
        ("v_Archery_g09_c02", 1, "Archery", "train"),
        ("v_ApplyEyeMakeup_g01_c01", 0, "ApplyEyeMakeup", "test"),
    ]
    assert all(Path(r.path).is_file() for r in records)


@pytest.fixture
def hmdb(tmp_path) -> Path:
    root = tmp_path / "hmdb"
    splits = root / "testTrainMulti_7030_splits"
    splits.mkdir(parents=True)
    for cls, rows in {
        "brush_hair": [("a.b_1.avi", 1), ("c_2.avi", 2), ("d_3.avi", 0)],
        "cartwheel": [("e_4.avi", 2), ("f_5.avi", 1)],
    }.items():
        for s in (1, 2, 3):
            (splits / f"{cls}_test_split{s}.txt").write_text("".join(f"{v} {k} \n" for v, k in rows))
        for v, _ in rows:
            _touch(root / cls / v)
    return root


def test_hmdb51_index(hmdb):
    records = build_index(hmdb, "hmdb51", 1)
    got = sorted((r.id, r.label, r.split) for r in records)
    assert got == [("a_b_1", 0, "train"), ("c_2", 0, "test"), ("e_4", 1, "test"), ("f_5", 1, "train")]


@pytest.fixture
def k400(tmp_path) -> Path:
    root = tmp_path / "k400"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "train.csv").write_text(
        "label,youtube_id,time_start,time_end,split\n"
        "abseiling,abc-_123,14,24,train\n"
        "air drumming,xyz,0,10,train\n"
    )
    (root / "annotations" / "validate.csv").write_text(
        "label,youtube_id,time_start,time_end,split\nabseiling,qqq,5,15,val\n"
    )
    (root / "annotations" / "test.csv").write_text(
        "label,youtube_id,time_start,time_end,split\n,zzz,0,10,test\n"
    )
    _touch(root / "train" / "abseiling" / "abc-_123_000014_000024.mp4")
    _touch(root / "train" / "air_drumming" / "xyz_000000_000010.mp4")
    _touch(root / "val" / "abseiling" / "qqq_000005_000015.mp4")
    return root


def test_kinetics400_index(k400):
    records = build_index(k400, "kinetics400")
    got = sorted((r.id, r.label, r.label_name, r.split) for r in records)
    assert got == [
        ("abc-_123_000014_000024", 0, "abseiling", "train"),
        ("qqq_000005_000015", 0, "abseiling", "val"),
        ("xyz_000000_000010", 1, "air drumming", "train"),
    ]


def test_oops_index(tmp_path):
    root = tmp_path / "oops"
    (root / "annotations").mkdir(parents=True)
    times = {
        "fail one": {"t": [2.0, 3.0, 2.5], "len": 6.0},
        "fail.two": {"t": [-1, 1.0], "len": 4.0},
        "none": {"t": [-1, -1], "len": 5.0},
    }
    (root / "annotations" / "transition_times.json").write_text(json.dumps(times))
    for split, name in (("train", "fail one"), ("val", "fail.two"), ("train", "none"), ("train", "unlisted")):
        _touch(root / split / f"{name}.mp4")
    records = build_index(root, "oops")
    assert sorted((r.id, r.split, r.extra["t"]) for r in records) == [
        ("fail_one", "train", 2.5),
        ("fail_two", "val", 1.0),
    ]


def test_folder_index(tmp_path):
    for rel in ("train/jump/a.mp4", "train/run/b.avi", "test/jump/c.mp4", "test/run/notes.txt"):
        _touch(tmp_path / rel)
    records = build_index(tmp_path, "folder")
    assert sorted((r.id, r.label, r.split) for r in records) == [
        ("jump__a", 0, "train"),
        ("jump__c", 0, "test"),
        ("run__b", 1, "train"),
    ]


def test_an_empty_class_folder_is_no_class(tmp_path):
    for rel in ("jump/a.mp4", "kick/notes.txt", "run/b.avi"):  # kick: a folder without a video
        _touch(tmp_path / rel)
    (tmp_path / "walk").mkdir()
    assert [(r.label_name, r.label) for r in build_index(tmp_path, "folder")] == [("jump", 0), ("run", 1)]


def _run_index(root: Path, layout: str, out: Path):
    return CliRunner().invoke(main, ["index", str(root), "--layout", layout, "--out", str(out)])


def test_cli_writes_index_and_summary(ucf, tmp_path):
    res = _run_index(ucf, "ucf101", tmp_path / "idx.jsonl")
    assert res.exit_code == 0, res.output
    assert "Archery" in res.output and "total" in res.output
    assert len(read_index(tmp_path / "idx.jsonl")) == 4


def test_cli_holds_out_validation_videos_or_says_why_not(ucf, tmp_path):
    out = tmp_path / "idx.jsonl"
    res = CliRunner().invoke(
        main, ["index", str(ucf), "--layout", "ucf101", "--out", str(out), "--val-per-class", "1"]
    )
    assert res.exit_code == 2 and not out.exists()
    assert res.output.strip().splitlines()[-1] == (
        "Error: class 'ApplyEyeMakeup' has 1 training video: too few to hold out 1 for validation and still "
        "train on one"
    )


def test_cli_refuses_to_add_videos_to_an_official_test_split(ucf, tmp_path):
    out = tmp_path / "idx.jsonl"
    res = CliRunner().invoke(
        main, ["index", str(ucf), "--layout", "ucf101", "--out", str(out), "--test-per-class", "1"]
    )
    assert res.exit_code == 2 and not out.exists()
    assert res.output.strip().splitlines()[-1] == (
        f"Error: {ucf}: already holds a test split (the ucf101 layout's); --test-per-class would add training "
        "videos to it: leave it out (--val-per-class holds videos out for validation)"
    )


def _bad_missing_split(root: Path) -> str:
    (root / "ucfTrainTestlist" / "testlist01.txt").unlink()
    return "testlist01.txt: split file not found"


def _bad_unknown_class(root: Path) -> str:
    with open(root / "ucfTrainTestlist" / "trainlist01.txt", "a") as f:
        f.write("Bowling/v_Bowling_g01_c01.avi 3\n")
    return "trainlist01.txt:4: class 'Bowling' is not in"


def _bad_missing_video(root: Path) -> str:
    (root / "UCF-101" / "Archery" / "v_Archery_g09_c02.avi").unlink()
    return "trainlist01.txt:3: video"


def _bad_duplicate(root: Path) -> str:
    with open(root / "ucfTrainTestlist" / "testlist01.txt", "a") as f:
        f.write("Archery/v_Archery_g08_c01.avi\n")
    return "duplicate video id 'v_Archery_g08_c01'"


@pytest.mark.parametrize(
    "breaker", [_bad_missing_split, _bad_unknown_class, _bad_missing_video, _bad_duplicate]
)
def test_bad_ucf_input_one_line_exit_2_no_partial_file(ucf, tmp_path, breaker):
    expected = breaker(ucf)
    out = tmp_path / "out" / "idx.jsonl"
    res = _run_index(ucf, "ucf101", out)
    assert res.exit_code == 2
    assert expected in res.output
    assert "Traceback" not in res.output
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _run_index(tmp_path / "empty", "folder", tmp_path / "idx.jsonl")
    assert res.exit_code == 2 and "no videos found" in res.output
    assert not (tmp_path / "idx.jsonl").exists()


def test_hmdb_bad_line_names_file_and_line(hmdb):
    (hmdb / "testTrainMulti_7030_splits" / "cartwheel_test_split1.txt").write_text("e_4.avi 2\nbroken\n")
    with pytest.raises(UserError, match=r"cartwheel_test_split1.txt:2: expected 'video 0\|1\|2'"):
        build_index(hmdb, "hmdb51", 1)


def test_k400_missing_video_names_csv_line(k400):
    (k400 / "val" / "abseiling" / "qqq_000005_000015.mp4").unlink()
    with pytest.raises(UserError, match=r"validate.csv:2: video qqq_000005_000015.mp4"):
        build_index(k400, "kinetics400")


def _video(path: Path, frames: int = 6, codec: str = "mp4v") -> Path:
    """A real (tiny) video file: ``frames`` frames of noise, 32×32 (``mp4v``: MPEG-4 Part 2, ``mjpg``)."""
    video = np.random.default_rng(len(path.name)).integers(0, 256, (frames, 32, 32, 3), np.uint8)
    write_video(path, video, 25.0, codec)
    return path


def _folder(root: Path, counts: dict[str, int], split: str = "") -> Path:
    """``root/[split/]<class>/<video>.mp4``: ``counts`` real videos per class (the hold-out reads them)."""
    for cls, n in counts.items():
        for i in range(n):
            _video(root / split / cls / f"{split}{cls}{i:02d}.mp4")
    return root


def _index_cli(root: Path, out: Path, *options: str):
    return CliRunner().invoke(main, ["index", str(root), "--layout", "folder", "--out", str(out), *options])


def test_cli_folder_index_holds_out_test_then_val_per_class(tmp_path):
    root = _folder(tmp_path / "videos", {"jump": 4, "run": 4, "sit": 3})
    out = tmp_path / "idx.jsonl"
    res = _index_cli(root, out, "--test-per-class", "1", "--val-per-class", "1")
    assert res.exit_code == 0, res.output
    split = {r.id: r.split for r in read_index(out)}
    assert sorted(k for k, s in split.items() if s == "test") == ["jump__jump03", "run__run03", "sit__sit02"]
    assert sorted(k for k, s in split.items() if s == "val") == ["jump__jump02", "run__run02", "sit__sit01"]
    assert "warning" not in res.output
    assert res.output.splitlines()[-1] == (
        f"wrote {out}; next: memdpc preprocess flow {out} --out FRAMES --streams rgb,flow (FRAMES: a new folder "
        "for the frame archives)"
    )
    res = _index_cli(root, out, "--test-per-class", "2", "--val-per-class", "1")
    assert res.exit_code == 2 and res.output.splitlines()[-1] == (
        "Error: class 'sit' has 3 training videos: too few to hold out 2 for test and 1 for validation and "
        "still train on one"
    )


def test_held_out_videos_are_those_whose_files_read_the_others_are_named_and_stay_in_train(tmp_path):
    """The last videos of a class by id are a text file named .mp4 and a video cut in half: the hold-out passes
    over them (they stay in train, where preprocess reports them) and holds out the readable ones before them."""
    root = _folder(tmp_path / "videos", {"jump": 3, "run": 3})
    text = root / "jump" / "jump98.mp4"
    text.write_text("shot list: jump, take 3\n")
    whole = _video(tmp_path / "whole.avi", frames=40, codec="mjpg")  # its header stays at the start
    cut = root / "jump" / "jump99.avi"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    out = tmp_path / "idx.jsonl"
    res = run_memdpc(
        "index", root, "--layout", "folder", "--test-per-class", "1", "--val-per-class", "1", "--out", out
    )
    assert res.returncode == 0, res.stderr
    split = {r.id: r.split for r in read_index(out)}
    assert {k for k, s in split.items() if s == "test"} == {"jump__jump02", "run__run02"}
    assert {k for k, s in split.items() if s == "val"} == {"jump__jump01", "run__run01"}
    assert split["jump__jump98"] == split["jump__jump99"] == "train"
    warning = next(line for line in res.stderr.splitlines() if line.startswith("warning: held out"))
    assert warning == (
        "warning: held out only videos whose files read: passed over 2 files, left in train, where preprocess "
        f"reports them: {cut} (frame 39 of the 40 its header promises does not decode (truncated or corrupt "
        f"file)), {text} (not a readable video (FFmpeg cannot open it))"
    )
    assert "VIDEOIO" not in res.stderr and "Traceback" not in res.stderr

    for name in ("run00.mp4", "run02.mp4"):  # run: 1 of its 3 training videos reads, 2 wanted
        (root / "run" / name).write_text("not a video")
    res = run_memdpc(
        "index", root, "--layout", "folder", "--test-per-class", "2", "--out", tmp_path / "two.jsonl"
    )
    assert res.returncode == 2 and not (tmp_path / "two.jsonl").exists()
    assert res.stderr.strip().splitlines()[-1] == (
        f"Error: class 'run': only 1 of its 3 training videos reads, too few to hold out 2 for test (e.g. "
        f"{root / 'run' / 'run02.mp4'}: not a readable video (FFmpeg cannot open it))"
    )


def test_cli_folder_index_with_a_seed_draws_at_random_and_the_same_seed_gives_the_same_bytes(tmp_path):
    root = _folder(tmp_path / "videos", {"jump": 10, "run": 10})
    held = {}
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        res = _index_cli(
            root, tmp_path / f"{name}.jsonl", "--test-per-class", "2", "--val-per-class", "2", "--seed", seed
        )
        assert res.exit_code == 0, res.output
        held[name] = {r.id: r.split for r in read_index(tmp_path / f"{name}.jsonl") if r.split != "train"}
        assert sorted(held[name].values()) == ["test"] * 4 + ["val"] * 4
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert held["a"] != held["c"]
    _index_cli(root, tmp_path / "last.jsonl", "--test-per-class", "2", "--val-per-class", "2")
    assert {r.id: r.split for r in read_index(tmp_path / "last.jsonl") if r.split != "train"} != held["a"]


def test_cli_index_warns_once_of_empty_splits_and_classes_missing_from_a_split(tmp_path):
    root = _folder(tmp_path / "plain", {"jump": 2, "run": 2})
    res = _index_cli(root, tmp_path / "plain.jsonl")
    assert res.exit_code == 0, res.output
    assert [line for line in res.output.splitlines() if line.startswith("warning:")] == [
        "warning: no 'val' videos: use --val-per-class N (held-out videos for train's kNN monitor and --best-by "
        "knn), or a val/ folder",
        "warning: no 'test' videos: use --test-per-class N, or train/ and test/ folders",
    ]
    split = _folder(
        _folder(tmp_path / "split", {"jump": 2, "run": 2, "sit": 2}, "train"), {"jump": 1}, "test"
    )
    res = _index_cli(split, tmp_path / "split.jsonl", "--val-per-class", "1")
    assert res.exit_code == 0, res.output
    assert [line for line in res.output.splitlines() if line.startswith("warning:")] == [
        "warning: 2 classes have no video in 'test': run, sit"
    ]


def test_index_warnings_follow_the_layout(tmp_path):
    oops = [VideoRecord("a", "/a", -1, "", "train"), VideoRecord("b", "/b", -1, "", "val")]
    assert index_warnings(oops, "oops") == []  # Oops has train and val, and no classes
    k400 = [VideoRecord("a", "/a", 0, "abseiling", "train"), VideoRecord("b", "/b", 0, "abseiling", "val")]
    assert index_warnings(k400, "kinetics400") == []  # its test set has no labels: nothing to warn of
    ucf = [VideoRecord(f"v{i}", f"/v{i}", i, f"c{i}", "train") for i in range(13)]
    ucf.append(VideoRecord("t", "/t", 0, "c0", "test"))
    assert index_warnings(ucf, "ucf101") == [
        "no 'val' videos: use --val-per-class N (held-out videos for train's kNN monitor and --best-by knn)",
        "12 classes have no video in 'test': c1, c10, c11, c12, c2, c3, c4, c5, c6, c7 and 2 more",
    ]


def test_cli_folder_index_takes_videos_in_sub_folders_and_names_the_files_it_passes_over(tmp_path):
    """``walk/sub/w6.mp4`` is a video of class walk (its id keeps the sub-folder); a class of only such videos is a
    class; a video outside every class folder and a file that is not a video are named, with why."""
    root = _folder(tmp_path / "videos", {"walk": 2, "run": 2})
    _video(root / "walk" / "sub" / "w6.mp4")
    _video(root / "crawl" / "deep" / "er" / "c1.mp4")  # a class made only of videos in sub-folders
    _video(root / "stray.mp4")
    (root / "run" / "notes.txt").write_text("shot on a phone")
    (root / "walk" / ".hidden").mkdir()
    _video(root / "walk" / ".hidden" / "h.mp4")  # hidden: left alone
    res = _index_cli(root, tmp_path / "index.jsonl")
    assert res.exit_code == 0, res.output
    records = read_index(tmp_path / "index.jsonl")
    assert sorted((r.id, r.label_name) for r in records) == [
        ("crawl__deep__er__c1", "crawl"),
        ("run__run00", "run"),
        ("run__run01", "run"),
        ("walk__sub__w6", "walk"),
        ("walk__walk00", "walk"),
        ("walk__walk01", "walk"),
    ]
    assert (
        f"warning: not indexed: 2 files of {root}: 1 file not a video by its extension ({root / 'run' / 'notes.txt'}); "
        f"1 file not in a class folder ({root / 'stray.mp4'})" in " ".join(res.output.split())
    )


def test_cli_index_refuses_to_write_over_an_index_shards_were_made_from(tmp_path):
    """An index that shards were made from is not written over by another one (another --seed draws other
    held-out videos): refused naming the shards, unless --overwrite; the same index again is written."""
    from memdpc.pipeline.shard import run_shard
    from memdpc.preprocess.run import preprocess

    root = _folder(tmp_path / "videos", {"jump": 3, "run": 3})
    index = tmp_path / "index.jsonl"
    assert _index_cli(root, index, "--test-per-class", "1").exit_code == 0
    preprocess(index, tmp_path / "frames", "rgb", size=16, workers=1, progress=False)
    for split in ("train", "test"):
        run_shard(tmp_path / "frames", index, "rgb", tmp_path / "shards", split)
    before = index.read_bytes()
    assert _index_cli(root, index, "--test-per-class", "1").exit_code == 0  # the same records: written
    res = _index_cli(root, index, "--test-per-class", "1", "--seed", "7")
    assert res.exit_code == 2 and index.read_bytes() == before
    assert res.output.splitlines()[-1] == (
        f"Error: {index}: the shards rgb/manifest-train.json, rgb/manifest-test.json in {tmp_path / 'shards'} were "
        "made from this index (and what was trained or evaluated on them); another index over it would no longer "
        "describe them: give another --out, or add --overwrite (then shard those splits again with --overwrite)"
    )
    res = _index_cli(root, index, "--test-per-class", "1", "--seed", "7", "--overwrite")
    assert res.exit_code == 0 and index.read_bytes() != before
    assert _index_cli(root, index, "--test-per-class", "1").exit_code == 0  # the shards are not of this one


def test_cli_indexes_videos_without_classes_for_pretraining_and_names_the_layout_a_flat_folder_needs(
    tmp_path,
):
    """A flat folder and a tree, hidden files left alone: every video in train without a label, some held out
    as val; the folder layout on a flat folder says why it found nothing and which layout takes it; a test
    split asked of unlabelled videos is refused."""
    root = tmp_path / "mine"
    for name in ("beach.mp4", "trip/day1/hill.mp4", "trip/day2/sea.mp4", "zoo.mp4"):
        _video(root / name)
    _video(root / ".cache" / "thumb.mp4")
    (root / "notes.txt").write_text("not a video")
    loose = tmp_path / "loose"
    for name in ("beach.mp4", "zoo.mp4"):
        _video(loose / name)
    flat = _index_cli(loose, tmp_path / "folder.jsonl")
    assert flat.exit_code == 2 and "Traceback" not in flat.output
    assert flat.output.splitlines()[-1] == (
        f"Error: {loose}: 2 videos found, but not in class sub-folders (e.g. {loose / 'beach.mp4'}); `--layout "
        "folder` wants <class>/<video>, `--layout unlabelled` takes videos without classes (to pretrain on)"
    )
    assert not (tmp_path / "folder.jsonl").exists()
    out = tmp_path / "pool.jsonl"
    res = CliRunner().invoke(
        main, ["index", str(root), "--layout", "unlabelled", "--val-per-class", "1", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    records = read_index(out)
    assert sorted(r.id for r in records) == ["beach", "trip__day1__hill", "trip__day2__sea", "zoo"]
    assert {(r.label, r.label_name) for r in records} == {(-1, "")}
    assert [r.id for r in records if r.split == "val"] == ["zoo"]  # the last by id
    assert "(unlabelled)" in res.output and "no 'test' videos" not in res.output
    refused = CliRunner().invoke(
        main,
        ["index", str(root), "--layout", "unlabelled", "--test-per-class", "1", "--out", str(tmp_path / "t")],
    )
    assert refused.exit_code == 2 and refused.output.splitlines()[-1].startswith(
        f"Error: {root}: --layout unlabelled has no classes to test on"
    )
    too_many = CliRunner().invoke(
        main,
        ["index", str(root), "--layout", "unlabelled", "--val-per-class", "4", "--out", str(tmp_path / "v")],
    )
    assert too_many.exit_code == 2 and too_many.output.splitlines()[-1] == (
        "Error: the unlabelled videos have 4 training videos: too few to hold out 4 for validation and still "
        "train on one"
    )


def test_the_hold_outs_of_ones_own_folders(tmp_path):
    """What `memdpc quickstart --videos` holds out: a third of the smallest class to test on (none where the
    folder has its own test split) and one video a class for the monitor; of an unlabelled folder a tenth."""
    labelled = _folder(tmp_path / "videos", {"jump": 7, "run": 9})
    assert hold_outs(labelled, "folder", seed=3) == IndexOptions(test_per_class=2, val_per_class=1, seed=3)
    split = _folder(_folder(tmp_path / "split", {"jump": 4}, "train"), {"jump": 2}, "test")
    assert hold_outs(split, "folder") == IndexOptions(val_per_class=1)
    pool = tmp_path / "pool"
    for i in range(25):
        _touch(pool / f"v{i:02d}.mp4")
    assert hold_outs(pool, UNLABELLED) == IndexOptions(val_per_class=2)
