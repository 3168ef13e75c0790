"""TV-L1 flow of a whole video file for Python users, computed as ``memdpc preprocess flow`` computes it before
storing it (the stored images clip it to ±20 px and round it to codes; this returns the flow itself)."""

from __future__ import annotations

import os

import numpy as np

from memdpc.common.errors import UserError
from memdpc.preprocess.decode import DecodeError, DecodeSpec, VideoStream
from memdpc.preprocess.flow.backends import codes_to_flow, flow_to_codes, make_backend, to_grey
from memdpc.preprocess.flow.tvl1_params import TVL1Params

__all__ = ["video_flow"]


def video_flow(
    path: str | os.PathLike,
    *,
    size: int = DecodeSpec.size,
    params: TVL1Params = TVL1Params(),
    backend: str = "native",
    stored: bool = False,
) -> np.ndarray:
    """Flow from frame k to k + 1 of every pair of consecutive frames of the video at ``path``, frames resized
    so the short side is ``size`` (0: as decoded): (T − 1, H, W, 2) float32 pixels (x right, y down), by
    ``backend`` (``native``: OpenCV's TV-L1 bit for bit, compiled; ``opencv``). ``stored``: clipped to ±20 px and
    rounded to the 8-bit codes the flow archives store (before their JPEG encoding), read back as pixels.
    A file that does not decode is a :class:`UserError` naming it."""
    flow_backend = make_backend(backend, params)
    flows: list[np.ndarray] = []
    prev = None
    try:
        for frame in VideoStream(path, DecodeSpec(size=size)):
            grey = to_grey(frame)
            if prev is not None:
                flows.append(flow_backend(prev[None], grey[None])[0])  # (1, H, W) ×2 -> (H, W, 2)
            prev = grey
    except DecodeError as e:
        raise UserError(f"{path}: {e}") from None
    if not flows:
        raise UserError(f"{path}: fewer than two frames, so no flow")
    out = np.stack(flows).astype(np.float32)
    return codes_to_flow(flow_to_codes(out)) if stored else out
