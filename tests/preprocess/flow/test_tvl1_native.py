"""The native (numba) TV-L1 against real OpenCV, bit for bit: rendered and decoded frames at 64², 128² and
256², other parameters, sizes the pyramid cannot halve; its stopping rule and medians; the backend, the
fallback to OpenCV where it is unavailable, and preprocess runs whose archives are the opencv backend's."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.archive import archive_path, read_archive
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import render_video, texture
from memdpc.preprocess.flow import tvl1_native
from memdpc.preprocess.flow.backends import make_backend
from memdpc.preprocess.flow.sorting_networks import selection_network
from memdpc.preprocess.flow.tvl1_native import ENV_SWITCH, NativeTVL1, tvl1_flow
from memdpc.preprocess.flow.tvl1_params import TVL1Params, opencv_record
from memdpc.preprocess.report import read_report
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import VideoRecord, write_index

MEMDPC = str(Path(sys.executable).parent / "memdpc")


@pytest.fixture(autouse=True)
def _one_opencv_thread():
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    yield
    cv2.setNumThreads(threads)


def grey(frames: np.ndarray) -> list[np.ndarray]:
    return [cv2.cvtColor(f, cv2.COLOR_BGR2GRAY) for f in frames]


def rendered(height: int, width: int, motion: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two consecutive greyscale frames of a rendered scene (textured objects moving), cropped to H×W."""
    frames = grey(render_video(motion, max(height, width, 32), 3, np.random.default_rng(seed)))
    return frames[1][:height, :width].copy(), frames[2][:height, :width].copy()


@pytest.fixture(scope="module")
def decoded(tmp_path_factory) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per size, two consecutive frames decoded from an xvid video file (compression noise, blocking)."""
    root, out = tmp_path_factory.mktemp("decoded"), {}
    for size, motion in ((64, "ZoomIn"), (128, "RotateClockwise"), (256, "MoveRight")):
        path = root / f"{size}.avi"
        write_video(path, render_video(motion, size, 4, np.random.default_rng(size)), 25.0, "xvid")
        cap = cv2.VideoCapture(str(path))
        frames = [cap.read()[1] for _ in range(4)]
        out[size] = tuple(grey(np.stack(frames[1:3])))
    return out


def assert_opencvs_flow(prev: np.ndarray, nxt: np.ndarray, params: TVL1Params = TVL1Params()) -> np.ndarray:
    """The native flow is OpenCV's to the bit (so every stored code is too); returns it."""
    ours, ref = tvl1_flow(prev, nxt, params), params.to_opencv().calc(prev, nxt, None)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    assert ours.tobytes() == ref.tobytes(), (
        f"OpenCV {cv2.__version__}: max difference {np.abs(ours - ref).max()} px"
    )
    return ours


@pytest.mark.parametrize("size", [64, 128, 256])
def test_rendered_and_decoded_frames_give_opencvs_flow_bit_for_bit(size, decoded):
    flow = assert_opencvs_flow(*rendered(size, size, "MoveDown", size))
    assert np.abs(flow).max() > 0.5  # there is motion to agree on
    flow = assert_opencvs_flow(*decoded[size])
    assert np.abs(flow).max() > 0.5


OTHER_PARAMS = [
    TVL1Params(scales=1),
    TVL1Params(scales=3, warps=2),
    TVL1Params(warps=1, inner_iterations=50, outer_iterations=2),
    TVL1Params(epsilon=0.001, inner_iterations=12, outer_iterations=3),
    TVL1Params(epsilon=0.1),
    TVL1Params(median_filtering=3),
    TVL1Params(median_filtering=1),
    TVL1Params(
        scale_step=0.7, scales=4
    ),  # 1 / scale_step is no float: OpenCV 5.0 scales flow in double, 5.1 in float
    TVL1Params(tau=0.2, lambda_=0.3, theta=0.5),
]


@pytest.mark.parametrize(
    "params",
    OTHER_PARAMS,
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.to_dict().items() if v != getattr(TVL1Params(), k)),
)
def test_other_parameters_give_opencvs_flow(params):
    prev, nxt = rendered(48, 64, "RotateClockwise", 3)
    flow = assert_opencvs_flow(prev, nxt, params)
    assert flow.tobytes() != tvl1_flow(prev, nxt).tobytes()  # the parameter reached the algorithm


@pytest.mark.parametrize("size", [(67, 93), (101, 37), (45, 16), (15, 20)])
def test_sizes_the_pyramid_cannot_halve_give_opencvs_flow(size):
    """Odd sides, levels of sizes rounded up or down, a side at the pyramid's 16 px minimum, and a frame
    below it (one level only)."""
    assert_opencvs_flow(*rendered(*size, "MoveUp", sum(size)))


def test_a_known_shift_is_found():
    tex = cv2.cvtColor(texture(np.random.default_rng(4), 64, 64), cv2.COLOR_BGR2GRAY)
    flow = assert_opencvs_flow(tex, np.roll(tex, (-2, 3), axis=(0, 1)))
    inner = flow[12:-12, 12:-12]  # away from the wrap-around seam
    assert np.abs(np.median(inner, axis=(0, 1)) - [3, -2]).max() < 0.1


