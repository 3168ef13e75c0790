"""Loading the model to evaluate: a pretrained checkpoint of the right stream, or random init (baseline)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from memdpc.errors import UserError


def load_encoder(checkpoint: str | os.PathLike, stream: str | None, device: torch.device
                 ) -> tuple[nn.Module, dict[str, Any], str]:
    """(model in eval mode on ``device``, checkpoint dict, stream) from a ``memdpc train`` checkpoint.

    ``stream`` None takes the checkpoint's stream; a different stream is refused (an RGB encoder
    evaluated on flow shards gives meaningless numbers without any error otherwise).
    """
    from memdpc.train.checkpoint import load_pretrained

    model, ckpt = load_pretrained(checkpoint, map_location=device)
    trained = ckpt.get("stream")
    if stream is not None and trained != stream:
        raise UserError(f"{checkpoint}: checkpoint was trained on the {trained} stream, "
                        f"not on the {stream} stream being evaluated")
    return model, ckpt, trained or stream


def default_size(ckpt: dict[str, Any]) -> int:
    """The input size the checkpoint was trained at (128 when it does not say)."""
    return int((ckpt.get("config") or {}).get("size") or ckpt["model_config"].get("input_size") or 128)
