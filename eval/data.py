"""What every ``memdpc eval`` verb evaluates on: the shard folder, the splits and how to load them. Without
torch, so that the command line reads its defaults from here at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class EvalData:
    """Where the evaluation data is and how to load it (shared by every ``memdpc eval`` command)."""

    shards: Path
    stream: str
    train_split: str = "train"
    test_split: str = "test"
    size: int = 128
    batch_size: int = 16
    backend: str = "auto"
    num_workers: int | None = None
    dataset: str | None = None

    @property
    def dataset_name(self) -> str:
        return self.dataset or Path(self.shards).resolve().name
