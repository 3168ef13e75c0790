"""Unintentional actions on Oops (ARCHITECTURE.md §3.6): per time step, z_t ⊕ ẑ_t → linear, 3 classes.

z_t is the encoder feature of block t and ẑ_t its prediction from blocks < t (forward aggregator, φ and
memory), both spatially pooled (:meth:`MemDPC.step_features`); block 0 has no past and is not used. Labels
come from the video's failure time (the ``t`` of the Oops index, see :mod:`memdpc.eval.oops_labels`).

* ``frozen``: step features of every window are extracted once (cached); a linear layer is trained with the
  transitional class oversampled (:func:`oversample`).
* ``finetune``: encoder, aggregator, predictor, memory and the linear layer train end to end; the
  oversampling becomes its expectation, a class weight in the loss (a streaming loader cannot repeat
  chosen windows).

Metrics (:mod:`memdpc.eval.scores`): accuracy over all time steps of all test windows, per-class recall and
their mean, with intervals from a bootstrap over the test videos (a video's steps are not independent).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from memdpc.common import distenv as dd
from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.features import eval_split, run_windows, task_features
from memdpc.eval.finetune import TRAIN_SHARDS, kept_batches, train_epochs, train_loader
from memdpc.eval.fit import OOPS_FIT, OOPS_MODES, FitConfig
from memdpc.eval.oops_labels import CLASSES, TRANSITIONAL, oversample, step_labels
from memdpc.eval.outputs import Outputs
from memdpc.eval.plots import confusion_matrix
from memdpc.eval.pretrained import load_encoder
from memdpc.eval.probe import fit_head
from memdpc.eval.results import save_result
from memdpc.eval.shard_meta import window_info
from memdpc.model import OopsHead
from memdpc.pipeline.provenance import manifest_identity
from memdpc.pipeline.shard_set import open_split
from memdpc.preprocess.video_index import read_index

__all__ = ["run_oops"]


def failure_times(index: str | os.PathLike) -> dict[str, float]:
    """{video id: failure time in seconds} from an Oops video index (``extra['t']``)."""
    times = {r.id: float(r.extra["t"]) for r in read_index(index) if r.extra.get("t") is not None}
    if not times:
        raise UserError(f"{index}: no video has a failure time (extra.t); build it with --layout oops")
    return times


def window_labels(
    data: EvalData, split: str, keys: list[str], times: dict[str, float], index: str
) -> np.ndarray:
    """(W, num_blocks) step labels of the given windows, from their start, fps and the failure time."""
    spec = open_split(data.loader.shards, data.loader.stream, split).clip
    info = window_info(data.loader.shards, data.loader.stream, split)
    out = []
    for key in keys:
        w = info[key]
        if w["video_id"] not in times:
            raise UserError(f"{index}: no failure time for video {w['video_id']} of the {split} shards")
        out.append(step_labels(int(w["start"]), float(w["fps"]), times[w["video_id"]], spec))
    return np.stack(out)


def _steps(values: np.ndarray) -> np.ndarray:
    """(W, 1, N, F) window outputs -> (W·(N−1), F): every step but the first."""
    return values[:, 0, 1:].reshape(-1, values.shape[-1])


class StepClassifier(nn.Module):
    """A (Mem)DPC model and a linear layer over z_t ⊕ ẑ_t: clips (B, N, ...) -> logits (B, N, 3)."""

    def __init__(self, model: nn.Module, dim: int):
        super().__init__()
        self.model, self.head = model, OopsHead(dim, len(CLASSES))

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.head(*self.model.step_features(clips))


def _frozen(model, data: EvalData, out: Outputs, env, times, index, fit: FitConfig):
    def step_fn(clips):
        return torch.cat(model.step_features(clips), dim=-1)  # (B, N, 2D)

    sets = {
        split: task_features(
            step_fn,
            data,
            split,
            env,
            out,
            f"oops-steps-{data.loader.stream}-{split}.npz",
            desc="step features",
            kind="oops-steps",
        )
        for split in (data.loader.train_split, data.test_split)
    }
    if not env.is_main:
        return None
    train, test = sets[data.loader.train_split], sets[data.test_split]
    y = window_labels(data, data.loader.train_split, train.keys, times, index)[:, 1:].reshape(-1)
    torch.manual_seed(fit.seed)

    head = OopsHead(model.backbone.out_channels, len(CLASSES)).fc  # the linear layer over z_t ⊕ ẑ_t
    x = torch.from_numpy(_steps(train.values)).float()
    losses = fit_head(head, x, torch.from_numpy(y), fit, order=oversample(y, TRANSITIONAL, fit.seed))
    with torch.inference_mode():
        pred = head(torch.from_numpy(_steps(test.values)).float()).argmax(-1).numpy()
    return pred, test, losses


def _finetune(model, data: EvalData, out: Outputs, env, times, index, fit: FitConfig, settings):
    info = window_info(data.loader.shards, data.loader.stream, data.loader.train_split)
    spec = eval_split(data, data.loader.train_split).clip
    labels_of = {
        k: step_labels(int(w["start"]), float(w["fps"]), times[w["video_id"]], spec)
        for k, w in info.items()
        if w["video_id"] in times
    }
    counts = np.bincount(np.concatenate([lab[1:] for lab in labels_of.values()]), minlength=3)
    weight = torch.ones(3)
    if counts[TRANSITIONAL]:
        weight[TRANSITIONAL] = max(
            1.0, min(c for i, c in enumerate(counts) if i != TRANSITIONAL and c) / counts[TRANSITIONAL]
        )
    clf = StepClassifier(model, model.backbone.out_channels).to(env.device)

    def batch_loss(module, clips, keys, _labels):
        missing = [k for k in keys if k not in labels_of]
        if missing:
            raise UserError(f"{index}: no failure time for the window {missing[0]}")
        y = torch.from_numpy(np.stack([labels_of[k] for k in keys])[:, 1:]).to(clips.device)
        logits = module(clips)[:, 1:]  # (B, N-1, 3)
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), weight=weight.to(clips.device))

    loader = train_loader(data, env, fit.seed)
    losses = train_epochs(
        clf,
        batch_loss,
        lambda e: kept_batches(loader, None, fit.batch_size, e),
        env,
        fit,
        out.folder / f"oops-finetune-{data.loader.stream}.state.pt",
        settings,
        out,
        "Oops finetune",
    )
    clf.eval()
    test = run_windows(clf, data, data.test_split, env, desc="test")
    if test is None:
        return None
    return test.values[:, 0, 1:].argmax(-1).reshape(-1), test, losses


def run_oops(
    checkpoint: str | os.PathLike,
    data: EvalData,
    out: Outputs,
    env: dd.DistEnv,
    *,
    index: str | os.PathLike,
    mode: str = OOPS_MODES[0],
    fit: FitConfig = OOPS_FIT,
    plot: bool = False,
) -> Path | None:
    """``memdpc eval oops``: writes ``oops-<mode>-<stream>.json`` (+ npz with per-step predictions)."""
    if mode not in OOPS_MODES:
        raise UserError(f"Oops mode must be 'frozen' or 'finetune', not {mode!r}")
    times = failure_times(index)
    model, _, stream = load_encoder(checkpoint, data, env)
    data = data.with_loader(stream=stream)
    for split in (data.loader.train_split, data.test_split):
        eval_split(data, split)  # refuses an empty split
    path = out.claim(f"oops-{mode}-{stream}.json")
    settings = {
        "checkpoint": out.source["checkpoint"],
        "checkpoint_sha256": out.source["sha256"],
        TRAIN_SHARDS: manifest_identity(data.loader.shards, data.loader.stream, data.loader.train_split)[
            "sha256"
        ],
        "index": str(index),
        "size": data.size,
        **asdict(fit),
    }
    got = (
        _frozen(model, data, out, env, times, str(index), fit)
        if mode == "frozen"
        else _finetune(model, data, out, env, times, str(index), fit, settings)
    )
    if got is None:
        return None
    pred, test, losses = got
    labels = window_labels(data, data.test_split, test.keys, times, str(index))[:, 1:]
    if plot:
        out.add(
            "plots",
            confusion_matrix(
                out.folder / f"oops-{mode}-{stream}-confusion.png",
                np.eye(3)[pred],
                labels.reshape(-1),
                CLASSES,
            ),
        )
    result = {
        "kind": f"oops-{mode}",
        "stream": stream,
        "dataset": data.dataset_name,
        "split": data.test_split,
        "classes": CLASSES,
        "train_loss": losses,
        "config": settings,
        **out.record(data, (data.loader.train_split, data.test_split)),
    }
    arrays = {
        "video_ids": np.array(test.video_ids),
        "keys": np.array(test.keys),
        "labels": labels,
        "pred": pred.reshape(labels.shape),
    }
    return save_result(path, result, arrays)
