"""The settings of the ``memdpc eval`` verbs besides the data (:class:`~memdpc.eval.data.EvalData`) and a head's
training (:class:`~memdpc.eval.fit.FitConfig`): where a task writes, each task's own and those of a fusion.
Without torch, so that the command line reads them at start."""

from __future__ import annotations

from dataclasses import MISSING, dataclass
from pathlib import Path

from memdpc.common.errors import UserError
from memdpc.common.settings import Checked, setting
from memdpc.eval.fit import FINETUNE_DROPOUT, OOPS_MODES, PROBE_DROPOUT, RETRIEVAL_CHUNK
from memdpc.pipeline.clip import EVAL_CROPS

__all__ = [
    "CompareOptions",
    "Crops",
    "EvalOutput",
    "FinetuneOptions",
    "FuseFiles",
    "FuseOptions",
    "HeadDropout",
    "OopsOptions",
    "ProbeOptions",
    "RecipeEval",
    "RetrieveOptions",
]


@dataclass(frozen=True)
class EvalOutput(Checked):
    """Where an evaluation task writes (every task verb)."""

    out: Path = setting(
        MISSING,
        "Folder for results JSON/npz, feature caches and plots.",
        required=True,
        path={"file_okay": False},
    )
    plot: bool = setting(False, "Also write PNG figures.")
    overwrite: bool = setting(
        False,
        "Replace results in --out made from another checkpoint (refused otherwise), and start an unfinished "
        "finetuning of other settings over.",
    )


@dataclass(frozen=True)
class Crops(Checked):
    """How many crops of each test window a classifier scores (probe, finetune, classify)."""

    crops: int = setting(EVAL_CROPS[0], "Test crops per window.", choices=EVAL_CROPS)


@dataclass(frozen=True)
class HeadDropout(Checked):
    """The dropout before a classifier's last layer (each task nests it with its own default)."""

    dropout: float = setting(PROBE_DROPOUT, "Dropout before the classifier's last layer.")


@dataclass(frozen=True)
class RetrieveOptions(Checked):
    chunk: int = setting(RETRIEVAL_CHUNK, "Queries per similarity block (memory: chunk × gallery).", min=1)


@dataclass(frozen=True)
class ProbeOptions(Checked):
    linear: bool = setting(True, "Linear or MLP head.", flags=("--linear/--mlp",))
    test: Crops = setting(Crops(), nested=True)
    head: HeadDropout = setting(HeadDropout(PROBE_DROPOUT), nested=True)


@dataclass(frozen=True)
class FinetuneOptions(Checked):
    test: Crops = setting(Crops(), nested=True)
    head: HeadDropout = setting(HeadDropout(FINETUNE_DROPOUT), nested=True)
    label_fraction: float = setting(
        1.0, "Train on this seeded, stratified fraction of the train videos (e.g. 0.1)."
    )
    random_init: bool = setting(False, "Same architecture, random weights (baseline).")


@dataclass(frozen=True)
class OopsOptions(Checked):
    index: Path = setting(
        MISSING,
        "Oops video index (JSONL from `memdpc index --layout oops`) with the failure times.",
        required=True,
    )
    mode: str = setting(
        OOPS_MODES[0], "Train only the linear layer, or the whole network.", choices=OOPS_MODES
    )


@dataclass(frozen=True)
class FuseOptions(Checked):
    """A late fusion's settings (``memdpc eval fuse A B`` and ``memdpc eval --fuse A B``)."""

    weights: tuple[float, float] = setting((1.0, 1.0), "Weights of the two results.", nargs=2)
    choose_weights: bool = setting(
        False,
        "Retrieval results: choose the weights on the training videos (the gallery) instead, the pair (1-s, s), "
        "s = 0, 0.1, ..., 1, under which each one's 10 nearest others are most often of its class; takes away the "
        "noise an uninformative stream adds to the other's similarities. No test label is read.",
    )
    out: Path | None = setting(
        None, "Results file to write (default: beside the first input).", flags=("--out", "--fuse-out")
    )
    overwrite: bool = setting(False, "Replace other results at --out.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.choose_weights and tuple(self.weights) != (1.0, 1.0):
            raise UserError("give --weights or --choose-weights, not both")


@dataclass(frozen=True)
class FuseFiles(Checked):
    """``memdpc eval --fuse A B``: the design card's spelling of ``memdpc eval fuse A B``."""

    fuse_paths: tuple[Path, Path] | None = setting(
        None,
        "Late fusion of two results files (same as `eval fuse`; with its --weights, --out, --overwrite).",
        flags=("--fuse",),
        nargs=2,
        metavar="RGB_RESULT FLOW_RESULT",
        path={},
    )


@dataclass(frozen=True)
class RecipeEval(Checked):
    """An evaluation's settings from a recipe."""

    config_file: str | None = setting(
        None,
        "A recipe (path or short name; `memdpc recipes` lists them) whose eval options are taken where the command "
        "line gives none.",
        flags=("--config",),
        metavar="RECIPE",
    )


@dataclass(frozen=True)
class CompareOptions(Checked):
    """Where ``memdpc eval compare`` also writes its comparison."""

    out: Path | None = setting(None, "Also write the comparison as JSON here.")
