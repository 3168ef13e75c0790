"""``--teacher``: another stream's pretrained encoder, whose features of the training videos the run's relation
loss pulls its own similarities towards (:func:`memdpc.model.loss.relation_loss`).

The teacher embeds every training video once, before the first step, on its own stream of the run's shards, as
evaluation embeds them (the checkpoint's frame size, no augmentation), its windows averaged per video. Every rank
computes the same table; a resumed run computes it again, which gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memdpc.common import interrupts
from memdpc.common.errors import UserError
from memdpc.model.checkpoint import load_model, require_pretrained, resolve_stream
from memdpc.pipeline.loader import make_loader
from memdpc.train.config import TrainConfig
from memdpc.train.knn import video_features

__all__ = ["Teacher", "TeacherModel", "load_teacher", "read_teacher", "teacher_loader", "teacher_words"]


@dataclass(frozen=True)
class Teacher:
    """The teacher's features of the training videos: row ``rows[video_id]`` of ``features`` (videos, D)."""

    path: str
    stream: str
    rows: dict[str, int]
    features: torch.Tensor

    def of(self, video_ids: list[str]) -> torch.Tensor:
        """The features (B, D) of each clip's video, on the features' device."""
        missing = next((v for v in video_ids if v not in self.rows), None)
        if missing is not None:
            raise UserError(
                f"{self.path}: video {missing} of the training split has no windows in the {self.stream} shards "
                "the teacher embedded; shard both streams of the same videos"
            )
        index = torch.tensor([self.rows[v] for v in video_ids], device=self.features.device)
        return self.features.index_select(0, index)


@dataclass(frozen=True)
class TeacherModel:
    """The ``--teacher`` checkpoint, read and checked before the run writes anything: its model (eval mode, on
    the CPU), stream and frame size."""

    path: str
    model: torch.nn.Module
    stream: str
    size: int | None


def read_teacher(config: TrainConfig) -> TeacherModel | None:
    """The ``--teacher`` checkpoint (None without one); one that is no pretrained model, or records no stream, is
    a :class:`UserError` naming it."""
    if not config.teacher:
        return None
    model, ckpt = load_model(config.teacher)
    require_pretrained(ckpt, config.teacher)
    stream, _ = resolve_stream(ckpt, config.teacher, None)
    return TeacherModel(config.teacher, model, stream, ckpt["input_size"])


def teacher_loader(config: TrainConfig, read: TeacherModel, device: torch.device):
    """The loader the teacher embeds the training split with: its own stream of the run's shards, unaugmented, at
    its checkpoint's frame size, in batches of the run's size."""
    return make_loader(
        config.loader.shards,
        read.stream,
        config.loader.train_split,
        train=False,
        batch_size=config.loader.batch_size,
        backend=config.loader.backend,
        size=read.size or config.size,
        num_workers=config.loader.num_workers,
        device=str(device),
    )


def load_teacher(config: TrainConfig, read: TeacherModel | None, device: torch.device) -> Teacher | None:
    """The teacher's features of every video of the run's training split (None without a teacher)."""
    if read is None:
        return None
    loader = teacher_loader(config, read, device)
    ids, features, _ = video_features(read.model.to(device), loader, device, max_batches=len(loader))
    interrupts.check()  # a signal cut the table short: the run stops before its first step
    return Teacher(read.path, read.stream, {v: i for i, v in enumerate(ids)}, features.to(device))


def teacher_words(teacher: Teacher) -> str:
    """What a run says of its teacher when it starts."""
    return f"teacher: {teacher.path} ({teacher.stream}), its features of {len(teacher.rows)} training videos"
