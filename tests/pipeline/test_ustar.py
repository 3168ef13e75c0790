"""The fast USTAR header writer/reader agrees with tarfile byte for byte and refuses what it can't handle."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from memdpc.pipeline import ustar

NAMES = ["a.jpg", "v_X_g01_c01_00059.f39.jpg", "k" * 100, "x.cls", "é.json"]
SIZES = [0, 1, 511, 512, 513, 12345, 8**10]


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", SIZES)
def test_header_equals_tarfile(name, size):
    assert ustar.header(name, size) == _tarfile_header(name, size)


def test_header_refuses_long_names():
    with pytest.raises(ustar.NotPlainUstar):
        ustar.header("k" * 101, 1)


def _tar(members: dict[str, bytes], fmt=tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


MEMBERS = {"000000.jpg": b"x" * 700, "000001.jpg": b"", "meta.json": b'{"num_frames": 2}'}


def test_list_members_and_tar_size_agree_with_tarfile():
    raw = _tar(MEMBERS)
    got = list(ustar.list_members(io.BytesIO(raw), len(raw)))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert got == [(m.name, m.offset_data, m.size) for m in tar]
    assert [raw[o : o + n] for _, o, n in got] == list(MEMBERS.values())
    assert ustar.tar_size(sum(ustar.member_bytes(len(v)) for v in MEMBERS.values())) == len(raw)
    sizes = np.array([len(v) for v in MEMBERS.values()])
    assert ustar.member_bytes(sizes).tolist() == [ustar.member_bytes(int(s)) for s in sizes]  # elementwise


def test_list_members_refuses_truncated_corrupt_and_non_plain_tars():
    raw = _tar(MEMBERS)
    with pytest.raises(ValueError, match="truncated"):
        list(ustar.list_members(io.BytesIO(raw[:1000]), 1000))
    bad = bytearray(raw)
    bad[10] ^= 1  # inside the first name: checksum no longer matches
    with pytest.raises(ValueError, match="checksum"):
        list(ustar.list_members(io.BytesIO(bytes(bad)), len(bad)))
    pax = _tar({"ü" * 120 + ".jpg": b"1"}, tarfile.PAX_FORMAT)
    with pytest.raises(ustar.NotPlainUstar):
        list(ustar.list_members(io.BytesIO(pax), len(pax)))
    with pytest.raises(ValueError):
        list(ustar.list_members(io.BytesIO(b""), 0))
