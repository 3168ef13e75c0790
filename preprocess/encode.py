"""Image encoding of frames and flow codes, and the measured storage error of an encoding.

Frames are stored as JPEG so that shard members decode on the GPU (DALI ``mixed`` decode). For flow the
image holds codes, not colours, in the order (x, y, third) as R, G, B; JPEG's default 4:2:0 chroma
subsampling averages colour over 2×2 pixels, which mixes x and y. Without subsampling, 8-bit YCbCr still
cannot hold every code triple (129, 128, 128 decodes as 128, 128, 128), so small motions carry a fraction
of a code of error (most in B = Y + 1.772 Cb). ``sampling="rgb"`` writes a JPEG without the colour
transform (Adobe APP14 transform 0, via Pillow): less code error and smaller files, decoded alike by
OpenCV and DALI's CPU decoder — but nvImageCodec (DALI's GPU decode) parses every 3-channel JPEG as
YCbCr, so it is an option for CPU decoding, not the default. :func:`code_error` measures what an
encoding does to the codes; ``bench/flow.py`` prints the table behind the default :data:`FLOW_ENCODING` (README has the figures).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image

from memdpc.common.errors import UserError

__all__ = [
    "DEFAULT_FLOW_ENCODING",
    "FLOW_ENCODING",
    "FLOW_ENCODINGS",
    "FLOW_ENCODING_RGB",
    "JpegEncoding",
    "RGB_ENCODING",
    "code_error",
    "decode_rgb",
    "gpu_decodes_alike",
]

_SAMPLING = {
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
}


@dataclass(frozen=True)
class JpegEncoding:
    """JPEG at ``quality`` (1–100) with chroma ``sampling`` 420, 422 or 444 (444: no subsampling), or
    ``rgb``: R, G, B coded directly, without the YCbCr transform and without subsampling."""

    quality: int = 90
    sampling: str = "420"

    def validate(self, option: str = "--quality") -> None:
        if not 1 <= self.quality <= 100:
            raise UserError(f"{option} must be between 1 and 100, not {self.quality}")
        if self.sampling not in (*_SAMPLING, "rgb"):
            raise UserError(
                f"JPEG chroma sampling must be one of {', '.join(_SAMPLING)} or rgb, not {self.sampling}"
            )

    @property
    def name(self) -> str:
        """The ``encoding`` recorded in archive metadata, e.g. ``jpeg-q90-420``."""
        return f"jpeg-q{self.quality}-{self.sampling}"

    def encode_bgr(self, image: np.ndarray) -> bytes:
        """Encode a BGR (H, W, 3) uint8 image (an OpenCV frame)."""
        if self.sampling == "rgb":
            return self.encode_rgb(image[..., ::-1])
        params = [
            cv2.IMWRITE_JPEG_QUALITY,
            self.quality,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
            _SAMPLING[self.sampling],
        ]
        ok, buf = cv2.imencode(".jpg", image, params)
        if not ok:
            raise RuntimeError("OpenCV failed to encode a JPEG")
        return buf.tobytes()

    def encode_rgb(self, image: np.ndarray) -> bytes:
        """Encode an (H, W, 3) uint8 array whose channels are R, G, B (e.g. flow codes x, y, third)."""
        if self.sampling != "rgb":
            return self.encode_bgr(np.ascontiguousarray(image[..., ::-1]))

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(
            buf, "JPEG", quality=self.quality, subsampling=0, keep_rgb=True
        )
        return buf.getvalue()


RGB_ENCODING = JpegEncoding(90, "420")
# Chosen by measurement (bench/flow.py's storage table; README has the figures): a standard YCbCr JPEG, which
# every decoder (nvJPEG included) reads alike, without chroma subsampling, at quality 100.
# ``FLOW_ENCODING_RGB`` (``--flow-encoding rgb``) is smaller and more exact, for CPU decoders.
FLOW_ENCODING = JpegEncoding(100, "444")
FLOW_ENCODING_RGB = JpegEncoding(90, "rgb")
FLOW_ENCODINGS = {"ycc": FLOW_ENCODING, "rgb": FLOW_ENCODING_RGB}  # by the name `--flow-encoding` takes
DEFAULT_FLOW_ENCODING = "ycc"


def gpu_decodes_alike(encoding: str) -> bool:
    """Whether nvJPEG (DALI's ``mixed`` decoder) decodes JPEGs of this recorded ``encoding`` like
    libjpeg-turbo: flow codes in ``jpeg-q100-444`` decode identically; ``-rgb`` encodings (no YCbCr
    transform) nvJPEG misreads (README has the measured error)."""
    return not encoding.endswith("-rgb")


def decode_rgb(data: bytes) -> np.ndarray:
    """Decode a JPEG to (H, W, 3) uint8 in R, G, B order."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ValueError("not a decodable image")
    return img[..., ::-1]


def code_error(codes: np.ndarray, data: bytes) -> tuple[float, int]:
    """Mean and max absolute difference between ``codes`` (H, W, 3, R-G-B order) and their decoded image."""
    diff = np.abs(decode_rgb(data).astype(np.int16) - codes.astype(np.int16))
    return float(diff.mean()), int(diff.max())
