"""A whole video's flow for Python users: OpenCV's TV-L1 of every pair of decoded frames, and, stored, the very
codes `memdpc preprocess flow` writes; an unreadable file is a one-line error naming it."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.encode import decode_rgb
from memdpc.preprocess.flow.backends import codes_to_flow
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.flow.video import video_flow
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import VideoRecord, write_index

from ...conftest import decode_video

CHEAP = TVL1Params(scales=2, warps=1, outer_iterations=2, inner_iterations=5)


def test_the_flow_of_every_pair_is_opencvs(tiny_dataset):
    path = next(tiny_dataset.rglob("*.avi"))
    flow = video_flow(path, size=0, params=CHEAP)
    frames = decode_video(path)
    assert flow.shape == (len(frames) - 1, *frames.shape[1:3], 2) and flow.dtype == np.float32
    tvl1 = CHEAP.to_opencv()
    for k in (0, len(frames) // 2):
        prev, nxt = (cv2.cvtColor(frames[i], cv2.COLOR_BGR2GRAY) for i in (k, k + 1))
        assert np.array_equal(flow[k], tvl1.calc(prev, nxt, None))


def test_stored_flow_is_what_preprocess_writes_up_to_its_jpeg(tiny_dataset, tmp_path):
    path = next(tiny_dataset.rglob("*.avi"))
    write_index([VideoRecord("v", str(path), -1, "", "test")], tmp_path / "index.jsonl")
    preprocess(
        tmp_path / "index.jsonl", tmp_path / "frames", "flow", size=24, tvl1=CHEAP.to_dict(), progress=False
    )
    _, images = read_archive(archive_path(tmp_path / "frames", "flow", "v"))
    archived = np.stack([codes_to_flow(decode_rgb(b)) for b in images])
    stored = video_flow(path, size=24, params=CHEAP, stored=True)
    step = 40 / 255  # one code in pixels
    assert stored.shape == archived.shape
    assert np.allclose(np.round((stored + 20) / step), (stored + 20) / step, atol=1e-3)  # on the codes' grid
    assert np.abs(stored - archived).mean() <= 0.5 * step  # the JPEG's storage error, within its bound


def test_a_file_that_is_not_a_video_is_a_one_line_error(tmp_path):
    bad = tmp_path / "notes.avi"
    bad.write_text("not a video")
    with pytest.raises(UserError, match=f"^{bad}: "):
        video_flow(bad)
