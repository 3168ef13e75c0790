"""atomic.py: output goes to a hidden temporary name beside the target and is renamed into place only when
complete; an exception leaves nothing under the final name and no temporary behind; a full disk (a real tmpfs)
is a resource fault."""

from __future__ import annotations

import json
import os

import pytest

from memdpc.common.atomic import (
    TMP_PREFIX,
    atomic_path,
    remove_stale_tmp,
    tmp_name,
    write_bytes_atomic,
    write_json_atomic,
)
from memdpc.common.errors import ResourceFault


def test_tmp_name_is_hidden_per_process_and_keeps_the_extension(tmp_path):
    tmp = tmp_name(tmp_path / "a" / "video.tar")
    assert tmp == tmp_path / "a" / f".tmp-{os.getpid()}-video.tar"
    assert tmp.name.startswith(TMP_PREFIX) and tmp.suffix == ".tar"


def test_the_final_name_appears_only_after_the_block_completes(tmp_path):
    target = tmp_path / "sub" / "out.bin"  # the parent folder is created
    with atomic_path(target) as tmp:
        assert tmp == tmp_name(target)
        tmp.write_bytes(b"abc")
        assert not target.exists()
    assert target.read_bytes() == b"abc"
    assert not tmp.exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.bin"]


def test_an_exception_leaves_nothing_under_the_final_name_and_no_temporary(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError, match="killed"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_an_exception_keeps_the_previous_complete_file(tmp_path):
    target = tmp_path / "out.bin"
    write_bytes_atomic(target, b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"new but incomplete")
        raise RuntimeError
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_write_bytes_atomic_replaces_an_existing_file(tmp_path):
    target = tmp_path / "out.bin"
    write_bytes_atomic(target, b"one")
    write_bytes_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert list(tmp_path.iterdir()) == [target]


def test_write_json_atomic_writes_indented_json_in_key_order(tmp_path):
    target = tmp_path / "report.json"
    obj = {"z": 1, "a": [1, 2], "n": None}
    write_json_atomic(target, obj)
    text = target.read_text()
    assert text == '{\n  "z": 1,\n  "a": [\n    1,\n    2\n  ],\n  "n": null\n}\n'
    assert json.loads(text) == obj


def test_write_json_atomic_refuses_what_json_cannot_hold_and_writes_nothing(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(tmp_path / "bad.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_remove_stale_tmp_deletes_only_temporaries(tmp_path):
    for name in (f"{TMP_PREFIX}1-a.tar", f"{TMP_PREFIX}22-b.json", "a.tar", "tmp-c.tar"):
        (tmp_path / name).write_bytes(b"")
    assert remove_stale_tmp(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "tmp-c.tar"]
    assert remove_stale_tmp(tmp_path) == 0


def test_a_full_disk_keeps_the_previous_file_leaves_no_temporary_and_is_a_fault(small_disk):
    small_disk.resize(64 * 1024)
    target = small_disk.path / "out.bin"
    write_bytes_atomic(target, b"old")
    with pytest.raises(ResourceFault, match=r"no space left on the file system of .*, writing out\.bin"):
        write_bytes_atomic(target, bytes(100 * 1024))
    assert target.read_bytes() == b"old"
    assert list(small_disk.path.iterdir()) == [target]
