"""The held-out example family: camera and object motions over real photographs, in the UCF101 layout.

The project's settings were tuned on the built-in family (``synthetic.py``: one textured object whose motion
is the class, with tints and shapes shared by pairs of classes). This family checks them on data they were
not tuned on, and is built unlike it: the textures are photographs that scikit-image ships, and a class is a
kind of motion of the whole view or of cut-out objects (see ``PHOTO_CLASSES``), never a direction or an
appearance. Every video shows one photograph with two patches cut from other photographs, all drawn at random
from the whole list at random crops and scales; what moves and how (direction, sense, speed, path) is drawn
at random where the class allows. Only the kind of motion tells the class. Deterministic for a seed (and
scikit-image's photographs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np

from memdpc.common.errors import UserError
from memdpc.preprocess.examples.layout import ExampleConfig, write_example

__all__ = [
    "MAX_ZOOM",
    "RENDER_SCALE",
    "PhotoConfig",
    "fit_centre",
    "load_photos",
    "make_photos",
    "render_video",
    "tracks",
    "view",
]

PHOTO_CLASSES = (
    "CameraPan",  # the view translates across the photograph in a random direction
    "CameraZoom",  # the view zooms in or out (at random) towards a fixed point
    "CameraRoll",  # the view rotates about its centre, clockwise or counter-clockwise at random
    "ObjectOrbit",  # a patch circles along a random ellipse over the still photograph
    "ObjectBounce",  # a patch moves in straight lines and reflects off the frame edges
    "ObjectsCross",  # two patches pass each other in opposite directions along a random axis
)
# The natural photographs of scikit-image's data folder, greyscale ones read as 3 channels. Left out: pictures
# that are mostly black (hubble_deep_field, retina: nothing there for optical flow to follow), a near copy
# (motorcycle_right), text and drawings (page, text, clock_motion, color, logo, phantom, chessboards, horse).
PHOTO_FILES = (
    "astronaut.png",
    "brick.png",
    "camera.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "ihc.png",
    "moon.png",
    "motorcycle_left.png",
    "rocket.jpg",
)

RENDER_SCALE = 3  # frames are drawn at 3× the size and shrunk with INTER_AREA: no aliasing in fine texture
SPEED = (
    1.2,
    2.8,
)  # px per frame at 64²: the speed of a moving patch, a pan, or the frame's edge in zoom and roll
MAX_ZOOM = 6.0  # a zoom changes the scale by at most this much over a video, however long
PATCHES = 2  # patches cut from other photographs per video; those that do not move on their own are still


@dataclass(frozen=True)
class PhotoConfig(ExampleConfig):
    num_classes: int = len(PHOTO_CLASSES)

    classes: ClassVar[tuple[str, ...]] = PHOTO_CLASSES


def photo_dir() -> Path:
    """scikit-image's data folder, found without importing scikit-image (only its files are used)."""
    spec = find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "scikit-image is not installed (the photos family reads the photographs it ships): "
            'pip install "memdpc[photos]"'
        )
    return Path(spec.submodule_search_locations[0]) / "data"


def load_photos() -> list[np.ndarray]:
    """The photographs of ``PHOTO_FILES`` as BGR uint8 images, in that order."""
    folder, photos = photo_dir(), []
    for name in PHOTO_FILES:
        img = cv2.imread(str(folder / name), cv2.IMREAD_COLOR)
        if img is None:
            raise UserError(f"{folder / name}: cannot read this photograph of scikit-image; reinstall it")
        photos.append(img)
    return photos


def view(centre: np.ndarray, scale: float, angle: float, r: int) -> np.ndarray:
    """The 2×3 map from render pixels (r × r frame) to photograph pixels of a view centred on ``centre``,
    ``scale`` photograph pixels per render pixel, rotated by ``angle`` radians."""
    c, s = math.cos(angle) * scale, math.sin(angle) * scale
    rot = np.array([[c, -s], [s, c]])
    return np.hstack([rot, (centre - rot @ np.array([r / 2, r / 2]))[:, None]])


def fit_centre(rng: np.random.Generator, shape: tuple[int, ...], half: float) -> np.ndarray:
    """A random point of the photograph at least ``half`` from its edges (its middle if none is)."""
    return np.array([rng.uniform(min(half, n / 2), max(n - half, n / 2)) for n in (shape[1], shape[0])])