def test_the_stopping_decision_is_the_serial_float_sums():
    """OpenCV sums the squared updates in float, one after another. ``_above`` decides from a double sum
    unless that lies within the float sum's error bound of the threshold: it must agree everywhere, on
    thresholds at the float sum itself and its neighbours (where only the serial sum decides) and far off."""
    rng = np.random.default_rng(0)
    for n in (7, 4096, 65536):
        e = (rng.random(n, dtype=np.float32) * rng.choice([1e-6, 1e-2, 3.0], n)).astype(np.float32)
        serial = np.cumsum(e, dtype=np.float32)[-1]  # float32, in order
        near = [serial]
        for _ in range(3):
            near = [np.nextafter(near[0], np.float32(0)), *near, np.nextafter(near[-1], np.float32(np.inf))]
        for t in [*near, serial * np.float32(0.5), serial * np.float32(2.0), np.float32(0.0)]:
            assert tvl1_native._above(e, np.float32(t)) == (serial > t), (n, t)
    assert not tvl1_native._above(np.array([1.0, np.nan], np.float32), np.float32(0.1))  # OpenCV: NaN stops
    assert tvl1_native._above(np.array([1.0, np.inf], np.float32), np.float32(0.1))


@pytest.mark.parametrize(("fn", "n"), [(tvl1_native._median9, 9), (tvl1_native._median25, 25)])
def test_the_written_median_networks_are_the_generated_ones(fn, n):
    source = inspect.getsource(fn.py_func)
    written = []
    for stmt in re.split(r"[;\n]", source):
        stmt = stmt.strip()
        if m := re.fullmatch(r"v(\d+), v(\d+) = _cx\(v\1, v\2\)", stmt):
            written.append((int(m[1]), int(m[2]), True, True))
        elif m := re.fullmatch(r"v(\d+) = min\(v\1, v(\d+)\)", stmt):
            written.append((int(m[1]), int(m[2]), True, False))
        elif m := re.fullmatch(r"v(\d+) = max\(v(\d+), v\1\)", stmt):
            written.append((int(m[2]), int(m[1]), False, True))
    assert written == list(selection_network(n, (n // 2,)))
    k = int(round(n**0.5))
    taps = re.findall(r"v(\d+) = r(\d)\[x(?: \+ (\d))?\]", source)
    assert [(int(v), int(i), int(j or 0)) for v, i, j in taps] == [
        (i * k + j, i, j) for i in range(k) for j in range(k)
    ]
    assert re.search(rf"out\[y, x\] = v{n // 2}\n", source)


@pytest.mark.parametrize("ksize", [3, 5])
def test_median_equals_opencv(ksize):
    rng = np.random.default_rng(2)
    for x in (rng.integers(0, 6, (21, 26)), rng.normal(0, 1, (9, 40))):  # many ties; none
        x = x.astype(np.float32)
        u = x.copy()
        tvl1_native._median(u, ksize, np.empty((x.shape[0] + 4) * (x.shape[1] + 4), np.float32))
        np.testing.assert_array_equal(u, cv2.medianBlur(x, ksize))


def test_the_backend_reuses_its_buffers_across_pairs_and_frame_sizes():
    backend = make_backend("native", TVL1Params())
    assert isinstance(backend, NativeTVL1) and backend.batch_size == 1
    small = [rendered(40, 48, "MoveLeft", s) for s in (0, 1)]
    large = rendered(72, 56, "ZoomIn", 2)
    for pairs in (small, [large], small[::-1]):
        prev, nxt = np.stack([p for p, _ in pairs]), np.stack([n for _, n in pairs])
        flows = backend(prev, nxt)
        assert flows.shape == (len(pairs), *prev.shape[1:], 2)
        for (p, n), f in zip(pairs, flows, strict=True):
            assert f.tobytes() == TVL1Params().to_opencv().calc(p, n, None).tobytes()


def test_the_workspace_keeps_guards_around_the_pyramid_and_the_fields():
    """One buffer, the pyramid and the fields at least GUARD floats from each other and from its ends: the
    iteration streams the last level's u2 and the fields together, and end to end they slow it several times."""
    space = tvl1_native.Workspace(64, 80, TVL1Params())
    base, guard = space.buffer.ctypes.data, tvl1_native.GUARD * 4
    pyr = (space.pyr.ctypes.data - base, space.pyr.ctypes.data - base + space.pyr.nbytes)
    fields = (space.ws.ctypes.data - base, space.ws.ctypes.data - base + space.ws.nbytes)
    assert np.shares_memory(space.pyr, space.buffer) and np.shares_memory(space.ws, space.buffer)
    assert pyr[0] >= guard and fields[0] - pyr[1] >= guard and space.buffer.nbytes - fields[1] >= guard
    assert space.pyr.flags.c_contiguous and space.ws.flags.c_contiguous


def test_refuses_what_it_does_not_do():
    with pytest.raises(UserError, match="CPU only"):
        NativeTVL1(device="cuda")
    with pytest.raises(UserError, match="gamma"):
        NativeTVL1(TVL1Params(gamma=0.1))
    frame = np.zeros((32, 32), np.uint8)
    with pytest.raises(ValueError, match="one shape"):
        tvl1_flow(frame, frame[:, :30])
    with pytest.raises(ValueError, match="uint8"):
        tvl1_flow(frame.astype(np.float32), frame.astype(np.float32))


_RESOLVE = """
import json, sys
from memdpc.common.errors import UserError
from memdpc.preprocess.flow.backends import make_backend, resolve_backend
if sys.argv[1] == "no-numba":
    sys.modules["numba"] = None  # this interpreter cannot import numba
if sys.argv[1] == "broken-numba":  # a numba whose compiled part fails to load, as a broken install's does
    sys.path.insert(0, sys.argv[2])
result = {"auto": resolve_backend("auto", "auto", gpus=0)}
try:
    make_backend("native")
except UserError as e:
    result["explicit"] = str(e)
print(json.dumps(result))
"""


@pytest.mark.parametrize("how", ["switched-off", "no-numba", "broken-numba"])
def test_auto_falls_back_to_opencv_with_a_note_where_the_native_path_is_unavailable(how, tmp_path):
    env = {**os.environ, ENV_SWITCH: "0" if how == "switched-off" else "1"}
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text(
        'raise OSError("libllvmlite.so: cannot open shared object file: No such file or directory")\n'
    )
    run = subprocess.run(
        [sys.executable, "-c", _RESOLVE, how, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    backend, devices, note = result["auto"]
    assert (backend, devices) == ("opencv", "cpu") and note.endswith("; using OpenCV")
    why = {"switched-off": "MEMDPC_NATIVE_FLOW=0", "no-numba": "numba", "broken-numba": "libllvmlite.so"}[how]
    assert "\n" not in note and why in note
    assert result["explicit"].startswith("flow backend 'native' is not available") or how == "switched-off"
    assert "\n" not in result["explicit"]  # asked for by name: a one-line error, not a silent fallback


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> Path:
    """An index of three short videos of three frame sizes (one portrait, odd sides)."""
    root = tmp_path_factory.mktemp("native-videos")
    recs = []
    for i, ((w, h), motion) in enumerate(
        [((48, 40), "MoveRight"), ((33, 45), "ZoomIn"), ((56, 56), "MoveDown")]
    ):
        square = render_video(motion, max(w, h), 6, np.random.default_rng(i))
        path = root / f"v{i}.avi"
        write_video(
            path,
            np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in square]),
            25.0,
            "mjpg",
        )
        recs.append(VideoRecord(f"v{i}", str(path), i, motion, "train"))
    write_index(recs, root / "index.jsonl")
    return root / "index.jsonl"


def flow_archives(out: Path, ids: list[str]) -> dict[str, tuple[dict, list[bytes]]]:
    return {i: read_archive(archive_path(out, "flow", i)) for i in ids}


@pytest.mark.slow
def test_a_preprocess_run_on_the_native_backend_writes_the_opencv_archives(videos, tmp_path):
    """``auto`` on a machine without CUDA takes the native backend (2 worker processes here); the flow
    JPEGs are the opencv backend's byte for byte, and meta.json differs in the backend's name only. With the
    native path switched off, ``memdpc preprocess`` takes OpenCV and says why, in one line and the report."""
    ids = ["v0", "v1", "v2"]
    ref = preprocess(videos, tmp_path / "cv", "flow", size=0, flow_backend="opencv", progress=False)
    assert ref.flow["backend"] == "opencv"
    ours = preprocess(videos, tmp_path / "native", "flow", size=0, workers=2, device="cpu", progress=False)
    assert ours.flow == {"backend": "native", "devices": ["cpu"], "note": None, "opencv": opencv_record()}
    assert ours.summary.done == 3 and not ours.failures
    expected = flow_archives(tmp_path / "cv", ids)
    for i, (meta, frames) in flow_archives(tmp_path / "native", ids).items():
        ref_meta, ref_frames = expected[i]
        assert len(frames) == 5 and frames == ref_frames
        assert meta["flow"].pop("backend") == "native" and ref_meta["flow"].pop("backend") == "opencv"
        assert meta == ref_meta

    out = tmp_path / "off"
    env = {**os.environ, ENV_SWITCH: "0"}
    run = subprocess.run(
        [MEMDPC, "preprocess", "flow", str(videos), "--out", str(out), "--size", "0", "--device", "cpu"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    note = "native TV-L1 unavailable (switched off by MEMDPC_NATIVE_FLOW=0); using OpenCV"
    assert note in " ".join(run.stderr.split()) and "flow: opencv on cpu" in run.stdout
    flow = {"backend": "opencv", "devices": ["cpu"], "note": note, "opencv": opencv_record()}
    assert read_report(out).runs[-1]["flow"] == flow
    assert f"OpenCV {cv2.__version__} (ports tested against 5.0.0, 5.1.0)" in " ".join(run.stdout.split())
    assert {i: a[1] for i, a in flow_archives(out, ids).items()} == {i: a[1] for i, a in expected.items()}
