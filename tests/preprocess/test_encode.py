"""Frame and flow image encodings and their measured storage error, on real TV-L1 codes of decoded video frames."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.decode import DecodeSpec, VideoStream
from memdpc.preprocess.encode import (
    FLOW_ENCODING,
    FLOW_ENCODING_RGB,
    FLOW_ENCODING_YCC,
    FLOW_ENCODINGS,
    PLANE_BLOCK,
    JpegEncoding,
    code_error,
    decode_rgb,
    gpu_decodes_alike,
    is_planes,
    planes_height,
    planes_image,
    planes_offset,
)
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import render_video
from memdpc.preprocess.flow.backends import FlowStage, OpenCVTVL1


@pytest.fixture(scope="module")
def real_codes(tmp_path_factory) -> list[np.ndarray]:
    """TV-L1 code images (OpenCV defaults) of three rendered scenes written as xvid videos of 128×96 and decoded
    back at the short side 72 (96×72: rows not a whole number of JPEG blocks)."""
    folder, out = tmp_path_factory.mktemp("videos"), []
    for i, cls in enumerate(("MoveRight", "ZoomIn", "ShakeVertical")):
        frames = [cv2.resize(f, (128, 96)) for f in render_video(cls, 96, 3, np.random.default_rng(10 + i))]
        write_video(folder / f"{cls}.avi", np.stack(frames), 25.0, "xvid")
        stage = FlowStage(OpenCVTVL1())
        out += [x for f in VideoStream(folder / f"{cls}.avi", DecodeSpec(size=72)) for x in stage.push(f)]
    assert out[0].shape == (72, 96, 3) and len(out) == 6
    return out


def axis_errors(codes: list[np.ndarray], enc: JpegEncoding) -> tuple[np.ndarray, np.ndarray]:
    """(signed mean, mean absolute) error of the x and y codes after encoding and decoding, over every pixel."""
    diffs = np.stack([decode_rgb(enc.encode_rgb(c))[..., :2].astype(int) - c[..., :2] for c in codes])
    return diffs.reshape(-1, 2).mean(0), np.abs(diffs).reshape(-1, 2).mean(0)


def test_default_flow_storage_gives_back_the_codes_without_drift(real_codes):
    """The signed error per axis is within 0.02 codes of none, and the absolute error is below the 3-channel
    YCbCr JPEG's, which shifts small motions by a fraction of a code (its x drifts here)."""
    signed, absolute = axis_errors(real_codes, FLOW_ENCODING)
    ycc_signed, ycc_absolute = axis_errors(real_codes, FLOW_ENCODING_YCC)
    print(f"planes: signed {signed}, absolute {absolute}; ycc: signed {ycc_signed}, absolute {ycc_absolute}")
    assert np.abs(signed).max() <= 0.02
    assert absolute.mean() <= ycc_absolute.mean() and (absolute <= 0.1).all()
    assert np.abs(ycc_signed).max() > 0.02  # what the default avoids
    assert code_error(real_codes[0], FLOW_ENCODING.encode_rgb(real_codes[0]))[0] < 0.1


def test_flow_storage_error_of_the_colour_encodings(real_codes):
    # 8-bit YCbCr cannot hold every code triple (129, 128, 128 decodes as 128, 128, 128)
    for enc, most in ((FLOW_ENCODING_YCC, 0.5), (FLOW_ENCODING_RGB, 0.15)):  # rgb: only DCT rounding
        assert np.mean([code_error(c, enc.encode_rgb(c))[0] for c in real_codes]) <= most


def test_planes_layout_splits_without_knowing_the_field():
    """x on top, padded to whole JPEG blocks, then y; every flow height is told from the image's height alone,
    and the x and y planes never share a block."""
    for height in range(1, 70):
        rows = planes_image(np.zeros((height, 3, 3), np.uint8)).shape[0]
        assert planes_height(rows) == height and planes_offset(rows) % PLANE_BLOCK == 0
        assert height <= planes_offset(rows) < height + PLANE_BLOCK
    codes = np.stack(np.broadcast_arrays(np.uint8(200), np.uint8(50), np.uint8(0)), -1)
    codes = np.broadcast_to(codes, (13, 17, 3)).copy()  # x and y far apart: a shared block would blur them
    data = FLOW_ENCODING.encode_rgb(codes)
    assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED).shape == (16 + 13, 17)
    assert np.array_equal(decode_rgb(data, third=0), codes) and (decode_rgb(data)[..., 2] == 128).all()


@pytest.mark.parametrize("enc", [FLOW_ENCODING, FLOW_ENCODING_YCC, FLOW_ENCODING_RGB], ids=lambda e: e.name)
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
    assert len(data) < len(FLOW_ENCODING_YCC.encode_rgb(real_codes[0]))


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
    with pytest.raises(ValueError, match="planes hold flow codes"):
        FLOW_ENCODING.encode_bgr(img)


def test_jpeg_encoding_validation():
    assert FLOW_ENCODING.name == "jpeg-q100-planes" and FLOW_ENCODING_RGB.name == "jpeg-q90-rgb"
    assert FLOW_ENCODING_YCC.name == "jpeg-q100-444" and list(FLOW_ENCODINGS) == ["planes", "ycc", "rgb"]
    assert is_planes(FLOW_ENCODING.name) and not any(
        is_planes(e.name) for e in (FLOW_ENCODING_YCC, FLOW_ENCODING_RGB)
    )
    with pytest.raises(UserError, match="--quality"):
        JpegEncoding(0).validate()
    with pytest.raises(UserError, match="sampling"):
        JpegEncoding(90, "411").validate()


@pytest.mark.gpu
def test_dali_gpu_decodes_flow_jpegs_like_the_cpu(real_codes):
    """The default flow encoding (greyscale planes) and the YCbCr one decode to the same codes with DALI's GPU
    (nvJPEG) decoder as on the CPU; the R, G, B-coded one does not (the loader decodes those on the CPU): what
    ``gpu_decodes_alike`` says."""
    from nvidia.dali import fn, pipeline_def, types

    from memdpc.preprocess.encode import split_planes

    for enc in (FLOW_ENCODING, FLOW_ENCODING_YCC, FLOW_ENCODING_RGB):
        data = [np.frombuffer(enc.encode_rgb(c), np.uint8) for c in real_codes]
        output = types.GRAY if is_planes(enc.name) else types.RGB

        @pipeline_def(batch_size=len(data), num_threads=1, device_id=0)
        def pipe(device):
            raw = fn.external_source(source=lambda: data, batch=True, dtype=types.UINT8)  # noqa: B023
            return fn.decoders.image(raw, device=device, output_type=output)  # noqa: B023

        outs = {}
        for device in ("cpu", "mixed"):
            p = pipe(device)
            p.build()
            (out,) = p.run()
            out = out.as_cpu() if device == "mixed" else out
            images = [np.array(out.at(i)) for i in range(len(data))]
            images = [split_planes(i) if is_planes(enc.name) else i for i in images]
            outs[device] = [i.astype(int) for i in images]
        assert (
            np.mean([np.abs(cpu - codes).mean() for cpu, codes in zip(outs["cpu"], real_codes, strict=True)])
            <= 0.5
        )
        diff = max(np.abs(gpu - cpu).mean() for cpu, gpu in zip(outs["cpu"], outs["mixed"], strict=True))
        print(f"{enc.name}: GPU vs CPU decode, largest mean difference per image {diff:.3f} codes")
        assert (diff < 0.1) == gpu_decodes_alike(enc.name)
