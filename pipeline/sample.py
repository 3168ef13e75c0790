"""One shard sample: its key and the names and encodings of its members, the one home of that format.

A sample is one window of one video. Its key is ``<video_id>_<start:05d>`` (``start``: the window's first
frame), and its tar members are ``<key>.f00.jpg … <key>.fNN.jpg`` (the window's JPEG frames in order),
``<key>.cls`` (the label, int32 little-endian) and ``<key>.json`` (video id, start, fps, the frames' height
and width, label, label name, split, stream). Video ids hold no dot, so the key is everything before the
first dot of a member name. Samples of one shard set may differ in frame size; the loaders crop each
relative to its own frames.
"""

from __future__ import annotations

import struct

__all__ = [
    "FRAME_PATTERN",
    "INFO",
    "LABEL",
    "LABEL_BYTES",
    "decode_label",
    "encode_label",
    "frame_member",
    "is_frame_member",
    "member_name",
    "parse_key",
    "sample_key",
    "sample_members",
]

LABEL = "cls"
"""The label member: the class index, int32 little-endian."""
INFO = "json"
"""The info member: the window's JSON (video_id, start, fps, height, width, label, label_name, split,
stream)."""
FRAME_PATTERN = "fNN.jpg"
"""How the frame members are named, in words (recorded in the manifest)."""
LABEL_BYTES = struct.calcsize("<i")


def sample_key(video_id: str, start: int) -> str:
    """The key of the window of ``video_id`` starting at frame ``start``."""
    return f"{video_id}_{start:05d}"


def parse_key(key: str) -> tuple[str, int]:
    """``<video_id>_<start>`` → (video id, start frame)."""
    video_id, start = key.rsplit("_", 1)
    return video_id, int(start)


def frame_member(i: int) -> str:
    """The member name (after the key) of the window's ``i``-th frame: ``fNN.jpg``."""
    return f"f{i:02d}.jpg"


def is_frame_member(member: str) -> bool:
    """Whether a member name (after the key) is one of the frames."""
    return member.endswith(".jpg")


def sample_members(num_frames: int) -> list[str]:
    """Every member name (after the key) of a sample of ``num_frames`` frames, in tar order."""
    return [frame_member(i) for i in range(num_frames)] + [LABEL, INFO]


def member_name(key: str, member: str) -> str:
    """The tar member name ``<key>.<member>``."""
    return f"{key}.{member}"


def encode_label(label: int) -> bytes:
    """The bytes of the label member."""
    return struct.pack("<i", label)


def decode_label(data: bytes) -> int:
    """The class index held by a label member."""
    return struct.unpack("<i", data)[0]
