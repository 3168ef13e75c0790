"""memdpc: self-supervised video representation learning with Memory-augmented Dense Predictive Coding.

The calls a Python user writes (a notebook, their own training loop; README, *From Python*, has examples):

- :func:`load_model`: a checkpoint (trained, ``init.pt``, finetuned or converted) → ``(model, checkpoint)``.
- :func:`make_loader`: a loader over a shard folder's split (DALI or torch), batches of normalised clips.
- :func:`shard_features` / :func:`video_features`: the encoder's per-video features of shards or video files.
- :func:`tvl1_flow` / :func:`video_flow`: OpenCV's TV-L1 flow of a pair of frames or of a video file.

They are imported on first use (PEP 562), so that ``import memdpc`` and ``memdpc --help`` need no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memdpc.common.version import __version__
    from memdpc.eval.embed import VideoFeatures, shard_features, video_features
    from memdpc.model.checkpoint import load_model
    from memdpc.pipeline.loader import make_loader
    from memdpc.preprocess.flow.tvl1_native import tvl1_flow
    from memdpc.preprocess.flow.tvl1_params import TVL1Params
    from memdpc.preprocess.flow.video import video_flow

_HOMES = {
    "__version__": "memdpc.common.version",
    "load_model": "memdpc.model.checkpoint",
    "make_loader": "memdpc.pipeline.loader",
    "shard_features": "memdpc.eval.embed",
    "video_features": "memdpc.eval.embed",
    "VideoFeatures": "memdpc.eval.embed",
    "tvl1_flow": "memdpc.preprocess.flow.tvl1_native",
    "TVL1Params": "memdpc.preprocess.flow.tvl1_params",
    "video_flow": "memdpc.preprocess.flow.video",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TVL1Params",
    "VideoFeatures",
    "__version__",
    "load_model",
    "make_loader",
    "shard_features",
    "tvl1_flow",
    "video_features",
    "video_flow",
]
