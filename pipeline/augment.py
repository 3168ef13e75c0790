"""The augmentation spec: one dataclass, read by both the DALI and the torch loader.

Every random choice is drawn here, in NumPy, and handed to the loaders as plain numbers (crop boxes, flip
flags, per-frame 3×4 colour matrices), so both loaders apply the same semantics:

* train *(ref)*: a random resized crop (area 0.5–1 of the frame, aspect 3/4–4/3, torchvision's sampling
  rule) shared by all frames of a clip, resized to ``crop_size`` (224) and then to the training size; a
  horizontal flip once per clip; per frame a colour jitter (brightness, contrast, saturation 0.5, hue 0.25,
  in a random order like torchvision) and a random grey (p 0.25, copying one random channel to all three,
  as *(ref)* does), or one jitter and grey per block or per clip (``colour_per``); ImageNet mean/std.
* eval: centre crop (a square of the short side), five-crop (4 corners + centre, side ``eval_scale`` × the
  short side) or ten-crop (the five and their mirror images), each resized straight to the output size.
* frame sizes: shards may mix videos of several sizes and aspect ratios (ARCHITECTURE.md §2.3), so every
  box is relative to the frames of its own sample. The random crop is drawn as numbers that do not depend on
  the frame size (:func:`draw_crop`); :func:`crop_box` turns them into a box once the sample's size is
  known (the torch loader and DALI's CPU path call it; DALI's GPU graph computes the same arithmetic from
  the sample's JPEG header).
* flow: a flip negates the x channel (x → 255 − x; *(ref)* forgets this); colour ops on flow are
  optional (``jitter_flow``, the paper: yes).

Colour ops are linear maps of RGB, so each frame's ops compose into one affine map ``out = M·rgb + T``,
applied with a single rounding and clamping to [0, 255] at the end (:func:`apply_colour`: ``cv2.transform``
on the CPU, a batched matmul on the GPU). Two differences from torchvision, for the same reason: contrast blends with
grey 128 instead of the frame's mean grey (DALI's ``color_twist`` does the same) and hue rotates about the
grey axis in YIQ space instead of shifting HSV hue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import cv2
import numpy as np
import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.clip import COLOUR_SPANS, EVAL_CROPS

__all__ = [
    "AugmentSpec",
    "CROP_TRIES",
    "apply_colour",
    "colour_frames",
    "crop_box",
    "crop_resize",
    "denormalise",
    "eval_boxes",
    "flow_flip_map",
    "normalise",
    "resize_frames",
    "sample_clip",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_LUMA = np.array([0.299, 0.587, 0.114])
_RGB2YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ2RGB = np.linalg.inv(_RGB2YIQ)

Box = tuple[int, int, int, int]
"""A crop in source pixels: (y0, x0, height, width)."""


@dataclass(frozen=True)
class AugmentSpec:
    """What the loaders do to a clip; ``AugmentSpec.off()`` gives plain decoding (for identity tests)."""

    enabled: bool = True
    crop_area: tuple[float, float] = (0.5, 1.0)
    crop_aspect: tuple[float, float] = (3 / 4, 4 / 3)
    crop_size: int | None = 224
    flip_p: float = 0.5
    brightness: float = 0.5
    contrast: float = 0.5
    saturation: float = 0.5
    hue: float = 0.25
    grey_p: float = 0.25
    jitter_flow: bool = True
    colour_per: str = "frame"  # one of COLOUR_SPANS: how many frames share a colour jitter and grey draw
    flow_shift: float = 0.0
    flow_gain: float = 1.0
    flow_reverse: float = 0.0
    eval_scale: float = 0.875
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        lo, hi = self.crop_area
        if not 0 < lo <= hi <= 1:
            raise UserError(f"augmentation crop_area must satisfy 0 < lo ≤ hi ≤ 1, got {self.crop_area}")
        if not 0 < self.crop_aspect[0] <= self.crop_aspect[1]:
            raise UserError(f"augmentation crop_aspect must be positive and ordered, got {self.crop_aspect}")
        if not 0 < self.eval_scale <= 1:
            raise UserError(f"augmentation eval_scale must be in (0, 1], got {self.eval_scale}")
        if self.colour_per not in COLOUR_SPANS:
            raise UserError(f"augmentation colour_per must be one of {', '.join(COLOUR_SPANS)}")

    @classmethod
    def off(cls) -> AugmentSpec:
        """No random op at all: train mode behaves like eval with a centre crop."""
        return cls(enabled=False)

    def colour_on(self, stream: str) -> bool:
        """Whether per-frame colour ops apply to this stream."""
        return self.enabled and (stream != "flow" or self.jitter_flow)

    def with_(self, **kw) -> AugmentSpec:
        return replace(self, **kw)


@dataclass(frozen=True)
class ClipParams:
    """The random draw for one training clip: the crop's draw (:func:`draw_crop`; :func:`crop_box` makes it a
    box of the sample's frames), flip, and per-frame affine colour maps (F, 3, 4)."""

    crop: np.ndarray
    flip: bool
    colour: np.ndarray | None


