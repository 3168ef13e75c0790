"""Batched dual TV-L1 optical flow in PyTorch, a port of OpenCV contrib's CPU ``DualTVL1OpticalFlow``.

It follows ``modules/optflow/src/tvl1flow.cpp`` (and the OpenCV 5 ``resize``/``remap`` it calls) operation
by operation, down to the rounding, so that on the CPU its flows equal OpenCV 5's up to float rounding
(bit for bit on some scenes; ≤ 1e-4 px on others), while running many frame pairs at once (B, H, W), on CPU
or CUDA:

- pyramid: each level is the previous one resized by ``scale_step`` with bilinear ``cv::resize`` (no
  blur; sizes rounded like OpenCV's), stopping before a level narrower or shorter than 16 px;
- gradients of I1 by centred differences (halved one-sided ones at the border), warping of I1 and its
  gradients by bicubic ``cv::remap`` (A = -0.75, zero outside the image);
- per warp, up to ``outer_iterations`` × ``inner_iterations`` primal-dual steps with OpenCV's forward
  gradient and divergence, a 5×5 median filter of the flow before every outer iteration, and OpenCV's
  stopping rule *per pair*: stop once the summed squared update of one step is ≤ epsilon² · H · W;
- the flow is carried to the next finer level by bilinear resize and multiplied by 1 / ``scale_step`` (in
  double or float, as the installed OpenCV does: ``TVL1Params.flow_scale``).

Pairs that have stopped are frozen (and dropped from the working set), so a pair's result does not depend
on what else is in its batch. Differences to OpenCV 4.x: its ``remap`` rounds sub-pixel positions to 1/32
px and its ``resize`` rounds differently, so flows agree with 4.x only to a small fraction of a pixel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from memdpc.preprocess.flow.sorting_networks import selection_network
from memdpc.preprocess.flow.tvl1_params import TVL1Params, level_sizes

FLT_EPSILON = float(np.finfo(np.float32).eps)


def check_params(params: TVL1Params) -> None:
    """Refuse parameters the port does not support (ValueError): ``gamma`` (illumination term) ≠ 0, a median
    filter other than 0/1 (off), 3 or 5, or a pyramid or warp count that is not ≥ 1. An initial flow is not
    supported either."""
    if params.gamma != 0.0:
        raise ValueError("TVL1Params: gamma != 0 is not supported by the torch backend")
    if params.median_filtering not in (0, 1, 3, 5):
        raise ValueError("TVL1Params: median_filtering must be 0/1 (off), 3 or 5 (as OpenCV for float)")
    if not 0 < params.scale_step < 1 or params.scales < 1 or params.warps < 1:
        raise ValueError("TVL1Params: need 0 < scale_step < 1, scales ≥ 1 and warps ≥ 1")


# --------------------------------------------------------------------------------------------------
# Resampling primitives matching OpenCV (bilinear resize, bicubic remap, 5×5 median blur)


def _linear_taps(n_src: int, n_dst: int, scale: float, device) -> tuple[torch.Tensor, ...]:
    """Source indices (left, right) and float32 right weights of ``cv::resize`` INTER_LINEAR along one axis.

    Position ``(dx + 0.5) · scale − 0.5`` and its fraction in double (as OpenCV 5), clamped at the edges:
    before the first pixel, weight 0 on the right; past the last, OpenCV 5 takes the last pixel itself when
    enlarging but interpolates the last two with weight 1 when shrinking (which can differ by an ulp).
    """
    pos = (np.arange(n_dst, dtype=np.float64) + 0.5) * scale - 0.5
    s = np.floor(pos).astype(np.int64)
    f = (pos - s).astype(np.float32)
    low, high = s < 0, s >= n_src - 1
    f[low] = 0.0
    s[low] = 0
    shrink = scale > 1 and n_src > 1
    f[high] = 1.0 if shrink else 0.0
    s[high] = n_src - 2 if shrink else n_src - 1
    i1 = np.minimum(s + 1, n_src - 1)
    return torch.from_numpy(s).to(device), torch.from_numpy(i1).to(device), torch.from_numpy(f).to(device)


def resize_linear(
    x: torch.Tensor, size: tuple[int, int], scale: tuple[float, float] | None = None
) -> torch.Tensor:
    """``cv::resize(..., INTER_LINEAR)`` of (B, H, W) float32 to ``size`` (H', W').

    ``scale`` is OpenCV's source-per-destination step (y, x); by default H/H' and W/W' (resize to a given
    size); when OpenCV resizes by a factor ``fx`` it is 1/fx.
    """
    (h, w), (nh, nw) = x.shape[-2:], size
    sy, sx = scale if scale is not None else (h / nh, w / nw)
    x0, x1, a1 = _linear_taps(w, nw, sx, x.device)
    y0, y1, b1 = _linear_taps(h, nh, sy, x.device)
    rows = _lerp(x.index_select(-1, x0), x.index_select(-1, x1), a1)  # (B, H, W')
    return _lerp(rows.index_select(-2, y0), rows.index_select(-2, y1), b1[:, None])


def scale_flow(u: torch.Tensor, factor: float) -> torch.Tensor:
    """float32 ``u · factor`` rounded once, as OpenCV scales the flow carried to a finer level
    (:meth:`TVL1Params.flow_scale`): in float where the factor is a float, else in double."""
    if float(np.float32(factor)) == factor:
        return u * factor
    return (u.double() * factor).float()


def _lerp(a: torch.Tensor, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """float32 ``fma(b − a, t, a)``, as OpenCV 5's resize interpolates."""
    return _fma(b - a, t, a)


