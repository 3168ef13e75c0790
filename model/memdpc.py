"""MemDPC (uni- and bidirectional) and the DPC baseline (ARCHITECTURE.md §3.1).

Pipeline for clips (B, N, 3, SL, H, W):
  f: (2+3D)-ResNet per block, time-averaged   -> z  (B, N, D, h, w), not rectified (targets)
  g: ConvGRU over ReLU(z) of the first N-P blocks -> c (B, D, h, w)
  φ: 1×1 conv, ReLU, 1×1 conv                   -> memory logits (B, k, h, w)  [DPC: ẑ directly, k = D]
  ẑ = softmax_k(φ(c)) · M                        -> (B, D, h, w); ReLU(ẑ) is fed back into g for the next step.
The P predictions are scored against the last P targets with the dense InfoNCE of :mod:`memdpc.model.loss`.
The bidirectional model runs a second GRU over the reversed sequence, sharing f, φ and M.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from memdpc.model.convgru import ConvGRU, init_orthogonal
from memdpc.model.layout import channels_innermost
from memdpc.model.loss import content_share, dense_infonce, relation_loss
from memdpc.model.names import NEGATIVES, diff_setting
from memdpc.model.parts import part
from memdpc.model.resnet2d3d import DEFAULT_WIDTHS, ResNet2d3d

__all__ = ["MemDPC", "encode", "finish_config", "objective", "pooled_context"]


def encode(backbone: ResNet2d3d, clips: torch.Tensor, relu_first: bool = False) -> torch.Tensor:
    """Per-block encoder features, averaged over time: (B, N, 3, SL, H, W) -> (B, N, D, h, w).

    ``relu_first`` rectifies before the time average (the reference classifier's order); otherwise the
    features are returned unrectified (the pretraining targets). An encoder in channels_last_3d gives features
    with D innermost (channels_last per block), which the aggregator and the loss then keep.
    """
    if clips.dim() != 6:
        raise ValueError(f"clips must be (B, N, C, SL, H, W), got shape {tuple(clips.shape)}")
    b, n = clips.shape[:2]
    feat = backbone(clips.flatten(0, 1))  # (B*N, D, T', h, w)
    if relu_first:
        feat = F.relu(feat)
    if channels_innermost(feat):  # time pool: T' = ceil(SL/4) -> 1, keeping D innermost
        feat = feat.permute(0, 2, 3, 4, 1).mean(dim=1).permute(0, 3, 1, 2)
    else:
        feat = feat.mean(dim=2)
    return feat.view(b, n, *feat.shape[1:])


def pooled_context(z: torch.Tensor, agg_f: ConvGRU, agg_b: ConvGRU | None) -> torch.Tensor:
    """Last GRU state over all blocks of rectified z (B, N, D, h, w), spatially averaged; fwd ⊕ bwd -> (B, D')."""
    ctx = [agg_f(z).mean(dim=(2, 3))]
    if agg_b is not None:
        ctx.append(agg_b(z.flip(1)).mean(dim=(2, 3)))
    return torch.cat(ctx, dim=1)


def objective(out: dict[str, torch.Tensor], relation_weight: float = 1.0) -> torch.Tensor:
    """What training minimises of a forward's outputs: the pretext ``loss``, plus ``relation_weight`` times the
    ``relation`` to a teacher's features where the forward was given one (kept apart so that ``loss`` stays
    comparable with its chance)."""
    return out["loss"] + relation_weight * out["relation"] if "relation" in out else out["loss"]


def finish_config(model: nn.Module, name: str, seed: int | None) -> nn.Module:
    """Record ``model.config`` (plain, YAML/JSON-friendly) from the model's resolved hyper-parameters."""
    hp = {k: v for k, v in model.hparams.items() if k not in ("depth", "memory")}
    model.config = {"name": name, **hp, "seed": seed}
    return model


class MemDPC(nn.Module):
    """MemDPC (``memory=True``) or the DPC baseline (``memory=False``: φ outputs ẑ directly)."""

    def __init__(
        self,
        depth: int = 18,
        widths: Sequence[int] = DEFAULT_WIDTHS,
        *,
        memory: bool = True,
        bidirectional: bool = True,
        mem_size: int = 1024,
        pred_steps: int = 3,
        num_blocks: int = 8,
        block_len: int = 5,
        input_size: int = 128,
        temperature: float | None = None,
        global_negatives: bool = False,
        negatives: str = "all",
        track_running_stats: bool = True,
        gru_dropout: float = 0.1,
        init_gain: float = 0.1,
        frame_diff: bool = False,
    ):
        super().__init__()
        if not 0 < pred_steps < num_blocks:
            raise ValueError(
                f"pred_steps must be in 1..num_blocks-1, got {pred_steps} of {num_blocks} blocks"
            )
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {', '.join(NEGATIVES)}, not {negatives!r}")
        self.pred_steps, self.temperature, self.global_negatives = pred_steps, temperature, global_negatives
        self.negatives = negatives
        # creation order (backbone, memory, GRUs, predictor) follows the reference
        self.backbone = ResNet2d3d(depth, widths, track_running_stats, frame_diff)
        dim = self.backbone.out_channels
        if memory:
            self.memory = nn.Parameter(torch.randn(mem_size, dim))  # M: k × D, standard normal
        else:
            self.register_parameter("memory", None)
        self.agg_f = ConvGRU(dim, dim, 1, gru_dropout)
        self.agg_b = ConvGRU(dim, dim, 1, gru_dropout) if bidirectional else None
        self.predictor = nn.Sequential(
            nn.Conv2d(dim, dim, 1), nn.ReLU(inplace=True), nn.Conv2d(dim, mem_size if memory else dim, 1)
        )
        for m in (self.agg_f, self.agg_b, self.predictor):
            if m is not None:
                init_orthogonal(m, init_gain)
        self.feature_dim = dim * (2 if bidirectional else 1)
        self.hparams = dict(
            depth=depth,
            widths=list(self.backbone.widths),
            memory=memory,
            bidirectional=bidirectional,
            mem_size=mem_size,
            pred_steps=pred_steps,
            num_blocks=num_blocks,
            block_len=block_len,
            input_size=input_size,
            temperature=temperature,
            global_negatives=global_negatives,
            negatives=negatives,
            track_running_stats=track_running_stats,
            gru_dropout=gru_dropout,
            init_gain=init_gain,
            **diff_setting(frame_diff),
        )
        self.config: dict = {}  # set by the factory: create_model(**model.config) rebuilds this model

    # ------------------------------------------------------------------ prediction
    def predict_next(self, hidden: torch.Tensor) -> torch.Tensor:
        """ẑ from a context state (B, D, h, w): memory read-out of softmax_k φ(c) (MemDPC) or φ(c) (DPC)."""
        with part("predictor"):
            out = self.predictor(hidden)
        if self.memory is None:
            return out
        with part("memory read"):
            if channels_innermost(out):  # channels_last: per position, k innermost; no layout change
                weights = F.softmax(
                    out.permute(0, 2, 3, 1), dim=-1
                )  # (B, h, w, k), convex weights over slots
                return (weights @ self.memory).permute(0, 3, 1, 2)  # (B, D, h, w), channels_last
            weights = F.softmax(out, dim=1)  # (B, k, h, w), convex weights over memory slots
            return torch.einsum("bkhw,kc->bchw", weights, self.memory)

    def rollout(self, agg: ConvGRU, z: torch.Tensor) -> torch.Tensor:
        """Predict the last P blocks of z (B, N, D, h, w) from the first N-P: returns ẑ (B, P, D, h, w)."""
        n = z.shape[1]
        with part("aggregation"):
            hidden = agg(F.relu(z[:, : n - self.pred_steps]))
        preds = []
        for step in range(self.pred_steps):
            if step > 0:
                with part("aggregation"):
                    hidden = agg(F.relu(preds[-1]).unsqueeze(1), hidden)
            preds.append(self.predict_next(hidden))
        # stacked with D innermost, the loss's row layout (B·P·h·w, D): a view there, whatever the layout here
        return torch.stack([p.permute(0, 2, 3, 1) for p in preds], dim=1).permute(0, 1, 4, 2, 3)

    def forward(self, clips: torch.Tensor, teacher: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """clips (B, N, 3, SL, H, W) -> scalar ``loss``, ``top1``, ``top5`` and per direction ``*_f``/``*_b``,
        ``chance`` (the loss of a uniform guess, see :func:`~memdpc.model.loss.dense_infonce`) and the encoder
        features' ``content_share`` (see :func:`~memdpc.model.loss.content_share`).

        ``loss`` is the sum of the per-direction mean losses (the reference), and so is ``chance``; top-k the mean
        over directions. ``teacher`` (B, D'), another encoder's features of the same clips: ``relation``, the
        :func:`~memdpc.model.loss.relation_loss` of the clips' pooled context features (:meth:`features`' kind)
        against it, which training adds to ``loss`` (:func:`objective`).
        """
        if clips.dim() != 6 or clips.shape[1] <= self.pred_steps:
            raise ValueError(f"clips must be (B, N>{self.pred_steps}, C, SL, H, W), got {tuple(clips.shape)}")
        with part("encoder"):
            z = encode(self.backbone, clips)
        dirs = [("f", self.agg_f, z)]
        if self.agg_b is not None:
            dirs.append(("b", self.agg_b, z.flip(1)))
        out: dict[str, torch.Tensor] = {}
        chance = []
        for tag, agg, seq in dirs:
            preds = self.rollout(agg, seq)
            with part("loss"):
                res = dense_infonce(
                    preds, seq[:, -self.pred_steps :], self.temperature, self.global_negatives, self.negatives
                )
            chance.append(res.pop("chance"))
            out.update({f"{k}_{tag}": v for k, v in res.items()})
        out["loss"] = sum(out[f"loss_{t}"] for t, _, _ in dirs)
        out["chance"] = sum(chance)
        for k in ("top1", "top5"):
            out[k] = torch.stack([out[f"{k}_{t}"] for t, _, _ in dirs]).mean()
        out["content_share"] = content_share(z)
        if teacher is not None:
            with part("loss"):
                out["relation"] = relation_loss(pooled_context(F.relu(z), self.agg_f, self.agg_b), teacher)
        return out

    # ------------------------------------------------------------------ features for evaluation
    def backbone_features(self, clips: torch.Tensor) -> torch.Tensor:
        """Unrectified, time-pooled encoder features z: (B, N, D, h, w)."""
        return encode(self.backbone, clips)

    def features(self, clips: torch.Tensor) -> torch.Tensor:
        """Pooled context feature for retrieval and probes: (B, D) or (B, 2D) for the bidirectional model.

        As the reference classifier: ReLU, time pool, GRU over all N blocks, last state, spatial mean,
        forward ⊕ backward. Call ``eval()`` first (GRU dropout).
        """
        return pooled_context(encode(self.backbone, clips, relu_first=True), self.agg_f, self.agg_b)

    def step_features(self, clips: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-block z_t and its prediction ẑ_t from blocks < t (forward GRU), spatially averaged.

        Returns (z, ẑ), both (B, N, D); ẑ_0 is predicted from the zero initial state. Used by the Oops head.
        """
        z = encode(self.backbone, clips)
        states = self.agg_f(F.relu(z), return_all=True)  # (B, N, D, h, w): state after block t
        prev = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)
        zhat = self.predict_next(prev.flatten(0, 1)).view_as(z)
        return z.mean(dim=(3, 4)), zhat.mean(dim=(3, 4))
