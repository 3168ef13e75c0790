"""The built-in example dataset: short videos whose class is a motion, in the UCF101 layout.

Every video shows a textured object on a textured, slowly drifting background (the scene), plus a smaller
distractor object with its own random motion. Textures are random; the object's shape, the tint its colour
leans towards and the tint the scene leans towards are shared by two classes of opposite motion (right/left,
up/down, clockwise/counter-clockwise, in/out, horizontal/vertical shake), as objects and scene context are in
real datasets. Appearance therefore narrows a video down to a pair of classes at best; only the motion
(direction, rotation, zoom, oscillation), which is what optical flow sees, tells the class. Deterministic for
a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np

from memdpc.preprocess.examples.layout import ExampleConfig, write_example

__all__ = ["CLASSES", "SyntheticConfig", "make_synthetic", "render_video"]

CLASSES = (
    "MoveRight",
    "MoveLeft",
    "MoveUp",
    "MoveDown",
    "RotateClockwise",
    "RotateCounterClockwise",
    "ZoomIn",
    "ZoomOut",
    "ShakeHorizontal",
    "ShakeVertical",
)


@dataclass(frozen=True)
class SyntheticConfig(ExampleConfig):
    num_classes: int = len(CLASSES)

    classes: ClassVar[tuple[str, ...]] = CLASSES


# BGR tints of the object, one per pair of classes (CLASSES[2i], CLASSES[2i + 1]): red, green, blue, yellow, magenta
PAIR_TINTS = ((0.3, 0.3, 1.0), (0.3, 1.0, 0.3), (1.0, 0.3, 0.3), (0.3, 1.0, 1.0), (1.0, 0.3, 1.0))
# BGR tints of the scene, one per pair, unlike the object's: teal, purple, orange, indigo, olive. The scene fills
# most of the frame: without a pair tint of its own its random colour drowned the object's, and appearance did
# not even narrow a video down to its pair (docs/stages.md, Built-in example data, has the measured figures).
SCENE_TINTS = ((0.8, 0.7, 0.2), (0.8, 0.3, 0.6), (0.2, 0.6, 1.0), (0.7, 0.3, 0.3), (0.2, 0.7, 0.5))


def texture(
    rng: np.random.Generator, h: int, w: int, lean: tuple[float, float, float] | None = None
) -> np.ndarray:
    """A random colour texture (H, W, 3) uint8: smoothed noise at a random scale, random tint and contrast.

    With ``lean``, the random tint is pulled 70 % of the way towards that BGR tint.
    """
    cell = int(rng.integers(2, 9))
    noise = rng.random((h // cell + 2, w // cell + 2, 3)).astype(np.float32)
    img = cv2.resize(noise, (w + 2 * cell, h + 2 * cell), interpolation=cv2.INTER_CUBIC)[
        cell:-cell, cell:-cell
    ]
    fine = rng.random((h, w, 1)).astype(np.float32)
    img = 0.7 * img + 0.3 * fine
    tint = rng.uniform(0.3, 1.0, 3).astype(np.float32)
    if lean is not None:
        tint = 0.7 * np.float32(lean) + 0.3 * tint
    img = (img - img.mean()) * rng.uniform(0.8, 1.6) + 0.5
    return np.clip(img * tint * 255 + rng.uniform(0, 60), 0, 255).astype(np.uint8)


def _object_pose(cls: str, t: int, rng_params: dict, size: int) -> tuple[float, float, float, float]:
    """Centre x, y, angle (degrees) and scale of the main object at frame ``t`` for class ``cls``."""
    cx, cy, v, period, amp = (rng_params[k] for k in ("cx", "cy", "speed", "period", "amp"))
    span = size * 1.5  # wrap-around span for translations: exit one side, re-enter the other
    angle, scale = rng_params["angle0"], 1.0
    if cls.startswith("Move"):
        dx, dy = {"MoveRight": (1, 0), "MoveLeft": (-1, 0), "MoveUp": (0, -1), "MoveDown": (0, 1)}[cls]
        cx = (cx + dx * v * t + span / 2 - size / 2) % span - span / 2 + size / 2
        cy = (cy + dy * v * t + span / 2 - size / 2) % span - span / 2 + size / 2
    elif cls.startswith("Rotate"):
        angle += (-1 if cls == "RotateClockwise" else 1) * rng_params["omega"] * t
    elif cls.startswith("Zoom"):
        phase = (t * rng_params["zoom_rate"]) % 1.0  # zoom cycles between 0.6 and 1.4
        scale = 0.6 + 0.8 * (phase if cls == "ZoomIn" else 1 - phase)
    else:
        offset = amp * math.sin(2 * math.pi * t / period)
        cx, cy = (cx + offset, cy) if cls == "ShakeHorizontal" else (cx, cy + offset)
    return cx, cy, angle, scale


def _paste(
    frame: np.ndarray, obj: np.ndarray, mask: np.ndarray, cx: float, cy: float, angle: float, scale: float
) -> None:
    """Warp ``obj`` (with alpha ``mask``) to centre (cx, cy), rotated and scaled, and blend it into frame."""
    h, w = obj.shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), angle, scale)
    m[:, 2] += (cx - w / 2, cy - h / 2)
    size = (frame.shape[1], frame.shape[0])
    warped = cv2.warpAffine(obj, m, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    alpha = cv2.warpAffine(mask, m, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)[..., None]
    frame[:] = (frame * (1 - alpha) + warped * alpha).astype(np.uint8)


# The object's shape, one per pair of classes like the tint: a cue that colour jitter leaves intact.
PAIR_SHAPES = ("disc", "square", "triangle", "ring", "cross")


def _shape_mask(rng: np.random.Generator, n: int, shape: str) -> np.ndarray:
    """A blob mask (n, n) float32 in [0, 1] of the given ``shape``, random in size, softened at the edge."""
    mask = np.zeros((n, n), np.float32)
    c, r = n // 2, int(n * rng.uniform(0.36, 0.48))
    if shape in ("disc", "ring"):
        cv2.circle(mask, (c, c), r, 1.0, -1)
        if shape == "ring":
            cv2.circle(mask, (c, c), r // 2, 0.0, -1)
    elif shape == "square":
        mask[c - r : c + r, c - r : c + r] = 1.0
    elif shape == "triangle":
        pts = np.int32([[c, c - r], [c - r, c + r * 3 // 4], [c + r, c + r * 3 // 4]])
        cv2.fillPoly(mask, [pts], 1.0)
    else:  # cross
        t = max(1, r // 3)
        mask[c - r : c + r, c - t : c + t] = mask[c - t : c + t, c - r : c + r] = 1.0
    return cv2.GaussianBlur(mask, (3, 3), 0)


def render_video(cls: str, size: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """Render one video of class ``cls``: (frames, size, size, 3) uint8 BGR."""
    pair = CLASSES.index(cls) // 2
    bg = texture(rng, size * 2, size * 2, SCENE_TINTS[pair])
    bg_v = rng.uniform(-0.3, 0.3, 2)
    n = size // 2
    obj, mask = texture(rng, n, n, PAIR_TINTS[pair]), _shape_mask(rng, n, PAIR_SHAPES[pair])
    dn = size // 4
    dis, dis_mask = texture(rng, dn, dn), _shape_mask(rng, dn, PAIR_SHAPES[rng.integers(len(PAIR_SHAPES))])
    dis_p, dis_v = rng.uniform(0.2 * size, 0.8 * size, 2), rng.uniform(-0.6, 0.6, 2)
    params = {
        "cx": size / 2 + rng.uniform(-0.1, 0.1) * size,
        "cy": size / 2 + rng.uniform(-0.1, 0.1) * size,
        "speed": size / 48 * rng.uniform(0.8, 1.25),
        "period": rng.uniform(8, 14),
        "amp": size * rng.uniform(0.1, 0.16),
        "angle0": rng.uniform(0, 360),
        "omega": rng.uniform(4, 7),
        "zoom_rate": rng.uniform(1 / 40, 1 / 28),
    }
    out = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        ox, oy = size / 2 + bg_v * t
        m = np.float32([[1, 0, -ox], [0, 1, -oy]])
        frame = cv2.warpAffine(bg, m, (size, size), borderMode=cv2.BORDER_REFLECT)
        _paste(frame, dis, dis_mask, *(dis_p + dis_v * t), angle=0.0, scale=1.0)
        _paste(frame, obj, mask, *_object_pose(cls, t, params, size))
        out[t] = frame
    return out


def make_synthetic(out: str | Path, cfg: SyntheticConfig = SyntheticConfig()) -> Path:
    """Write the example dataset to ``out`` in the UCF101 layout (``example_layout.write_example``) and
    return the dataset root."""
    cfg.validate()
    return write_example(out, cfg, lambda cls, rng: render_video(cls, cfg.size, cfg.frames, rng))
