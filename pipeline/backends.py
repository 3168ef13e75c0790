"""The loader backends' names and the settings of the loader that a run reads its shards with
(:class:`LoaderSettings`, shared by ``memdpc train`` and every ``memdpc eval`` verb), in a module without torch so
that the command line can offer them quickly."""

from __future__ import annotations

from dataclasses import dataclass

from memdpc.common.settings import Checked, setting
from memdpc.common.streams import STREAMS

__all__ = ["BACKENDS", "DEVICES", "LoaderSettings"]

BACKENDS = ("auto", "dali", "torch")
DEVICES = ("auto", "cpu", "cuda")  # where a run computes (and DALI decodes): auto = CUDA where available


@dataclass(frozen=True)
class LoaderSettings(Checked):
    """Which shards a run reads and how: the loader's settings of ``memdpc train`` and of every ``memdpc eval``
    verb (each nests them, with its own defaults)."""

    shards: str = setting(
        "", "Shard folder (holding <stream>/manifest-<split>.json).", required=True, path={}
    )
    stream: str | None = setting(
        "rgb",
        "Stream of the shards; must match their manifest. Evaluation: the checkpoint's where not given (another "
        "one is refused, except for a converted checkpoint, with a warning).",
        choices=STREAMS,
    )
    train_split: str = setting("train", "Shard split to train on (retrieval: the gallery).")
    backend: str = setting("auto", "Loader backend.", choices=BACKENDS)
    num_workers: int | None = setting(
        2,
        "Loader worker processes per rank (torch backend) / threads (DALI); none given: 2 processes, or a "
        "thread per core.",
        flags=("--workers", "--num-workers"),
        min=0,
    )
    batch_size: int = setting(16, "Clips per batch (per device, per rank).", min=1)
    device: str = setting(
        "auto", "Where the run computes: auto = CUDA when available, else the CPU.", choices=DEVICES
    )
