"""Dense InfoNCE: every prediction against every target of the batch, in one matrix product (ARCHITECTURE.md §3.2).

A prediction at (batch b, step t, position p) must pick its own target (b, t, p) among all B·T·H·W targets
(``negatives="all"``, the paper's loss). Features that encode only the position p (zero padding gives it
away) already lower that loss from ln(B·T·H·W) to ln(B·T); :func:`content_share` measures how much of the
features is more than that. Two options take such shortcuts away:

- ``same_position``: a prediction at p is scored only against the B·T targets at p, so knowing p no longer helps;
- ``other_clips``: only against the B targets at p and step t, one per clip: the clip's other steps are no
  longer negatives, so what changes within a clip from step to step (where an object has got to) no longer
  helps either, and what sets the clip apart from other clips (its motion, its scene) is what is left to learn.
- ``own_clip``: only against the P targets of its own clip at p, one per predicted step: what every step of a
  clip shares (its scene, its objects' looks) no longer helps, and what is left is the order of events, where
  things will have got to; frames shuffled in time leave nothing to learn (chance, ln P).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from memdpc.model.names import NEGATIVES

__all__ = [
    "RELATION_MIN_BATCH",
    "RELATION_TEMPERATURE",
    "content_share",
    "dense_infonce",
    "label_rank",
    "relation_loss",
    "topk_accuracy",
]

RELATION_TEMPERATURE = 0.1  # of both similarity rows that relation_loss compares
RELATION_MIN_BATCH = 3  # relation_loss's smallest batch: a clip's similarities to two others at least


def _flatten(x: torch.Tensor) -> torch.Tensor:
    # (B, T, D, H, W) -> (B*T*H*W, D), rows ordered (b, t, h, w) as in the reference
    return x.permute(0, 1, 3, 4, 2).reshape(-1, x.shape[2])


class _AllGather(torch.autograd.Function):
    """Every rank's rows, concatenated in rank order; the gradient of a rank's rows is the sum of what every
    rank's loss sends back to them. torch's own ``torch.distributed.nn.functional.all_gather`` is deprecated,
    and its default argument binds the process group when first imported: imported after the group was made,
    it keeps the group (and gloo's threads) alive past ``destroy_process_group``, into the interpreter's
    shutdown, where a gloo thread that frees a collective's tensors aborts the process."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone(memory_format=torch.contiguous_format)  # the incoming gradient stays untouched
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size())[dist.get_rank()]


