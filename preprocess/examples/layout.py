"""What the built-in example families share: their options, the video writer and the UCF101 layout.

Each family (``synthetic.py``, ``photos.py``) only renders one video of a class from a random generator;
this module turns that into real video files and split lists that ``memdpc index --layout ucf101`` reads,
so both families are laid out, seeded and split by the same rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np

from memdpc.common import interrupts
from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError
from memdpc.common.settings import setting

__all__ = ["ExampleConfig", "write_example", "write_video"]

CODECS = {"xvid": ("XVID", ".avi"), "mjpg": ("MJPG", ".avi"), "mp4v": ("mp4v", ".mp4")}
UCF_SPLITS = (1, 2, 3)

# renders one video of a class: (class name, generator) → (frames, H, W, 3) uint8 BGR
Render = Callable[[str, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class ExampleConfig:
    """The options of an example family; a family subclasses it and names its classes (``classes``), whose
    count is the default of ``num_classes``."""

    videos_per_class: int = setting(8, "Videos per class.")
    frames: int = setting(48, "Frames per video.")
    size: int = setting(64, "Frame width and height in pixels.")
    fps: float = setting(25.0, "Frame rate written in the files.")
    num_classes: int = setting(
        0, "Number of classes (at most as many as the family has).", flags=("--classes",)
    )
    codec: str = setting("xvid", "Video codec (xvid/mjpg: .avi, mp4v: .mp4).", choices=tuple(CODECS))
    seed: int = setting(0, "Random seed (same seed, same bytes).")

    classes: ClassVar[tuple[str, ...]] = ()

    def validate(self) -> None:
        if not 1 <= self.num_classes <= len(self.classes):
            raise UserError(f"--classes must be between 1 and {len(self.classes)}, not {self.num_classes}")
        if self.videos_per_class < 1 or self.frames < 2 or self.size < 16 or self.fps <= 0:
            raise UserError("need --videos-per-class ≥ 1, --frames ≥ 2, --size ≥ 16 and --fps > 0")
        if self.codec not in CODECS:
            raise UserError(f"unknown codec '{self.codec}' (choose from {', '.join(CODECS)})")


def write_video(path: Path, frames: np.ndarray, fps: float, codec: str) -> None:
    """Encode ``frames`` with OpenCV to ``path`` atomically."""
    fourcc, _ = CODECS[codec]
    h, w = frames.shape[1:3]
    with atomic_path(path) as tmp:
        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*fourcc), fps, (w, h))
        if not writer.isOpened():
            raise UserError(f"{path}: OpenCV cannot write codec {codec}")
        try:
            for f in frames:
                writer.write(f)
        finally:
            writer.release()


def write_example(out: str | Path, cfg: ExampleConfig, render: Render) -> Path:
    """Render ``cfg.videos_per_class`` videos of each of the first ``cfg.num_classes`` classes into ``out``
    in the UCF101 layout and return the dataset root.

    ``out/UCF-101/<Class>/v_<Class>_gNN_c01.<ext>`` plus ``out/ucfTrainTestlist/`` with ``classInd.txt``
    and three train/test splits (split s tests the groups g with (g - 1) % 3 == s - 1). Video g of class
    index c is rendered from ``np.random.default_rng([seed, c, g])``: a video does not depend on how many
    others are made, and a video already on disk is kept (a killed run resumes).
    """
    out = Path(out)
    classes = cfg.classes[: cfg.num_classes]
    _, ext = CODECS[cfg.codec]
    lists: dict[int, tuple[list, list]] = {s: ([], []) for s in UCF_SPLITS}
    videos = [
        (ci, cls, g, f"{cls}/v_{cls}_g{g:02d}_c01{ext}")
        for ci, cls in enumerate(classes)
        for g in range(1, cfg.videos_per_class + 1)
    ]
    try:
        for ci, cls, g, rel in videos:
            path = out / "UCF-101" / rel
            if not path.exists():
                write_video(path, render(cls, np.random.default_rng([cfg.seed, ci, g])), cfg.fps, cfg.codec)
            for s in UCF_SPLITS:
                train, test = lists[s]
                (test if (g - 1) % 3 == s - 1 else train).append((rel, ci + 1))
    except KeyboardInterrupt as e:
        # counted on disk: a signal may land after a video's rename and before the loop knows it is written
        done = sum((out / "UCF-101" / rel).exists() for *_, rel in videos)
        raise interrupts.as_interrupted(e).keep(
            f"{done} of {len(videos)} videos written to {out}; the same command resumes"
        ) from None
    _write_lists(out / "ucfTrainTestlist", classes, lists)
    return out


def _write_lists(split_dir: Path, classes: Sequence[str], lists: dict[int, tuple[list, list]]) -> None:
    _write_text(split_dir / "classInd.txt", "".join(f"{i + 1} {c}\n" for i, c in enumerate(classes)))
    for s, (train, test) in lists.items():
        _write_text(split_dir / f"trainlist0{s}.txt", "".join(f"{r} {c}\n" for r, c in train))
        _write_text(split_dir / f"testlist0{s}.txt", "".join(f"{r}\n" for r, _ in test))


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