def _view_path(
    cls: str, rng: np.random.Generator, shape: tuple[int, ...], frames: int, size: int
) -> np.ndarray:
    """The view of every frame, (frames, 2, 3) maps from render to photograph pixels: still for the object
    classes, moving for the camera classes. Borders beyond the photograph are mirrored."""
    r, side, t = size * RENDER_SCALE, min(shape[:2]), np.arange(frames)
    angle, speed = rng.uniform(0, 2 * math.pi), rng.uniform(*SPEED) * size / 64  # output px per frame
    window = side * rng.uniform(0.4, 0.75)  # photograph pixels across the frame
    centres, windows, angles = np.zeros((frames, 2)), np.full(frames, window), np.full(frames, angle)
    if cls == "CameraZoom":
        rate = min(speed / (size / 2), math.log(MAX_ZOOM) / max(frames - 1, 1))  # the frame's edge at `speed`
        big = side * rng.uniform(0.8, 1.0)
        zoom_in = rng.random() < 0.5
        windows = big * np.exp(-rate * (t if zoom_in else frames - 1 - t))
        centres[:] = fit_centre(rng, shape, big / 2)
    elif cls == "CameraPan":
        heading = rng.uniform(0, 2 * math.pi)
        step = speed * window / size * np.array([math.cos(heading), math.sin(heading)])
        centres[:] = fit_centre(rng, shape, window / 2) + (t - (frames - 1) / 2)[:, None] * step
    else:
        centres[:] = fit_centre(rng, shape, window / math.sqrt(2))
        if cls == "CameraRoll":
            angles += rng.choice([-1.0, 1.0]) * speed / (size / 2) * t
    return np.stack([view(c, w / r, a, r) for c, w, a in zip(centres, windows, angles, strict=True)])


def tracks(cls: str, rng: np.random.Generator, frames: int, size: int, patch: int) -> list[np.ndarray]:
    """The centres (frames, 2) in render pixels of the patches that move on their own: none in the camera
    classes, one in ObjectOrbit and ObjectBounce, two in ObjectsCross."""
    r, t = size * RENDER_SCALE, np.arange(frames)[:, None]
    speed = rng.uniform(*SPEED) * size / 64 * RENDER_SCALE  # render px per frame
    heading = rng.uniform(0, 2 * math.pi)
    unit = np.array([math.cos(heading), math.sin(heading)])
    if cls == "ObjectOrbit":
        axes = rng.uniform(0.12, 0.3, 2) * r
        centre = r / 2 + rng.uniform(-0.08, 0.08, 2) * r
        omega = rng.choice([-1.0, 1.0]) * speed / axes.mean()
        phase = rng.uniform(0, 2 * math.pi) + omega * t[:, 0]
        ellipse = np.stack([axes[0] * np.cos(phase), axes[1] * np.sin(phase)], 1)
        rot = np.array([[unit[0], -unit[1]], [unit[1], unit[0]]])
        return [centre + ellipse @ rot.T]
    if cls == "ObjectBounce":
        lo, span = patch * 0.4, r - patch * 0.8  # the patch's centre stays in [lo, lo + span]
        free = rng.uniform(0, span, 2) + speed * unit * t
        return [lo + span - np.abs(np.mod(free, 2 * span) - span)]  # a triangle wave: reflection at the edges
    if cls == "ObjectsCross":
        crossing = rng.uniform(0.35, 0.65) * (frames - 1)
        centre = r / 2 + rng.uniform(-0.1, 0.1, 2) * r
        apart = rng.uniform(0.08, 0.2) * r * np.array([-unit[1], unit[0]])  # half the gap between their lanes
        along = speed * unit * (t - crossing)
        return [centre + apart + along, centre - apart - along]
    return []


