"""preprocess/source.py: a real video file against the identity its archive recorded (archive_meta's), after it is
replaced, edited at the same size, touched, or removed."""

from __future__ import annotations

import os
import shutil

import numpy as np

from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import render_video
from memdpc.preprocess.job import archive_meta
from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.source import same_bytes, source_changes
from memdpc.preprocess.video_index import VideoRecord


def test_a_file_is_compared_by_size_time_and_where_they_disagree_its_bytes(tmp_path):
    video, other = tmp_path / "v.avi", tmp_path / "w.avi"
    write_video(video, render_video("MoveLeft", 32, 6, np.random.default_rng(0)), 25.0, "mjpg")
    write_video(other, render_video("ZoomIn", 32, 9, np.random.default_rng(1)), 25.0, "mjpg")
    stream = VideoStream(video, DecodeSpec(size=0))
    meta = archive_meta(
        VideoRecord("v", str(video), 0, "a", "train"), "rgb", PreprocessConfig(out="o"), stream, (32, 32)
    )
    stat = video.stat()
    assert meta["source_sha256"] == stream.file_sha256 and source_changes(meta) == []
    os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))  # touched: the same bytes
    assert source_changes(meta) == []
    body = bytearray(video.read_bytes())
    body[len(body) // 2] ^= 1
    video.write_bytes(bytes(body))  # the same size, one bit changed
    (modified, content) = source_changes(meta)
    assert modified.startswith("modified ") and content == (
        f"content: SHA-256 {meta['source_sha256'][:12]} → {stream.__class__(video).file_sha256[:12]}"
    )
    shutil.copyfile(other, video)  # another video at its path
    assert source_changes(meta)[0] == f"size {stat.st_size} → {other.stat().st_size} bytes"
    assert source_changes(meta, other) == source_changes(meta)  # any path against the recorded identity
    video.unlink()
    assert source_changes(meta) == []  # gone: its archive is all that is left of it
    assert source_changes({"source": str(other)}) == []  # an archive that recorded no identity


def test_a_file_elsewhere_is_the_same_source_only_with_the_recorded_bytes(tmp_path):
    video = tmp_path / "a" / "v.avi"
    video.parent.mkdir()
    write_video(video, render_video("MoveLeft", 32, 6, np.random.default_rng(0)), 25.0, "mjpg")
    stream = VideoStream(video, DecodeSpec(size=0))
    meta = archive_meta(
        VideoRecord("v", str(video), 0, "a", "train"), "rgb", PreprocessConfig(out="o"), stream, (32, 32)
    )
    moved = tmp_path / "b" / "v.avi"
    moved.parent.mkdir()
    shutil.copyfile(video, moved)  # a copy: another modification time
    assert same_bytes(meta, moved) and not same_bytes(meta, tmp_path / "gone.avi")
    body = bytearray(moved.read_bytes())
    body[len(body) // 2] ^= 1
    moved.write_bytes(bytes(body))  # the same size, one bit changed
    assert not same_bytes(meta, moved)
    undigested = {k: v for k, v in meta.items() if k != "source_sha256"}  # an archive that recorded no digest
    assert not same_bytes(undigested, video)
