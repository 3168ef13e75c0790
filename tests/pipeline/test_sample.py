"""pipeline/sample.py: a shard sample's key, its member names and the label encoding."""

from __future__ import annotations

import pytest

from memdpc.pipeline.sample import (
    FRAME_PATTERN,
    INFO,
    LABEL,
    LABEL_BYTES,
    decode_label,
    encode_label,
    frame_member,
    is_frame_member,
    member_name,
    parse_key,
    sample_key,
    sample_members,
)


@pytest.mark.parametrize(
    "video_id, start", [("v_Walk_g01_c02", 0), ("a-b", 59), ("x_1", 12345), ("v", 123456)]
)
def test_key_round_trip(video_id, start):
    key = sample_key(video_id, start)
    assert parse_key(key) == (video_id, start)


def test_key_pads_the_start_to_five_digits():
    assert sample_key("v_Walk_g01", 59) == "v_Walk_g01_00059"
    assert parse_key("v_Walk_g01_00059") == ("v_Walk_g01", 59)


def test_member_names_in_tar_order():
    assert frame_member(0) == "f00.jpg" and frame_member(39) == "f39.jpg"
    assert sample_members(3) == ["f00.jpg", "f01.jpg", "f02.jpg", "cls", "json"]
    assert (LABEL, INFO, FRAME_PATTERN) == ("cls", "json", "fNN.jpg")
    assert member_name("v_00000", "f07.jpg") == "v_00000.f07.jpg"
    assert (
        member_name("v_00000", LABEL).split(".", 1)[0] == "v_00000"
    )  # the key is what precedes the first dot


def test_only_jpegs_are_frame_members():
    assert [m for m in sample_members(2) if is_frame_member(m)] == ["f00.jpg", "f01.jpg"]
    assert not is_frame_member(LABEL) and not is_frame_member(INFO)


@pytest.mark.parametrize(
    "label, data", [(0, b"\0\0\0\0"), (7, b"\x07\0\0\0"), (300, b"\x2c\x01\0\0"), (-1, b"\xff" * 4)]
)
def test_label_is_int32_little_endian(label, data):
    assert encode_label(label) == data
    assert len(data) == LABEL_BYTES == 4
    assert decode_label(data) == label
