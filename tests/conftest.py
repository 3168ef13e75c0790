"""Shared fixtures and helpers: tiny real data generated once per session (real video files, real OpenCV),
and the JPEG frame archives the pipeline, train and eval tests build from rendered frames."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from memdpc.preprocess.archive import archive_path, write_archive
from memdpc.preprocess.examples.layout import write_video
from memdpc.preprocess.examples.synthetic import CLASSES, SyntheticConfig, make_synthetic, render_video
from memdpc.preprocess.flow.tvl1_params import TESTED_OPENCV, opencv_scales_in_float

if not torch.cuda.is_available():  # before anything imports Triton: its kernels then run in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
# One torch thread in each test process, and in the processes tests start unless a test sets its own count:
# the test command runs a test file per core (pytest-xdist), where more threads than cores wait on each other.
# (MKL's count is left alone: a process given two torch threads, as README's quickstart is, sums as there.)
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


# The files of the longest tests, started first: the test command runs whole files in parallel, and a long
# file started last keeps one core busy after the others are done (the default quickstart's is the longest).
LONGEST_FIRST = (
    "tests/test_quickstart.py",
    "tests/train/test_loop_resume.py",
    "tests/train/test_loop.py",
    "tests/train/test_step.py",
    "tests/bench/test_gpu_checks.py",
    "tests/preprocess/test_run.py",
    "tests/test_own_videos.py",
)


def pytest_report_header(config):
    """The OpenCV the flow ports' bit-for-bit tests compare against (and those they were made for)."""
    scales = "float" if opencv_scales_in_float() else "double"
    return f"OpenCV {cv2.__version__} (flow scaled in {scales}; the flow ports tested against {', '.join(TESTED_OPENCV)})"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: unused without it (-p no:xdist, a bare GPU machine)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` in the collection's order (below), not pytest-xdist's (more tests first)."""
    if config.getoption("dist") == "loadfile":
        config.option.loadscopereorder = False
    return None


def pytest_collection_modifyitems(config, items):
    """:data:`LONGEST_FIRST`, then the files of slow tests, then the others, each of more tests first (the last
    to run are short); GPU tests skipped without CUDA."""
    counts = Counter(item.nodeid.split("::")[0] for item in items)
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(
        key=lambda item: (
            first.get(f := item.nodeid.split("::")[0], len(first)),
            f not in slow,
            -counts[f],
            f,
        )
    )
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


TINY = SyntheticConfig(videos_per_class=3, frames=30, size=32, num_classes=3, seed=0)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A 3-class × 3-video synthetic dataset (30 frames of 32×32) in the UCF101 layout."""
    return make_synthetic(tmp_path_factory.mktemp("tiny") / "syn", TINY)


# A user's own folder (<class>/<video>), as real ones are: (class, motion, file name, width × height, frames, fps,
# codec). Three frame sizes and aspect ratios (one portrait), two codecs, two frame rates, one long video.
MESSY_VIDEOS = (
    ("jumping", "MoveUp", "a", (64, 48), 44, 25.0, "mjpg"),
    ("jumping", "MoveUp", "b", (48, 64), 40, 30.0, "mp4v"),
    ("jumping", "MoveUp", "c", (80, 44), 150, 30.0, "mp4v"),
    ("jumping", "MoveUp", "d", (64, 48), 42, 25.0, "mjpg"),
    ("spinning", "RotateClockwise", "a", (48, 64), 44, 25.0, "mjpg"),
    ("spinning", "RotateClockwise", "b", (80, 44), 40, 25.0, "mp4v"),
    ("spinning", "RotateClockwise", "c", (64, 48), 46, 30.0, "mjpg"),
    ("spinning", "RotateClockwise", "d", (48, 64), 40, 30.0, "mp4v"),
    ("zooming", "ZoomIn", "a", (80, 44), 44, 30.0, "mjpg"),
    ("zooming", "ZoomIn", "b", (64, 48), 40, 25.0, "mp4v"),
    ("zooming", "ZoomIn", "c", (48, 64), 48, 25.0, "mjpg"),
    ("zooming", "ZoomIn", "d", (80, 44), 40, 30.0, "mp4v"),
    ("zooming", "ZoomIn", "e", (64, 48), 42, 25.0, "mjpg"),
)
MESSY_BROKEN = ("zooming/cut.avi", "jumping/broken.avi")  # half a file; a text file named .avi


def make_messy_folder(root: Path) -> Path:
    """Write :data:`MESSY_VIDEOS` and the broken files of :data:`MESSY_BROKEN` under ``root``; return it."""
    for i, (cls, motion, name, (w, h), frames, fps, codec) in enumerate(MESSY_VIDEOS):
        square = render_video(motion, max(w, h), frames, np.random.default_rng([7, i]))
        video = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in square])
        write_video(root / cls / f"{name}{'.avi' if codec == 'mjpg' else '.mp4'}", video, fps, codec)
    truncated, text = (root / p for p in MESSY_BROKEN)
    whole = root / "zooming" / "e.avi"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    text.write_text("shot list: jumping, take 3\n")
    return root


@pytest.fixture(scope="session")
def messy_folder(tmp_path_factory) -> Path:
    """A user's folder of 13 videos of 3 classes in mixed sizes, codecs and frame rates, plus 2 broken files."""
    return make_messy_folder(tmp_path_factory.mktemp("messy") / "my_videos")


class SmallDisk:
    """A real file system of a few hundred kilobytes for a test: a tmpfs mounted at ``path``. ``resize`` gives it
    another size (remounted, its files kept): a full disk, then space freed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def resize(self, size: int) -> None:
        """``size`` bytes in all (rounded up to pages by the kernel); shrinking below what it holds fails."""
        self.remount(f"size={size}")

    def remount(self, options: str) -> None:
        """Remount with ``options`` (e.g. ``ro``)."""
        res = subprocess.run(
            ["mount", "-o", f"remount,{options}", str(self.path)], capture_output=True, text=True
        )
        assert res.returncode == 0, res.stderr

    @property
    def free(self) -> int:
        return shutil.disk_usage(self.path).free


@pytest.fixture
def small_disk(tmp_path) -> SmallDisk:
    """A tmpfs of 1 MB mounted in the test's folder (it needs root, as CI runs; skipped with the reason
    elsewhere), always unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    path = tmp_path / "small_disk"
    path.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "memdpc-test", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


MIXED_SIZES = ((48, 64), (64, 36), (40, 40))  # (height, width): landscape 4:3, portrait 9:16, square
MIXED_FRAMES = 20


@pytest.fixture(scope="session")
def mixed_size_dataset(tmp_path_factory) -> Path:
    """Real video files (MJPG, 20 frames) of three frame sizes in the folder layout ``<split>/<class>/``: per
    class (2) one train video of each size of MIXED_SIZES, and one test video (portrait for the first class,
    landscape for the second). Each is a rendered motion, cut to its size from a square render."""
    root = tmp_path_factory.mktemp("mixed") / "videos"
    videos = [
        (split, ci, hw)
        for ci in range(2)
        for split, hw in [("train", hw) for hw in MIXED_SIZES] + [("test", MIXED_SIZES[1 - ci])]
    ]
    for g, (split, ci, (h, w)) in enumerate(videos):
        side = max(h, w)
        frames = render_video(CLASSES[ci], side, MIXED_FRAMES, np.random.default_rng([ci, g]))
        y, x = (side - h) // 2, (side - w) // 2
        path = root / split / CLASSES[ci] / f"clip{g:02d}_{h}x{w}.avi"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_video(path, np.ascontiguousarray(frames[:, y : y + h, x : x + w]), 25.0, "mjpg")
    return root


MIXED_FRAME_SIZES = {(24, 32), (43, 24), (24, 24)}  # mixed_size_dataset after preprocess --size 24


# A tiny network on clips of 5 blocks × 3 frames of 32 px, read by the torch loader in the test's own process: the
# training settings the train, eval and report tests start from (TrainConfig's names), each adding its own
TINY_TRAIN = dict(
    stream="rgb",
    arch="dpc_r18",
    widths=[4, 8, 16, 16],
    size=32,
    num_blocks=5,
    block_len=3,
    pred_steps=2,
    batch_size=4,
    backend="torch",
    num_workers=0,
    progress=False,
)


def train_options(**settings) -> list[str]:
    """Training settings (TrainConfig's names) as ``memdpc train`` options: ``--num-blocks 5``, lists
    comma-separated, a boolean as its flag or the flag's ``--no-`` form."""
    out = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{flag[2:]}")
        else:
            out += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return out


def subprocess_env() -> dict:
    """The environment of a process a test starts: one torch thread, as the tests' own."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def memdpc_command(*args) -> list[str]:
    """``python -m memdpc.cli ARGS`` (this interpreter, this checkout)."""
    return [sys.executable, "-m", "memdpc.cli", *map(str, args)]


def torchrun_command(*args, ranks: int = 2) -> list[str]:
    """``memdpc ARGS`` under torchrun: ``ranks`` processes on this machine (gloo on a CPU), on a free port."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        "-m",
        "memdpc.cli",
        *map(str, args),
    ]


def run_memdpc(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m memdpc.cli ARGS`` in a subprocess with one torch thread; output captured as text."""
    return subprocess.run(
        memdpc_command(*args), capture_output=True, text=True, timeout=timeout, env=subprocess_env(), cwd=cwd
    )


_OPENED: list[list[Path]] = []  # while files_opened runs: the files opened so far
_HOOKED: list[bool] = []


def _audit_opens(event: str, args: tuple) -> None:
    if _OPENED and event == "open" and isinstance(args[0], (str, Path)):
        _OPENED[-1].append(Path(args[0]))


def files_opened(call: Callable[[], object]) -> tuple[object, list[Path]]:
    """``call()``'s result and the files it opened, in order, as they were named (Python's audit events)."""
    if not _HOOKED:  # once per process; inert but while this runs (an audit hook cannot be removed)
        sys.addaudithook(_audit_opens)
        _HOOKED.append(True)
    _OPENED.append([])
    try:
        return call(), _OPENED[-1]
    finally:
        _OPENED.pop()


def tars_opened(call: Callable[[], object]) -> tuple[object, list[str]]:
    """``call()``'s result and the names of the tar files it opened, in order."""
    result, opened = files_opened(call)
    return result, [p.name for p in opened if p.suffix == ".tar"]


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` made by ``build(folder)`` once for the whole test run: the first pytest-xdist worker
    to ask builds it while the others wait on a lock, then every test reads it (none writes into it)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, which its workers share
    folder, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            done.touch()
    return folder


