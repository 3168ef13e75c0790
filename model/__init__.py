"""Models: 2D3D-ResNet encoder, ConvGRU, MemDPC (uni/bi) and the DPC baseline, heads, checkpoint import.

The names below are imported on first use (PEP 562), so that importing :mod:`memdpc.model.names` (the
model names, read by the CLI and the training config) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memdpc.model.names import MODEL_NAMES

if TYPE_CHECKING:
    from memdpc.model.factory import create_model
    from memdpc.model.heads import Classifier, LinearHead, MLPHead, OopsHead
    from memdpc.model.memdpc import MemDPC

_HOMES = {
    "create_model": "memdpc.model.factory",
    "Classifier": "memdpc.model.heads",
    "LinearHead": "memdpc.model.heads",
    "MLPHead": "memdpc.model.heads",
    "OopsHead": "memdpc.model.heads",
    "MemDPC": "memdpc.model.memdpc",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODEL_NAMES", "Classifier", "LinearHead", "MLPHead", "MemDPC", "OopsHead", "create_model"]
