"""Image encoding of frames and flow codes, and the measured storage error of an encoding.

Frames are stored as JPEG so that shard members decode on the GPU (DALI ``mixed`` decode). Flow is stored as
codes, not colours (x, y and a constant third channel, ARCHITECTURE.md §2.2). The default, ``planes``, writes
x and y as two greyscale planes of one JPEG, x on top and y below it (:func:`planes_image`); the x plane is
padded to whole JPEG blocks so that no block holds both, and its padded height follows from the image's
(:func:`planes_offset`), so a decoder splits the planes knowing nothing but the JPEG. Without a colour
transform there is nothing to round but the DCT: the codes come back without drift. The readers put the
constant third channel back (:func:`split_planes`).

The older 3-channel encodings stay readable: ``ycc`` (YCbCr 4:4:4; no chroma subsampling, which would
average x and y over 2×2 pixels) cannot hold every code triple in 8-bit YCbCr (129, 128, 128 decodes as 128,
128, 128), so small motions come back shifted by a fraction of a code, on average (docs/benchmarks.md has the figures);
``rgb`` (JPEG without the colour transform: Adobe APP14 transform 0, via Pillow) is decoded alike by OpenCV and
DALI's CPU decoder, but nvImageCodec (DALI's GPU decode) parses every 3-channel JPEG as YCbCr, so it is decoded
on the CPU. :func:`code_error` measures what an encoding does to the codes; ``bench/flow.py`` prints the table
behind the default :data:`FLOW_ENCODING`.
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
    "FLOW_ENCODING_YCC",
    "PLANES",
    "PLANE_BLOCK",
    "JpegEncoding",
    "RGB_ENCODING",
    "code_error",
    "decode_rgb",
    "gpu_decodes_alike",
    "is_planes",
    "planes_height",
    "planes_image",
    "planes_offset",
    "split_planes",
]

_SAMPLING = {
    "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
    "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
    "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
}


PLANES = "planes"  # the layout of flow's x and y as greyscale planes, in place of a chroma sampling
PLANE_BLOCK = 8  # rows of a JPEG block of a greyscale image: the x plane is padded to a multiple of it


def planes_offset(image_height: int) -> int:
    """The row where the y plane starts in a planes image ``image_height`` rows high: the x plane's height padded
    to whole blocks. A flow field H rows high makes an image of P + H rows (P = H rounded up to a multiple of
    :data:`PLANE_BLOCK`, B); as H ≤ P < H + B, P = B · ⌈(P + H) / 2B⌉."""
    return PLANE_BLOCK * -(-image_height // (2 * PLANE_BLOCK))


def planes_height(image_height: int) -> int:
    """The flow field's height of a planes image ``image_height`` rows high."""
    return image_height - planes_offset(image_height)


def planes_image(codes: np.ndarray) -> np.ndarray:
    """Flow codes (H, W, ≥ 2) → the greyscale image a planes JPEG holds: x on top, its last row repeated down to
    the next whole block, then y."""
    height = codes.shape[0]
    pad = -height % PLANE_BLOCK
    x = np.pad(codes[..., 0], ((0, pad), (0, 0)), mode="edge")
    return np.ascontiguousarray(np.concatenate([x, codes[..., 1]]))


def split_planes(image: np.ndarray, third: int = 128, bgr: bool = False) -> np.ndarray:
    """A decoded planes image (..., H', W) (or (..., H', W, 1)) → flow codes (..., H, W, 3): x, y and the
    constant ``third`` as R, G, B (``bgr``: B, G, R, OpenCV's order)."""
    if image.shape[-1] == 1 and image.ndim >= 3:
        image = image[..., 0]
    rows = image.shape[-2]
    offset, height = planes_offset(rows), planes_height(rows)
    out = np.empty((*image.shape[:-2], height, image.shape[-1], 3), np.uint8)
    x, y = (2, 1) if bgr else (0, 1)
    out[..., x] = image[..., :height, :]
    out[..., y] = image[..., offset : offset + height, :]
    out[..., 2 - x] = third
    return out


def is_planes(encoding: str) -> bool:
    """Whether images of the recorded ``encoding`` (a ``meta.json``'s or manifest's) hold flow as planes."""
    return str(encoding).endswith("-" + PLANES)


