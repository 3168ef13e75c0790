"""Checkpoint files: the one builder and the one reader of every checkpoint memdpc writes.

A checkpoint is a dict that loads with ``torch.load(weights_only=True)``. Every one holds ``format``,
``memdpc_version``, ``origin`` (``train``: written by the training loop; ``init``: the untrained model of a
config; ``converted``: imported from the reference implementation; ``finetune``: the classifier that
``memdpc eval finetune`` trained), ``model`` (state_dict), ``model_config``
(``create_model(**it)`` rebuilds the model), ``stream`` (None for a converted file that was not told) and
``input_size`` (the size the weights were trained at; None when unknown). Training checkpoints add the
resume state (see :mod:`memdpc.train.checkpoint`), converted ones the ``source`` file and its ``epoch``,
finetuned ones the ``source`` checkpoint they started from.

Training and evaluation both read checkpoints through :func:`read_checkpoint`; it also accepts the files
of earlier versions (no ``origin`` or ``input_size``; converted files without ``format``). A verb that hands a
checkpoint to several parts reads it once (:func:`open_checkpoint`) and hands down the :class:`Checkpoint`,
which goes wherever a path goes and which :func:`read_checkpoint` and :func:`load_model` take without reading.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError
from memdpc.common.version import __version__
from memdpc.model.factory import create_model, has_memory

__all__ = [
    "WEIGHT_KEYS",
    "Checkpoint",
    "build_checkpoint",
    "check_compatible",
    "load_model",
    "load_torch_file",
    "open_checkpoint",
    "read_checkpoint",
    "require_classifier",
    "require_pretrained",
    "resolve_stream",
    "serialize",
    "write_checkpoint",
]

FORMAT = "memdpc-train-1"
ORIGINS = ("train", "init", "converted", "finetune")
# model_config entries that change which weights a model has or their shapes
WEIGHT_KEYS = ("name", "widths", "bidirectional", "mem_size", "track_running_stats", "num_classes")


def build_checkpoint(
    model: nn.Module, stream: str | None, origin: str, *, input_size: int | None = None, **extra: Any
) -> dict[str, Any]:
    """The checkpoint dict of ``model``; ``extra`` holds what its origin adds (training state, source)."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {ORIGINS}, not {origin!r}")
    return {
        "format": FORMAT,
        "memdpc_version": __version__,
        "origin": origin,
        "model": model.state_dict(),
        "model_config": model.config,
        "stream": stream,
        "input_size": input_size or model.config.get("input_size"),
        **extra,
    }


