"""Checkpoints: atomic save, exact-resume state (RNG, loader position), compatibility checks, pretrained load.

A checkpoint is a dict (contract #4): ``model`` (state_dict), ``model_config`` (``create_model(**it)``
rebuilds the model), ``stream``, ``optimizer``, ``scheduler``, ``epoch`` (epoch in progress), ``step``
(optimiser steps done), ``epoch_step`` (batches of ``epoch`` already consumed: the loader position), ``rng``
(python, numpy, torch, cuda, now and at the start of the epoch), ``config`` (the training config),
``world_size``, ``best_val`` and ``format``. Everything in it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from memdpc.atomic import atomic_path
from memdpc.errors import UserError

FORMAT = "memdpc-train-1"


# ------------------------------------------------------------------------------------------------- RNG
def rng_state() -> dict[str, Any]:
    """The state of every random generator training uses (python, numpy, torch CPU, all CUDA devices)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate needs tuples; a state that went through a list-preserving round trip gets them back."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list | tuple) else x


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ------------------------------------------------------------------------------------------- save/load
def serialize(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def write_checkpoint(data: bytes, path: Path) -> None:
    """Write serialised checkpoint bytes to ``path`` atomically.

    When the disk is full (or a quota or file-size limit is hit) the temporary file is removed, the file
    previously at ``path`` stays intact, and a :class:`UserError` says so.
    """
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            kept = f"; the previous {path.name} is unchanged" if path.exists() else ""
            raise UserError(f"{path}: could not write the checkpoint ({e.strerror}){kept}") from None
        raise


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a memdpc training checkpoint on the CPU; UserError for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — any unpickling failure means "not a checkpoint we can read"
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UserError(f"{path}: not a memdpc training checkpoint (no format {FORMAT!r})")
    return ckpt


def _check(ckpt: dict[str, Any], path: Path, stream: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    if ckpt["stream"] != stream:
        raise UserError(f"{path}: checkpoint was trained on the {ckpt['stream']} stream, not {stream}")
    diff = [f"{k} {theirs.get(k)!r} (this run: {ours.get(k)!r})"
            for k in sorted(set(theirs) | set(ours)) if k != "seed" and theirs.get(k) != ours.get(k)]
    if diff:
        raise UserError(f"{path}: checkpoint is of another architecture: {'; '.join(diff)}")


def check_config_compatible(ckpt: dict[str, Any], path: Path, stream: str, model_kwargs: dict[str, Any]) -> None:
    """Refuse a checkpoint of another stream, or whose training config asks for another model."""
    from memdpc.train.config import config_from_dict

    theirs = config_from_dict(ckpt["config"], where=str(path)).model_kwargs()
    _check(ckpt, path, stream, model_kwargs, theirs)


def check_compatible(ckpt: dict[str, Any], path: Path, stream: str, model_config: dict[str, Any]) -> None:
    """Refuse a checkpoint of another stream, or whose model differs from ``model_config`` (``model.config``)."""
    _check(ckpt, path, stream, model_config, ckpt["model_config"])


def param_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter's name and bytes: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def load_pretrained(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model stored in a training checkpoint and load its weights (for evaluation).

    Returns ``(model, checkpoint_dict)``; the model is in eval mode on ``map_location``.
    """
    from memdpc.model import create_model

    ckpt = read_checkpoint(path)
    model = create_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return model.to(map_location).eval(), ckpt


def write_initial_checkpoint(config: Any, path: str | Path) -> Path:
    """Write the untrained model of ``config`` (a TrainConfig), seeded as training would seed it, as a
    checkpoint that evaluation reads like a trained one: the random-init baseline of the paper's tables."""
    from memdpc import __version__
    from memdpc.model import create_model

    path = Path(path)
    model = create_model(**config.model_kwargs(), seed=config.seed)
    write_checkpoint(serialize({"format": FORMAT, "memdpc_version": __version__, "model": model.state_dict(),
                                "model_config": model.config, "stream": config.stream, "epoch": 0, "step": 0,
                                "config": config.to_dict()}), path)
    return path
