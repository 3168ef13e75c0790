"""End-to-end finetuning (ARCHITECTURE.md §3.4, §3.6) and its scarce-label variant.

The classifier is the pretrained encoder and aggregators with a BatchNorm → Dropout 0.9 → Linear head
(:class:`~memdpc.model.Classifier`), trained with Adam 1e-3, weight decay 1e-3, the lr decayed once to 1e-4
when the training loss plateaus (no validation split is touched). ``label_fraction`` < 1 trains on a seeded,
stratified subset of the train videos (the windows of other videos are skipped and the kept ones regrouped
into full batches). The state is saved after every epoch (atomically) and a re-run resumes from it (with
more ``--epochs`` too). The test is every window of the test split in 1, 5 or 10 crops, softmax averaged per video.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from memdpc.common import distenv as dd
from memdpc.common import interrupts
from memdpc.common.atomic import write_bytes_atomic
from memdpc.common.console import rich_console
from memdpc.common.errors import UserError
from memdpc.eval.classify import score_videos
from memdpc.eval.data import EvalData
from memdpc.eval.features import loader_batches, same_classes
from memdpc.eval.fit import FINETUNE_DROPOUT, FINETUNE_FIT, FitConfig
from memdpc.eval.optim import adam_with_plateau
from memdpc.eval.outputs import Outputs
from memdpc.eval.plots import confusion_matrix
from memdpc.eval.pretrained import load_encoder
from memdpc.eval.results import save_result
from memdpc.eval.shard_meta import window_info
from memdpc.eval.subset import stratified_subset
from memdpc.model import Classifier
from memdpc.model import checkpoint as mc
from memdpc.model.memdpc import finish_config
from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.provenance import manifest_identity

__all__ = ["TRAIN_SHARDS", "kept_batches", "run_finetune", "train_epochs", "train_loader"]

RESUMABLE = (
    "epochs",
    "checkpoint",
)  # a resumed finetuning may grow, or read its checkpoint (same bytes) elsewhere
TRAIN_SHARDS = (
    "train_manifest_sha256"  # the setting naming the train split's shards (SHA-256 of its manifest)
)
# settings a state written by an earlier memdpc lacks: compared only where the state records them
RECORDED_SINCE = (TRAIN_SHARDS,)
Batches = Callable[[int], Iterator[tuple[torch.Tensor, list[str], torch.Tensor]]]


def train_loader(data: EvalData, env: dd.DistEnv, seed: int):
    """The finetuning's loader of the training split: augmented, this rank's part, drawn with ``seed``."""
    return make_loader(
        data.loader.shards,
        data.loader.stream,
        data.loader.train_split,
        train=True,
        batch_size=data.loader.batch_size,
        backend=data.loader.backend,
        size=data.size,
        rank=env.rank,
        world_size=env.world_size,
        seed=seed,
        num_workers=data.loader.num_workers,
        device=str(env.device),
        drop_last=env.distributed,
    )


def kept_batches(
    loader, keep: set[str] | None, batch_size: int, epoch: int
) -> Iterator[tuple[torch.Tensor, list[str], torch.Tensor]]:
    """(clips, keys, labels) of one epoch, only windows of videos in ``keep`` (all when None), regrouped
    into batches of ``batch_size`` (the last one may be smaller)."""
    loader.set_epoch(epoch)
    clips, keys, labels = [], [], []
    for batch in loader_batches(loader):
        mask = [keep is None or v in keep for v in batch.video_ids]
        if not any(mask):
            continue
        sel = torch.tensor(mask, device=batch.clips.device)
        clips.append(batch.clips[sel])
        labels.append(batch.labels[sel])
        keys.extend(k for k, m in zip(batch.keys, mask, strict=True) if m)
        while len(keys) >= batch_size:
            c, y = torch.cat(clips), torch.cat(labels)
            yield c[:batch_size], keys[:batch_size], y[:batch_size]
            clips, labels, keys = [c[batch_size:]], [y[batch_size:]], keys[batch_size:]
    if len(keys) >= 2:  # a lone last window is left out: BatchNorm cannot train on one sample
        yield torch.cat(clips), keys, torch.cat(labels)


def train_epochs(
    model: nn.Module,
    batch_loss: Callable,
    batches: Batches,
    env: dd.DistEnv,
    fit: FitConfig,
    state_path: Path,
    settings: dict[str, Any],
    out: Outputs,
    what: str = "finetune",
) -> list[float]:
    """Adam + plateau decay over ``fit.epochs`` epochs, resuming from ``state_path`` when it holds the same
    ``settings`` (``--epochs`` may grow). ``batch_loss(module, clips, keys, labels)`` returns the mean loss of a
    batch. Every rank takes the same number of steps (an epoch ends when any rank runs out). The state is
    saved after every epoch and added to ``out`` (what an interrupt kept). Returns per-epoch mean losses."""
    opt, sched = adam_with_plateau(model.parameters(), fit)
    losses: list[float] = []
    state = _read_state(state_path, settings, fit, out.overwrite, what)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        losses = list(state["losses"])
        out.add(
            "state", state_path, f"{what} state kept at {state_path}, epoch {len(losses)} of {fit.epochs}"
        )
        if env.is_main and len(losses) < fit.epochs:
            rich_console(stderr=True).print(
                f"resuming {state_path}: epoch {len(losses)} of {fit.epochs} done",
                markup=False,
                soft_wrap=True,
            )
    module = (
        nn.parallel.DistributedDataParallel(model, find_unused_parameters=True) if env.distributed else model
    )
    for epoch in range(len(losses), fit.epochs):
        torch.manual_seed(fit.seed + 1000 * epoch + env.rank)
        model.train()
        total, count = 0.0, 0
        it = batches(epoch)
        while True:
            item = next(it, None)
            if not dd.all_true(env, item is not None):
                break
            clips, keys, labels = item
            loss = batch_loss(module, clips, keys, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + loss.item() * len(keys), count + len(keys)
        if count == 0 and not env.distributed:
            raise UserError("no training windows: the train split (or the label subset) is empty")
        mean = dd.all_mean(env, {"loss": total / max(count, 1)})["loss"]
        sched.step(mean)
        losses.append(mean)
        with interrupts.deferred():  # the state on disk and the epoch an interrupt reports agree
            if env.is_main:
                _save_state(state_path, model, opt, sched, losses, settings)
            out.add(
                "state", state_path, f"{what} state kept at {state_path}, epoch {len(losses)} of {fit.epochs}"
            )
    return losses


def _read_state(
    path: Path, settings: dict[str, Any], fit: FitConfig, overwrite: bool, what: str
) -> dict[str, Any] | None:
    """The state to resume from: None without one (or with ``overwrite``, which starts over); refuses a state
    of other settings (all but ``--epochs``) or of more epochs than asked for."""
    if overwrite or not path.is_file():
        return None
    state = mc.load_torch_file(path, remedy="give --overwrite to start over")
    before, now = json.loads(state["settings"]), json.loads(json.dumps(settings, default=str))
    diff = [
        f"{k} {_short(before.get(k))} → {_short(now.get(k))}"
        for k in sorted(set(before) | set(now))
        if k not in RESUMABLE and before.get(k) != now.get(k) and (k in before or k not in RECORDED_SINCE)
    ]
    if diff:
        raise UserError(
            f"{path}: a {what} with other settings is there ({'; '.join(diff)}); the same command "
            "as before resumes it, --overwrite starts over, or give another --out"
        )
    if len(state["losses"]) > fit.epochs:
        raise UserError(
            f"{path}: a {what} of {len(state['losses'])} epochs is there, more than --epochs "
            f"{fit.epochs}; give --epochs {len(state['losses'])} or more, or --overwrite to start over"
        )
    return state


def _save_state(path: Path, model: nn.Module, opt, sched, losses: list[float], settings: dict) -> None:
    buf = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "losses": losses,
            "settings": json.dumps(settings, default=str),
        },
        buf,
    )
    write_bytes_atomic(path, buf.getvalue())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:16] + "…"


def label_subset(data: EvalData, fraction: float, seed: int) -> set[str] | None:
    """The train videos kept for ``fraction`` (None: all), from the windows' own labels in the shards."""
    if fraction >= 1.0:
        return None
    info = window_info(data.loader.shards, data.loader.stream, data.loader.train_split)
    videos = {w["video_id"]: int(w["label"]) for w in info.values()}
    return set(stratified_subset(list(videos), list(videos.values()), fraction, seed))


