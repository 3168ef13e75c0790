"""Train fixtures: real RGB shards of rendered motion videos, with a small clip geometry for fast CPU runs.

Videos are rendered (``render_video``), JPEG-encoded with OpenCV into per-video frame archives, then sharded
by the real shard writer. Clips are 5 blocks × 3 frames (stride 1), so a tiny network trains in seconds.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memdpc.cli import main
from memdpc.model.checkpoint import read_checkpoint
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.examples.synthetic import CLASSES, render_video
from memdpc.preprocess.video_index import VideoRecord

from ..conftest import (
    TINY_TRAIN,
    memdpc_command,
    run_memdpc,
    subprocess_env,
    train_options,
    write_jpeg_archive,
)

CLIP = ClipSpec(num_blocks=5, block_len=3, stride=1)
FRAMES, SIZE = 24, 32


@pytest.fixture
def one_thread():
    """Torch on one CPU thread during the test, its thread count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def video_record(ci: int, g: int, split: str) -> VideoRecord:
    """The index record of rendered video ``g`` of class ``ci`` (its archive: ``v_<class>_g<g>``) in ``split``."""
    vid = f"v_{CLASSES[ci]}_g{g:02d}"
    return VideoRecord(vid, f"/nowhere/{vid}.avi", ci, CLASSES[ci], split, 25.0, FRAMES)


def shard_train_and_test(root: Path, records: list[VideoRecord]) -> Path:
    """The train and test shards, in ``root / "shards"``, of the RGB frame archives in ``root / "archives"`` of
    ``records``: :data:`CLIP`'s windows every 8 frames, at most 4 of a video."""
    out = root / "shards"
    for split in ("train", "test"):
        shard_stream(
            root / "archives",
            records,
            "rgb",
            out,
            split,
            ShardSettings(clip=CLIP, window_step=8, max_count=4, seed=0),
        )
    return out


