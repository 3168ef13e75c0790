"""Frame archive member names: what the writer names a frame, the scanner reads back."""

from __future__ import annotations

from memdpc.preprocess.archive import META, frame_index, frame_name


def test_frame_index_reads_back_frame_name():
    assert [frame_index(frame_name(i)) for i in (0, 7, 123456)] == [0, 7, 123456]
    assert [frame_index(n) for n in (META, frame_name(1, "png"), "1.jpg", "0000001.jpg")] == [None] * 4
