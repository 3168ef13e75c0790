"""Training-state specifics of checkpoints: the entries a training checkpoint adds (:data:`TRAINING_KEYS`, their
one home), RNG states for exact resume, the resume checks (:func:`read_resume`: the config and the world size;
:func:`check_same_shards`: the shards the run was trained on) and the ``--init`` ones, the model a run starts
from, and the untrained (init-only) checkpoint.

A training checkpoint is built by :func:`memdpc.model.checkpoint.build_checkpoint` (origin ``train``) with the
entries of :func:`training_entries` and read back by :func:`read_training_entries`.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from memdpc.common import interrupts
from memdpc.common.errors import UserError
from memdpc.model import create_model
from memdpc.model.checkpoint import (
    WEIGHT_KEYS,
    build_checkpoint,
    check_compatible,
    read_checkpoint,
    require_pretrained,
    resolve_stream,
    serialize,
    write_checkpoint,
)
from memdpc.pipeline.provenance import shard_changes, split_record
from memdpc.train.bn_stats import data_batchnorm_stats
from memdpc.train.config import TrainConfig, config_differences, config_from_dict
from memdpc.train.prepare import check_shards, split_loader

__all__ = [
    "OPTIONAL",
    "TRAINING_KEYS",
    "check_same_shards",
    "is_training_checkpoint",
    "next_command",
    "read_resume",
    "read_training_entries",
    "rng_state",
    "set_rng_state",
    "training_entries",
    "write_initial_checkpoint",
]

# The entries a training checkpoint adds to the common ones, and what each holds. A key in OPTIONAL may be missing
# from a checkpoint (written before it existed) and is read as the value given there.
TRAINING_KEYS = {
    "optimizer": "the optimiser's state dict",
    "scheduler": "the learning-rate scheduler's state dict (None: constant)",
    "scaler": "the fp16 loss scaler's state dict",
    "epoch": "the epoch in progress",
    "step": "optimiser steps done",
    "epoch_step": "batches of the epoch already consumed: the loader position",
    "epoch_loss": "sum and count of the epoch's training loss so far",
    "rng": "per rank: the python, numpy, torch and cuda generators, now and at the start of the epoch",
    "rank_digests": "per rank: the digest of its weights (equal on every rank)",
    "config": "the training config",
    "world_size": "the number of processes that wrote it (a resume needs as many)",
    "best_val": "the best watched value so far, lower is better: the validation loss, or minus the kNN R@1",
    "best_epoch": "the epoch of best_val (None: no epoch finished yet)",
    "stale": "epochs since best_val last improved (--early-stop)",
    "first_val": "the watched value after epoch 0 (None: not finished yet): what best_val is measured against",
    "shards": "per role (train, val): what the run records of the split it reads (train.prepare.shard_records)",
}
OPTIONAL = {"best_epoch": None, "stale": 0, "first_val": None, "shards": None}


def training_entries(**values: Any) -> dict[str, Any]:
    """The entries of a training checkpoint: exactly :data:`TRAINING_KEYS`, each given."""
    if set(values) != set(TRAINING_KEYS):
        raise ValueError(
            f"training entries differ from TRAINING_KEYS: {sorted(set(values) ^ set(TRAINING_KEYS))}"
        )
    return values


def is_training_checkpoint(ckpt: dict[str, Any]) -> bool:
    """Whether ``ckpt`` holds the state a run resumes from (a training checkpoint), not only weights."""
    return all(k in ckpt for k in TRAINING_KEYS if k not in OPTIONAL)


def read_training_entries(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A training checkpoint's :data:`TRAINING_KEYS`, the optional ones missing read as :data:`OPTIONAL` says."""
    return {k: ckpt[k] if k in ckpt else OPTIONAL[k] for k in TRAINING_KEYS}


BN_BATCHES = 100  # training batches whose clips give an untrained encoder its BatchNorm statistics
BN_STATS = (
    "running_mean",
    "running_var",
    "num_batches_tracked",
)  # BatchNorm buffers, absent when not tracked