@functools.cache
def _addcmul_is_fused(device_type: str) -> bool:
    """Whether ``torch.addcmul`` rounds once (a fused multiply-add) on this device type, checked on random
    values in the layouts used here (contiguous with a ragged tail, strided, broadcast)."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(2, 4099, generator=g) for _ in range(3))
    cases = [(a, b, c), (a[:, ::2], b[:, ::2], c[:, ::2]), (a, b[:1], c)]
    for x, y, z in cases:
        fused = torch.addcmul(z.to(device_type), x.to(device_type), y.to(device_type)).cpu()
        if not torch.equal(fused, (x.double() * y.double() + z.double()).float()):
            return False
    return True


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add ``a · b + c``: ``torch.addcmul`` where it is fused, else via float64 (where
    the product of two floats is exact)."""
    if _addcmul_is_fused(a.device.type):
        return torch.addcmul(c, a, b)
    return (a.double() * b.double() + c.double()).float()


def _cubic_weights(t: torch.Tensor) -> list[torch.Tensor]:
    """Bicubic (A = -0.75) weights of the 4 taps at sub-pixel offsets ``t`` in [0, 1), rounded as OpenCV 5's
    remap computes them: A·t·(1−t)², (A+2)·t³ − (A+3)·t² + 1 (fused), A·(1−t)·t², and 1 minus the others."""
    a, s = -0.75, 1.0 - t
    t2, s2 = t * t, s * s
    c0 = (t * s2) * a
    c3 = (s * t2) * a
    c1 = _fma(_fma(torch.full_like(t, a + 2.0), t, torch.full_like(t, -(a + 3.0))), t2, torch.ones_like(t))
    return [c0, c1, ((1.0 - c0) - c1) - c3, c3]


REMAP_PAD = 4  # zeros around the image: a 4×4 window wholly outside it reads only zeros


