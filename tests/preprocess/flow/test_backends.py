"""TV-L1 flow backend, code mapping, batching hook and the flow storage error (real OpenCV throughout)."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.examples.synthetic import render_video, texture
from memdpc.preprocess.flow.backends import (
    BatchedFlowBackend,
    FlowStage,
    OpenCVTVL1,
    TorchTVL1,
    codes_to_flow,
    flow_to_codes,
    flow_to_codes_torch,
    make_backend,
    parse_devices,
    resolve_backend,
)
from memdpc.preprocess.flow.tvl1_params import TVL1Params


def expected_code(d: float) -> int:
    return int(np.floor((np.clip(d, -20, 20) + 20) * 255 / 40 + 0.5))


def translated(dx: int, dy: int, n: int = 3, size: int = 64, seed: int = 0) -> list[np.ndarray]:
    """n BGR frames of a texture moving (dx, dy) pixels per frame (wrap-around, so motion is exact)."""
    tex = texture(np.random.default_rng(seed), size, size)
    return [np.roll(tex, (k * dy, k * dx), axis=(0, 1)) for k in range(n)]


@pytest.mark.parametrize("dx, dy", [(3, -2), (-5, 1)])
def test_known_translation_gives_expected_codes(dx, dy):
    frames = translated(dx, dy)
    stage = FlowStage(OpenCVTVL1())
    codes = [c for f in frames for c in stage.push(f)] + stage.flush()
    assert len(codes) == len(frames) - 1  # n frames -> n - 1 flows
    for c in codes:
        inner = c[12:-12, 12:-12]  # away from the wrap-around seam
        assert abs(np.median(inner[..., 0]) - expected_code(dx)) <= 1
        assert abs(np.median(inner[..., 1]) - expected_code(dy)) <= 1
        assert np.abs(inner[..., :2].astype(int) - [expected_code(dx), expected_code(dy)]).mean() < 2
        assert (c[..., 2] == 128).all()


def test_flow_is_frame_k_to_k_plus_1():
    """A texture moving right then left: the first flow is +x, the second −x."""
    a, b = translated(4, 0, n=2)
    stage = FlowStage(OpenCVTVL1())
    codes = [x for f in (a, b, a) for x in stage.push(f)] + stage.flush()
    assert [np.median(x[16:-16, 16:-16, 0]) for x in codes] == [expected_code(4), expected_code(-4)]


def test_mapping_is_exact_and_saturates_beyond_bound():
    d = np.array([-100, -20.5, -20, -10, -0.01, 0, 0.05, 7.3, 20, 20.01, 55], np.float32)
    flow = np.stack([d, -d], axis=-1)[None]  # (1, 11, 2)
    codes = flow_to_codes(flow, third=0)
    assert codes.dtype == np.uint8 and codes.shape == (1, 11, 3)
    assert codes[0, :, 0].tolist() == [expected_code(v) for v in d]
    assert codes[0, :, 1].tolist() == [expected_code(-v) for v in d]
    assert codes[0, [0, 1, 2], 0].tolist() == [0, 0, 0] and codes[0, [-3, -2, -1], 0].tolist() == [255] * 3
    assert codes[0, 5, 0] == 128  # zero flow
    assert (codes[..., 2] == 0).all()
    back = codes_to_flow(codes)
    assert np.abs(back[0, 3:-3] - flow[0, 3:-3]).max() <= 20 / 255 + 1e-6  # half a code step


@pytest.mark.parametrize("third", [0, 128])
def test_third_channel_is_constant(third):
    frames = render_video("RotateClockwise", 48, 3, np.random.default_rng(1))
    stage = FlowStage(OpenCVTVL1(TVL1Params(scales=2, warps=2)), third=third)
    codes = [x for f in frames for x in stage.push(f)]
    assert len(codes) == 2 and all((c[..., 2] == third).all() for c in codes)
    assert any(c[..., 0].std() > 0 for c in codes)  # the x channel carries the motion


class BatchedOpenCV(OpenCVTVL1):
    """A backend that asks for pairs in batches, as a GPU backend does (exercises the batching hook)."""

    batch_size = 3


def test_batched_backend_gives_the_same_flows_in_order():
    frames = render_video("MoveDown", 32, 8, np.random.default_rng(2))
    params = TVL1Params(scales=2, warps=2, outer_iterations=3)
    one, three = FlowStage(OpenCVTVL1(params)), FlowStage(BatchedOpenCV(params))
    a = [x for f in frames for x in one.push(f)] + one.flush()
    pushed = [three.push(f) for f in frames]
    assert [len(p) for p in pushed] == [0, 0, 0, 3, 0, 0, 3, 0]  # never holds more than a batch
    b = [x for p in pushed for x in p] + three.flush()
    assert len(a) == len(b) == 7
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_backend_registry():
    assert isinstance(make_backend("opencv", TVL1Params()), OpenCVTVL1)
    assert make_backend("opencv", TVL1Params()) is make_backend("opencv", TVL1Params())  # once per process
    with pytest.raises(UserError, match="unknown flow backend"):
        make_backend("nope", TVL1Params())
    with pytest.raises(UserError, match="CPU only"):
        OpenCVTVL1(device="cuda")


def test_params_reach_opencv():
    tv = OpenCVTVL1(TVL1Params(tau=0.2, lambda_=0.1, scales=3, warps=2, median_filtering=3))._tv
    assert (tv.getTau(), tv.getLambda(), tv.getScalesNumber(), tv.getWarpingsNumber()) == pytest.approx(
        (0.2, 0.1, 3, 2)
    )
    assert tv.getMedianFiltering() == 3


def _codes(stage: FlowStage, frames) -> list[np.ndarray]:
    return [x for f in frames for x in stage.push(f)] + stage.flush()


def test_torch_backend_matches_opencv_on_cpu():
    """The batched PyTorch port plugs in as a backend and gives the same codes as OpenCV."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    frames = render_video("MoveRight", 32, 6, np.random.default_rng(0))
    params = TVL1Params(scales=2, warps=2, outer_iterations=3)
    backend = make_backend("torch", params, "cpu")
    assert backend.batch_size > 1
    a, b = _codes(FlowStage(OpenCVTVL1(params)), frames), _codes(FlowStage(backend), frames)
    assert len(a) == len(b) == 5
    assert np.mean([np.abs(x.astype(int) - y).mean() for x, y in zip(a, b, strict=True)]) < 0.05


