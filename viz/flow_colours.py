"""Flow in colour: the one colouring of optical flow, wherever memdpc shows it (ARCHITECTURE.md §2.6).

The colour wheel every optical-flow tool draws (the Middlebury flow benchmark's): the direction of motion is
the hue, its speed the saturation. In image coordinates (y down): rightward is red, downward yellow,
leftward cyan, upward blue-violet; no motion is white. Speeds are scaled to one maximum, a given one or the
picture's own: its 99th percentile of speed (:data:`PERCENTILE`), so that a few stray pixels of TV-L1 do not
wash out the rest (the largest speed where nearly every pixel is still). A speed above the maximum keeps its
full colour, darkened (× 0.75), so that it cannot pass for the maximum. :attr:`FlowColours.note` says which
maximum a picture uses, for its caption.

Stored flow images hold codes, not colours (``preprocess/flow/backends.py``, ARCHITECTURE.md §2.2):
:func:`codes_to_motion` decodes them with that mapping's inverse, which reads the two codes either side of zero flow (127 and 128) as
± half a code step; both are still (the mapping rounds a flow of 0 up to 128 and one of −0.01 px down to 127,
and a flipped training clip turns 128 into 127), so they are drawn white.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memdpc.preprocess.flow.backends import codes_to_flow, flow_to_codes

__all__ = ["DIRECTIONS", "FLOW_KEY", "codes_colours", "legend"]

# the wheel's segments: colours from one primary or secondary to the next, as the benchmark's code spaces them
_SEGMENTS = (
    ("red", "yellow", 15),
    ("yellow", "green", 6),
    ("green", "cyan", 4),
    ("cyan", "blue", 11),
    ("blue", "magenta", 13),
    ("magenta", "red", 6),
)
_PRIMARIES = {
    "red": (255, 0, 0),
    "yellow": (255, 255, 0),
    "green": (0, 255, 0),
    "cyan": (0, 255, 255),
    "blue": (0, 0, 255),
    "magenta": (255, 0, 255),
}
OUT_OF_RANGE = 0.75  # speeds above the maximum: full colour, darkened by this factor
PERCENTILE = 99  # a picture's own maximum: this percentile of its speeds
DIRECTIONS = {"right": "red", "down": "yellow", "left": "cyan", "up": "blue-violet"}
FLOW_KEY = (
    "flow in colour: hue = direction ("
    + ", ".join(f"{d} {c}" for d, c in DIRECTIONS.items())
    + "), saturation = speed, white = still"
)
"""How to read a flow picture, in one line (ASCII, so that any renderer draws it)."""


def colour_wheel() -> np.ndarray:
    """The wheel's 55 colours, (55, 3) float64 R, G, B in [0, 255]: red, through yellow, green, cyan, blue
    and magenta, back towards red; each segment steps one channel linearly (rounded down)."""
    rows = []
    for start, end, steps in _SEGMENTS:
        a, b = np.array(_PRIMARIES[start], float), np.array(_PRIMARIES[end], float)
        t = np.arange(steps)[:, None] / steps
        rows.append(a + np.floor(255 * t) * ((b - a) / 255))  # (b − a) / 255 is −1, 0 or 1 per channel
    return np.concatenate(rows)


_WHEEL = colour_wheel() / 255.0


@dataclass(frozen=True)
class FlowColours:
    """Flow drawn in colour: ``image`` (..., H, W, 3) uint8 R, G, B; ``max_flow`` the speed in pixels that
    full colour stands for; ``given`` whether it was given (else it is the picture's own, :data:`PERCENTILE`)."""

    image: np.ndarray
    max_flow: float
    given: bool

    @property
    def note(self) -> str:
        """The picture's caption: :data:`FLOW_KEY` and the scale (ASCII)."""
        if self.given:
            return f"{FLOW_KEY}; full colour = {self.max_flow:.3g} px (given), faster is darker"
        if self.max_flow == 0:
            return f"{FLOW_KEY}; no motion here"
        return (
            f"{FLOW_KEY}; full colour = {self.max_flow:.3g} px ({PERCENTILE}th percentile of speed here), "
            "faster is darker"
        )


def flow_colours(flow: np.ndarray, max_flow: float | None = None) -> FlowColours:
    """Flow (..., H, W, 2) in pixels (x right, y down) as colours; speeds scaled to ``max_flow`` (None: the
    :data:`PERCENTILE` th percentile of the speeds of everything given, or their largest where that is 0; pass
    a whole clip to draw its frames on one scale)."""
    flow = np.asarray(flow, dtype=np.float64)
    u, v = flow[..., 0], flow[..., 1]
    speed = np.hypot(u, v)
    given = max_flow is not None
    if given and not max_flow > 0:
        raise ValueError(f"max_flow must be positive, not {max_flow}")
    top = float(max_flow) if given else own_maximum(speed)
    r = speed / top if top > 0 else np.zeros_like(speed)
    n = len(_WHEEL)
    position = (np.arctan2(-v, -u) / np.pi + 1) / 2 * (n - 1)  # 0 … n − 1 around the wheel
    k0 = np.floor(position).astype(np.int64)
    k1 = (k0 + 1) % n
    f = (position - k0)[..., None]
    colour = (1 - f) * _WHEEL[k0] + f * _WHEEL[k1]
    colour = np.where((r <= 1)[..., None], 1 - r[..., None] * (1 - colour), colour * OUT_OF_RANGE)
    return FlowColours(np.floor(255 * colour).astype(np.uint8), top, given)


def own_maximum(speed: np.ndarray) -> float:
    """The speed a picture's full colour stands for when none is given (module docstring)."""
    if speed.size == 0:
        return 0.0
    top = float(np.percentile(speed, PERCENTILE))
    return top if top > 0 else float(speed.max())


# what the code of zero flow decodes to: half a code step, the most the codes either side of zero are read as
_STILL = float(np.abs(codes_to_flow(flow_to_codes(np.zeros((1, 2), np.float32)))).max()) * (1 + 1e-6)


def codes_to_motion(codes: np.ndarray) -> np.ndarray:
    """Stored flow codes (..., H, W, 3) uint8 (x, y, third; ARCHITECTURE.md §2.2) → flow (..., H, W, 2) in
    pixels: the mapping's inverse, with the two codes either side of zero flow read as still (module
    docstring)."""
    flow = codes_to_flow(np.asarray(codes))
    flow[np.abs(flow) <= _STILL] = 0
    return flow


def codes_colours(codes: np.ndarray, max_flow: float | None = None) -> FlowColours:
    """:func:`flow_colours` of stored flow codes (..., H, W, 3) uint8, e.g. decoded flow JPEGs."""
    return flow_colours(codes_to_motion(codes), max_flow)


def legend(size: int = 129) -> np.ndarray:
    """The wheel as a disc on white, (size, size, 3) uint8: a pixel's colour is that of a motion from the
    centre to it, the rim standing for full colour."""
    c = (size - 1) / 2
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    flow = np.stack([(x - c) / c, (y - c) / c], axis=-1)
    image = flow_colours(flow, 1.0).image
    image[np.hypot(*np.moveaxis(flow, -1, 0)) > 1] = 255
    return image
