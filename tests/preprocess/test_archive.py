"""preprocess/archive.py: frame member names (what the writer names a frame, the scanner reads back), and
``meta.json`` read alone from the archive's end, as a rerun checks hundreds of thousands of archives."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.archive import META, frame_index, frame_name, read_archive, read_meta, write_archive


def test_frame_index_reads_back_frame_name():
    assert [frame_index(frame_name(i)) for i in (0, 7, 123456)] == [0, 7, 123456]
    assert [frame_index(n) for n in (META, frame_name(1, "png"), "1.jpg", "0000001.jpg")] == [None] * 4


@pytest.mark.parametrize(
    "frames, meta",
    [
        ([], {"stream": "rgb"}),  # no frame: meta.json is the only member
        ([os.urandom(700)], {"stream": "flow", "source": "/v/a.avi"}),
        ([os.urandom(n) for n in (512, 1023, 10240)], {"tvl1": {"tau": 0.25}, "note": "ends on a block"}),
        ([b"x" * 10], {"pad": "y" * 50_000}),  # larger than the tail read first: found by the full walk
    ],
)
def test_read_meta_equals_the_meta_of_the_whole_archive(tmp_path, frames, meta):
    path = tmp_path / "v.tar"
    write_archive(path, frames, meta)
    assert read_meta(path) == read_archive(path)[0] == {**meta, "num_frames": len(frames)}


def test_read_meta_of_a_tar_written_otherwise(tmp_path):
    """meta.json not last (another tool's tar): the full walk of the headers finds it."""
    path = tmp_path / "other.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((META, json.dumps({"num_frames": 1}).encode()), (frame_name(0), b"jpeg")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert read_meta(path) == {"num_frames": 1}


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
