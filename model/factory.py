"""``create_model(name, **kw)``: the one way to build a model; ``create_model(**model.config)`` rebuilds it.

Names: ``memdpc_r18``, ``memdpc_r34`` (bidirectional by default, as the reference code), ``dpc_r18``,
``dpc_r34`` (unidirectional by default, no memory), ``classifier_r18``, ``classifier_r34`` (needs
``num_classes``). ``widths=(16, 32, 64, 64)`` gives a tiny network for CPU runs; the feature, GRU, predictor
and memory dimensions follow the last width. ``seed`` makes the initialisation deterministic without
touching the global random state.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from memdpc.common.errors import UserError
from memdpc.model.heads import Classifier
from memdpc.model.memdpc import MemDPC, finish_config
from memdpc.model.names import MODEL_NAMES, split_name

__all__ = ["create_model", "has_memory"]

# family (memdpc.model.names.FAMILIES) -> (class, fixed arguments, overridable defaults)
_FAMILIES = {
    "memdpc": (MemDPC, {"memory": True}, {"bidirectional": True}),
    "dpc": (MemDPC, {"memory": False}, {"bidirectional": False}),
    "classifier": (Classifier, {}, {}),
}


def _parse(name: str) -> tuple[type[nn.Module], dict, dict]:
    if name not in MODEL_NAMES:
        raise UserError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    fam, depth = split_name(name)
    cls, fixed, defaults = _FAMILIES[fam]
    return cls, {**fixed, "depth": depth}, defaults


def has_memory(name: str) -> bool:
    """Whether model ``name`` has MemDPC's memory bank, so that its ``mem_size`` shapes weights."""
    return _parse(name)[1].get("memory", False)


def create_model(name: str, seed: int | None = None, **kw) -> nn.Module:
    """Build a model by name; unknown names or options raise :class:`UserError`."""
    cls, fixed, defaults = _parse(name)
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", *fixed}
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise UserError(
            f"model {name}: unknown option(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    kw = {**defaults, **kw}
    if "widths" in kw:
        kw["widths"] = tuple(kw["widths"])
    try:
        if seed is None:
            model = cls(**fixed, **kw)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = cls(**fixed, **kw)
    except (TypeError, ValueError) as e:
        raise UserError(f"model {name}: {e}") from None
    return finish_config(model, name, seed)
