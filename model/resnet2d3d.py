"""The (2+3D)-ResNet encoder f of DPC/MemDPC (ARCHITECTURE.md §3.1).

res2/res3 use 2D kernels (1×3×3), res4/res5 3D kernels (3×3×3). For a 5×128² block the stage outputs are
5×64²×64 (stem conv), 5×32²×64 (pool), 5×32²×64 (res2), 5×16²×128 (res3), 3×8²×256 (res4), 2×4²×256 (res5).
Parameter names match the reference implementation (``conv1``, ``bn1``, ``layer1.0.conv1`` …,
``layerK.0.downsample.{0,1}``), so its checkpoints load without renaming.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["DEFAULT_WIDTHS", "DEPTHS", "ResNet2d3d"]

DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}
DEFAULT_WIDTHS = (64, 128, 256, 256)


class FrameMaxPool(nn.Module):
    """The stem's 3×3 / stride-2 max pool on each frame: the reference's ``MaxPool3d((1, 3, 3), (1, 2, 2),
    (0, 1, 1))``, computed as a 2D pool because CUDA has no deterministic backward for ``max_pool3d``
    (``--deterministic`` training would fail) while ``max_pool2d``'s is deterministic.

    The 2D pool sees the frames through a view that keeps the input's layout (no copy either way):
    (B, C·T, H, W) for contiguous input, (B·T, C, H, W) in channels_last for channels_last_3d input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last_3d):
            y = nn.functional.max_pool2d(x.reshape(b, c * t, h, w), 3, stride=2, padding=1)
            return y.view(b, c, t, *y.shape[-2:])
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)  # a view: (B·T, C, H, W), channels_last
        y = nn.functional.max_pool2d(frames, 3, stride=2, padding=1)  # keeps channels_last
        return y.view(b, t, c, *y.shape[-2:]).transpose(1, 2)  # (B, C, T, H', W'), channels_last_3d


class BasicBlock(nn.Module):
    """Two convolutions with a residual shortcut; 2D (1×3×3) or 3D (3×3×3) kernels.

    ``final_relu=False`` leaves the output unrectified (used for the very last block of the encoder).
    """

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        stride: int,
        temporal: bool,
        track_running_stats: bool,
        final_relu: bool = True,
    ):
        super().__init__()
        k, pad = ((3, 3, 3), (1, 1, 1)) if temporal else ((1, 3, 3), (0, 1, 1))
        st = (stride, stride, stride) if temporal else (1, stride, stride)
        self.conv1 = nn.Conv3d(in_ch, out_ch, k, stride=st, padding=pad, bias=False)
        self.bn1 = nn.BatchNorm3d(out_ch, track_running_stats=track_running_stats)
        self.conv2 = nn.Conv3d(out_ch, out_ch, k, padding=pad, bias=False)
        self.bn2 = nn.BatchNorm3d(out_ch, track_running_stats=track_running_stats)
        self.relu = nn.ReLU(inplace=True)
        self.final_relu = final_relu
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv3d(in_ch, out_ch, 1, stride=st, bias=False),
                nn.BatchNorm3d(out_ch, track_running_stats=track_running_stats),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + (x if self.downsample is None else self.downsample(x))
        return self.relu(out) if self.final_relu else out


class ResNet2d3d(nn.Module):
    """(2+3D)-ResNet: (B', 3, T, H, W) -> (B', widths[-1], ceil(T/4), H/32, W/32), not rectified.

    ``frame_diff``: it reads the differences of consecutive frames (T − 1 of them) instead of the frames, so
    that what does not change over time (a still background, the colour and texture of what does not move)
    never reaches it.
    """

    def __init__(
        self,
        depth: int = 18,
        widths: Sequence[int] = DEFAULT_WIDTHS,
        track_running_stats: bool = True,
        frame_diff: bool = False,
    ):
        super().__init__()
        self.frame_diff = frame_diff
        if depth not in DEPTHS:
            raise ValueError(f"depth must be one of {sorted(DEPTHS)}, got {depth}")
        if len(widths) != 4:
            raise ValueError(f"widths needs 4 entries (res2..res5), got {tuple(widths)}")
        self.depth, self.widths = depth, tuple(int(w) for w in widths)
        stem = self.widths[0]
        self.conv1 = nn.Conv3d(3, stem, (1, 7, 7), stride=(1, 2, 2), padding=(0, 3, 3), bias=False)
        self.bn1 = nn.BatchNorm3d(stem, track_running_stats=track_running_stats)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = FrameMaxPool()
        in_ch = stem
        for i, (n, w) in enumerate(zip(DEPTHS[depth], self.widths, strict=True)):
            blocks = []
            for j in range(n):
                last = i == 3 and j == n - 1
                blocks.append(
                    BasicBlock(
                        in_ch,
                        w,
                        stride=2 if (i > 0 and j == 0) else 1,
                        temporal=i >= 2,
                        track_running_stats=track_running_stats,
                        final_relu=not last,
                    )
                )
                in_ch = w
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.out_channels = in_ch
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv3d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm3d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        if not self.frame_diff:
            return x
        if x.shape[2] < 2:
            raise ValueError(f"frame differences need at least 2 frames a block, got {x.shape[2]}")
        return x[:, :, 1:] - x[:, :, :-1]

    def stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs of stem conv, pool, res2, res3, res4, res5 (for inspection and shape tests)."""
        outs = [self.relu(self.bn1(self.conv1(self._input(x))))]
        outs.append(self.maxpool(outs[-1]))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            outs.append(layer(outs[-1]))
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(self._input(x)))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))
