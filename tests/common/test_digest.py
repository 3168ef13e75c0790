"""common/digest.py: a file's SHA-256, as sha256sum prints it, read in chunks."""

from __future__ import annotations

import hashlib
import subprocess

from memdpc.common.digest import file_sha256


def test_the_digest_is_sha256sum_s_whatever_the_chunk(tmp_path):
    path = tmp_path / "f.bin"
    data = bytes(range(256)) * 1000 + b"tail"
    path.write_bytes(data)
    assert file_sha256(path) == file_sha256(path, chunk=7) == hashlib.sha256(data).hexdigest()
    assert subprocess.run(["sha256sum", path], capture_output=True, text=True).stdout.split()[
        0
    ] == file_sha256(path)
