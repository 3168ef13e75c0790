"""What every ``memdpc eval`` verb evaluates on: the shard folder, the splits and how to load them. Without
torch, so that the command line reads its defaults from here at start."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memdpc.common.settings import Checked, setting
from memdpc.pipeline.backends import LoaderSettings

__all__ = ["EvalData"]


@dataclass(frozen=True)
class EvalData(Checked):
    """Where the evaluation data is and how to load it (shared by every ``memdpc eval`` command): the loader's
    settings as training has them (the stream: the checkpoint's where not given; the workers: the loader's
    choice), the split to test and the input size."""

    loader: LoaderSettings = setting(LoaderSettings(stream=None, num_workers=None), nested=True)
    test_split: str = setting("test", "Split to test / the queries.")
    size: int | None = setting(None, "Input size [default: the checkpoint's training size].")
    dataset: str | None = setting(None, "Dataset name in the results (default: the shard folder's).")

    @property
    def dataset_name(self) -> str:
        return self.dataset or Path(self.loader.shards).resolve().name

    def with_loader(self, **changes: Any) -> EvalData:
        """The same evaluation with some of the loader's settings changed (e.g. the stream the checkpoint
        resolves to)."""
        return replace(self, loader=replace(self.loader, **changes))
