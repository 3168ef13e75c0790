"""``--plot`` figures (matplotlib, Agg backend, PNG): retrieval examples, confusion matrix, memory norms.

* Retrieval examples (paper appendix): each row is a test query and its top-3 train neighbours, every video
  shown as a strip of one frame per block of its first window, titled with the class (green: same class);
  flow in colour (:mod:`memdpc.viz.flow_colours`), each strip on a scale of its own (flow_colours'), named in its title.
* Confusion matrix of per-video predictions (rows: true class, normalised per row).
* Memory norms (paper appendix, Fig. "memory retrieval"): ‖M_i‖ of every memory slot, the largest few
  highlighted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import cv2
import matplotlib
import numpy as np

from memdpc.common.atomic import atomic_path
from memdpc.common.streams import FLOW, RGB
from memdpc.eval.shard_meta import window_frames
from memdpc.pipeline.sample import sample_key
from memdpc.pipeline.shard_set import open_split
from memdpc.viz.flow_colours import FLOW_KEY, codes_colours
from memdpc.viz.pictures import PNG_OPTIONS, decode_frames

__all__ = ["confusion_matrix", "memory_norms", "retrieval_examples"]

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 — after choosing the backend

if TYPE_CHECKING:
    from memdpc.eval.data import EvalData


DPI = 100
# the width a retrieval strip's frame is drawn at: small frames enlarged, large ones shrunk
STRIP_FRAME_PX = 96
TITLE_PAD = 6  # points between a strip and its title (matplotlib's axes titles')


def _save(fig, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=DPI, format="png", pil_kwargs=PNG_OPTIONS)
    plt.close(fig)
    return Path(path)


def frame_strip(
    jpegs: Sequence[bytes], num_blocks: int, stream: str = RGB
) -> tuple[np.ndarray, float | None]:
    """One frame from the middle of every block, side by side: (h, num_blocks·w, 3) RGB uint8, flow in colour on
    the strip's own scale (flow_colours'); and, for flow, the speed its full colour stands for."""
    per_block = len(jpegs) // num_blocks
    frames = decode_frames([jpegs[b * per_block + per_block // 2] for b in range(num_blocks)])
    if stream != FLOW:
        return np.concatenate(frames, axis=1), None
    colours = codes_colours(frames)
    return np.concatenate(colours.image, axis=1), colours.max_flow


def retrieval_examples(
    path: str | os.PathLike,
    data: EvalData,
    q_ids: Sequence[str],
    q_labels: np.ndarray,
    g_ids: Sequence[str],
    g_labels: np.ndarray,
    neighbours: np.ndarray,
    classes: Sequence[str],
    rows: int = 5,
    stream: str | None = None,
) -> Path:
    """Queries (the first ``rows`` test videos) and their top-3 neighbours as frame strips.

    Frames come from the first window of each video in the shards of ``stream`` (default: the evaluated
    stream; pass "rgb" to show RGB frames for a flow model, as the paper does); flow is drawn in colour. Every
    frame is drawn :data:`STRIP_FRAME_PX` pixels wide (the figure is sized to it), whatever the frames' size.
    """
    stream = stream or data.loader.stream
    num_blocks = open_split(data.loader.shards, stream, data.test_split).clip.num_blocks
    rows = min(rows, len(q_ids))
    top = neighbours[:rows, :3]
    q_frames = window_frames(
        data.loader.shards, stream, data.test_split, [sample_key(q_ids[i], 0) for i in range(rows)]
    )
    g_keys = [sample_key(g_ids[j], 0) for j in np.unique(top)]
    g_frames = window_frames(data.loader.shards, stream, data.loader.train_split, g_keys)
    grid = []  # per row: (strip or None, title, colour) of the query and its neighbours
    for i in range(rows):
        cells = [(q_frames.get(sample_key(q_ids[i], 0)), f"query: {classes[q_labels[i]]}", "black")]
        for j in top[i]:
            color = "green" if g_labels[j] == q_labels[i] else "red"
            cells.append((g_frames.get(sample_key(g_ids[j], 0)), classes[g_labels[j]], color))
        row = []
        for jpegs, title, color in cells:
            strip = None
            if jpegs:
                strip, top_speed = frame_strip(jpegs, num_blocks, stream)
                if top_speed is not None:
                    title += f" (full colour: {top_speed:.2g} px)"
            row.append((strip, title, color))
        grid.append(row)
    aspect = max((s.shape[0] / s.shape[1] for row in grid for s, _, _ in row if s is not None), default=0.75)
    columns, top_edge = 1 + top.shape[1], 0.93 if stream != FLOW else 0.88
    # A grid of cells (margin: of the figure; gaps: of a cell's width and height), the figure sized to it; each
    # strip drawn pixel for pixel into its cell (to the cell's width, centred, nearest neighbour), its title above
    # it; no axes (an axes per strip, made and drawn, cost most of a report page's time).
    margin, wspace, hspace = 0.01, 0.05, 0.3
    strip_w = num_blocks * STRIP_FRAME_PX  # a cell's width in pixels
    cell_h = strip_w * aspect
    width = strip_w * (columns + wspace * (columns - 1)) / (1 - 2 * margin)
    height = cell_h * (rows + hspace * (rows - 1)) / (top_edge - margin)
    fig = plt.figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    for i, row in enumerate(grid):
        cell_top = height * (1 - top_edge) + i * cell_h * (1 + hspace)  # pixels from the figure's top
        for j, (strip, title, color) in enumerate(row):
            left, drawn_top = margin * width + j * strip_w * (1 + wspace), cell_top
            if strip is not None:
                drawn_h = max(1, round(strip_w * strip.shape[0] / strip.shape[1]))
                drawn_top += (cell_h - drawn_h) / 2
                image = cv2.resize(strip, (strip_w, drawn_h), interpolation=cv2.INTER_NEAREST)
                fig.figimage(image, xo=round(left), yo=round(height - drawn_top - drawn_h), origin="upper")
            x, y = (left + strip_w / 2) / width, 1 - (drawn_top - TITLE_PAD * DPI / 72) / height
            fig.text(x, y, title, ha="center", va="baseline", fontsize=8, color=color)
    if stream == FLOW:
        fig.suptitle(f"{FLOW_KEY}; each strip on its own scale, its full colour in its title", fontsize=9)
    return _save(fig, path)


def confusion(pred: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts (true class, predicted class)."""
    m = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(m, (labels, pred), 1)
    return m