def remap_cubic(images: torch.Tensor, map_x: torch.Tensor, map_y: torch.Tensor) -> torch.Tensor:
    """``cv::remap(..., INTER_CUBIC, BORDER_CONSTANT 0)`` of (B, C, H, W) at float maps (B, H, W).

    As OpenCV 5 does for float maps: exact sub-pixel offsets, each of the 4 rows of taps interpolated along
    x by a chain of fused multiply-adds, then the 4 rows along y; taps outside the image count as 0.
    """
    b, c, h, w = images.shape
    p = REMAP_PAD
    hp, wp = h + 2 * p, w + 2 * p
    flat = F.pad(images, (p, p, p, p)).transpose(0, 1).reshape(c, b * hp * wp)  # channel-major pixels
    ix, iy = torch.floor(map_x), torch.floor(map_y)
    wx = [k.reshape(1, -1) for k in _cubic_weights(map_x - ix)]  # 4 × (1, B·H·W)
    wy = [k.reshape(1, -1) for k in _cubic_weights(map_y - iy)]
    # the 4×4 window's top-left tap is (iy − 1, ix − 1); clamped far outside, it still reads only zeros
    tx = (ix.long() - 1).clamp_(-p, w) + p
    ty = (iy.long() - 1).clamp_(-p, h) + p
    base = (torch.arange(b, device=images.device).reshape(b, 1, 1) * (hp * wp) + ty * wp + tx).reshape(-1)
    out = None
    for i in range(4):
        row = None
        for j in range(4):
            tap = flat.index_select(1, base + (i * wp + j))  # (C, B·H·W)
            row = tap * wx[0] if row is None else _fma(tap, wx[j], row)
        out = row * wy[0] if out is None else _fma(row, wy[i], out)
    return out.reshape(c, b, h, w).transpose(0, 1)


def _select(values: list[torch.Tensor], wanted: tuple[int, ...]) -> list[torch.Tensor]:
    """Elementwise order statistics: the ranks ``wanted`` (0 = smallest) of the tensors ``values``."""
    v = list(values)
    for lo, hi, need_lo, need_hi in selection_network(len(v), wanted):
        a, b = v[lo], v[hi]
        if need_lo:
            v[lo] = torch.minimum(a, b)
        if need_hi:
            v[hi] = torch.maximum(a, b)
    return [v[k] for k in wanted]


# After sorting each column of a 5×5 window and then each row, the window is sorted along both axes; its
# median (rank 12) is then the median (rank 6) of these 13 candidates (row rank → ranks within the row):
# the 6 entries above/left of them are ≤ it and the 6 below/right are ≥ it.
_MEDIAN5_CANDIDATES = ((3, 4), (2, 3, 4), (1, 2, 3), (0, 1, 2), (0, 1))


def median_blur(x: torch.Tensor, ksize: int) -> torch.Tensor:
    """``cv::medianBlur`` of (B, H, W) float32, ``ksize`` 3 or 5 (replicated border), by selection networks."""
    r, (h, w) = ksize // 2, x.shape[-2:]
    padded = F.pad(x[:, None], (r, r, r, r), mode="replicate")[:, 0]
    cols = _select([padded[:, i : i + h] for i in range(ksize)], tuple(range(ksize)))  # sorted columns
    if ksize == 3:
        window = [c[..., j : j + w] for c in cols for j in range(3)]
        return _select(window, (4,))[0]
    candidates = []
    for row, ranks in zip(cols, _MEDIAN5_CANDIDATES, strict=True):
        candidates += _select([row[..., j : j + w] for j in range(5)], ranks)
    return _select(candidates, (6,))[0]


# --------------------------------------------------------------------------------------------------
# The algorithm