def _tiny_quickstart(out: Path) -> None:
    res = run_memdpc("quickstart", "--tiny", "--workers", "1", "--out", out, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"report: {out / 'report' / 'index.html'}" in res.stderr


@pytest.fixture(scope="session")
def tiny_quickstart(tmp_path_factory) -> Path:
    """The folder of a real ``memdpc quickstart --tiny`` (one worker): data, frames, shards, runs, eval, the table
    and the page it ends with (``report/index.html``), whose path it printed; one for the whole run."""
    return built_once(tmp_path_factory, "tiny_quickstart", _tiny_quickstart)


@pytest.fixture(scope="session")
def mixed_size_frames(mixed_size_dataset, tmp_path_factory) -> Path:
    """``memdpc index --layout folder`` and ``memdpc preprocess frames --size 24`` (README's short side,
    aspect kept) of ``mixed_size_dataset``: a folder with ``index.jsonl`` and ``frames/rgb/<id>.tar`` of
    three frame sizes (MIXED_FRAME_SIZES, one of them portrait)."""
    root = tmp_path_factory.mktemp("mixed_frames")
    for args in (
        ["index", mixed_size_dataset, "--layout", "folder", "--out", root / "index.jsonl"],
        ["preprocess", "frames", root / "index.jsonl", "--out", root / "frames", "--size", "24"],
    ):
        res = run_memdpc(*args)
        assert res.returncode == 0, res.stderr
    return root


def decode_video(path: Path) -> np.ndarray:
    """Every frame of a video file, read back with OpenCV: (frames, H, W, 3) uint8 BGR."""
    cap = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            cap.release()
            return np.stack(frames)
        frames.append(frame)


def jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    """A BGR (H, W, 3) uint8 image as OpenCV JPEG bytes."""
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes()


def frame_diffs(frames: np.ndarray) -> np.ndarray:
    """n frames → n−1 3-channel uint8 images standing in for flow (absolute differences of neighbours)."""
    return np.abs(frames[1:].astype(np.int16) - frames[:-1]).astype(np.uint8)


def write_jpeg_archive(root: Path, stream: str, video_id: str, images: np.ndarray, fps: float) -> None:
    """The frame archive ``<root>/<stream>/<video_id>.tar`` of ``images`` (n, H, W, 3), JPEG-encoded."""
    h, w = images.shape[1:3]
    meta = {"fps": fps, "height": h, "width": w, "stream": stream, "encoding": "jpeg"}
    write_archive(archive_path(root, stream, video_id), (jpeg(f) for f in images), meta)


# the reference implementation's names for memdpc's top-level modules (ARCHITECTURE.md §3.4), per family
_REFERENCE_NAMES = {
    "memdpc": {
        "memory": "mb",
        "backbone": "backbone",
        "agg_f": "agg_f",
        "agg_b": "agg_b",
        "predictor": "network_pred",
    },
    "dpc": {"backbone": "module.backbone", "agg_f": "module.agg", "predictor": "module.network_pred"},
    "classifier": {"backbone": "backbone", "agg_f": "agg_f", "agg_b": "agg_b", "head": ""},
}


def reference_weights(
    name: str, seed: int = 0, **kw
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(memdpc state dict, the same tensors in the reference implementation's layout) of a ``name`` model
    with randomised weights and BatchNorm statistics.

    The reference layout is written here from ARCHITECTURE.md §3.4, independently of ``model/convert.py``: ``mb``,
    GRU tensors twice (``ConvGRUCell_00`` and ``cell_list.0``), ``network_pred``, DPC under ``module.`` with
    one aggregator ``agg``, a classifier's ``final_bn`` and ``final_fc.1`` at the top level.
    """
    from memdpc.model import create_model

    g = torch.Generator().manual_seed(seed)
    ours = {}
    for key, value in create_model(name, seed=seed, **kw).state_dict().items():
        if key.endswith("running_var"):
            value = torch.rand(value.shape, generator=g) + 0.5
        elif value.is_floating_point():
            value = value + 0.05 * torch.randn(value.shape, generator=g)
        ours[key] = value
    names = _REFERENCE_NAMES[name.split("_r")[0]]
    ref = {}
    for key, value in ours.items():
        top, _, rest = key.partition(".")
        if rest.startswith("cell."):
            for twin in ("ConvGRUCell_00", "cell_list.0"):
                ref[f"{names[top]}.{twin}.{rest[len('cell.') :]}"] = value.clone()
        else:
            ref[".".join(p for p in (names[top], rest) if p)] = value.clone()
    return ours, ref