@dataclass(frozen=True)
class JpegEncoding:
    """JPEG at ``quality`` (1–100) with chroma ``sampling`` 420, 422 or 444 (444: no subsampling), ``rgb``: R,
    G, B coded directly, without the YCbCr transform and without subsampling, or ``planes`` (flow only): x and
    y as greyscale planes of one image (:func:`planes_image`)."""

    quality: int = 90
    sampling: str = "420"

    def validate(self, option: str = "--quality") -> None:
        if not 1 <= self.quality <= 100:
            raise UserError(f"{option} must be between 1 and 100, not {self.quality}")
        if self.sampling not in (*_SAMPLING, "rgb", PLANES):
            raise UserError(
                f"JPEG chroma sampling must be one of {', '.join(_SAMPLING)}, rgb or {PLANES}, not {self.sampling}"
            )

    @property
    def name(self) -> str:
        """The ``encoding`` recorded in archive metadata, e.g. ``jpeg-q90-420``."""
        return f"jpeg-q{self.quality}-{self.sampling}"

    def encode_bgr(self, image: np.ndarray) -> bytes:
        """Encode a BGR (H, W, 3) uint8 image (an OpenCV frame)."""
        if self.sampling == PLANES:
            raise ValueError("planes hold flow codes, not frames: encode them with encode_rgb")
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
        """Encode an (H, W, 3) uint8 array whose channels are R, G, B (e.g. flow codes x, y, third; ``planes``:
        x and y only, the third being a constant the readers put back)."""
        if self.sampling == PLANES:
            ok, buf = cv2.imencode(".jpg", planes_image(image), [cv2.IMWRITE_JPEG_QUALITY, self.quality])
            if not ok:
                raise RuntimeError("OpenCV failed to encode a JPEG")
            return buf.tobytes()
        if self.sampling != "rgb":
            return self.encode_bgr(np.ascontiguousarray(image[..., ::-1]))

        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(image)).save(
            buf, "JPEG", quality=self.quality, subsampling=0, keep_rgb=True
        )
        return buf.getvalue()


RGB_ENCODING = JpegEncoding(90, "420")
# Chosen by measurement (bench/flow.py's storage table; docs/benchmarks.md has the figures): greyscale planes at quality 100,
# a standard JPEG every decoder reads (nvJPEG included), whose codes come back without drift. The 3-channel
# ``--flow-encoding ycc`` (4:4:4, quality 100) and ``rgb`` (no colour transform; CPU decoders) write 3-channel
# JPEGs; archives and shards of every encoding are read.
FLOW_ENCODING = JpegEncoding(100, PLANES)
FLOW_ENCODING_YCC = JpegEncoding(100, "444")
FLOW_ENCODING_RGB = JpegEncoding(90, "rgb")
FLOW_ENCODINGS = {  # by the name `--flow-encoding` takes
    PLANES: FLOW_ENCODING,
    "ycc": FLOW_ENCODING_YCC,
    "rgb": FLOW_ENCODING_RGB,
}
DEFAULT_FLOW_ENCODING = PLANES


def gpu_decodes_alike(encoding: str) -> bool:
    """Whether nvJPEG (DALI's ``mixed`` decoder) decodes JPEGs of this recorded ``encoding`` like
    libjpeg-turbo: YCbCr and greyscale JPEGs (``-444``, ``-planes``) decode alike; ``-rgb`` encodings (no YCbCr
    transform) nvJPEG misreads (docs/benchmarks.md has the measured error)."""
    return not encoding.endswith("-rgb")


def decode_rgb(data: bytes, third: int = 128) -> np.ndarray:
    """Decode a JPEG to (H, W, 3) uint8 in R, G, B order; a greyscale one, which only flow's planes are, to its
    codes x, y and the constant ``third`` (:func:`split_planes`)."""
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise ValueError("not a decodable image")
    if img.ndim == 2:
        return split_planes(img, third)
    return img[..., 2::-1]


def code_error(codes: np.ndarray, data: bytes) -> tuple[float, int]:
    """Mean and max absolute difference between ``codes`` (H, W, 3, R-G-B order) and their decoded image (a
    planes image gives its third channel back as ``codes`` hold it: it is not stored)."""
    decoded = decode_rgb(data, int(codes[0, 0, 2]))
    diff = np.abs(decoded.astype(np.int16) - codes.astype(np.int16))
    return float(diff.mean()), int(diff.max())
