"""What ``memdpc convert`` writes (:class:`ConvertOptions`), without torch, so that the command line reads its
options from here at start (:mod:`memdpc.model.convert` converts)."""

from __future__ import annotations

from dataclasses import dataclass

from memdpc.common.settings import Checked, setting
from memdpc.common.streams import STREAMS

__all__ = ["ConvertOptions"]


@dataclass(frozen=True)
class ConvertOptions(Checked):
    """The direction of a conversion and what an imported checkpoint records of its training."""

    to: str = setting(
        "memdpc",
        "memdpc: import a reference MemDPC/DPC/classifier file; reference: export back to its layout.",
        choices=("memdpc", "reference"),
    )
    stream: str | None = setting(
        None,
        "Stream the weights were trained on, recorded in the imported checkpoint (evaluation needs it).",
        choices=STREAMS,
    )
    input_size: int | None = setting(
        None,
        "Input size the weights were trained at, recorded as evaluation's default (unknown: 128).",
        flags=("--size",),
        min=1,
    )
