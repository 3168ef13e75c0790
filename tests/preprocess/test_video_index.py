"""preprocess/video_index.py: the JSONL video index, its round trip and its one-line errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.video_index import (
    VideoRecord,
    check_unique,
    hold_out,
    read_index,
    summary,
    video_id,
    write_index,
)

RECORDS = [
    VideoRecord("v_Walk_g01_c01", "/data/v_Walk_g01_c01.avi", 0, "Walk", "train"),
    VideoRecord("v_Run_g02_c01", "/data/v_Run_g02_c01.avi", 1, "Run", "test", fps=25.0, num_frames=180),
    VideoRecord("fall-3", "/data/fall 3.mp4", -1, "", "val", extra={"t": 1.25, "rel_t": [0.5]}),
]


def test_write_then_read_gives_the_same_records(tmp_path):
    path = tmp_path / "index.jsonl"
    write_index(RECORDS, path)
    assert read_index(path) == RECORDS
    assert [p.name for p in tmp_path.iterdir()] == ["index.jsonl"]  # no temporary left


def test_unset_optional_fields_are_left_out_of_the_line():
    assert json.loads(RECORDS[0].to_json()) == {
        "id": "v_Walk_g01_c01",
        "path": "/data/v_Walk_g01_c01.avi",
        "label": 0,
        "label_name": "Walk",
        "split": "train",
    }
    assert json.loads(RECORDS[1].to_json())["num_frames"] == 180
    assert json.loads(RECORDS[2].to_json())["extra"] == {"t": 1.25, "rel_t": [0.5]}


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "index.jsonl"
    path.write_text("\n" + RECORDS[0].to_json() + "\n   \n" + RECORDS[1].to_json() + "\n\n")
    assert read_index(path) == RECORDS[:2]


@pytest.mark.parametrize(
    "bad, why",
    [
        ("{not json", "Expecting property name"),
        ('{"id": "a", "path": "/a"}', "missing 3 required positional arguments"),
        ('{"id": "a", "path": "/a", "label": 0, "label_name": "A", "split": "train", "colour": 1}', "colour"),
    ],
)
def test_a_bad_line_is_a_one_line_error_naming_file_and_line(tmp_path, bad, why):
    path = tmp_path / "index.jsonl"
    path.write_text(RECORDS[0].to_json() + "\n" + bad + "\n")
    with pytest.raises(UserError) as e:
        read_index(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:2: not a video index record (") and why in msg
    assert "\n" not in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_missing_and_empty_index_are_user_errors(tmp_path):
    with pytest.raises(UserError) as e:
        read_index(tmp_path / "no.jsonl")
    assert str(e.value) == (
        f"{tmp_path / 'no.jsonl'}: video index not found; give the JSONL file "
        "`memdpc index DATASET_ROOT --layout …` writes"
    )
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UserError, match="empty.jsonl: the video index is empty$"):
        read_index(tmp_path / "empty.jsonl")


def test_a_folder_a_video_or_a_binary_file_given_as_the_index_says_what_it_is(tmp_path):
    videos = tmp_path / "videos"
    (videos / "jump").mkdir(parents=True)
    clip = videos / "jump" / "a.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42\xff\xfe")
    with pytest.raises(UserError) as e:
        read_index(videos)
    assert str(e.value) == (
        f"{videos}: is a folder, not a video index; `memdpc index {videos} --layout folder` "
        "(or the dataset's layout) writes the index file"
    )
    with pytest.raises(UserError) as e:
        read_index(clip)
    assert str(e.value).startswith(f"{clip}: is a video file, not a video index; give the JSONL file")
    blob = tmp_path / "index.bin"
    blob.write_bytes(bytes(range(256)))
    with pytest.raises(UserError) as e:
        read_index(blob)
    assert str(e.value).startswith(f"{blob}: is a binary file, not a video index; give the JSONL file")
    results = tmp_path / "retrieval-rgb.json"
    results.write_text(json.dumps({"kind": "retrieval", "stream": "rgb", "metrics": {"R@1": 0.5}}))
    with pytest.raises(UserError) as e:
        read_index(results)
    assert str(e.value).startswith(f"{results}: is a results file of `memdpc eval`, not a video index;")


@pytest.mark.parametrize(
    "name, vid",
    [
        ("v_Walk_g01_c01.avi", "v_Walk_g01_c01"),
        ("Fall/clip one.mp4", "Fall_clip_one"),
        ("a.b.c.mp4", "a_b_c"),
        ("noext", "noext"),
        ("dir.d/noext", "dir_d_noext"),
    ],
)
def test_video_id_drops_the_extension_and_replaces_unsafe_characters(name, vid):
    assert video_id(name) == vid


def test_duplicate_ids_are_refused_naming_both_videos():
    check_unique(RECORDS, "index.jsonl")
    twin = VideoRecord("v_Run_g02_c01", "/other/v_Run_g02_c01.mp4", 1, "Run", "train")
    with pytest.raises(UserError) as e:
        check_unique([*RECORDS, twin], "index.jsonl")
    assert str(e.value) == (
        "index.jsonl: duplicate video id 'v_Run_g02_c01' for /data/v_Run_g02_c01.avi and /other/v_Run_g02_c01.mp4"
    )


def test_summary_counts_classes_per_split():
    recs = [
        *RECORDS,
        VideoRecord("w2", "/w2", 0, "Walk", "train"),
        VideoRecord("r2", "/r2", 1, "Run", "train"),
    ]
    assert summary(recs) == {"train": Counter(Walk=2, Run=1), "test": Counter(Run=1), "val": Counter({"": 1})}


def _videos(per_class: dict[str, int]) -> list[VideoRecord]:
    """Training videos g01 … gNN of each class, listed out of id order, plus one test video per class."""
    out = []
    for label, (c, n) in enumerate(per_class.items()):
        out += [VideoRecord(f"v_{c}_g{g:02d}", f"/d/{c}{g}.avi", label, c, "train") for g in range(n, 0, -1)]
        out.append(VideoRecord(f"v_{c}_t", f"/d/{c}t.avi", label, c, "test"))
    return out


def _held(records: list[VideoRecord], split: str) -> list[str]:
    return sorted(r.id for r in records if r.split == split)


def test_hold_out_val_moves_the_last_training_videos_of_each_class():
    videos = _videos({"Walk": 4, "Run": 4})
    held = hold_out(videos, 1)
    assert _held(held, "val") == ["v_Run_g04", "v_Walk_g04"]
    assert [r.id for r in held] == [r.id for r in videos]  # order and everything but the split kept
    assert summary(hold_out(videos, 2))["train"] == Counter({"Walk": 2, "Run": 2})
    assert hold_out(videos, 0) == videos
    with pytest.raises(UserError, match="must be ≥ 0"):
        hold_out(videos, -1)


def test_test_is_held_out_first_then_val_and_val_alone_is_unchanged():
    videos = _videos({"Walk": 5, "Run": 4})
    both = hold_out(videos, val_per_class=1, test_per_class=2)
    assert _held(both, "test") == [
        "v_Run_g03",
        "v_Run_g04",
        "v_Run_t",
        "v_Walk_g04",
        "v_Walk_g05",
        "v_Walk_t",
    ]
    assert _held(both, "val") == ["v_Run_g02", "v_Walk_g03"]
    assert _held(hold_out(videos, 1), "val") == ["v_Run_g04", "v_Walk_g05"]  # the README's quickstart choice


def test_a_seed_draws_the_held_out_videos_at_random_and_the_same_seed_gives_the_same_index(tmp_path):
    videos = _videos({"Walk": 12, "Run": 12})
    draws = {seed: hold_out(videos, 2, 3, seed=seed) for seed in (0, 1)}
    for seed, held in draws.items():
        assert summary(held)["test"] == Counter(Walk=4, Run=4) and summary(held)["val"] == Counter(
            Walk=2, Run=2
        )
        write_index(held, tmp_path / f"a{seed}.jsonl")
        write_index(hold_out(videos, 2, 3, seed=seed), tmp_path / f"b{seed}.jsonl")
        assert (tmp_path / f"a{seed}.jsonl").read_bytes() == (tmp_path / f"b{seed}.jsonl").read_bytes()
    assert _held(draws[0], "val") != _held(draws[1], "val")
    last = hold_out(videos, 2, 3)
    assert (_held(draws[0], "test"), _held(draws[0], "val")) != (_held(last, "test"), _held(last, "val"))


def test_every_class_keeps_a_training_video():
    videos = _videos({"Walk": 3, "Run": 3})
    assert summary(hold_out(videos, 1, 1, seed=2))["train"] == Counter(Walk=1, Run=1)
    with pytest.raises(UserError) as e:
        hold_out(videos, 1, 2)
    assert str(e.value) == (
        "class 'Walk' has 3 training videos: too few to hold out 2 for test and 1 for "
        "validation and still train on one"
    )
    with pytest.raises(
        UserError, match="class 'Walk' has 3 training video.*hold out 3 for validation and still"
    ):
        hold_out(videos, 3, seed=0)
    with pytest.raises(UserError, match="--seed must be ≥ 0"):
        hold_out(videos, 1, seed=-1)


def test_a_check_passes_over_the_videos_it_refuses_in_the_draws_order_and_asks_no_more_than_needed():
    videos = _videos({"Walk": 6, "Run": 6, "Sit": 4})
    broken = {"v_Walk_g06": "not a readable video", "v_Walk_g05": "truncated", "v_Run_g04": "truncated"}
    asked: list[str] = []

    def check(rec: VideoRecord) -> str | None:
        asked.append(rec.id)
        return broken.get(rec.id)

    held = hold_out(videos, 1, 1, check=check)
    assert _held(held, "test") == sorted(
        ["v_Run_g06", "v_Sit_g04", "v_Walk_g04", "v_Run_t", "v_Sit_t", "v_Walk_t"]
    )
    assert _held(held, "val") == ["v_Run_g05", "v_Sit_g03", "v_Walk_g03"]
    assert asked == [
        *("v_Walk_g06", "v_Walk_g05", "v_Walk_g04", "v_Walk_g03"),
        *("v_Run_g06", "v_Run_g05", "v_Sit_g04", "v_Sit_g03"),
    ]
    assert {r.id: r.split for r in held if r.id in broken} == dict.fromkeys(broken, "train")
    # with a seed: the same draw, the refused videos skipped in it (Sit, with none refused, is held out as before)
    seeded = hold_out(videos, 1, 1, seed=3, check=lambda r: broken.get(r.id))
    assert seeded == hold_out(videos, 1, 1, seed=3, check=lambda r: broken.get(r.id))
    assert not {r.id for r in seeded if r.split != "train"} & broken.keys()
    unchecked = hold_out(videos, 1, 1, seed=3)
    sit = [(r.id, r.split) for r in unchecked if r.label_name == "Sit"]
    assert [(r.id, r.split) for r in seeded if r.label_name == "Sit"] == sit
    with pytest.raises(UserError) as e:
        hold_out(videos, 1, 4, check=check)
    assert str(e.value) == (
        "class 'Walk': only 4 of its 6 training videos read, too few to hold out 4 for test and 1 for validation "
        "(e.g. /d/Walk6.avi: not a readable video)"
    )
