"""What every ``memdpc eval`` verb evaluates on: the shard folder, the splits and how to load them. Without
torch, so that the command line reads its defaults from here at start."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

from memdpc.common.settings import setting
from memdpc.common.streams import STREAMS
from memdpc.pipeline.backends import BACKENDS

__all__ = ["EvalData"]


@dataclass
class EvalData:
    """Where the evaluation data is and how to load it (shared by every ``memdpc eval`` command)."""

    shards: Path = setting(MISSING, "Shard folder (holding <stream>/manifest-<split>.json).", required=True)
    stream: str = setting(
        MISSING,
        "Stream to evaluate (default: the checkpoint's; another one is refused, except for a converted checkpoint, "
        "with a warning).",
        choices=STREAMS,
        option_default=None,
    )
    train_split: str = setting("train", "Split to train on / the gallery.")
    test_split: str = setting("test", "Split to test / the queries.")
    size: int = setting(128, "Input size (default: the checkpoint's training size).", option_default=None)
    batch_size: int = setting(16, "Clips per batch (per rank).", min=1)
    backend: str = setting("auto", "Loader backend.", choices=BACKENDS)
    num_workers: int | None = setting(
        None, "Loader workers (torch) / threads (DALI).", flags=("--workers", "--num-workers"), min=0
    )
    dataset: str | None = setting(None, "Dataset name in the results (default: the shard folder's).")

    @property
    def dataset_name(self) -> str:
        return self.dataset or Path(self.shards).resolve().name
