"""How ``memdpc eval`` trains a head or a network and scores it: the optimiser settings and each task's defaults.

The command line shows these defaults as its own (``memdpc eval probe|finetune|oops --help``), so Python
callers and the command line train alike. This module imports no torch so that the CLI stays fast to start.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memdpc.common.settings import setting

__all__ = [
    "FINETUNE_DROPOUT",
    "FINETUNE_FIT",
    "FitConfig",
    "OOPS_FIT",
    "OOPS_MODES",
    "PROBE_DROPOUT",
    "PROBE_FIT",
    "RETRIEVAL_CHUNK",
    "fit_config",
]


@dataclass(frozen=True)
class FitConfig:
    """Adam with one plateau decay: after ``patience`` epochs without a lower training loss the learning rate
    drops from ``lr`` to ``lr_min`` (``None``: ``lr / 10``)."""

    epochs: int = setting(100, "Epochs.", min=1)
    batch_size: int = 256  # not an option of its own: the eval verbs' --batch-size
    lr: float = setting(1e-3, "Adam learning rate.")
    weight_decay: float = setting(1e-3, "Adam weight decay.")
    lr_min: float | None = setting(
        None, "Learning rate after the plateau decay [default: lr / 10].", option_default=None
    )
    patience: int = setting(
        10, "Epochs without training-loss improvement before the lr decays ×0.1 (once).", min=0
    )
    seed: int = setting(0, "Random seed.")

    def __post_init__(self) -> None:
        if self.lr_min is None:
            object.__setattr__(self, "lr_min", self.lr / 10)


PROBE_FIT = FitConfig()
FINETUNE_FIT = FitConfig(epochs=50, batch_size=16)
OOPS_FIT = FitConfig(epochs=50)
PROBE_DROPOUT = 0.5  # before the probe's head
FINETUNE_DROPOUT = 0.9  # before the classifier's last layer
RETRIEVAL_CHUNK = 1024  # test queries per block of the similarity matrix
OOPS_MODES = ("frozen", "finetune")  # the Oops head on frozen features, or the network finetuned with it


def fit_config(base: FitConfig, **given: float | int | None) -> FitConfig:
    """``base`` with the ``given`` settings (a None keeps base's); a new ``lr`` without ``lr_min`` brings
    ``lr_min = lr / 10``."""
    given = {k: v for k, v in given.items() if v is not None}
    if "lr" in given and "lr_min" not in given:
        given["lr_min"] = given["lr"] / 10
    return replace(base, **given)