def confusion_matrix(
    path: str | os.PathLike, probs: np.ndarray, labels: np.ndarray, classes: Sequence[str]
) -> Path:
    """A row-normalised confusion matrix of the arg-max predictions."""
    m = confusion(probs.argmax(axis=1), labels, len(classes)).astype(float)
    m /= np.maximum(m.sum(axis=1, keepdims=True), 1)
    size = min(4 + 0.25 * len(classes), 30)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(m, vmin=0, vmax=1, cmap="Blues")
    if len(classes) <= 30:
        ax.set_xticks(range(len(classes)), classes, rotation=90, fontsize=7)
        ax.set_yticks(range(len(classes)), classes, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.tight_layout()
    return _save(fig, path)


def memory_norms(path: str | os.PathLike, memory: np.ndarray, highlight: int = 5) -> Path:
    """Bar plot of ‖M_i‖ over the k memory slots; the ``highlight`` largest in orange."""
    norms = np.linalg.norm(np.asarray(memory, dtype=np.float64), axis=1)
    top = np.argsort(-norms, kind="stable")[:highlight]
    colors = np.array(["tab:blue"] * len(norms), dtype=object)
    colors[top] = "tab:orange"
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.bar(np.arange(len(norms)), norms, width=1.0, color=list(colors))
    ax.set_xlabel("memory slot")
    ax.set_ylabel("‖M_i‖")
    ax.set_title(f"memory norms (k = {len(norms)}; largest: {', '.join(map(str, top))})")
    fig.tight_layout()
    return _save(fig, path)
