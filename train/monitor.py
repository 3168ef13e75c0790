"""What a training run measures between epochs: the validation loss and the kNN monitor's R@1 (on the run's
shards, or ``--knn-shards``), each cut short by a signal."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator

import torch
from torch import nn

from memdpc.common import distenv as dd
from memdpc.common import interrupts
from memdpc.train import checkpoint as ck
from memdpc.train.bn_stats import data_batchnorm_stats
from memdpc.train.knn import knn_recall
from memdpc.train.parts import Parts, State, run_loader
from memdpc.train.prepare import monitored

__all__ = ["knn", "local_negatives", "log_knn", "validate"]


@contextlib.contextmanager
def local_negatives(model: nn.Module) -> Iterator[None]:
    """Evaluate with per-rank negatives: ranks may hold different numbers of validation batches."""
    saved = getattr(model, "global_negatives", False)
    model.global_negatives = False
    try:
        yield
    finally:
        model.global_negatives = saved


@torch.no_grad()
def validate(p: Parts) -> dict[str, float]:
    """Mean loss and top-k over the validation split (all ranks; per-rank negatives). Cut short when a signal
    has arrived: the caller then stops (the loop's stop point) and records nothing."""
    model = ck.unwrap(p.model)
    model.eval()
    sums: dict[str, float] = {}
    n = 0
    with local_negatives(model):
        for i, batch in enumerate(p.val_loader):
            if (p.config.val_max_batches and i >= p.config.val_max_batches) or interrupts.received():
                break
            out = model(batch.clips.to(p.env.device, non_blocking=True))
            for k, v in out.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            n += 1
    sums["batches"] = float(n)
    totals = dd.all_mean(p.env, sums)
    count = max(totals.pop("batches"), 1e-9)
    model.train()
    return {k: v / count for k, v in totals.items()}


def knn(p: Parts, data_bn: bool = False) -> float:
    """The kNN monitor's R@1 (rank 0 computes it; every rank returns it); NaN without a validation split. Cut
    short when a signal has arrived, like :func:`validate`. With ``data_bn``, of a copy of the model whose
    BatchNorm statistics are the training split's (the baseline ``--bn-from-data`` evaluates); the model
    itself is left as it is."""
    r1 = math.nan
    if p.env.is_main and p.config.val_split != "none":
        c = p.config
        loaders = [
            run_loader(monitored(c), p.env, split, p.clip, train=False, rank=0, world_size=1)
            for split in (c.loader.train_split, c.val_split)
        ]
        model = ck.unwrap(p.model)
        if data_bn:
            model = copy.deepcopy(model)
            bn_loader = run_loader(c, p.env, c.loader.train_split, p.clip, train=False, rank=0, world_size=1)
            data_batchnorm_stats(model, bn_loader, p.env.device, ck.BN_BATCHES)
        r1 = knn_recall(model, *loaders, p.env.device, c.knn_max_batches)
    return dd.from_main(p.env, r1)


def log_knn(p: Parts, s: State, r1: float) -> None:
    """Record a kNN monitor's R@1 at the run's epoch and step."""
    p.logger.log({"kind": "knn", "epoch": s.epoch, "step": s.step, "r1": r1})
