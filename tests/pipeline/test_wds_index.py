"""The index writer produces exactly the text of DALI's wds2idx tool, for any tar."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.wds_index import index_for_tar, index_path, read_index, scan_tar, split_name, write_index


def _write_tar(path: Path, fmt: int) -> None:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, size in [
            ("a/k1.f00.jpg", 10),
            ("a/k1.cls", 4),
            ("a/k1.json", 600),
            ("k2.jpg", 0),
            ("k2.seg.png", 1025),
            ("a/.hidden", 3),
            ("k3.txt", 7),
        ]:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"z" * size))
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
def test_index_equals_wds2idx(tmp_path, fmt):
    tar = tmp_path / "shard-000.tar"
    _write_tar(tar, fmt)
    ref = tmp_path / "ref.idx"
    subprocess.run(
        [str(Path(sys.executable).parent / "wds2idx"), str(tar), str(ref)], check=True, capture_output=True
    )
    assert write_index(tar) == tmp_path / "shard-000.idx"
    assert (tmp_path / "shard-000.idx").read_bytes() == ref.read_bytes()
    assert ref.read_text().startswith("v1.2 3\n")  # the hidden file and the folder are left out


def test_read_index_gives_back_every_indexed_member(tmp_path):
    tar = tmp_path / "shard-000.tar"
    _write_tar(tar, tarfile.USTAR_FORMAT)
    samples = list(read_index(write_index(tar)))
    entries = {name: (offset, size) for name, offset, size in scan_tar(tar) if name != "a/.hidden"}
    assert [sorted(s) for s in samples] == [
        ["a/k1.cls", "a/k1.f00.jpg", "a/k1.json"],
        ["k2.jpg", "k2.seg.png"],
        ["k3.txt"],
    ]
    assert {n: v for s in samples for n, v in s.items()} == entries


def test_split_name_cuts_at_the_first_dot_of_the_file_name():
    assert split_name("d.x/key.f00.jpg") == ("d.x/key", "f00.jpg")
    assert index_path("out/train-000001.tar") == Path("out/train-000001.idx")


def test_empty_or_broken_tar_is_a_user_error(tmp_path):
    empty = tmp_path / "e.tar"
    tarfile.open(empty, "w").close()
    with pytest.raises(UserError, match="empty"):
        index_for_tar(empty)
    (tmp_path / "b.tar").write_bytes(b"garbage" * 100)
    with pytest.raises(UserError, match="b.tar"):
        index_for_tar(tmp_path / "b.tar")