@pytest.fixture(scope="session")
def train_shards(tmp_path_factory) -> Path:
    """RGB shards (train: 18 clips in 5 shards; test: 6 clips) of 12 rendered videos, 3 classes (test: one
    video of each); their frame archives in the sibling folder ``archives``."""
    root = tmp_path_factory.mktemp("train_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(4):
            frames = render_video(cls, SIZE, FRAMES, np.random.default_rng([ci, g]))
            write_jpeg_archive(root / "archives", "rgb", f"v_{cls}_g{g:02d}", frames, 25.0)
            records.append(video_record(ci, g, "test" if g == 3 else "train"))
    return shard_train_and_test(root, records)


@pytest.fixture(scope="session")
def val_shards(train_shards, tmp_path_factory) -> Path:
    """The train shards and a ``val`` split of two videos, of the first two classes only (the third has none)."""
    out = tmp_path_factory.mktemp("val_data") / "shards"
    shutil.copytree(train_shards, out)
    records = [video_record(0, 3, "val"), video_record(1, 3, "val")]
    shard_stream(
        train_shards.parent / "archives",
        records,
        "rgb",
        out,
        "val",
        ShardSettings(clip=CLIP, max_count=4, seed=0),
    )
    return out


@pytest.fixture(scope="session")
def blank_shards(tmp_path_factory) -> Path:
    """RGB shards (train and test) of 9 videos of one flat grey, 3 classes: no clip, step or position tells
    apart from another, so no model can score a target above the others (the validation loss is chance's)."""
    root = tmp_path_factory.mktemp("blank_data")
    records = []
    for ci, cls in enumerate(CLASSES[:3]):
        for g in range(3):
            write_jpeg_archive(
                root / "archives",
                "rgb",
                f"v_{cls}_g{g:02d}",
                np.full((FRAMES, SIZE, SIZE, 3), 128, np.uint8),
                25.0,
            )
            records.append(video_record(ci, g, "test" if g == 2 else "train"))
    return shard_train_and_test(root, records)


def tb_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``log_dir``: {tag: [(step, value), ...]} in order."""
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tb_images(log_dir: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Every image in the TensorBoard event files of ``log_dir``: {tag: [(step, RGB uint8 (H, W, 3)), ...]}."""
    acc = EventAccumulator(str(log_dir), size_guidance={"images": 0})
    acc.Reload()
    return {
        tag: [
            (
                e.step,
                cv2.imdecode(np.frombuffer(e.encoded_image_string, np.uint8), cv2.IMREAD_COLOR)[..., ::-1],
            )
            for e in acc.Images(tag)
        ]
        for tag in acc.Tags()["images"]
    }


# The tiny network as `memdpc train` options (logging every step); each run adds its own settings.
TINY = train_options(**TINY_TRAIN, log_every=1)


def tiny(**settings) -> list[str]:
    """:data:`TINY` and a run's own settings as ``memdpc train`` options (a repeated option: the last wins)."""
    return [*TINY, *train_options(**settings)]


# The learning run: MemDPC at 64 px with the kNN monitor at the end.
LEARNED = [
    "--arch",
    "memdpc_r18",
    "--widths",
    "8,16,32,32",
    "--mem-size",
    "32",
    "--size",
    "64",
    "--knn-every",
    "4",
    "--log-every",
    "2",
]


def cli(*args: str):
    """``memdpc train ARGS`` in this process (click's runner)."""
    return CliRunner().invoke(main, ["train", *args])


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    """A real process, its stdout and stderr going to ``log``."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, env=subprocess_env(), stdout=f, stderr=subprocess.STDOUT)


def start_train(args: list[str], out: Path) -> subprocess.Popen:
    """``memdpc train ARGS --out OUT`` in a real process (:func:`start`), its output going to ``OUT.log``
    beside the run folder."""
    return start(memdpc_command("train", *args, "--out", str(out)), out.with_suffix(".log"))


def assert_finished(proc: subprocess.Popen, log: Path) -> None:
    """``proc`` (from :func:`start`) ends within 4 minutes with exit 0; if not, its ``log`` is the message."""
    assert proc.wait(timeout=240) == 0, log.read_text()


def run_to_end(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """A real process run to its end, its stdout and stderr captured as text."""
    return subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)


def train_steps(run: Path) -> int:
    """The train records a running run (logging every step) has written so far, complete lines only."""
    path = run / "metrics.jsonl"
    lines = path.read_text().split("\n")[:-1] if path.exists() else []
    return sum('"kind": "train"' in line for line in lines)


def children(pid: int) -> list[str]:
    """The child processes of ``pid`` (Linux)."""
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def signal_when(proc: subprocess.Popen, ready, sig: int) -> float:
    """Send ``sig`` to ``proc`` as soon as ``ready()`` holds; return the seconds from the signal to the exit."""
    deadline = time.monotonic() + 240
    while not ready():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the signal"
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.005)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running 60 s after {signal.Signals(sig).name}") from None
    return time.monotonic() - sent


def assert_same_training(a: Path, b: Path) -> None:
    """The two runs' last checkpoints hold the same step, bit-identical weights and optimiser state, and the
    same RNG states."""
    ca, cb = (read_checkpoint(run / "checkpoints" / "last.pt") for run in (a, b))
    assert (ca["epoch"], ca["step"], ca["epoch_step"]) == (cb["epoch"], cb["step"], cb["epoch_step"])
    assert ca["model"].keys() == cb["model"].keys()
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    opt_a, opt_b = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert all(torch.equal(opt_a[i][k], opt_b[i][k]) for i in opt_a for k in ("exp_avg", "exp_avg_sq"))
    for ra, rb in zip(ca["rng"], cb["rng"], strict=True):
        assert (
            torch.equal(ra["now"]["torch"], rb["now"]["torch"]) and ra["now"]["python"] == rb["now"]["python"]
        )


def family_flow_shards(root: Path, family: str, classes: int) -> Path:
    """Flow shards (train, and a val split of one video a class) of ``classes`` classes of an example family,
    made through the command line: 6 videos a class of 24 frames at 32², clips of 4 blocks × 4 frames."""
    steps = [
        ("data", family, root / "d", "--classes", classes, "--videos-per-class", "6", "--frames", "24", "--size", "32"),
        ("index", root / "d", "--layout", "ucf101", "--val-per-class", "1", "--out", root / "idx.jsonl"),
        ("preprocess", "flow", root / "idx.jsonl", "--out", root / "frames", "--streams", "flow", "--size", "32",
         "--scales", "2", "--warps", "2", "--workers", "1"),
        *(
            ("shard", root / "frames", "--index", root / "idx.jsonl", "--stream", "flow", "--split", split, "--out",
             root / "shards", "--blocks", "4", "--block-len", "4", "--clip-stride", "1", "--window-step", "4",
             "--max-count", "2")
            for split in ("train", "val")
        ),
    ]  # fmt: skip
    for args in steps:
        res = run_memdpc(*map(str, args))
        assert res.returncode == 0, res.stderr[-2000:]
    return root / "shards"


@pytest.fixture(scope="session")
def direction_shards(tmp_path_factory) -> Path:
    """Flow shards of 4 classes of the directions family, where the untrained encoder already tells most
    validation videos apart, and the direction of a video's global motion tells its class."""
    return family_flow_shards(tmp_path_factory.mktemp("directions"), "directions", 4)
