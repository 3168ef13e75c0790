"""Loading the model to evaluate: a pretrained or classifier checkpoint (memdpc's own or converted) for the
stream being evaluated."""

from __future__ import annotations

import os
from typing import Any

from rich.markup import escape
from torch import nn

from memdpc.common.console import rich_console
from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.common.streams import STREAMS
from memdpc.eval.data import EvalData
from memdpc.model.checkpoint import load_model, require_classifier, require_pretrained, resolve_stream
from memdpc.pipeline.manifest import manifest_path

__all__ = ["default_size", "load_classifier", "load_encoder"]


def load_encoder(
    checkpoint: str | os.PathLike, data: EvalData, env: DistEnv
) -> tuple[nn.Module, dict[str, Any], str]:
    """(pretrained MemDPC/DPC model in eval mode on the device, checkpoint dict, stream to evaluate)."""
    return _load(checkpoint, data, env, require_pretrained)


def load_classifier(
    checkpoint: str | os.PathLike, data: EvalData, env: DistEnv
) -> tuple[nn.Module, dict[str, Any], str]:
    """(finetuned classifier in eval mode on the device, checkpoint dict, stream to evaluate)."""
    return _load(checkpoint, data, env, require_classifier)


def _load(checkpoint, data: EvalData, env: DistEnv, require) -> tuple[nn.Module, dict[str, Any], str]:
    """``data.loader.stream`` None takes the checkpoint's stream. An RGB encoder evaluated on flow shards gives
    meaningless numbers without any error, so another stream is refused, except for a converted checkpoint
    whose recorded stream ``--stream`` overrides (with a warning)."""
    model, ckpt = load_model(checkpoint, map_location=env.device)
    require(ckpt, checkpoint)
    stream, warning = resolve_stream(ckpt, checkpoint, data.loader.stream)
    if warning and env.is_main:
        rich_console(stderr=True).print("[yellow]warning:[/]", escape(warning), soft_wrap=True)
    if data.loader.stream is None:
        _check_shards_hold(checkpoint, ckpt, data, stream)
    return model, ckpt, stream


def _check_shards_hold(checkpoint, ckpt: dict[str, Any], data: EvalData, stream: str) -> None:
    """Refuse shards that lack the checkpoint's stream, naming the stream they do hold."""
    if manifest_path(data.loader.shards, stream, data.test_split).is_file():
        return
    others = [
        s for s in STREAMS if s != stream and manifest_path(data.loader.shards, s, data.test_split).is_file()
    ]
    if not others:
        return  # no shards of either stream: the manifest reader names the missing file
    hint = (
        f"; pass --stream {others[0]} to evaluate these weights on {others[0]} anyway"
        if ckpt["origin"] == "converted"
        else ""
    )
    raise UserError(
        f"{checkpoint}: holds {stream} weights, but {data.loader.shards} has no {stream} shards, only "
        f"{others[0]}{hint}"
    )


def default_size(ckpt: dict[str, Any]) -> int:
    """The input size the checkpoint was trained at (128 when it does not say)."""
    return int(ckpt["input_size"] or 128)