def centered_gradient(img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV's ``centeredGradient``: 0.5 · (next − previous), replicated border."""
    p = F.pad(img[:, None], (1, 1, 1, 1), mode="replicate")[:, 0]
    dx = 0.5 * (p[:, 1:-1, 2:] - p[:, 1:-1, :-2])
    dy = 0.5 * (p[:, 2:, 1:-1] - p[:, :-2, 1:-1])
    return dx, dy


def forward_gradient(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenCV's ``forwardGradient``: next − current, 0 in the last column / row."""
    dx, dy = torch.empty_like(u), torch.empty_like(u)
    torch.sub(u[:, :, 1:], u[:, :, :-1], out=dx[:, :, :-1])
    dx[:, :, -1] = 0.0
    torch.sub(u[:, 1:], u[:, :-1], out=dy[:, :-1])
    dy[:, -1] = 0.0
    return dx, dy


def divergence(v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
    """OpenCV's ``divergence``: backward differences with zeros before the first column / row (and, like
    OpenCV, ``(v1 + v2) − v2[y − 1]`` in the first column rather than ``v1 + (v2 − v2[y − 1])``)."""
    v1x, v2y = torch.empty_like(v1), torch.empty_like(v2)
    torch.sub(v1[:, :, 1:], v1[:, :, :-1], out=v1x[:, :, 1:])
    v1x[:, :, 0] = v1[:, :, 0]
    torch.sub(v2[:, 1:], v2[:, :-1], out=v2y[:, 1:])
    v2y[:, 0] = v2[:, 0]
    div = v1x.add_(v2y)
    div[:, 1:, 0] = (v1[:, 1:, 0] + v2[:, 1:, 0]) - v2[:, :-1, 0]
    return div


def primal_dual_step(state: list[torch.Tensor], data: list[torch.Tensor], consts: list[torch.Tensor]):
    """One inner iteration: OpenCV's estimateV, divergence, estimateU, forwardGradient, estimateDualVariables.

    ``state`` = (u1, u2, p11, p12, p21, p22); ``data`` = (I1wx, I1wy, ρ_c, λθ|∇I1w|², −λθ|∇I1w|², −|∇I1w|²
    or +inf where |∇I1w|² ≤ FLT_EPSILON); ``consts`` = 0-d tensors (λθ, −λθ, θ, τ/θ). Products and sums
    are kept separate (no fused multiply-add) so that rounding follows OpenCV's. Returns the new state
    and each pair's summed squared update of u (B,).
    """
    u1, u2, p11, p12, p21, p22 = state
    i1wx, i1wy, rho_c, lg, neg_lg, neg_grad = data
    l_t, neg_l_t, theta, taut = consts
    rho = rho_c + (i1wx * u1 + i1wy * u2)
    # OpenCV: l_t if rho < -l_t·grad, -l_t if rho > l_t·grad, else -rho / grad (0 where grad ≤ FLT_EPSILON)
    fi = torch.where(rho < neg_lg, l_t, torch.where(rho > lg, neg_l_t, rho / neg_grad))
    n1 = (u1 + fi * i1wx) + theta * divergence(p11, p12)
    n2 = (u2 + fi * i1wy) + theta * divergence(p21, p22)
    d1, d2 = (n1 - u1).flatten(1), (n2 - u2).flatten(1)
    if (
        d1.is_cuda
    ):  # CUDA's summation order depends on the batch size: sum in double to keep pairs independent
        d1, d2 = d1.double(), d2.double()
    error = (d1 * d1).sum(1) + (d2 * d2).sum(1)
    u1x, u1y = forward_gradient(n1)
    u2x, u2y = forward_gradient(n2)
    ng1 = torch.hypot(u1x, u1y).mul_(taut).add_(1.0)
    ng2 = torch.hypot(u2x, u2y).mul_(taut).add_(1.0)
    p11 = u1x.mul_(taut).add_(p11).div_(ng1)  # (p11 + taut·u1x) / ng1, reusing u1x's memory
    p12 = u1y.mul_(taut).add_(p12).div_(ng1)
    p21 = u2x.mul_(taut).add_(p21).div_(ng2)
    p22 = u2y.mul_(taut).add_(p22).div_(ng2)
    return [n1, n2, p11, p12, p21, p22], error


def _masked(fn):
    """``fn(state, ...) -> (new_state, *rest)`` that keeps the old state of pairs where ``active`` is False."""

    def step(active: torch.Tensor | None, state: list[torch.Tensor], *args):
        new, *rest = fn(state, *args)
        if active is None:  # all pairs run
            return new, *rest
        m = active[:, None, None]
        return [torch.where(m, n, o) for n, o in zip(new, state, strict=True)], *rest

    return step


def _median_uv(state: list[torch.Tensor], ksize: int):
    """OpenCV's median filtering of the flow (u1, u2) between outer iterations."""
    return ([median_blur(state[0], ksize), median_blur(state[1], ksize), *state[2:]],)


@dataclass(frozen=True)
class Schedule:
    """How the batch is run (results do not depend on it, only speed).

    Attributes:
        check_every: inner iterations between checks of which pairs have stopped (a host sync on CUDA);
            pairs that stop in between are frozen by masking, so results are unchanged.
        compact_below: drop stopped pairs from the working set once fewer than this fraction of it runs
            (1.0: as soon as one stops; then no masking is needed when ``check_every`` is 1).
        compile: run the inner iteration and the median filter through ``torch.compile`` (meant for
            CUDA; on CPU it does not pay: minutes of compilation, recompiles as the working set shrinks).
    """

    check_every: int = 1
    compact_below: float = 1.0
    compile: bool = False

    @staticmethod
    def for_device(device: torch.device | str) -> Schedule:
        """The default: check every iteration on CPU (free), every 10 on CUDA and compact below half."""
        return Schedule() if torch.device(device).type == "cpu" else Schedule(10, 0.5, False)


@functools.cache
def _kernels(compile: bool):
    step, median = _masked(primal_dual_step), _masked(_median_uv)
    if compile:
        step, median = torch.compile(step, dynamic=True), torch.compile(median, dynamic=True)
    return step, median


def _warp_data(i0, i1, i1x, i1y, u1, u2, l_t: float) -> list[torch.Tensor]:
    """Warp I1 and its gradients by the flow (OpenCV's remap + calcGradRho); the ``data`` of a warp."""
    h, w = i0.shape[-2:]
    xs = torch.arange(w, device=i0.device, dtype=torch.float32)
    ys = torch.arange(h, device=i0.device, dtype=torch.float32)[:, None]
    i1w, i1wx, i1wy = remap_cubic(torch.stack([i1, i1x, i1y], 1), xs + u1, ys + u2).unbind(1)
    grad = i1wx * i1wx + i1wy * i1wy
    rho_c = i1w - i1wx * u1 - i1wy * u2 - i0
    lg = l_t * grad
    neg_grad = torch.where(grad > FLT_EPSILON, -grad, torch.inf)
    return [i1wx, i1wy, rho_c, lg, -lg, neg_grad]


class _Warp:
    """The outer/inner loops of one warp with OpenCV's per-pair stopping rule, on a shrinking working set."""

    def __init__(self, state, data, scaled_eps: float, schedule: Schedule):
        self.full, self.work, self.data = state, list(state), data
        self.index = torch.arange(state[0].shape[0], device=state[0].device)  # working row → batch row
        self.active = torch.ones(len(self.index), dtype=torch.bool, device=self.index.device)
        self.all_active = True
        self.eps, self.schedule = scaled_eps, schedule

    def apply(self, kernel, *args):
        """Run a masked kernel on the working set; return its extra outputs."""
        self.work, *rest = kernel(None if self.all_active else self.active, self.work, *args)
        return rest

    def update(self, error: torch.Tensor, check: bool) -> bool:
        """Record which pairs stopped; at a check, compact the working set. False once all pairs stopped."""
        self.active = self.active & (error > self.eps)
        if not check:
            self.all_active = False
            return True
        n_active = int(self.active.sum())
        self.all_active = n_active == len(self.index)
        if self.all_active or n_active >= self.schedule.compact_below * len(self.index):
            return True
        self.write_back()
        if n_active == 0:
            return False
        keep = self.active.nonzero()[:, 0]
        self.index, self.active, self.all_active = self.index[keep], self.active[keep], True
        self.work = [s[keep] for s in self.work]
        self.data = [d[keep] for d in self.data]
        return True

    def write_back(self) -> None:
        if len(self.index) == self.full[0].shape[0]:
            self.full[:] = self.work
        else:
            for f, s in zip(self.full, self.work, strict=True):
                f.index_copy_(0, self.index, s)


def _solve_warp(state, data, consts, params: TVL1Params, scaled_eps: float, schedule: Schedule, checkpoint):
    """One warp: up to ``outer_iterations`` × (median filter, ``inner_iterations`` steps) per pair."""
    step, median = _kernels(schedule.compile)
    warp = _Warp(state, data, scaled_eps, schedule)
    n = 0
    for _ in range(params.outer_iterations):
        if params.median_filtering > 1:
            warp.apply(median, params.median_filtering)
        for _ in range(params.inner_iterations):
            checkpoint()
            (error,) = warp.apply(step, warp.data, consts)
            n += 1
            if not warp.update(error, check=n % schedule.check_every == 0):
                return warp.full
    warp.write_back()
    return warp.full


def _solve_level(i0, i1, u1, u2, params: TVL1Params, schedule: Schedule, checkpoint):
    """OpenCV's ``procOneScale`` for a batch: all warps at one pyramid level."""
    h, w = i0.shape[-2:]
    scaled_eps = float(np.float32(params.epsilon * params.epsilon * h * w))
    l_t = float(np.float32(params.lambda_ * params.theta))
    taut = float(np.float32(params.tau / params.theta))
    consts = [torch.tensor(v, dtype=torch.float32, device=i0.device) for v in (l_t, -l_t, params.theta, taut)]
    i1x, i1y = centered_gradient(i1)
    zeros = torch.zeros_like(i0)
    state = [u1.contiguous(), u2.contiguous(), zeros, zeros.clone(), zeros.clone(), zeros.clone()]
    for _ in range(params.warps):
        data = _warp_data(i0, i1, i1x, i1y, state[0], state[1], l_t)
        state = _solve_warp(state, data, consts, params, scaled_eps, schedule, checkpoint)
    return state[0], state[1]


@torch.no_grad()
def tvl1_flow(
    prev: torch.Tensor,
    next: torch.Tensor,
    params: TVL1Params = TVL1Params(),
    schedule: Schedule | None = None,
    checkpoint: Callable[[], None] = lambda: None,
) -> torch.Tensor:
    """Dual TV-L1 flow from ``prev`` to ``next`` for a batch of pairs, as OpenCV's CPU implementation.

    Args:
        prev, next: (B, H, W) greyscale frames, values in [0, 255] (uint8 or float), on any device.
        params: the TV-L1 parameters (OpenCV's defaults).
        schedule: how to run the batch (speed only); default ``Schedule.for_device(prev.device)``.
        checkpoint: called before every inner iteration; an exception it raises abandons the batch (a run
            being stopped does so within one iteration).

    Returns:
        (B, H, W, 2) float32 flow (x, y) in pixels, on the input's device.
    """
    if prev.shape != next.shape or prev.dim() != 3:
        raise ValueError(
            f"tvl1_flow: need two (B, H, W) tensors of one shape, got {prev.shape} and {next.shape}"
        )
    check_params(params)
    schedule = schedule or Schedule.for_device(prev.device)
    sizes = level_sizes(prev.shape[1], prev.shape[2], params)
    step = 1.0 / params.scale_step
    i0s, i1s = [prev.float()], [next.float()]
    for size in sizes[1:]:
        i0s.append(resize_linear(i0s[-1], size, (step, step)))
        i1s.append(resize_linear(i1s[-1], size, (step, step)))
    u1 = torch.zeros_like(i0s[-1])
    u2 = torch.zeros_like(i0s[-1])
    up = params.flow_scale()
    for s in range(len(sizes) - 1, -1, -1):
        u1, u2 = _solve_level(i0s[s], i1s[s], u1, u2, params, schedule, checkpoint)
        if s > 0:
            u1 = scale_flow(resize_linear(u1, sizes[s - 1]), up)
            u2 = scale_flow(resize_linear(u2, sizes[s - 1]), up)
    return torch.stack([u1, u2], dim=-1)


def opencv_flow(prev: np.ndarray, next: np.ndarray, params: TVL1Params = TVL1Params()) -> np.ndarray:
    """OpenCV's flow for (B, H, W) uint8 arrays, one pair after another: (B, H, W, 2) float32."""
    out = np.empty((*prev.shape, 2), np.float32)
    for k in range(prev.shape[0]):
        out[k] = params.to_opencv().calc(prev[k], next[k], None)
    return out


__all__ = [
    "FLT_EPSILON",
    "Schedule",
    "centered_gradient",
    "check_params",
    "level_sizes",
    "opencv_flow",
    "resize_linear",
    "scale_flow",
    "tvl1_flow",
]
