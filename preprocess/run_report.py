"""What one preprocess run did, as :func:`memdpc.preprocess.run.run_preprocess` returns it: typed, where the
report's file (``preprocess/report.py``) holds the same facts as JSON lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memdpc.preprocess.options import PreprocessConfig
from memdpc.preprocess.report import WRITTEN

__all__ = ["STATUSES", "RunReport", "RunSummary"]

STATUSES = ("done", "partial", "skipped", "failed")  # a video's status in a run
STAGES = ("decode", "flow", "encode")


@dataclass(frozen=True)
class RunSummary:
    """The counts of a run: its videos by status, ``pending`` (those a signal or a fault kept it from reaching),
    the frames of the archives it wrote, its seconds and each stage's seconds summed over its videos."""

    done: int
    partial: int
    skipped: int
    failed: int
    pending: int
    videos: int
    frames: int
    seconds: float
    frames_per_s: float
    stage_seconds: Mapping[str, float]

    @classmethod
    def of(cls, entries: Iterable[Mapping[str, Any]], seconds: float, pending: int) -> RunSummary:
        """The summary of a run's video entries (as the report's lines hold them)."""
        videos = list(entries)
        frames = sum(v.get("num_frames", 0) for v in videos if v["status"] in WRITTEN)
        return cls(
            **{s: sum(v["status"] == s for v in videos) for s in STATUSES},
            pending=pending,
            videos=len(videos),
            frames=frames,
            seconds=round(seconds, 3),
            frames_per_s=round(frames / seconds, 3) if seconds > 0 else 0.0,
            stage_seconds={k: round(sum(v.get("stages", {}).get(k, 0.0) for v in videos), 3) for k in STAGES},
        )

    @property
    def written(self) -> int:
        """The videos whose archives the run wrote (done or partial)."""
        return self.done + self.partial


@dataclass(frozen=True)
class RunReport:
    """What a run did: the config it was given, when it started and finished, its summary, every video of its
    part it reached (``videos``: one entry each, as the report's line holds it, the reused ones ``skipped``), the
    failed ones with their split and class (``failures``), the flow's backend, devices, OpenCV and batched stage
    (``flow``; None for a run of frames only) and FFmpeg's messages not tied to a video."""

    config: PreprocessConfig
    started: str
    finished: str
    summary: RunSummary
    videos: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    flow: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)

    def pairs(self) -> int:
        """The flow images the run wrote."""
        return sum(v.get("streams", {}).get("flow", 0) for v in self.videos)
