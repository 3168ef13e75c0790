"""What ``memdpc bench loader`` measures (:class:`LoaderBench`), without torch, so that the command line reads its
options from here at start (``loader_bench.py`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memdpc.common.settings import setting
from memdpc.common.streams import STREAMS

if TYPE_CHECKING:
    from memdpc.pipeline.augment import AugmentSpec

__all__ = ["LoaderBench"]


@dataclass
class LoaderBench:
    """What ``memdpc bench loader`` measures; the defaults are its options' defaults."""

    shards: Path
    stream: str = setting("rgb", "Stream.", choices=STREAMS)
    split: str = setting("train", "Split whose shards are read.")
    size: int = setting(128, "Output clip size (full augmentation).")
    batch_size: int = setting(8, "Clips per batch.")
    batches: int = setting(8, "Timed batches per run (after 1 warm-up).")
    repeat: int = setting(2, "Alternating runs per loader (best counts).")
    workers: int = setting(2, "DataLoader workers / DALI threads.")
    device: str = setting("cpu", "cpu, or cuda for DALI mixed decode.")
    out: Path = setting(Path("bench/results/loader.json"), "JSON result file.")
    spec: AugmentSpec | None = None  # the "full" augmentation (None: the training default)
