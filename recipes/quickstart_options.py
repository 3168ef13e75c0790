"""What ``memdpc quickstart`` runs (:class:`QuickstartOptions`), without torch, so that the command line reads its
options from here at start (:mod:`memdpc.quickstart` runs it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memdpc.common.settings import Checked, setting
from memdpc.pipeline.backends import BACKENDS
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES

__all__ = ["QuickstartOptions"]


@dataclass(frozen=True)
class QuickstartOptions(Checked):
    """The quickstart's folder, sizes, data and seed; the defaults are its options' defaults."""

    out: Path = setting(
        Path("quickstart"),
        "Folder for everything the run makes (data, frames, shards, runs, eval, the table).",
        path={"file_okay": False},
    )
    tiny: bool = setting(False, "A reduced run (3 classes, 32² frames, 2–3 epochs) for CI and smoke tests.")
    workers: int = setting(2, "Preprocessing processes and loader workers.", min=1)
    seed: int = setting(0, "Random seed of every stage.")
    data: str = setting(
        next(iter(EXAMPLE_FAMILIES)),
        "Example family: the built-in synthetic motions, or the held-out photos (needs memdpc[photos]).",
        choices=tuple(EXAMPLE_FAMILIES),
    )
    backend: str = setting(
        "auto", "Loader backend for training and evaluation (auto: DALI where installed).", choices=BACKENDS
    )
    recipe: str | None = setting(
        None,
        "An example recipe's sizes instead of the default's (`memdpc recipes` lists them): a name or a file.",
    )
