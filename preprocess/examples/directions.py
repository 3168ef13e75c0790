"""The example family whose classes are directions: camera motions over real photographs, in the UCF101 layout.

The other two families are built so that a class is a *kind* of motion, never its direction (the built-in
family pairs opposite motions by appearance, the photos family draws every direction at random). Real data has
classes that only a direction tells apart ("pushing something from left to right" and "from right to left"),
and an invariance that suits the other families (to the clip's global motion, to its sense) is wrong here. This
family is that case: the view pans left or right, tilts up or down, rolls clockwise or counter-clockwise, or
zooms in or out (see ``DIRECTION_CLASSES``), always with a speed and a photograph drawn at random, while three
patches cut from other photographs bounce across the frame in random directions, faster than the camera moves
(distractors with motions of their own). Only the direction of the camera's motion tells the class. Rendered as the photos family is
(``photos.render_video``); deterministic for a seed (and scikit-image's photographs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from memdpc.preprocess.examples.layout import ExampleConfig, write_example
from memdpc.preprocess.examples.photos import (
    MAX_ZOOM,
    RENDER_SCALE,
    fit_centre,
    load_photos,
    render_video,
    tracks,
    view,
)

__all__ = ["DIRECTION_CLASSES", "DirectionConfig", "make_directions"]

# the camera's motion, named as a camera operator would (the scene in the frame moves the other way: PanLeft moves
# it right, RollClockwise turns it counter-clockwise, ZoomIn spreads it out): per class, a pan or tilt's heading in
# the frame's own axes (x right, y down), a roll's or zoom's sense
DIRECTION_CLASSES = (
    "PanLeft",
    "PanRight",
    "TiltUp",
    "TiltDown",
    "RollClockwise",
    "RollCounterClockwise",
    "ZoomIn",
    "ZoomOut",
)
_HEADINGS = {"PanLeft": (-1.0, 0.0), "PanRight": (1.0, 0.0), "TiltUp": (0.0, -1.0), "TiltDown": (0.0, 1.0)}
_SENSES = {"RollClockwise": 1.0, "RollCounterClockwise": -1.0, "ZoomIn": 1.0, "ZoomOut": -1.0}
# the camera's speed at 64², px a frame (of the frame's edge in a roll or zoom): slower than the distractors'
CAMERA_SPEED = (0.4, 1.2)
DISTRACTORS = 3  # patches bouncing across the frame, each in a random direction at the photos family's speeds


@dataclass(frozen=True)
class DirectionConfig(ExampleConfig):
    num_classes: int = len(DIRECTION_CLASSES)

    classes: ClassVar[tuple[str, ...]] = DIRECTION_CLASSES


def direction_views(
    cls: str, rng: np.random.Generator, shape: tuple[int, ...], frames: int, size: int
) -> np.ndarray:
    """The view of every frame, (frames, 2, 3) maps from render to photograph pixels: the camera moves in the
    class's direction relative to the frame (whatever the view's random orientation on the photograph), at a
    random speed. Borders beyond the photograph are mirrored."""
    r, side, t = size * RENDER_SCALE, min(shape[:2]), np.arange(frames)
    angle, speed = rng.uniform(0, 2 * math.pi), rng.uniform(*CAMERA_SPEED) * size / 64  # output px per frame
    window = side * rng.uniform(0.4, 0.75)  # photograph pixels across the frame
    windows, angles = np.full(frames, window), np.full(frames, angle)
    if cls in _HEADINGS:
        c, s = math.cos(angle), math.sin(angle)
        heading = np.array([[c, -s], [s, c]]) @ np.array(_HEADINGS[cls])  # the frame's axes on the photograph
        step = speed * window / size * heading
        centres = fit_centre(rng, shape, window / 2) + (t - (frames - 1) / 2)[:, None] * step
    elif cls.startswith("Roll"):
        centres = np.tile(fit_centre(rng, shape, window / math.sqrt(2)), (frames, 1))
        angles = angles + _SENSES[cls] * speed / (size / 2) * t
    else:  # a zoom: the frame's edge moves at `speed`
        rate = min(speed / (size / 2), math.log(MAX_ZOOM) / max(frames - 1, 1))
        big = side * rng.uniform(0.8, 1.0)
        windows = big * np.exp(-rate * (t if _SENSES[cls] > 0 else frames - 1 - t))
        centres = np.tile(fit_centre(rng, shape, big / 2), (frames, 1))
    return np.stack([view(c, w / r, a, r) for c, w, a in zip(centres, windows, angles, strict=True)])


def distractors(cls: str, rng: np.random.Generator, frames: int, size: int, patch: int) -> list[np.ndarray]:
    """:data:`DISTRACTORS` patches bouncing across the frame in random directions (at the photos family's speeds),
    whatever the class."""
    return [track for _ in range(DISTRACTORS) for track in tracks("ObjectBounce", rng, frames, size, patch)]


def make_directions(out: str | Path, cfg: DirectionConfig = DirectionConfig()) -> Path:
    """Write the directions family to ``out`` in the UCF101 layout (``layout.write_example``) and return the
    dataset root."""
    cfg.validate()
    photos = load_photos()
    return write_example(
        out,
        cfg,
        lambda cls, rng: render_video(
            cls, cfg.size, cfg.frames, rng, photos, direction_views, distractors, DISTRACTORS
        ),
    )