# ------------------------------------------------------------------------------------------ geometry
CROP_TRIES = 10
"""torchvision's tries at an area and aspect that fit the frame before it falls back to a centre crop."""


def draw_crop(rng: np.random.Generator, spec: AugmentSpec) -> np.ndarray:
    """The random resized crop's draw, independent of the frame size: float64 (2·CROP_TRIES + 2,) = per try
    an area fraction (uniform in ``crop_area``), per try an aspect ratio w/h (log-uniform in ``crop_aspect``),
    then where the crop sits vertically and horizontally (uniforms in [0, 1))."""
    log_lo, log_hi = math.log(spec.crop_aspect[0]), math.log(spec.crop_aspect[1])
    area = rng.uniform(*spec.crop_area, CROP_TRIES)
    aspect = np.exp(rng.uniform(log_lo, log_hi, CROP_TRIES))
    return np.concatenate([area, aspect, rng.random(2)])


def _round(x: float) -> int:
    """Half up, as the DALI graph computes it (``floor(x + 0.5)``; Python's round goes to even on exact
    halves, the only place the two differ)."""
    return math.floor(x + 0.5)


def crop_box(h: int, w: int, draw: np.ndarray, spec: AugmentSpec) -> Box:
    """The crop box of a :func:`draw_crop` draw in an h × w frame, by torchvision's
    ``RandomResizedCrop.get_params``: the first try whose box fits, at a position scaled from the draw's two
    uniforms; if none fits, a centre crop with the aspect clamped to ``crop_aspect``.

    Float64 operations in this order are what ``dali_loader`` computes in its graph (tested equal)."""
    target = float(h * w) * draw[:CROP_TRIES]
    aspect = draw[CROP_TRIES : 2 * CROP_TRIES]
    cws = np.floor(np.sqrt(target * aspect) + 0.5)
    chs = np.floor(np.sqrt(target / aspect) + 0.5)
    fits = np.flatnonzero((cws > 0) & (cws <= w) & (chs > 0) & (chs <= h))
    if len(fits):
        ch, cw = int(chs[fits[0]]), int(cws[fits[0]])
        pos_y, pos_x = draw[2 * CROP_TRIES :]
        return math.floor(pos_y * (h - ch + 1)), math.floor(pos_x * (w - cw + 1)), ch, cw
    lo, hi = spec.crop_aspect
    ratio = w / h
    if ratio < lo:
        cw, ch = w, _round(w / lo)
    elif ratio > hi:
        ch, cw = h, _round(h * hi)
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def eval_boxes(h: int, w: int, crops: int, spec: AugmentSpec) -> list[tuple[Box, bool]]:
    """Eval crops of an h × w frame as (box, flipped): 1 = centre square of the short side; 5 = corners +
    centre, side ``eval_scale`` × the short side (rounded half up, as the DALI graph computes it);
    10 = ×flip."""
    if crops not in EVAL_CROPS:
        raise UserError(f"crops must be one of {', '.join(map(str, EVAL_CROPS))}, not {crops}")
    if crops == 1:
        s = min(h, w)
        return [(((h - s) // 2, (w - s) // 2, s, s), False)]
    s = max(1, _round(min(h, w) * spec.eval_scale))
    five = [(0, 0), (0, w - s), (h - s, 0), (h - s, w - s), ((h - s) // 2, (w - s) // 2)]
    boxes = [((y, x, s, s), False) for y, x in five]
    return boxes + [(b, True) for b, _ in boxes] if crops == 10 else boxes


# --------------------------------------------------------------------------------------------- colour
# Colour maps are handled as homogeneous 4×4 matrices (rows 0–2 = the 3×4 affine map), batched over frames.


def _homogeneous(n: int) -> np.ndarray:
    out = np.zeros((n, 4, 4))
    out[:, 3, 3] = 1.0
    return out


def flow_flip_map() -> np.ndarray:
    """A horizontal flip of a flow image negates its x channel: x → 255 − x (3×4 affine map)."""
    return np.array([[-1.0, 0, 0, 255.0], [0, 1, 0, 0], [0, 0, 1, 0]])


def _jitter_maps(rng: np.random.Generator, n: int, spec: AugmentSpec) -> np.ndarray:
    """(n, 4, 4): per frame brightness, contrast, saturation and hue as linear maps, in a random order."""
    b = rng.uniform(max(0.0, 1 - spec.brightness), 1 + spec.brightness, n)[:, None, None]
    c = rng.uniform(max(0.0, 1 - spec.contrast), 1 + spec.contrast, n)[:, None, None]
    s = rng.uniform(max(0.0, 1 - spec.saturation), 1 + spec.saturation, n)[:, None, None]
    theta = 2 * np.pi * rng.uniform(-spec.hue, spec.hue, n)
    eye = np.eye(3)
    ops = _homogeneous(4 * n).reshape(4, n, 4, 4)
    ops[0, :, :3, :3] = b * eye
    ops[1, :, :3, :3] = c * eye
    ops[1, :, :3, 3] = (1 - c[:, :, 0]) * 128.0
    ops[2, :, :3, :3] = s * eye + (1 - s) * np.outer(np.ones(3), _LUMA)
    rot = np.zeros((n, 3, 3))
    rot[:, 0, 0] = 1.0
    rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = (
        np.cos(theta),
        -np.sin(theta),
        np.sin(theta),
        np.cos(theta),
    )
    ops[3, :, :3, :3] = _YIQ2RGB @ rot @ _RGB2YIQ
    order = rng.permuted(np.tile(np.arange(4), (n, 1)), axis=1)  # (n, 4): each frame's op order
    out = _homogeneous(n)
    out[:, :3, :3] = eye
    for k in range(4):
        out = ops[order[:, k], np.arange(n)] @ out
    return out


def _grey_maps(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """(n, 4, 4): with probability p *(ref)*'s random grey (one random channel copied to all three), else I."""
    out = _homogeneous(n)
    out[:, :3, :3] = np.eye(3)
    grey = np.flatnonzero(rng.random(n) < p)
    channel = rng.integers(0, 3, len(grey))
    out[grey, :3, :3] = 0.0
    out[grey, :3, channel] = 1.0
    return out


def _motion_maps(rng: np.random.Generator, num_frames: int, num_blocks: int, spec: AugmentSpec) -> np.ndarray:
    """(F, 4, 4): per block, one random global shift and gain of the flow codes, x and y alike; with
    ``flow_reverse``, that block's gain negative at that probability (its motion run backwards)."""
    shift = rng.uniform(-spec.flow_shift, spec.flow_shift, (num_blocks, 2))
    gain = np.exp(rng.uniform(-math.log(spec.flow_gain), math.log(spec.flow_gain), num_blocks))
    if spec.flow_reverse > 0:  # drawn only when asked: the other draws stay those of runs without it
        gain *= np.where(rng.random(num_blocks) < spec.flow_reverse, -1.0, 1.0)
    per = num_frames // num_blocks
    out = _homogeneous(num_frames)
    out[:, 2, 2] = 1.0
    for k in range(num_blocks):
        sl = slice(k * per, (k + 1) * per)
        out[sl, 0, 0] = out[sl, 1, 1] = gain[k]
        out[sl, :2, 3] = 128.0 * (1 - gain[k]) + shift[k]
    return out


def colour_maps(
    rng: np.random.Generator, num_frames: int, stream: str, flip: bool, spec: AugmentSpec, num_blocks: int = 1
) -> np.ndarray | None:
    """Per-frame affine colour maps (F, 3, 4) float32, or None when the clip's colours stay as they are."""
    flow_flip = stream == "flow" and flip
    motion = (
        stream == "flow"
        and spec.enabled
        and (spec.flow_shift > 0 or spec.flow_gain > 1 or spec.flow_reverse > 0)
    )
    if not spec.colour_on(stream) and not flow_flip and not motion:
        return None
    maps = _homogeneous(num_frames)
    maps[:, :3] = flow_flip_map() if flow_flip else np.eye(3, 4)
    if motion:
        maps = _motion_maps(rng, num_frames, num_blocks, spec) @ maps
    if spec.colour_on(stream):
        n = {"frame": num_frames, "block": num_blocks, "clip": 1}[spec.colour_per]
        jitter = _grey_maps(rng, n, spec.grey_p) @ _jitter_maps(rng, n, spec)
        maps = np.repeat(jitter, num_frames // n, axis=0) @ maps
    return maps[:, :3].astype(np.float32)


def sample_clip(
    rng: np.random.Generator, num_frames: int, stream: str, spec: AugmentSpec, num_blocks: int = 1
) -> ClipParams:
    """Draw everything random for one training clip (``spec.enabled`` must be true), whatever its frame size:
    the same draws fit every sample, so a loader may draw before it knows which sample they go to."""
    crop = draw_crop(rng, spec)
    flip = bool(rng.random() < spec.flip_p)
    return ClipParams(crop, flip, colour_maps(rng, num_frames, stream, flip, spec, num_blocks))


# ------------------------------------------------------------------------------- OpenCV (host) ops
def resize_frames(frames: Sequence[np.ndarray], size: int) -> np.ndarray:
    """Resize every frame of (F, h, w, C) (or a list of F frames) to size × size (area filter when shrinking,
    like antialiasing)."""
    if frames[0].shape[:2] == (size, size):
        return np.asarray(frames)
    interp = cv2.INTER_AREA if min(frames[0].shape[:2]) > size else cv2.INTER_LINEAR
    return np.stack([cv2.resize(f, (size, size), interpolation=interp) for f in frames])


def crop_resize(
    frames: Sequence[np.ndarray], box: Box, flip: bool, size: int, spec: AugmentSpec
) -> np.ndarray:
    """A training clip's geometry on decoded frames (F, H, W, C) (or a list of F frames), in any channel order:
    its crop box resized to ``spec.crop_size`` and then to ``size``, mirrored when ``flip``."""
    y0, x0, h, w = box
    crops = [f[y0 : y0 + h, x0 : x0 + w] for f in frames]
    video = resize_frames(resize_frames(crops, spec.crop_size or size), size)
    return video[:, :, ::-1] if flip else video


def colour_frames(frames: np.ndarray, maps: np.ndarray) -> np.ndarray:
    """Per-frame affine colour maps with ``cv2.transform``: (F, H, W, 3) uint8 with (F, 3, 4) → uint8."""
    out = np.empty(frames.shape, np.uint8)
    for i, m in enumerate(maps.astype(np.float32, copy=False)):
        cv2.transform(frames[i], m, dst=out[i])
    return out


# ------------------------------------------------------------------------------------------ normalise
def apply_colour(frames: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
    """Per-frame affine colour maps on uint8 frames: (B, F, H, W, 3) with (B, F, 3, 4) → uint8, rounded and
    saturated. On the CPU with ``cv2.transform`` (what the torch loader uses; DALI's CPU ``coord_transform``
    is much slower; docs/loaders.md has the figure), elsewhere as a batched matmul on the frames' device."""
    if frames.device.type == "cpu":
        fr, ms = frames.numpy(), maps.numpy()
        return torch.from_numpy(np.stack([colour_frames(f, m) for f, m in zip(fr, ms, strict=True)]))
    b, f, h, w, c = frames.shape
    x = frames.reshape(b * f, h * w, c).float()
    m = maps.to(device=frames.device, dtype=torch.float32).reshape(b * f, 3, 4)
    x = torch.baddbmm(m[:, None, :, 3], x, m[:, :, :3].transpose(1, 2))  # (B·F, H·W, 3)
    return x.round_().clamp_(0, 255).to(torch.uint8).reshape(b, f, h, w, c)


def normalise(frames: torch.Tensor, num_blocks: int, spec: AugmentSpec) -> torch.Tensor:
    """uint8 (..., F, H, W, 3) → float32 (..., N, 3, SL, H, W), contiguous, mean/std normalised.

    Runs on whatever device ``frames`` lives on (the training device), so loaders ship uint8. The layout
    change runs on the uint8 data (4× less memory traffic than on floats).
    """
    *lead, f, h, w, c = frames.shape
    mean = torch.tensor(spec.mean, device=frames.device).view(3, 1, 1, 1) * 255
    inv = 1.0 / (torch.tensor(spec.std, device=frames.device).view(3, 1, 1, 1) * 255)
    x = frames.reshape(*lead, num_blocks, f // num_blocks, h, w, c)  # (..., N, SL, H, W, 3)
    x = x.movedim(-1, -4).contiguous().float()  # (..., N, 3, SL, H, W)
    return x.sub_(mean).mul_(inv)


def denormalise(clips: torch.Tensor, spec: AugmentSpec) -> torch.Tensor:
    """The inverse of :func:`normalise`: float (..., N, 3, SL, H, W) → uint8 (..., F, H, W, 3), rounded."""
    mean = torch.tensor(spec.mean, device=clips.device).view(3, 1, 1, 1) * 255
    std = torch.tensor(spec.std, device=clips.device).view(3, 1, 1, 1) * 255
    x = (clips * std + mean).round_().clamp_(0, 255).to(torch.uint8)
    x = x.movedim(-4, -1)  # (..., N, SL, H, W, 3)
    return x.flatten(-5, -4)