# ------------------------------------------------------------------------------------------------- RNG
def rng_state() -> dict[str, Any]:
    """The state of every random generator training uses (python, numpy, torch CPU, all CUDA devices)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore Python's, NumPy's and torch's random states from :func:`rng_state`'s record."""
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    """random.setstate needs tuples; a state that went through a list-preserving round trip gets them back."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list | tuple) else x


# ------------------------------------------------------------------------------------------ weights
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


# ------------------------------------------------------------------------------------------- load/check
def check_config_compatible(
    ckpt: dict[str, Any], path: Path, stream: str, model_kwargs: dict[str, Any]
) -> None:
    """Refuse a checkpoint of another stream, or whose training config asks for another model."""
    resolve_stream(ckpt, path, stream)
    theirs = config_from_dict(ckpt["config"], where=str(path)).model_kwargs()
    check_compatible({"model_config": theirs}, path, model_kwargs)


def read_resume(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    """The checkpoint a run of ``config`` resumes from, with ``world_size`` processes. Refuses a weights-only
    checkpoint, one of another stream, model or config, and one of another world size (its shards are checked
    against the run's by :func:`check_same_shards`, once the shards are read)."""
    ckpt = read_checkpoint(path)
    if not is_training_checkpoint(ckpt):
        raise UserError(
            f"{path}: holds weights only (no optimiser, RNG or loader state), so training cannot "
            "resume from it; start a new run from its weights with --init"
        )
    check_config_compatible(ckpt, path, config.loader.stream, config.model_kwargs())
    diff = config_differences(ckpt["config"], config)
    if diff:
        raise UserError(f"{path}: checkpoint of a different config ({'; '.join(diff)})")
    if ckpt["world_size"] != world_size:
        raise UserError(
            f"{path}: written by {ckpt['world_size']} process(es); resume it with the same number "
            f"(now {world_size}) so that data order and RNG continue exactly"
        )
    return ckpt


def check_same_shards(ckpt: dict[str, Any], path: Path, shards: dict[str, dict[str, Any]]) -> None:
    """Refuse to resume the checkpoint ``ckpt`` (read from ``path``) on shards other than those it was trained
    on, naming what changed since; ``shards`` is the run's record of its shards now
    (:func:`~memdpc.train.prepare.shard_records`). A checkpoint written before runs recorded their shards is not
    compared; shards copied elsewhere are the same shards."""
    recorded = read_training_entries(ckpt)["shards"]
    changes = shard_changes(recorded, shards) if recorded is not None else []
    if changes:
        raise UserError(
            f"{path}: shards changed since this run: {', '.join(changes)}; --overwrite starts afresh "
            "(or train on the shards it was trained on)"
        )


def read_init(path: str | Path, config: TrainConfig) -> tuple[dict[str, Any], str | None]:
    """The checkpoint whose weights start a new run of ``config``, and a warning or None.

    Refuses a classifier, a checkpoint of another stream (a converted one only warns), and one whose
    weights do not fit the config's model (another family, widths, memory size or direction). Weights without
    BatchNorm statistics (a reference DPC's) are accepted: see :func:`initial_model`.
    """
    ckpt = read_checkpoint(path)
    require_pretrained(ckpt, path)
    _, warning = resolve_stream(ckpt, path, config.loader.stream)
    keys = tuple(k for k in WEIGHT_KEYS if k != "track_running_stats")
    check_compatible(ckpt, path, create_model(**config.model_kwargs()).config, keys)
    return ckpt, warning


def initial_model(config: TrainConfig, init: dict[str, Any] | None = None) -> nn.Module:
    """The model a run of ``config`` starts from: seeded random weights, or those of ``init`` (from
    :func:`read_init`).

    The reference DPC tracks no BatchNorm statistics (``track_running_stats=False``), and a run has no
    option to match it; such weights start a run whose statistics begin at their initial values (mean 0,
    variance 1), which training mode never reads and which follow the data within a few steps.
    """
    model = create_model(**config.model_kwargs(), seed=config.seed)
    if init is not None:
        absent = {
            k: v
            for k, v in model.state_dict().items()
            if k not in init["model"] and k.rsplit(".", 1)[-1] in BN_STATS
        }
        model.load_state_dict({**init["model"], **absent})
    return model


def write_initial_checkpoint(config: TrainConfig, path: str | Path, bn_from_data: bool = False) -> Path:
    """Write the model a run of ``config`` starts from, seeded as training would seed it
    (or with the ``--init`` weights), as a checkpoint that evaluation reads like a trained one: the
    random-init baseline of the paper's tables. With ``bn_from_data`` its BatchNorm statistics are those of
    the training split's clips (:mod:`memdpc.train.bn_stats`); no weight changes.

    SIGINT or SIGTERM stop it between batches (the loader's shutdown cannot swallow them: they wait until
    then) and leave no checkpoint (written atomically)."""
    path = Path(path)
    try:
        init = read_init(config.init, config)[0] if config.init else None
        model = initial_model(config, init)
        if bn_from_data:
            with interrupts.deferred():
                clip = check_shards(config)["train"].clip
                data_batchnorm_stats(
                    model,
                    split_loader(config, config.loader.train_split, clip, False),
                    torch.device("cpu"),
                    BN_BATCHES,
                )
        write_checkpoint(
            serialize(
                build_checkpoint(
                    model,
                    config.loader.stream,
                    "init",
                    input_size=config.size,
                    epoch=0,
                    step=0,
                    config=config.to_dict(),
                    bn_from_data=bn_from_data,
                    shards=(
                        {
                            "train": split_record(
                                config.loader.shards, config.loader.stream, config.loader.train_split
                            )
                        }
                        if bn_from_data
                        else None
                    ),
                )
            ),
            path,
        )
    except KeyboardInterrupt as e:
        raise interrupts.as_interrupted(e).keep(
            f"{path} not written; the same command starts again"
        ) from None
    return path


def next_command(checkpoint: Path, shards: str) -> str:
    """The command that evaluates ``checkpoint``: what a run suggests doing next."""
    return f"memdpc eval retrieve {checkpoint} --shards {shards or 'SHARDS'} --out EVAL_DIR"
