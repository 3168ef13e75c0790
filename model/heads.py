"""Evaluation heads: linear and MLP probes, the finetune classifier, the Oops head (ARCHITECTURE.md §3.4)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from memdpc.model.convgru import ConvGRU, init_orthogonal
from memdpc.model.memdpc import MemDPC, encode, finish_config, pooled_context
from memdpc.model.names import diff_setting
from memdpc.model.resnet2d3d import DEFAULT_WIDTHS, ResNet2d3d

__all__ = ["Classifier", "LinearHead", "MLPHead", "OopsHead"]


class LinearHead(nn.Module):
    """BatchNorm1d -> Dropout -> Linear: (B, D) -> (B, classes). Names follow the reference classifier."""

    def __init__(self, in_dim: int, num_classes: int, dropout: float = 0.5):
        super().__init__()
        self.final_bn = nn.BatchNorm1d(in_dim)
        self.final_fc = nn.Sequential(nn.Dropout(dropout), nn.Linear(in_dim, num_classes))
        init_orthogonal(self.final_fc, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_fc(self.final_bn(x))


class MLPHead(nn.Module):
    """Non-linear probe: BatchNorm1d -> Linear -> ReLU -> Dropout -> Linear: (B, D) -> (B, classes)."""

    def __init__(self, in_dim: int, num_classes: int, hidden: int = 512, dropout: float = 0.5):
        super().__init__()
        self.net = nn.Sequential(
            nn.BatchNorm1d(in_dim),
            nn.Linear(in_dim, hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class OopsHead(nn.Module):
    """Unintentional-action head: per time step z_t ⊕ ẑ_t -> Linear -> 3 classes.

    z and ẑ are (..., D) (e.g. (B, T, D) from :meth:`MemDPC.step_features`); returns (..., num_classes).
    """

    def __init__(self, dim: int, num_classes: int = 3):
        super().__init__()
        self.fc = nn.Linear(2 * dim, num_classes)

    def forward(self, z: torch.Tensor, zhat: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([z, zhat], dim=-1))


class Classifier(nn.Module):
    """Finetune / linear-evaluation classifier of the reference: f, ReLU + time pool, forward (and backward)
    GRU last state, spatial mean, concat -> BatchNorm1d -> Dropout -> Linear.

    clips (B, N, 3, SL, H, W) -> logits (B, num_classes). Build it from a pretrained model with
    :meth:`from_pretrained`, or from scratch (random init) with ``create_model("classifier_r18", ...)``.
    """

    def __init__(
        self,
        num_classes: int,
        depth: int = 18,
        widths: Sequence[int] = DEFAULT_WIDTHS,
        *,
        bidirectional: bool = True,
        dropout: float = 0.9,
        gru_dropout: float = 0.1,
        track_running_stats: bool = True,
        frame_diff: bool = False,
    ):
        super().__init__()
        self.backbone = ResNet2d3d(depth, widths, track_running_stats, frame_diff)
        dim = self.backbone.out_channels
        self.agg_f = ConvGRU(dim, dim, 1, gru_dropout)
        self.agg_b = ConvGRU(dim, dim, 1, gru_dropout) if bidirectional else None
        for m in (self.agg_f, self.agg_b):
            if m is not None:
                init_orthogonal(m, 1.0)
        self.feature_dim = dim * (2 if bidirectional else 1)
        self.head = LinearHead(self.feature_dim, num_classes, dropout)
        self.hparams = dict(
            num_classes=num_classes,
            depth=depth,
            widths=list(self.backbone.widths),
            bidirectional=bidirectional,
            dropout=dropout,
            gru_dropout=gru_dropout,
            track_running_stats=track_running_stats,
            **diff_setting(frame_diff),
        )
        self.config: dict = {}

    @classmethod
    def from_pretrained(cls, model: MemDPC, num_classes: int, dropout: float = 0.9) -> Classifier:
        """A classifier whose encoder and GRUs are copies of a pretrained (Mem)DPC model's."""
        hp = model.hparams
        clf = cls(
            num_classes,
            hp["depth"],
            hp["widths"],
            bidirectional=hp["bidirectional"],
            dropout=dropout,
            gru_dropout=hp["gru_dropout"],
            track_running_stats=hp["track_running_stats"],
            frame_diff=hp.get("frame_diff", False),
        )
        clf.backbone.load_state_dict(copy.deepcopy(model.backbone.state_dict()))
        clf.agg_f.load_state_dict(copy.deepcopy(model.agg_f.state_dict()))
        if clf.agg_b is not None:
            clf.agg_b.load_state_dict(copy.deepcopy(model.agg_b.state_dict()))
        return finish_config(clf, f"classifier_r{hp['depth']}", None)

    def features(self, clips: torch.Tensor) -> torch.Tensor:
        """The pooled context feature (B, D') that enters the head."""
        return pooled_context(encode(self.backbone, clips, relu_first=True), self.agg_f, self.agg_b)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(clips))
