"""Import and export checkpoints of the reference implementations (MemDPC, DPC, their classifiers).

Reference layouts (ARCHITECTURE.md §3.4), file ``{epoch, state_dict, best_acc, optimizer, iteration}``:
  MemDPC:       ``mb``, ``backbone.*``, ``agg_f.*``, ``agg_b.*``, ``network_pred.{0,2}.*``
  DPC:          ``module.backbone.*``, ``module.agg.*``, ``module.network_pred.{0,2}.*``
  classifier:   ``backbone.*``, ``agg_f.*``, ``agg_b.*``, ``final_bn.*``, ``final_fc.1.*``
                (DPC's: ``resnet.*``, ``convrnn.*``, ``final_bn.*``, ``final_fc.1.*``)
Every GRU tensor appears twice, under ``<agg>.ConvGRUCell_00.*`` and ``<agg>.cell_list.0.*``.
memdpc names them ``memory``, ``backbone.*``, ``agg_f.cell.*``, ``agg_b.cell.*``, ``predictor.*``, ``head.*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from memdpc.common.errors import UserError
from memdpc.model.checkpoint import (
    build_checkpoint,
    load_torch_file,
    read_checkpoint,
    serialize,
    write_checkpoint,
)
from memdpc.model.factory import create_model
from memdpc.model.resnet2d3d import DEPTHS

__all__ = ["convert_file"]

_GRU_CELL = re.compile(r"^(ConvGRUCell_00|cell_list\.0)\.")
_AGG = {"agg": "agg_f", "agg_f": "agg_f", "convrnn": "agg_f", "agg_b": "agg_b"}
_PLAIN = {
    "backbone": "backbone",
    "resnet": "backbone",
    "network_pred": "predictor",
    "final_bn": "head.final_bn",
    "final_fc": "head.final_fc",
}


@dataclass
class ConvertReport:
    """What an import or export did: the model built, and the keys that did not find a counterpart."""

    kind: str
    config: dict
    unused: list[str] = field(default_factory=list)  # in the source, not used
    missing: list[str] = field(default_factory=list)  # expected by the target, absent in the source


# ------------------------------------------------------------------------------------------ file access
def load_file(path: Path) -> dict:
    """``torch.load`` without running arbitrary pickled code (numpy scalars, e.g. ``best_acc``, allowed)."""
    path = Path(path)
    scalar = np._core.multiarray.scalar
    # files written under numpy 1 name the scalar constructor numpy.core.multiarray.scalar
    safe = [
        np.dtype,
        scalar,
        (scalar, "numpy.core.multiarray.scalar"),
        *(type(np.dtype(c)) for c in "bBhHiIlLqQefdg?"),
    ]
    obj = load_torch_file(path, safe, remedy="download or copy it again")
    if not isinstance(obj, dict):
        raise UserError(f"{path}: checkpoint holds a {type(obj).__name__}, expected a dict")
    return obj


def _state_dict_of(obj: dict, path: Path) -> dict[str, torch.Tensor]:
    sd = obj.get("state_dict", obj)
    if not isinstance(sd, dict) or not sd or not all(torch.is_tensor(v) for v in sd.values()):
        raise UserError(
            f"{path}: no 'state_dict' of tensors in this checkpoint (keys: {', '.join(map(str, obj))})"
        )
    return sd


# ------------------------------------------------------------------------------------------ key mapping
def _to_memdpc_key(key: str) -> str | None:
    key = key.removeprefix("module.")
    if key == "mb":
        return "memory"
    top, _, rest = key.partition(".")
    if top in _AGG and _GRU_CELL.match(rest):
        return f"{_AGG[top]}.cell.{_GRU_CELL.sub('', rest)}"
    if top in _PLAIN and rest:
        return f"{_PLAIN[top]}.{rest}"
    return None


def _map_reference(sd: dict[str, torch.Tensor], path: Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    out: dict[str, torch.Tensor] = {}
    unused = []
    for key, value in sd.items():
        new = _to_memdpc_key(key)
        if new is None:
            unused.append(key)
        elif new in out and not torch.equal(out[new], value):
            raise UserError(
                f"{path}: duplicated GRU tensor {key} differs from its twin; the file is inconsistent"
            )
        else:
            out[new] = value
    return out, unused


def _count(sd: dict, prefix: str) -> int:
    return len({k[len(prefix) :].split(".")[0] for k in sd if k.startswith(prefix)})


def _infer_config(sd: dict[str, torch.Tensor], path: Path) -> tuple[str, dict]:
    blocks = tuple(_count(sd, f"backbone.layer{i}.") for i in range(1, 5))
    depth = next((d for d, b in DEPTHS.items() if b == blocks), None)
    if depth is None:
        raise UserError(f"{path}: no 2D3D-ResNet18/34 encoder found (blocks per stage {blocks})")
    widths = [sd[f"backbone.layer{i}.0.conv1.weight"].shape[0] for i in range(1, 5)]
    cfg = {
        "widths": widths,
        "bidirectional": any(k.startswith("agg_b.") for k in sd),
        "track_running_stats": "backbone.bn1.running_mean" in sd,
    }
    if "head.final_fc.1.weight" in sd:
        return f"classifier_r{depth}", {**cfg, "num_classes": sd["head.final_fc.1.weight"].shape[0]}
    if "memory" in sd:
        return f"memdpc_r{depth}", {**cfg, "mem_size": sd["memory"].shape[0]}
    return f"dpc_r{depth}", cfg


def import_reference(
    sd: dict[str, torch.Tensor], path: Path = Path("<state_dict>"), input_size: int | None = None
):
    """Reference state dict -> (memdpc model with its weights, :class:`ConvertReport`).

    ``input_size`` goes into the config of a MemDPC/DPC model (a classifier's has no input size).
    """
    mapped, unused = _map_reference(sd, path)
    name, cfg = _infer_config(mapped, path)
    if input_size and not name.startswith("classifier"):
        cfg["input_size"] = input_size
    model = create_model(name, **cfg)
    own = model.state_dict()
    for key, value in mapped.items():
        if key in own and own[key].shape != value.shape:
            raise UserError(
                f"{path}: {key} has shape {tuple(value.shape)}, the model expects {tuple(own[key].shape)}"
            )
    unused += [k for k in mapped if k not in own]
    model.load_state_dict({k: v for k, v in mapped.items() if k in own}, strict=False)
    # load_state_dict forgives absent BatchNorm counters; report them anyway
    missing = sorted(k for k in own if k not in mapped)
    return model, ConvertReport(name.split("_r")[0], model.config, sorted(unused), missing)


def export_reference(state_dict: dict[str, torch.Tensor], config: dict) -> tuple[dict, ConvertReport]:
    """memdpc state dict + config -> reference state dict (GRU tensors twice; DPC under ``module.``)."""
    family = config["name"].split("_r")[0]
    if family == "dpc" and config.get("bidirectional"):
        raise UserError("a bidirectional DPC model has no counterpart in the reference DPC code")
    uni_clf = family == "classifier" and not config.get("bidirectional", True)
    names = {
        "memory": "mb",
        "predictor": "network_pred",
        "head": "",
        "backbone": "resnet" if uni_clf else "backbone",
        "agg_f": "agg" if family == "dpc" else "convrnn" if uni_clf else "agg_f",
        "agg_b": "agg_b",
    }
    prefix = "module." if family == "dpc" else ""
    out, unused = {}, []
    for key, value in state_dict.items():
        top, _, rest = key.partition(".")
        if top not in names:
            unused.append(key)
        elif rest.startswith("cell."):
            for twin in ("ConvGRUCell_00", "cell_list.0"):
                out[f"{prefix}{names[top]}.{twin}.{rest[5:]}"] = value
        else:  # "memory" -> "mb"; "head.final_bn.x" -> "final_bn.x"; "backbone.x" -> "<backbone>.x"
            out[prefix + ".".join(p for p in (names[top], rest) if p)] = value
    return out, ConvertReport(family, config, sorted(unused), [])


# ------------------------------------------------------------------------------------------ files
def convert_file(
    src: Path, dst: Path, to: str = "memdpc", stream: str | None = None, input_size: int | None = None
) -> ConvertReport:
    """Convert a checkpoint file; ``to="memdpc"`` imports a reference file, ``to="reference"`` exports one.

    An imported checkpoint records ``stream`` and ``input_size`` (the size the weights were trained at)
    when given: evaluation needs the stream, and takes the size as its default input size.
    """
    src, dst = Path(src), Path(dst)
    if to == "memdpc":
        obj = load_file(src)
        model, report = import_reference(_state_dict_of(obj, src), src, input_size)
        out = build_checkpoint(
            model, stream, "converted", input_size=input_size, source=str(src), epoch=obj.get("epoch")
        )
    elif to == "reference":
        ckpt = read_checkpoint(src)
        sd, report = export_reference(ckpt["model"], ckpt["model_config"])
        out = {
            "epoch": ckpt.get("epoch") or 0,
            "state_dict": sd,
            "best_acc": 0.0,
            "optimizer": None,
            "iteration": ckpt.get("step", 0),
        }
        if report.kind == "classifier":
            out["backbone"] = f"resnet{ckpt['model_config']['name'].split('_r')[1]}"
    else:
        raise UserError(f"unknown conversion target {to!r}; use 'memdpc' or 'reference'")
    write_checkpoint(serialize(out), dst)
    return report