def _patch(rng: np.random.Generator, photo: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A random crop of ``photo`` as an n × n float32 image and a random soft-edged shape (ellipse or
    polygon) as its alpha mask."""
    h, w = photo.shape[:2]
    crop = int(min(h, w) * rng.uniform(0.15, 0.45))
    y, x = rng.integers(0, h - crop + 1), rng.integers(0, w - crop + 1)
    inter = cv2.INTER_AREA if crop > n else cv2.INTER_LINEAR
    img = cv2.resize(photo[y : y + crop, x : x + crop], (n, n), interpolation=inter).astype(np.float32)
    mask = np.zeros((n, n), np.float32)
    if rng.random() < 0.5:
        axes = (int(n * rng.uniform(0.3, 0.48)), int(n * rng.uniform(0.3, 0.48)))
        cv2.ellipse(mask, (n // 2, n // 2), axes, rng.uniform(0, 180), 0, 360, 1.0, -1)
    else:
        corners = np.sort(rng.uniform(0, 2 * math.pi, rng.integers(3, 9)))
        radii = n * rng.uniform(0.3, 0.48, len(corners))
        pts = n / 2 + radii[:, None] * np.stack([np.cos(corners), np.sin(corners)], 1)
        cv2.fillPoly(mask, [pts.astype(np.int32)], 1.0)
    return img, cv2.GaussianBlur(mask, (0, 0), 0.5 + n / 60)


def _paste(dst: np.ndarray, img: np.ndarray, alpha: np.ndarray, m: np.ndarray) -> None:
    """Blend ``img`` (float32, with ``alpha``) into ``dst`` (float32) through the 2×3 map ``m`` from patch
    to ``dst`` pixels."""
    dsize = (dst.shape[1], dst.shape[0])
    warped = cv2.warpAffine(img, m, dsize, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    a = cv2.warpAffine(alpha, m, dsize, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)[..., None]
    dst += a * (warped - dst)


def _at(centre: np.ndarray, n: int) -> np.ndarray:
    """The 2×3 map placing an n × n patch with its middle at ``centre``."""
    return np.array([[1.0, 0.0, centre[0] - n / 2], [0.0, 1.0, centre[1] - n / 2]])


def _then(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The 2×3 map that applies ``first``, then ``second``."""
    return np.hstack([second[:, :2] @ first[:, :2], (second[:, :2] @ first[:, 2] + second[:, 2])[:, None]])


# the view of every frame of a class's video: (class, generator, photograph's shape, frames, size) → (frames, 2, 3)
ViewPath = Callable[[str, np.random.Generator, tuple[int, ...], int, int], np.ndarray]
# the patches that move on their own: (class, generator, frames, size, patch side) → their centres, (frames, 2) each
Tracks = Callable[[str, np.random.Generator, int, int, int], list[np.ndarray]]


def render_video(
    cls: str,
    size: int,
    frames: int,
    rng: np.random.Generator,
    photos: list[np.ndarray],
    views_of: ViewPath | None = None,
    tracks_of: Tracks | None = None,
    patches: int = PATCHES,
) -> np.ndarray:
    """Render one video of class ``cls`` from ``photos`` (``load_photos()``): (frames, size, size, 3) uint8
    BGR. ``views_of``, ``tracks_of`` and ``patches``: how a class moves the view and the patches, and how many
    patches there are (default: this family's; another family over photographs gives its own)."""
    r = size * RENDER_SCALE
    picks = rng.permutation(len(photos))[: patches + 1]  # the background and the patches' photographs
    scene = photos[picks[0]].astype(np.float32)
    n = int(r * rng.uniform(0.26, 0.4))
    cut = [_patch(rng, photos[i], n) for i in picks[1:]]
    views = (views_of or _view_path)(cls, rng, scene.shape, frames, size)
    moving = (tracks_of or tracks)(cls, rng, frames, size, n)
    for img, alpha in cut[len(moving) :]:  # still patches: part of the scene, where a frame showed them
        view = views[rng.integers(frames)]
        m = _at(rng.uniform(n / 2, r - n / 2, 2), n)
        _paste(scene, img, alpha, _then(m, view))
    out = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        frame = cv2.warpAffine(
            scene,
            views[t],
            (r, r),
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REFLECT_101,
        )
        for (img, alpha), track in zip(cut[: len(moving)], moving, strict=True):
            _paste(frame, img, alpha, _at(track[t], n))
        small = cv2.resize(frame, (size, size), interpolation=cv2.INTER_AREA)
        out[t] = np.clip(np.rint(small), 0, 255).astype(np.uint8)
    return out


def make_photos(out: str | Path, cfg: PhotoConfig = PhotoConfig()) -> Path:
    """Write the photos family to ``out`` in the UCF101 layout (``example_layout.write_example``) and return
    the dataset root."""
    cfg.validate()
    photos = load_photos()
    return write_example(out, cfg, lambda cls, rng: render_video(cls, cfg.size, cfg.frames, rng, photos))
