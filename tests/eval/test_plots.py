"""Figures: confusion counts by hand, and real PNG files from matplotlib's Agg backend."""

from __future__ import annotations

import cv2
import numpy as np

from memdpc.eval.data import EvalData
from memdpc.eval.plots import (
    STRIP_FRAME_PX,
    confusion,
    confusion_matrix,
    frame_strip,
    memory_norms,
    retrieval_examples,
)
from memdpc.pipeline.backends import LoaderSettings
from memdpc.preprocess.encode import FLOW_ENCODING
from memdpc.preprocess.flow.backends import flow_to_codes

PNG = b"\x89PNG\r\n\x1a\n"


def test_confusion_counts_by_hand():
    m = confusion(np.array([0, 1, 1, 2, 0]), np.array([0, 1, 2, 2, 1]), 3)
    assert m.tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]


def test_confusion_matrix_and_memory_norm_pngs(tmp_path):
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    assert (
        confusion_matrix(tmp_path / "c.png", probs, np.array([0, 1, 1]), ["a", "b"]).read_bytes()[:8] == PNG
    )
    memory = np.zeros((32, 4))
    memory[7] = 5.0
    assert memory_norms(tmp_path / "m.png", memory, highlight=3).read_bytes()[:8] == PNG
    assert not list(tmp_path.glob(".tmp-*"))


def test_frame_strip_takes_the_middle_frame_of_every_block():
    frames = []
    for i in range(6):  # 2 blocks × 3 frames, frame i filled with the value 40·i
        ok, buf = cv2.imencode(".png", np.full((4, 5, 3), 40 * i, np.uint8))
        frames.append(buf.tobytes())
    strip, _ = frame_strip(frames, num_blocks=2)
    assert strip.shape == (4, 10, 3)
    assert strip[0, 0, 0] == 40 and strip[0, 5, 0] == 160  # frames 1 and 4


def test_a_flow_strip_is_drawn_in_colour_not_as_grey_codes():
    frames = []
    for i in range(4):  # 2 blocks × 2 frames of stored flow: block 0 moves right, block 1 left, 2 px
        codes = flow_to_codes(np.tile(np.array([2.0 if i < 2 else -2.0, 0.0], np.float32), (4, 5, 1)))
        frames.append(FLOW_ENCODING.encode_rgb(codes))
    grey, _ = frame_strip(frames, num_blocks=2)  # as RGB: the codes themselves, near grey
    assert np.abs(grey.astype(int) - 128).max() < 20
    strip, _ = frame_strip(frames, num_blocks=2, stream="flow")
    assert strip.shape == (4, 10, 3)
    r, g, b = strip[0, 0].astype(int)
    assert r == 255 and abs(g - b) < 5 and g < 60  # right: red (JPEG moves a code by one here and there)
    r, g, b = strip[0, 5].astype(int)
    assert r < 60 and g > 150 and b == 255  # left: cyan


def test_retrieval_strips_draw_every_frame_large_enough_to_see(eval_data, tmp_path):
    """32² frames, 5 blocks: each strip is drawn STRIP_FRAME_PX a frame (46×35 px a frame before)."""
    test = [r for r in eval_data.records if r.split == "test"]
    train = [r for r in eval_data.records if r.split == "train"]
    neighbours = np.tile(np.arange(len(train)), (len(test), 1))
    path = retrieval_examples(
        tmp_path / "strips.png",
        EvalData(LoaderSettings(eval_data.shards, "rgb")),
        [r.id for r in test],
        np.array([r.label for r in test]),
        [r.id for r in train],
        np.array([r.label for r in train]),
        neighbours,
        ["MoveRight", "MoveLeft", "MoveUp"],
    )
    picture = cv2.imread(str(path))
    columns, blocks = 4, 5  # a query and its 3 neighbours
    assert picture.shape[1] >= columns * blocks * STRIP_FRAME_PX
    # the query of the first row: its frames, not white, span a strip's width
    drawn = np.flatnonzero((picture[: picture.shape[0] // 5] < 250).any(axis=(0, 2)))
    assert np.ptp(drawn[drawn < picture.shape[1] // columns]) >= blocks * STRIP_FRAME_PX * 0.95