def _ce(module: nn.Module, clips: torch.Tensor, keys: list[str], labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(module(clips), labels)


def run_finetune(
    checkpoint: str | os.PathLike,
    data: EvalData,
    out: Outputs,
    env: dd.DistEnv,
    *,
    crops: int = 1,
    dropout: float = FINETUNE_DROPOUT,
    label_fraction: float = 1.0,
    random_init: bool = False,
    fit: FitConfig = FINETUNE_FIT,
    plot: bool = False,
) -> Path | None:
    """``memdpc eval finetune``: writes ``finetune-<stream>[-frac<F>].json`` (+ npz with probabilities) and the
    finetuned classifier's checkpoint ``….pt``; ``….state.pt`` resumes an interrupted run."""
    pretrained, _, stream = load_encoder(checkpoint, data, env)
    data = data.with_loader(stream=stream, batch_size=fit.batch_size)
    classes = same_classes(data)
    tag = (
        f"finetune-{stream}"
        + ("-scratch" if random_init else "")
        + (f"-frac{label_fraction:g}" if label_fraction < 1 else "")
    )
    path = out.claim(f"{tag}.json")
    keep = label_subset(data, label_fraction, fit.seed)
    clf = _classifier(pretrained, len(classes), dropout, random_init, fit.seed).to(env.device)
    settings = {
        "checkpoint": out.source["checkpoint"],
        "checkpoint_sha256": out.source["sha256"],
        TRAIN_SHARDS: manifest_identity(data.loader.shards, data.loader.stream, data.loader.train_split)[
            "sha256"
        ],
        "label_fraction": label_fraction,
        "random_init": random_init,
        "dropout": dropout,
        "size": data.size,
        **asdict(fit),
    }
    loader = train_loader(data, env, fit.seed)
    losses = train_epochs(
        clf,
        _ce,
        lambda e: kept_batches(loader, keep, fit.batch_size, e),
        env,
        fit,
        out.folder / f"{tag}.state.pt",
        settings,
        out,
    )
    clf.eval()
    _keep_classifier(clf, stream, data, settings["checkpoint"], out.folder / f"{tag}.pt", out, env)
    scored = score_videos(clf, data, env, crops)
    if scored is None:
        return None
    _, ids, labels, probs = scored
    if plot:
        out.add("plots", confusion_matrix(out.folder / f"{tag}-confusion.png", probs, labels, classes))
    result = {
        "kind": "finetune",
        "stream": stream,
        "dataset": data.dataset_name,
        "split": data.test_split,
        "classes": classes,
        "train_loss": losses,
        "config": {**settings, "crops": crops, "train_videos": None if keep is None else len(keep)},
        **out.record(data, (data.loader.train_split, data.test_split)),
    }
    return save_result(
        path, result, {"video_ids": np.array(ids), "labels": labels, "probs": probs.astype(np.float32)}
    )


def _classifier(
    pretrained: nn.Module, classes: int, dropout: float, random_init: bool, seed: int
) -> Classifier:
    """The classifier to finetune, seeded: the pretrained encoder and GRUs with a new head, or (``random_init``)
    a classifier of the same architecture from scratch."""
    torch.manual_seed(seed)
    clf = Classifier.from_pretrained(pretrained, classes, dropout)
    if not random_init:
        return clf
    name = clf.config["name"]
    return finish_config(
        Classifier(classes, **{k: v for k, v in clf.hparams.items() if k != "num_classes"}), name, None
    )


def _keep_classifier(
    clf: Classifier, stream: str, data: EvalData, source: str, path: Path, out: Outputs, env: dd.DistEnv
) -> None:
    """Write the finetuned classifier (rank 0), for `memdpc eval classify`: the state file holds it only to
    resume."""
    with interrupts.deferred():
        if env.is_main:
            ckpt = mc.build_checkpoint(clf, stream, "finetune", input_size=data.size, source=source)
            mc.write_checkpoint(mc.serialize(ckpt), path)
        out.add("classifier", path, f"finetuned classifier kept at {path}")
