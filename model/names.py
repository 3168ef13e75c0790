"""The model registry's names (no torch here, so the CLI and the training config can list them cheaply).

A name is ``<family>_r<depth>``: ``memdpc`` (MemDPC), ``dpc`` (the DPC baseline: no memory) and
``classifier`` (an encoder with a classification head), each at depth 18 or 34. The families a
self-supervised run pretrains are :data:`PRETRAIN_NAMES`. :func:`memdpc.model.factory.create_model` builds
a model from its name.
"""

from __future__ import annotations

__all__ = ["MODEL_NAMES", "NEGATIVES", "PRETRAIN_NAMES", "diff_setting", "split_name"]

FAMILIES = ("memdpc", "dpc", "classifier")
PRETRAIN_FAMILIES = ("memdpc", "dpc")
DEPTHS = (18, 34)
MODEL_NAMES = tuple(f"{fam}_r{d}" for fam in FAMILIES for d in DEPTHS)
PRETRAIN_NAMES = tuple(f"{fam}_r{d}" for fam in PRETRAIN_FAMILIES for d in DEPTHS)
# which targets the dense loss scores a prediction against (memdpc.model.loss.dense_infonce); the first is the paper's
NEGATIVES = ("all", "same_position", "other_clips", "own_clip")


def split_name(name: str) -> tuple[str, int]:
    """``memdpc_r18`` → (``memdpc``, 18); the name must be one of :data:`MODEL_NAMES`."""
    fam, depth = name.rsplit("_r", 1)
    return fam, int(depth)


def diff_setting(frame_diff: bool) -> dict[str, bool]:
    """A model's ``frame_diff`` as its config records it: only where it is on, so that the config of a model that
    reads frames is what it was before the setting existed (and its checkpoints load as they did)."""
    return {"frame_diff": True} if frame_diff else {}
