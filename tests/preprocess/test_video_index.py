"""preprocess/video_index.py: the JSONL video index, its round trip and its one-line errors."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from memdpc.errors import UserError
from memdpc.preprocess.video_index import (
    VideoRecord,
    check_unique,
    hold_out_val,
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
    with pytest.raises(UserError, match=f"^{tmp_path / 'no.jsonl'}: video index not found$"):
        read_index(tmp_path / "no.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UserError, match="empty.jsonl: the video index is empty$"):
        read_index(tmp_path / "empty.jsonl")


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


def test_hold_out_val_moves_the_last_training_videos_of_each_class():
    videos = [VideoRecord(f"v_{c}_g{g:02d}", f"/d/{c}{g}.avi", label, c, "test" if g == 1 else "train")
              for label, c in enumerate(("Walk", "Run")) for g in (3, 1, 4, 2)]
    held = hold_out_val(videos, 1)
    assert [(r.id, r.split) for r in held if r.split == "val"] == [("v_Walk_g04", "val"), ("v_Run_g04", "val")]
    assert [r.id for r in held] == [r.id for r in videos]  # order and everything but the split kept
    assert summary(hold_out_val(videos, 2))["train"] == Counter({"Walk": 1, "Run": 1})
    assert hold_out_val(videos, 0) == videos
    with pytest.raises(UserError, match="class 'Walk' has 3 training video"):
        hold_out_val(videos, 3)
    with pytest.raises(UserError, match="must be ≥ 0"):
        hold_out_val(videos, -1)
