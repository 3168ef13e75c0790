"""The aggregator g: a one-layer convolutional GRU (1×1 kernels in MemDPC), dropout on the state every step."""

from __future__ import annotations

import torch
from torch import nn

from memdpc.model.layout import channels_innermost

__all__ = ["ConvGRU", "init_orthogonal"]


class ConvGRUCell(nn.Module):
    """One ConvGRU step; gate names (``reset_gate``, ``update_gate``, ``out_gate``) follow the reference."""

    def __init__(self, input_size: int, hidden_size: int, kernel_size: int = 1):
        super().__init__()
        self.hidden_size = hidden_size
        pad = kernel_size // 2
        self.reset_gate = nn.Conv2d(input_size + hidden_size, hidden_size, kernel_size, padding=pad)
        self.update_gate = nn.Conv2d(input_size + hidden_size, hidden_size, kernel_size, padding=pad)
        self.out_gate = nn.Conv2d(input_size + hidden_size, hidden_size, kernel_size, padding=pad)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """x: (B, C, H, W), h: (B, hidden, H, W) or None (zeros, in x's layout) -> new state (B, hidden, H, W).

        The state keeps x's layout (channels_last where x's channels are its innermost dimension, as the encoder's
        features in channels_last_3d), so that no step converts between layouts."""
        if h is None:
            shape = (x.shape[0], self.hidden_size, *x.shape[2:])
            layout = torch.channels_last if channels_innermost(x) else torch.contiguous_format
            h = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=layout).zero_()
        combined = torch.cat([x, h], dim=1)
        update = torch.sigmoid(self.update_gate(combined))
        reset = torch.sigmoid(self.reset_gate(combined))
        out = torch.tanh(self.out_gate(torch.cat([x, h * reset], dim=1)))
        return h * (1 - update) + out * update


class ConvGRU(nn.Module):
    """Runs a :class:`ConvGRUCell` over a sequence, applying dropout to the state after every step."""

    def __init__(self, input_size: int, hidden_size: int, kernel_size: int = 1, dropout: float = 0.1):
        super().__init__()
        self.cell = ConvGRUCell(input_size, hidden_size, kernel_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None = None, return_all: bool = False):
        """x: (B, T, C, H, W); h: initial state (B, hidden, H, W) or None.

        Returns the last state (B, hidden, H, W), or all states (B, T, hidden, H, W) with ``return_all``.
        """
        states = []
        for t in range(x.shape[1]):
            h = self.dropout(self.cell(x[:, t], h))
            states.append(h)
        return torch.stack(states, dim=1) if return_all else h


def init_orthogonal(module: nn.Module, gain: float) -> None:
    """Reference init of the GRU, predictor and classifier layers: orthogonal weights with ``gain``, zero biases."""
    for name, p in module.named_parameters():
        if "bias" in name:
            nn.init.zeros_(p)
        elif "weight" in name:
            nn.init.orthogonal_(p, gain)