@pytest.mark.gpu
def test_torch_backend_on_gpu_matches_opencv():
    frames = render_video("ZoomIn", 64, 5, np.random.default_rng(0))
    a, b = (
        _codes(FlowStage(OpenCVTVL1()), frames),
        _codes(FlowStage(make_backend("torch", TVL1Params(), "cuda")), frames),
    )
    assert np.mean([np.abs(x.astype(int) - y).mean() for x, y in zip(a, b, strict=True)]) < 0.1


def test_flow_does_not_depend_on_the_videos_a_worker_saw_before():
    """OpenCV lowers a TV-L1 object's scale count after a small frame; the backend must undo that."""
    big = [np.ascontiguousarray(texture(np.random.default_rng(s), 96, 96)[..., 0]) for s in (0, 1)]
    small = np.ascontiguousarray(texture(np.random.default_rng(2), 24, 24)[..., 0])
    fresh = OpenCVTVL1(TVL1Params())(big[0][None], big[1][None])
    reused = OpenCVTVL1(TVL1Params())
    reused(small[None], small[None])
    assert np.array_equal(reused(big[0][None], big[1][None]), fresh)


def test_torch_code_mapping_equals_the_numpy_one():
    """Bit for bit, at the rounding boundaries (half codes) and beyond the bound too."""
    torch = pytest.importorskip("torch")
    step = np.float32(40 / 255)
    edges = np.array([-20 + (k + 0.5) * step for k in range(255)], np.float32)  # half-code boundaries
    near = np.concatenate(
        [np.nextafter(edges, np.float32(-np.inf)), edges, np.nextafter(edges, np.float32(np.inf))]
    )
    rng = np.random.default_rng(0)
    values = np.concatenate([near, rng.uniform(-25, 25, 200_000).astype(np.float32), [-1e9, -20, 0, 20, 1e9]])
    flow = values.astype(np.float32).reshape(1, -1, 1, 1).repeat(2, axis=-1)  # (1, N, 1, 2)
    flow[..., 1] *= -1
    for third in (0, 128):
        ours = flow_to_codes_torch(torch.from_numpy(flow), third)
        assert ours.dtype == torch.uint8
        assert np.array_equal(ours.numpy(), flow_to_codes(flow, third))


