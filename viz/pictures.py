"""Pictures of frames and clips, drawn with OpenCV (no matplotlib, so that training can draw them cheaply):
frames as the eye sees them (flow in colour, :mod:`memdpc.viz.flow_colours`), grids, captions, PNG and GIF files.

Every flow picture is captioned with its scale (:attr:`memdpc.viz.flow_colours.FlowColours.note`). Small frames are
enlarged by whole factors (nearest neighbour), so that a 32-pixel clip is still seen pixel by pixel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from memdpc.common.atomic import atomic_path
from memdpc.common.streams import FLOW
from memdpc.preprocess.encode import decode_rgb
from memdpc.viz.flow_colours import DIRECTIONS, codes_colours, legend

__all__ = [
    "PNG_OPTIONS",
    "caption",
    "clip_picture",
    "decode_frames",
    "enlarge",
    "grid",
    "legend_picture",
    "side_by_side",
    "write_gif",
    "write_png",
]

WHITE = 255
GAP = 2  # pixels between the frames of a grid
MIN_WIDTH = 480  # pictures narrower than this are enlarged (whole factors)
_FONT, _SCALE, _LINE = cv2.FONT_HERSHEY_SIMPLEX, 0.45, 16


def decode_frames(jpegs: Sequence[bytes]) -> np.ndarray:
    """JPEG frames (of one size) → (F, H, W, 3) uint8 R, G, B."""
    return np.stack([decode_rgb(data) for data in jpegs])


def visible(frames: np.ndarray, stream: str, max_flow: float | None = None) -> tuple[np.ndarray, str | None]:
    """Frames (..., H, W, 3) uint8 as they are seen: RGB as it is; flow codes in colour on one scale for all of
    them (``max_flow`` None: their speed at ``flow_colours.PERCENTILE``, as ``flow_colours`` scales a picture). Returns the
    pictures and, for flow, the scale's caption line."""
    if stream != FLOW:
        return frames, None
    colours = codes_colours(frames, max_flow)
    return colours.image, colours.note


def grid(frames: np.ndarray | Sequence[np.ndarray], columns: int, gap: int = GAP) -> np.ndarray:
    """Frames of one size, row by row, ``columns`` to a row, on white: (rows·(H+gap)−gap, …, 3) uint8."""
    frames = list(frames)
    h, w = frames[0].shape[:2]
    rows = -(-len(frames) // columns)
    out = np.full((rows * (h + gap) - gap, columns * (w + gap) - gap, 3), WHITE, np.uint8)
    for i, f in enumerate(frames):
        y, x = (i // columns) * (h + gap), (i % columns) * (w + gap)
        out[y : y + h, x : x + w] = f
    return out


def enlarge(image: np.ndarray, min_width: int = MIN_WIDTH) -> np.ndarray:
    """``image`` enlarged by the smallest whole factor that makes it at least ``min_width`` wide (nearest
    neighbour), or as it is."""
    factor = max(1, -(-min_width // image.shape[1]))
    if factor == 1:
        return image
    return cv2.resize(image, None, fx=factor, fy=factor, interpolation=cv2.INTER_NEAREST)


def _wrap(text: str, width: int) -> list[str]:
    words, lines, line = text.split(), [], ""
    for word in words:
        trial = f"{line} {word}".strip()
        if line and cv2.getTextSize(trial, _FONT, _SCALE, 1)[0][0] > width:
            lines.append(line)
            line = word
        else:
            line = trial
    return [*lines, line] if line else lines


def caption(image: np.ndarray, lines: Sequence[str]) -> np.ndarray:
    """``image`` under a white band holding ``lines`` (wrapped to its width; characters outside ASCII are
    drawn as '?')."""
    width = image.shape[1]
    text = [part for line in lines for part in _wrap(line.encode("ascii", "replace").decode(), width - 8)]
    if not text:
        return image
    band = np.full((len(text) * _LINE + 6, width, 3), WHITE, np.uint8)
    for i, line in enumerate(text):
        cv2.putText(band, line, (4, (i + 1) * _LINE), _FONT, _SCALE, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([band, image])


def side_by_side(images: Sequence[np.ndarray], gap: int = GAP) -> np.ndarray:
    """Images of one height, left to right, with white gaps."""
    h = images[0].shape[0]
    spacer = np.full((h, gap, 3), WHITE, np.uint8)
    parts = [p for img in images for p in (spacer, img)][1:]
    return np.concatenate(parts, axis=1)


def clip_picture(
    frames: np.ndarray, stream: str, num_blocks: int, title: Sequence[str] = (), max_flow: float | None = None
) -> np.ndarray:
    """A clip as the model reads it: (F, H, W, 3) uint8 frames (flow as codes) in ``num_blocks`` rows of
    F / num_blocks frames, enlarged, under ``title`` and, for flow, its colour scale."""
    shown, note = visible(frames, stream, max_flow)
    picture = enlarge(grid(shown, len(frames) // num_blocks))
    return caption(picture, [*title, *([note] if note else [])])


def legend_picture(size: int = 161) -> np.ndarray:
    """The colour wheel as a disc with how to read it: what a motion from the centre to a point is drawn as."""
    disc = np.full((size + 40, size + 80, 3), WHITE, np.uint8)
    disc[20 : 20 + size, 40 : 40 + size] = legend(size)
    labels = {
        "right": (size + 42, 24 + size // 2),
        "left": (2, 24 + size // 2),
        "up": (40 + size // 2 - 8, 14),
        "down": (40 + size // 2 - 16, size + 34),
    }
    for direction, at in labels.items():
        cv2.putText(disc, direction, at, _FONT, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    lines = [
        "flow colours: a pixel moving from the centre towards a point of the disc has its colour; "
        "the rim is full colour, the centre (still) white",
        ", ".join(f"{d}: {c}" for d, c in DIRECTIONS.items()),
    ]
    return caption(enlarge(disc, 320), lines)


# zlib's fastest level for every PNG the package writes: a report draws many pictures, and Pillow's default
# level spends most of their writing time compressing them a little smaller
PNG_OPTIONS = {"compress_level": 1}


def write_png(path: str | os.PathLike, image: np.ndarray) -> Path:
    """Write an (H, W, 3) uint8 R, G, B image as PNG, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        Image.fromarray(np.ascontiguousarray(image)).save(tmp, format="PNG", **PNG_OPTIONS)
    return path


def write_gif(path: str | os.PathLike, frames: Sequence[np.ndarray], fps: float) -> Path:
    """Write (H, W, 3) uint8 R, G, B frames as an animated GIF that loops, at ``fps``, atomically. Each frame's
    256 colours are chosen by Pillow's fast octree: its default (median cut) is many times slower on frames
    of a report's size."""
    path = Path(path)
    images = [
        Image.fromarray(np.ascontiguousarray(f)).quantize(256, method=Image.Quantize.FASTOCTREE)
        for f in frames
    ]
    with atomic_path(path) as tmp:
        images[0].save(
            tmp,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            loop=0,
            duration=max(20, round(1000 / max(fps, 1e-3))),
        )
    return path
