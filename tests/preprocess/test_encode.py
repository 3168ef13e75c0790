"""Frame and flow image encodings and their measured storage error, on real TV-L1 codes."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.encode import (
    FLOW_ENCODING,
    FLOW_ENCODING_RGB,
    JpegEncoding,
    code_error,
    decode_rgb,
    gpu_decodes_alike,
)
from memdpc.preprocess.examples.synthetic import render_video
from memdpc.preprocess.flow.backends import FlowStage, OpenCVTVL1


@pytest.fixture(scope="module")
def real_codes() -> list[np.ndarray]:
    """TV-L1 code images (OpenCV defaults) of three rendered scenes at 96²."""
    out = []
    for i, cls in enumerate(("MoveRight", "ZoomIn", "ShakeVertical")):
        stage = FlowStage(OpenCVTVL1())
        out += [x for f in render_video(cls, 96, 2, np.random.default_rng(10 + i)) for x in stage.push(f)]
    return out


def mean_error(codes: list[np.ndarray], enc: JpegEncoding) -> float:
    return float(np.mean([code_error(c, enc.encode_rgb(c))[0] for c in codes]))


def test_flow_storage_error_within_half_a_code(real_codes):
    # 8-bit YCbCr cannot hold every code triple (129, 128, 128 decodes as 128, 128, 128): ~0.45 here.
    assert mean_error(real_codes, FLOW_ENCODING) <= 0.5
    assert mean_error(real_codes, FLOW_ENCODING_RGB) <= 0.15  # no colour transform: only DCT rounding


@pytest.mark.parametrize("enc", [FLOW_ENCODING, FLOW_ENCODING_RGB], ids=lambda e: e.name)
def test_channels_keep_their_order(enc):
    """x (a horizontal ramp) comes back in channel R, y (a vertical ramp) in G, the constant in B."""
    ramp = np.linspace(60, 200, 48).astype(np.uint8)
    codes = np.stack(
        [np.tile(ramp, (48, 1)), np.tile(ramp[:, None], (1, 48)), np.full((48, 48), 128, np.uint8)], -1
    )
    decoded = decode_rgb(enc.encode_rgb(codes)).astype(int)
    assert np.abs(decoded - codes).mean() < 1
    assert decoded.shape == codes.shape


def test_rgb_jpeg_keeps_a_constant_channel_exact(real_codes):
    data = FLOW_ENCODING_RGB.encode_rgb(real_codes[0])
    assert data[:2] == b"\xff\xd8" and b"Adobe" in data[:200]  # a JPEG, marked as RGB-coded
    assert (decode_rgb(data)[..., 2] == 128).all()
    assert len(data) < len(FLOW_ENCODING.encode_rgb(real_codes[0]))


def test_chroma_subsampling_mixes_x_and_y():
    """Opposite x and y codes on a fine checkerboard: 4:2:0 blurs them into each other, 4:4:4 does not."""
    x = (np.indices((32, 32)).sum(0) % 2 * 255).astype(np.uint8)
    codes = np.stack([x, 255 - x, np.full_like(x, 128)], axis=-1)
    err420 = code_error(codes, JpegEncoding(95, "420").encode_rgb(codes))[0]
    err444 = code_error(codes, JpegEncoding(95, "444").encode_rgb(codes))[0]
    assert err420 > 4 * err444


def test_bgr_and_rgb_entry_points_agree():
    img = render_video("MoveLeft", 32, 1, np.random.default_rng(0))[0]  # BGR
    for enc in (JpegEncoding(90, "420"), FLOW_ENCODING_RGB):
        assert enc.encode_bgr(img) == enc.encode_rgb(img[..., ::-1])
        assert (
            np.abs(decode_rgb(enc.encode_bgr(img))[..., ::-1].astype(int) - img).mean() < 10
        )  # q90 of a 32² texture


def test_jpeg_encoding_validation():
    assert FLOW_ENCODING.name == "jpeg-q100-444" and FLOW_ENCODING_RGB.name == "jpeg-q90-rgb"
    with pytest.raises(UserError, match="--quality"):
        JpegEncoding(0).validate()
    with pytest.raises(UserError, match="sampling"):
        JpegEncoding(90, "411").validate()


@pytest.mark.gpu
def test_dali_gpu_decodes_flow_jpegs_like_the_cpu(real_codes):
    """The default flow encoding decodes to the same codes with DALI's GPU (nvJPEG) decoder as on the CPU; the
    R, G, B-coded one does not (the loader decodes those on the CPU): what ``gpu_decodes_alike`` says."""
    from nvidia.dali import fn, pipeline_def, types

    for enc in (FLOW_ENCODING, FLOW_ENCODING_RGB):
        data = [np.frombuffer(enc.encode_rgb(c), np.uint8) for c in real_codes]

        @pipeline_def(batch_size=len(data), num_threads=1, device_id=0)
        def pipe(device):
            raw = fn.external_source(source=lambda: data, batch=True, dtype=types.UINT8)  # noqa: B023
            return fn.decoders.image(raw, device=device, output_type=types.RGB)

        outs = {}
        for device in ("cpu", "mixed"):
            p = pipe(device)
            p.build()
            (out,) = p.run()
            out = out.as_cpu() if device == "mixed" else out
            outs[device] = [np.array(out.at(i)).astype(int) for i in range(len(data))]
        assert (
            np.mean([np.abs(cpu - codes).mean() for cpu, codes in zip(outs["cpu"], real_codes, strict=True)])
            <= 0.5
        )
        diff = max(np.abs(gpu - cpu).mean() for cpu, gpu in zip(outs["cpu"], outs["mixed"], strict=True))
        print(f"{enc.name}: GPU vs CPU decode, largest mean difference per image {diff:.3f} codes")
        assert (diff < 0.1) == gpu_decodes_alike(enc.name)