def test_torch_backend_codes_are_its_flow_mapped():
    torch = pytest.importorskip("torch")
    frames = render_video("ZoomIn", 32, 4, np.random.default_rng(3))
    grey = np.stack([f[..., 1] for f in frames])
    backend = TorchTVL1(TVL1Params(scales=2, warps=1, outer_iterations=2), "cpu")
    assert isinstance(backend, BatchedFlowBackend) and not isinstance(OpenCVTVL1(), BatchedFlowBackend)
    codes = backend.device_codes(torch.from_numpy(grey[:-1]), torch.from_numpy(grey[1:]), 0).numpy()
    assert codes.dtype == np.uint8 and codes.shape == (3, 32, 32, 3)
    assert np.array_equal(codes, flow_to_codes(backend(grey[:-1], grey[1:]), 0))


def test_device_strings():
    assert parse_devices("cpu", 0) == parse_devices("auto", 0) == ["cpu"]
    assert parse_devices("cuda", 3) == parse_devices("auto", 3) == ["cuda:0", "cuda:1", "cuda:2"]
    assert parse_devices("cuda:0,2", 4) == parse_devices(" cuda:0, cuda:2 ", 4) == ["cuda:0", "cuda:2"]
    assert parse_devices("CUDA:1", 2) == ["cuda:1"]
    for text, gpus, message in [
        ("cuda", 0, "no CUDA device"),
        ("cuda:0", 0, "no CUDA device"),
        ("cuda:2", 2, "distinct GPUs among the 2"),
        ("cuda:0,0", 2, "distinct GPUs"),
        ("gpu", 2, "must be auto, cpu, cuda"),
        ("cuda:", 2, "must be"),
        ("cpu,cuda", 2, "must be"),
        ("", 0, "must be"),
    ]:
        with pytest.raises(UserError, match=message):
            parse_devices(text, gpus)


def test_backend_resolution():
    gpu_note = "Triton TV-L1 kernels unavailable"
    assert resolve_backend("auto", "auto", gpus=0) == ("native", "cpu", None)  # the CPU: native TV-L1
    assert resolve_backend("auto", "cpu", gpus=2) == ("native", "cpu", None)
    assert resolve_backend("native", "auto", gpus=2) == ("native", "cpu", None)  # a CPU backend: the CPU
    name, devices, note = resolve_backend("auto", "auto", gpus=2)
    assert (name, devices) == ("torch", "cuda:0,cuda:1") and gpu_note in note  # no CUDA here for the kernels
    assert resolve_backend("auto", "cuda:1", gpus=2)[:2] == ("torch", "cuda:1")
    assert resolve_backend("torch", "auto", gpus=0) == ("torch", "cpu", None)
    assert resolve_backend("torch", "cuda", gpus=1) == ("torch", "cuda:0", None)  # explicit: no note
    assert resolve_backend("opencv", "auto") == ("opencv", "cpu", None)
    assert resolve_backend("opencv", "cuda") == ("opencv", "cuda", None)  # refused by the backend, as before
    with pytest.raises(UserError, match="no CUDA device"):
        resolve_backend("auto", "cuda", gpus=0)
    with pytest.raises(UserError, match="unknown --flow-backend 'nope'"):
        resolve_backend("nope", "cpu")


def test_auto_on_this_machine():
    torch = pytest.importorskip("torch")
    name, devices, note = resolve_backend("auto", "auto")
    if torch.cuda.is_available():
        assert name in ("triton", "torch") and devices.startswith("cuda:")
    else:
        assert (name, devices, note) == ("native", "cpu", None)