def serialize(state: dict[str, Any]) -> bytes:
    """A checkpoint's bytes as ``torch.save`` writes them (to size one, or write it atomically)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_checkpoint(data: bytes, path: str | Path) -> None:
    """Write serialised checkpoint bytes to ``path`` atomically.

    When the disk is full (or a quota or file-size limit is hit, or the folder is read-only) the temporary file
    is removed, the file previously at ``path`` stays intact, and a
    :class:`~memdpc.common.errors.ResourceFault` says what failed (:func:`memdpc.common.atomic.atomic_path`).
    """
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


@dataclass(frozen=True, eq=False)  # compared and hashed as the one object read
class Checkpoint:
    """A checkpoint file read once: its path (``os.fspath`` and ``str`` give it, so that it goes wherever a path
    goes), its content as :func:`read_checkpoint` returns it (read it, never change it) and the SHA-256 of its
    bytes (what results are keyed by)."""

    path: Path
    content: dict[str, Any] = field(repr=False)
    sha256: str

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)


def open_checkpoint(path: str | os.PathLike | Checkpoint) -> Checkpoint:
    """Read a memdpc checkpoint on the CPU once: its content, with ``origin``, ``stream`` and ``input_size``
    always present, and its digest. A :class:`Checkpoint` is returned as it is.

    UserError for a missing, damaged (e.g. truncated) or foreign file (see :func:`load_torch_file`).
    """
    if isinstance(path, Checkpoint):
        return path
    path = Path(path)
    data = _read_torch_bytes(path, "copy it again from where it came from")
    ckpt = _unpickle(path, data, (), "copy it again from where it came from")
    if not isinstance(ckpt, dict):
        raise UserError(f"{path}: not a memdpc checkpoint (it holds a {type(ckpt).__name__})")
    if ckpt.get("format") != FORMAT and "converted_from" not in ckpt:
        hint = "; import a reference checkpoint with `memdpc convert`" if "state_dict" in ckpt else ""
        raise UserError(f"{path}: not a memdpc checkpoint (no format {FORMAT!r}){hint}")
    if not isinstance(ckpt.get("model"), dict) or not isinstance(ckpt.get("model_config"), dict):
        raise UserError(f"{path}: a memdpc checkpoint without model weights or model config")
    return Checkpoint(path, _complete(ckpt), hashlib.sha256(data).hexdigest())


def read_checkpoint(path: str | os.PathLike | Checkpoint) -> dict[str, Any]:
    """A memdpc checkpoint's content (:func:`open_checkpoint`; a :class:`Checkpoint`'s without reading)."""
    return open_checkpoint(path).content


def load_torch_file(
    path: str | Path, safe: Sequence[Any] = (), remedy: str = "copy it again from where it came from"
) -> Any:
    """``torch.load`` of a file given as a checkpoint, weights only, on the CPU (``safe``: globals allowed
    besides tensors). One-line errors: a folder (a run folder's checkpoints are named), a missing file, a
    file of another kind (what it looks like, and where the checkpoints are), a truncated or damaged file
    (``remedy`` says what to do)."""
    path = Path(path)
    return _unpickle(path, _read_torch_bytes(path, remedy), safe, remedy)


def _read_torch_bytes(path: Path, remedy: str) -> bytes:
    """The bytes of a file given as a checkpoint, read once, after its kind is checked on them."""
    if path.is_dir():
        raise UserError(_folder_given(path))
    if not path.is_file():
        others = _checkpoints_in(path.parent)
        there = f" ({path.parent} holds {', '.join(p.name for p in others)})" if others else ""
        raise UserError(f"{path}: checkpoint not found{there}")
    data = file_kinds.read_if_torch(path)
    kind = file_kinds.describe(path, data)
    if kind == file_kinds.TORCH_DAMAGED:
        raise UserError(
            f"{path}: not a readable checkpoint (truncated or damaged: its zip directory is missing); "
            f"{remedy}"
        )
    if kind == file_kinds.BINARY:  # binary, but neither a PyTorch zip nor a legacy PyTorch file
        raise UserError(
            f"{path}: not a readable checkpoint (not a PyTorch file: damaged, or a file of another "
            f"kind); {remedy}"
        )
    if kind != file_kinds.TORCH or data is None:  # read_if_torch reads every file describe calls PyTorch's
        raise UserError(
            f"{path}: not a memdpc checkpoint (it looks like {kind}){_where_checkpoints_are(path, kind)}"
        )
    return data


def _unpickle(path: Path, data: bytes, safe: Sequence[Any], remedy: str) -> Any:
    """``torch.load`` of a checkpoint's bytes, weights only, on the CPU; one-line errors naming ``path``."""
    try:
        with torch.serialization.safe_globals(list(safe)):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — a damaged file can fail anywhere inside the unpickler
        if isinstance(e, pickle.UnpicklingError) and "weights only" in str(e).lower():
            raise UserError(
                f"{path}: not a memdpc checkpoint (a PyTorch file holding Python objects other than "
                "tensors and plain values)"
            ) from None
        raise UserError(
            f"{path}: not a readable checkpoint (truncated or damaged: {_first_line(e)}); {remedy}"
        ) from None


def _first_line(e: BaseException) -> str:
    """``Type: first sentence`` of an exception (torch's long advice cut off)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(". This is an internal")[0]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _checkpoints_in(folder: Path) -> list[Path]:
    """The ``.pt`` files of a folder, best.pt and last.pt first."""
    if not folder.is_dir():
        return []
    order = {"best.pt": 0, "last.pt": 1}
    return sorted(folder.glob("*.pt"), key=lambda p: (order.get(p.name, 2), p.name))


def _folder_given(path: Path) -> str:
    if ckpts := _checkpoints_in(path / "checkpoints"):
        return (
            f"{path} is a run folder: give one of its checkpoints, e.g. {ckpts[0]} (it holds "
            f"{', '.join(p.name for p in ckpts)})"
        )
    if ckpts := _checkpoints_in(path):
        return f"{path} is a folder: give one of its checkpoints, e.g. {ckpts[0]}"
    return f"{path} is a folder, not a checkpoint file"


def _where_checkpoints_are(path: Path, kind: str) -> str:
    """For a file given as a checkpoint that is none: the checkpoint a results file was made from, or the
    checkpoints of the run folder it is in."""
    if kind == file_kinds.RESULTS:
        try:
            made_from = json.loads(path.read_text()).get("source", {}).get("checkpoint")
        except (ValueError, AttributeError):
            made_from = None
        return f"; it was made from {made_from}" if made_from else ""
    ckpts = [
        p for p in _checkpoints_in(path.parent / "checkpoints") or _checkpoints_in(path.parent) if p != path
    ]
    return f"; give a checkpoint, e.g. {ckpts[0]}" if ckpts else ""


def _complete(ckpt: dict[str, Any]) -> dict[str, Any]:
    """Fill in what files of earlier versions do not record."""
    if "origin" not in ckpt:
        ckpt["origin"] = (
            "converted" if "converted_from" in ckpt else "train" if "optimizer" in ckpt else "init"
        )
        if "converted_from" in ckpt:
            ckpt["source"] = ckpt.pop("converted_from")
    if "input_size" not in ckpt:
        ckpt["input_size"] = (
            (ckpt.get("config") or {}).get("size") or ckpt["model_config"].get("input_size")
            if ckpt["origin"] != "converted"
            else None
        )
    ckpt.setdefault("stream", None)
    return ckpt


def load_model(
    path: str | os.PathLike | Checkpoint, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model stored in a checkpoint and load its weights.

    Returns ``(model, checkpoint_dict)``; the model is in eval mode on ``map_location``.
    """
    ckpt = read_checkpoint(path)
    model = create_model(**ckpt["model_config"])
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as e:
        raise UserError(
            f"{path}: its weights do not fit its model config ({str(e).splitlines()[0]})"
        ) from None
    return model.to(map_location).eval(), ckpt


def is_classifier(ckpt: dict[str, Any]) -> bool:
    """Whether the checkpoint holds a (finetuned) classifier rather than a pretrained (Mem)DPC model."""
    return ckpt["model_config"]["name"].startswith("classifier")


def require_pretrained(ckpt: dict[str, Any], path: str | Path) -> None:
    """Refuse a classifier checkpoint where a pretrained MemDPC/DPC model is needed."""
    if is_classifier(ckpt):
        raise UserError(
            f"{path}: holds a finetuned classifier ({ckpt['model_config']['name']}), not a pretrained "
            "MemDPC/DPC model; score it with `memdpc eval classify`"
        )


def require_classifier(ckpt: dict[str, Any], path: str | Path) -> None:
    """Refuse a pretrained model where a finetuned classifier is needed."""
    if not is_classifier(ckpt):
        raise UserError(
            f"{path}: holds a pretrained {ckpt['model_config']['name']} model, not a finetuned "
            "classifier; evaluate it with `memdpc eval probe` or `memdpc eval finetune`"
        )


def resolve_stream(ckpt: dict[str, Any], path: str | Path, requested: str | None) -> tuple[str, str | None]:
    """(the stream to use, a warning or None) for using ``ckpt`` on ``requested`` (None: the checkpoint's).

    The stream of a checkpoint memdpc trained is a fact, so another one is refused; the stream of a
    converted file is what `memdpc convert --stream` was told, so an explicit other stream wins, with a
    warning.
    """
    recorded = ckpt["stream"]
    if recorded is None:
        if requested is None:
            raise UserError(
                f"{path}: the checkpoint does not record its stream; pass --stream rgb|flow (or "
                "convert it again with --stream)"
            )
        return requested, None
    if requested is None or requested == recorded:
        return recorded, None
    if ckpt["origin"] != "converted":
        raise UserError(f"{path}: checkpoint was trained on the {recorded} stream, not {requested}")
    return requested, (
        f"{path}: converted as {recorded} weights; used on the {requested} stream because --stream says so"
    )


def check_compatible(
    ckpt: dict[str, Any], path: str | Path, model_config: dict[str, Any], keys: tuple[str, ...] | None = None
) -> None:
    """Refuse a checkpoint whose model differs from ``model_config`` in ``keys`` (default: every setting
    but the seed)."""
    ours, theirs = model_config, ckpt["model_config"]
    keys = keys or tuple(k for k in sorted(set(theirs) | set(ours)) if k != "seed")
    if ours.get("name") == theirs.get("name") and not has_memory(ours["name"]):  # DPC: mem_size is moot
        keys = tuple(k for k in keys if k != "mem_size")
    diff = [
        f"{k} {theirs.get(k)!r} (this run: {ours.get(k)!r})" for k in keys if theirs.get(k) != ours.get(k)
    ]
    if diff:
        raise UserError(f"{path}: checkpoint is of another architecture: {'; '.join(diff)}")
