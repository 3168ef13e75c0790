"""preprocess/archive.py: frame member names (what the writer names a frame, the scanner reads back), and
``meta.json`` read alone from the archive's end, as a rerun checks hundreds of thousands of archives, with the
frames' sizes it records, as shard finds every frame."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.archive import (
    FRAME_BYTES,
    META,
    frame_index,
    frame_name,
    read_archive,
    read_meta,
    recorded_frames,
    write_archive,
)


def test_frame_index_reads_back_frame_name():
    assert [frame_index(frame_name(i)) for i in (0, 7, 123456)] == [0, 7, 123456]
    assert [frame_index(n) for n in (META, frame_name(1, "png"), "1.jpg", "0000001.jpg")] == [None] * 4


@pytest.mark.parametrize(
    "frames, meta",
    [
        ([], {"stream": "rgb"}),  # no frame: meta.json is the only member
        ([os.urandom(700)], {"stream": "flow", "source": "/v/a.avi"}),
        ([os.urandom(n) for n in (512, 1023, 10240)], {"tvl1": {"tau": 0.25}, "note": "ends on a block"}),
        ([b"x" * 10], {"pad": "y" * 50_000}),  # larger than the tail read first: found in a larger one
    ],
)
def test_read_meta_equals_the_meta_of_the_whole_archive_and_finds_the_frames_the_headers_do(
    tmp_path, frames, meta
):
    path = tmp_path / "v.tar"
    write_archive(path, frames, meta)
    sizes = [len(f) for f in frames]
    assert read_meta(path) == read_archive(path)[0] == {**meta, "num_frames": len(frames), FRAME_BYTES: sizes}
    with tarfile.open(path) as tar:
        headers = [(m.offset_data, m.size) for m in tar if m.name != META]
    recorded, offsets, found = recorded_frames(path)
    assert recorded == {**meta, "num_frames": len(frames)}
    assert list(zip(offsets.tolist(), found.tolist(), strict=True)) == headers


def _tar(path, members: list[tuple[str, bytes]], fmt=tarfile.USTAR_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_sizes_not_recorded_or_not_leading_to_meta_json_leave_the_frames_to_the_headers(tmp_path):
    earlier = tmp_path / "earlier.tar"  # written before archives recorded their frames' sizes
    _tar(earlier, [(frame_name(0), b"jpeg"), (META, json.dumps({"num_frames": 1}).encode())])
    other = tmp_path / "other.tar"  # sizes that do not add up to where meta.json is
    meta = {"num_frames": 2, FRAME_BYTES: [600, 4]}
    _tar(other, [(frame_name(0), b"j" * 500), (frame_name(1), b"jpeg"), (META, json.dumps(meta).encode())])
    assert recorded_frames(earlier) is None and recorded_frames(other) is None
    assert read_meta(other) == meta
    written = tmp_path / "written.tar"
    write_archive(written, [b"j" * 500, b"jpeg"], {})
    assert np.array_equal(recorded_frames(written)[2], [500, 4])


def test_read_meta_of_a_tar_written_otherwise(tmp_path):
    """meta.json not last (another tool's tar): the full walk of the headers finds it."""
    path = tmp_path / "other.tar"
    _tar(path, [(META, json.dumps({"num_frames": 1}).encode()), (frame_name(0), b"jpeg")], tarfile.PAX_FORMAT)
    assert read_meta(path) == {"num_frames": 1} and recorded_frames(path) is None


def test_read_meta_refuses_what_is_not_a_complete_archive(tmp_path):
    whole = tmp_path / "whole.tar"
    write_archive(whole, [os.urandom(3000) for _ in range(3)], {"stream": "rgb"})
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:4000])  # a copy that stopped halfway: no meta.json
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar " * 100)
    bare = tmp_path / "bare.tar"
    with tarfile.open(bare, "w") as tar:
        info = tarfile.TarInfo(frame_name(0))
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(UserError, match=f"{cut}: frame archive has no meta.json"):
        read_meta(cut)
    with pytest.raises(UserError, match=f"{junk}: unreadable frame archive"):
        read_meta(junk)
    with pytest.raises(UserError, match=f"{bare}: frame archive has no meta.json"):
        read_meta(bare)