def _gather_targets(targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All-gather the targets of every rank (gradient flows back); returns them and this rank's row offset."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return targets, 0
    return _AllGather.apply(targets), dist.get_rank() * targets.shape[0]


def topk_accuracy(
    scores: torch.Tensor,
    labels: torch.Tensor,
    ks: tuple[int, ...] = (1, 5),
    dtype: torch.dtype = torch.float32,
) -> list[torch.Tensor]:
    """Fraction of rows whose label is among the k highest scores (k capped at the number of columns).

    Equal scores rank the lower column first, a fixed rule whatever order a kernel leaves ties in. Each
    fraction is a 0-dim tensor of ``dtype``. The label's rank is counted over every column, with no branch on
    the data, so that the training step compiles to one graph and can run in a CUDA graph (nothing waits for
    the device).
    """
    rank = label_rank(scores, labels)
    return [(rank < k).to(dtype).mean() for k in ks]


def label_rank(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's rank of its label's score (0: the highest): the columns with a higher score, and those
    with an equal score in a lower column (:func:`topk_accuracy`'s rule for ties). (rows, C) -> (rows,)"""
    own = scores.gather(1, labels[:, None])  # (rows, 1)
    columns = torch.arange(scores.shape[1], device=scores.device)
    return (scores > own).sum(dim=1) + ((scores == own) & (columns < labels[:, None])).sum(dim=1)


def _grouped(x: torch.Tensor, group: int) -> torch.Tensor:
    """Rows ordered (b, t, h, w) -> (group, rows / group, D), where each of the ``group`` last (fastest)
    row indices collects its rows: group H*W gathers every position's rows, T*H*W every (step, position)'s."""
    return x.view(-1, group, x.shape[1]).transpose(0, 1)


def _per_clip(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Rows ordered (b, t, h, w) -> (B*H*W, T, D): each (clip, position)'s rows, one per step."""
    b, steps, _, h, w = shape
    return x.view(b, steps, h * w, x.shape[1]).transpose(1, 2).reshape(b * h * w, steps, x.shape[1])


def dense_infonce(
    pred: torch.Tensor,
    target: torch.Tensor,
    temperature: float | None = None,
    global_negatives: bool = False,
    negatives: str = "all",
) -> dict[str, torch.Tensor]:
    """Contrastive loss of predictions against targets, both (B, T, D, H, W).

    Scores are raw dot products (the reference), or cosine similarities divided by ``temperature`` when one
    is given. With ``global_negatives`` under torch.distributed the targets of all ranks are negatives too
    (every rank must hold the same batch size; not with ``own_clip``, whose targets are the clip's own).
    ``negatives`` (:data:`~memdpc.model.names.NEGATIVES`): "all" targets of the batch (the paper), only those
    at the prediction's own map position ("same_position"), only those of every clip at its own position and
    step ("other_clips"), or only its own clip's steps at its position ("own_clip"). Returns scalar ``loss`` (mean
    cross-entropy), ``top1``, ``top5`` and ``chance``: the loss of a uniform guess, ln of the number of candidates
    each prediction is scored against (e.g. 10 clips × 3 steps × a 1×1 map, all negatives: ln 30), which a model
    that learnt nothing the loss can see stays at.
    """
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ in shape")
    if negatives not in NEGATIVES:
        raise ValueError(f"negatives must be one of {', '.join(NEGATIVES)}, not {negatives!r}")
    p, t = _flatten(pred), _flatten(target)
    if temperature is not None:
        p, t = F.normalize(p, dim=1), F.normalize(t, dim=1)
    offset = 0
    if global_negatives and negatives != "own_clip":  # own_clip scores a clip's own targets only
        t, offset = _gather_targets(t)
    if negatives == "all":
        scores = p @ t.t()  # (B*T*H*W, [world*]B*T*H*W)
        labels = torch.arange(p.shape[0], device=p.device) + offset
    elif negatives == "own_clip":  # the clip's own steps only
        steps = pred.shape[1]
        scores = torch.bmm(_per_clip(p, pred.shape), _per_clip(t, pred.shape).mT)
        labels = torch.arange(steps, device=p.device).repeat(scores.shape[0])
        scores = scores.reshape(-1, steps)  # (B*H*W*T, T)
    else:
        group = pred.shape[3] * pred.shape[4] * (pred.shape[1] if negatives == "other_clips" else 1)
        scores = torch.bmm(
            _grouped(p, group), _grouped(t, group).transpose(1, 2)
        )  # (group, rows, [world*]rows)
        labels = (torch.arange(scores.shape[1], device=p.device) + offset // group).repeat(group)
        scores = scores.reshape(-1, scores.shape[2])
    if temperature is not None:
        scores = scores / temperature
    loss = F.cross_entropy(scores.float(), labels)
    top1, top5 = topk_accuracy(scores.detach(), labels)
    chance = torch.full((), scores.shape[1], dtype=torch.float32, device=scores.device).log()
    return {"loss": loss, "top1": top1, "top5": top5, "chance": chance}


def content_share(z: torch.Tensor) -> torch.Tensor:
    """Share of the variance of features z (B, T, D, H, W) that tells clips and time steps apart, against the
    variance that only tells map positions apart: 1 when every position looks alike, near 0 when the features
    say where on the map they are and hardly anything about the clip (the dense loss's positional shortcut).
    """
    z = z.detach().float()
    per_position = z.mean(dim=(0, 1))  # (D, H, W): the part every clip and step shares
    content = (z - per_position).pow(2).mean()
    position = (per_position - per_position.mean(dim=(1, 2), keepdim=True)).pow(2).mean()
    return content / (content + position).clamp_min(torch.finfo(torch.float32).tiny)


def relation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """How far the batch's similarities under ``student`` (B, D) are from those under ``teacher`` (B, D'): per
    clip, the cross-entropy of the softmax over the other clips' cosine similarities (over
    :data:`RELATION_TEMPERATURE`) under the student against the same under the teacher, averaged.

    Each side is centred by its batch mean before the cosine, as retrieval centres its features. The student is
    pulled to find alike the clips the teacher finds alike, whatever else tells them apart: a flow encoder as the
    teacher of an RGB one makes clips of alike motion alike under RGB, across backgrounds and colours. Needs B ≥
    :data:`RELATION_MIN_BATCH`.
    """
    if student.shape[0] != teacher.shape[0] or student.shape[0] < RELATION_MIN_BATCH:
        raise ValueError(
            f"student {tuple(student.shape)} and teacher {tuple(teacher.shape)} need the same batch of "
            f"{RELATION_MIN_BATCH} or more"
        )
    n = student.shape[0]
    # row i's columns i+1, …, i+n-1 (mod n): every other clip, a clip's similarity to itself left out (a gather of
    # fixed shape, which compiles into one graph where a boolean mask would not)
    steps = torch.arange(n, device=student.device)
    others = (steps[:, None] + steps[None, 1:]) % n

    def scores(x: torch.Tensor) -> torch.Tensor:
        x = F.normalize(x.float() - x.float().mean(dim=0), dim=1)
        return (x @ x.t()).gather(1, others) / RELATION_TEMPERATURE

    target = F.softmax(scores(teacher.detach()), dim=1)
    return -(target * F.log_softmax(scores(student), dim=1)).sum(dim=1).mean()
