"""Dual TV-L1 on the CPU as compiled code (numba): OpenCV's CPU ``DualTVL1OpticalFlow``, bit for bit.

The arithmetic of the Triton kernels (``tvl1_triton``), which follow OpenCV operation by operation, as native
code for one core: the same pyramid (bilinear ``cv::resize``), bicubic warp (``cv::remap``, A = -0.75, fused
multiply-adds as OpenCV 5), 3×3 / 5×5 median (the selection networks of ``sorting_networks``, written out),
and per-pair stopping rule. float32 throughout where OpenCV uses it, no fast-math: numba compiles without
contraction into fused multiply-adds or reassociation, except where asked (``_fma``, ``_sum64``).

Per inner iteration one pass over the rows does estimateV, divergence, estimateU and the squared update of
row y, then forwardGradient and the dual update of row y − 1 (which needs the new u of rows y − 1 and y), so
each field is read and written once per iteration; vectorised by LLVM (AVX2 / AVX-512 where the CPU has them).

OpenCV's stopping rule compares the squared updates summed in float, pixel after pixel, with ε²·H·W. That
sum is serial; :func:`_above` decides from a vectorised double sum and the float sum's error bound, and runs
the float sum only when the double sum lies within that bound of the threshold.

Compiled once per machine (numba's cache next to this file, or ``NUMBA_CACHE_DIR``); a worker process loads
it.
``MEMDPC_NATIVE_FLOW=0`` switches the backend off (``--flow-backend auto`` then takes OpenCV, with a note).
"""

# ruff: noqa: E702

from __future__ import annotations

import functools
import os

import cv2
import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from memdpc.common.errors import UserError
from memdpc.preprocess.flow.tvl1_params import TESTED_OPENCV, TVL1Params, level_sizes

ENV_SWITCH = "MEMDPC_NATIVE_FLOW"  # "0": the native backend is unavailable
F32 = np.float32
FLT_EPSILON = F32(np.finfo(np.float32).eps)
PAD = 4  # zeros around the warped images: a 4×4 window clamped to it reads only zeros
WORKSPACE_FIELDS = 12  # p11, p21, p12, p22, I1wx, I1wy, ρ_c, error terms, 3 warp sources, scratch
GUARD = 4096  # floats (16 KB) around the pyramid and the fields: see Workspace
JIT = {"cache": True, "error_model": "numpy"}  # numpy: a division by zero gives inf, as in C, unchecked


@intrinsic
def _fma(typingctx, a, b, c):
    """float32 fused multiply-add ``a · b + c`` (one rounding)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


# ------------------------------------------------------------------------------------------- resampling
@njit(**JIT)
def _linear_taps(n_src, n_dst, scale):
    """Source indices (left, right) and float32 right weights of ``cv::resize`` INTER_LINEAR along one axis
    (as ``tvl1_torch._linear_taps``: positions in double, OpenCV 5's clamping at the edges)."""
    i0 = np.empty(n_dst, np.int64)
    i1 = np.empty(n_dst, np.int64)
    f = np.empty(n_dst, np.float32)
    shrink = scale > 1.0 and n_src > 1
    for d in range(n_dst):
        pos = (d + 0.5) * scale - 0.5
        fl = np.floor(pos)
        s = int(fl)
        fr = F32(pos - fl)
        if s < 0:
            fr, s = F32(0.0), 0
        elif s >= n_src - 1:
            fr, s = (F32(1.0), n_src - 2) if shrink else (F32(0.0), n_src - 1)
        i0[d], i1[d], f[d] = s, min(s + 1, n_src - 1), fr
    return i0, i1, f


@njit(**JIT)
def _resize(src, out, scratch, sy, sx):
    """``cv::resize(src, out, INTER_LINEAR)`` of float32 images, source steps per destination pixel (sy, sx):
    along x, then along y, each ``fma(b − a, t, a)``. ``scratch``: at least src rows × out columns floats."""
    h, w = src.shape
    nh, nw = out.shape
    x0, x1, a = _linear_taps(w, nw, sx)
    y0, y1, b = _linear_taps(h, nh, sy)
    rows = scratch[: h * nw].reshape((h, nw))
    for y in range(h):
        for x in range(nw):
            lo = src[y, x0[x]]
            rows[y, x] = _fma(src[y, x1[x]] - lo, a[x], lo)
    for y in range(nh):
        for x in range(nw):
            lo = rows[y0[y], x]
            out[y, x] = _fma(rows[y1[y], x] - lo, b[y], lo)


@njit(**JIT)
def _warp_sources(i1, imgs):
    """I1 and its centred gradient (OpenCV's ``centeredGradient``: 0.5 · (next − previous), replicated
    border) into the three planes of ``imgs``, each inside a border of ``PAD`` zeros."""
    h, w = i1.shape
    imgs[:] = 0.0
    half = F32(0.5)
    for y in range(h):
        yp, yn = max(y - 1, 0), min(y + 1, h - 1)
        for x in range(w):
            xp, xn = max(x - 1, 0), min(x + 1, w - 1)
            imgs[0, y + PAD, x + PAD] = i1[y, x]
            imgs[1, y + PAD, x + PAD] = half * (i1[y, xn] - i1[y, xp])
            imgs[2, y + PAD, x + PAD] = half * (i1[yn, x] - i1[yp, x])


@njit(inline="always", **JIT)
def _cubic_weights(t):
    """OpenCV 5's bicubic weights (A = -0.75) of the 4 taps at sub-pixel offset ``t``, rounded as it does."""
    s = F32(1.0) - t
    c0 = (t * (s * s)) * F32(-0.75)
    c3 = (s * (t * t)) * F32(-0.75)
    c1 = _fma(_fma(F32(1.25), t, F32(-2.25)), t * t, F32(1.0))
    return c0, c1, ((F32(1.0) - c0) - c1) - c3, c3


@njit(inline="always", **JIT)
def _chain(t0, t1, t2, t3, c0, c1, c2, c3):
    """4 taps interpolated as OpenCV's remap does: a chain of fused multiply-adds."""
    return _fma(t3, c3, _fma(t2, c2, _fma(t1, c1, t0 * c0)))


@njit(**JIT)
def _warp(i0, imgs, u1, u2, wx, wy, rc):
    """I1, I1x, I1y (``imgs``, zero-padded) warped by u (bicubic, zero outside the image), then I1wx, I1wy
    and ρ_c = I1w − I1wx·u1 − I1wy·u2 − I0 (OpenCV's remap + calcGradRho)."""
    h, w = i0.shape
    for y in range(h):
        for x in range(w):
            a, b = u1[y, x], u2[y, x]
            mx = F32(x) + a
            my = F32(y) + b
            fx, fy = np.floor(mx), np.floor(my)
            cx0, cx1, cx2, cx3 = _cubic_weights(mx - fx)
            cy0, cy1, cy2, cy3 = _cubic_weights(my - fy)
            # top-left tap of the 4×4 window in the padded planes; clamped where the whole window is outside
            ix = int(min(max(fx, F32(1 - PAD)), F32(w + 1))) + PAD - 1
            iy = int(min(max(fy, F32(1 - PAD)), F32(h + 1))) + PAD - 1
            v, gx, gy = F32(0.0), F32(0.0), F32(0.0)
            for c in range(3):
                s = F32(0.0)
                for i in range(4):
                    yy = iy + i
                    t0, t1, t2, t3 = (
                        imgs[c, yy, ix],
                        imgs[c, yy, ix + 1],
                        imgs[c, yy, ix + 2],
                        imgs[c, yy, ix + 3],
                    )
                    row = _chain(t0, t1, t2, t3, cx0, cx1, cx2, cx3)
                    if i == 0:
                        s = row * cy0
                    else:
                        s = _fma(row, cy1 if i == 1 else (cy2 if i == 2 else cy3), s)
                if c == 0:
                    v = s
                elif c == 1:
                    gx = s
                else:
                    gy = s
            wx[y, x] = gx
            wy[y, x] = gy
            rc[y, x] = ((v - gx * a) - gy * b) - i0[y, x]


# --------------------------------------------------------------------------------------------- medians
@njit(inline="always", **JIT)
def _cx(a, b):
    """A comparator: (min, max)."""
    return min(a, b), max(a, b)


@njit(**JIT)
def _median9(p, out):
    """3×3 median of ``p`` (the image with a replicated border of 1) into ``out``: the comparators of
    ``sorting_networks.selection_network(9, (4,))``, written out."""
    h, w = out.shape
    for y in range(h):
        r0, r1, r2 = p[y], p[y + 1], p[y + 2]
        for x in range(w):
            # fmt: off
            v0 = r0[x]; v1 = r0[x + 1]; v2 = r0[x + 2]; v3 = r1[x]; v4 = r1[x + 1]; v5 = r1[x + 2]; v6 = r2[x]
            v7 = r2[x + 1]; v8 = r2[x + 2]
            v0, v1 = _cx(v0, v1); v2, v3 = _cx(v2, v3); v4, v5 = _cx(v4, v5); v6, v7 = _cx(v6, v7)
            v0, v2 = _cx(v0, v2); v1, v3 = _cx(v1, v3); v4, v6 = _cx(v4, v6); v5, v7 = _cx(v5, v7)
            v1, v2 = _cx(v1, v2); v5, v6 = _cx(v5, v6); v0, v4 = _cx(v0, v4); v1, v5 = _cx(v1, v5)
            v2, v6 = _cx(v2, v6); v3 = min(v3, v7); v2, v4 = _cx(v2, v4); v3, v5 = _cx(v3, v5)
            v2 = max(v1, v2); v3, v4 = _cx(v3, v4); v5 = min(v5, v6); v8 = max(v0, v8); v4 = min(v4, v8)
            v4 = max(v2, v4); v3 = min(v3, v5); v4 = max(v3, v4)
            # fmt: on
            out[y, x] = v4


@njit(**JIT)
def _median25(p, out):
    """5×5 median of ``p`` (the image with a replicated border of 2) into ``out``: the comparators of
    ``sorting_networks.selection_network(25, (12,))``, written out."""
    h, w = out.shape
    for y in range(h):
        r0, r1, r2, r3, r4 = p[y], p[y + 1], p[y + 2], p[y + 3], p[y + 4]
        for x in range(w):
            # fmt: off
            v0 = r0[x]; v1 = r0[x + 1]; v2 = r0[x + 2]; v3 = r0[x + 3]; v4 = r0[x + 4]; v5 = r1[x]
            v6 = r1[x + 1]; v7 = r1[x + 2]; v8 = r1[x + 3]; v9 = r1[x + 4]; v10 = r2[x]; v11 = r2[x + 1]
            v12 = r2[x + 2]; v13 = r2[x + 3]; v14 = r2[x + 4]; v15 = r3[x]; v16 = r3[x + 1]; v17 = r3[x + 2]
            v18 = r3[x + 3]; v19 = r3[x + 4]; v20 = r4[x]; v21 = r4[x + 1]; v22 = r4[x + 2]; v23 = r4[x + 3]
            v24 = r4[x + 4]
            v0, v1 = _cx(v0, v1); v2, v3 = _cx(v2, v3); v4, v5 = _cx(v4, v5); v6, v7 = _cx(v6, v7)
            v8, v9 = _cx(v8, v9); v10, v11 = _cx(v10, v11); v12, v13 = _cx(v12, v13); v14, v15 = _cx(v14, v15)
            v16, v17 = _cx(v16, v17); v18, v19 = _cx(v18, v19); v20, v21 = _cx(v20, v21)
            v22, v23 = _cx(v22, v23); v0, v2 = _cx(v0, v2); v1, v3 = _cx(v1, v3); v4, v6 = _cx(v4, v6)
            v5, v7 = _cx(v5, v7); v8, v10 = _cx(v8, v10); v9, v11 = _cx(v9, v11); v12, v14 = _cx(v12, v14)
            v13, v15 = _cx(v13, v15); v16, v18 = _cx(v16, v18); v17, v19 = _cx(v17, v19)
            v20, v22 = _cx(v20, v22); v21, v23 = _cx(v21, v23); v1, v2 = _cx(v1, v2); v5, v6 = _cx(v5, v6)
            v9, v10 = _cx(v9, v10); v13, v14 = _cx(v13, v14); v17, v18 = _cx(v17, v18)
            v21, v22 = _cx(v21, v22); v0, v4 = _cx(v0, v4); v1, v5 = _cx(v1, v5); v2, v6 = _cx(v2, v6)
            v3, v7 = _cx(v3, v7); v8, v12 = _cx(v8, v12); v9, v13 = _cx(v9, v13); v10, v14 = _cx(v10, v14)
            v11, v15 = _cx(v11, v15); v16, v20 = _cx(v16, v20); v17, v21 = _cx(v17, v21)
            v18, v22 = _cx(v18, v22); v19, v23 = _cx(v19, v23); v2, v4 = _cx(v2, v4); v3, v5 = _cx(v3, v5)
            v10, v12 = _cx(v10, v12); v11, v13 = _cx(v11, v13); v18, v20 = _cx(v18, v20)
            v19, v21 = _cx(v19, v21); v1, v2 = _cx(v1, v2); v3, v4 = _cx(v3, v4); v5, v6 = _cx(v5, v6)
            v9, v10 = _cx(v9, v10); v11, v12 = _cx(v11, v12); v13, v14 = _cx(v13, v14)
            v17, v18 = _cx(v17, v18); v19, v20 = _cx(v19, v20); v21, v22 = _cx(v21, v22); v0, v8 = _cx(v0, v8)
            v1, v9 = _cx(v1, v9); v2, v10 = _cx(v2, v10); v3, v11 = _cx(v3, v11); v4, v12 = _cx(v4, v12)
            v5, v13 = _cx(v5, v13); v6, v14 = _cx(v6, v14); v7 = min(v7, v15); v16, v24 = _cx(v16, v24)
            v4, v8 = _cx(v4, v8); v5, v9 = _cx(v5, v9); v6, v10 = _cx(v6, v10); v7, v11 = _cx(v7, v11)
            v20, v24 = _cx(v20, v24); v2, v4 = _cx(v2, v4); v3, v5 = _cx(v3, v5); v6, v8 = _cx(v6, v8)
            v7, v9 = _cx(v7, v9); v10, v12 = _cx(v10, v12); v11, v13 = _cx(v11, v13); v18, v20 = _cx(v18, v20)
            v19, v21 = _cx(v19, v21); v22, v24 = _cx(v22, v24); v1, v2 = _cx(v1, v2); v3, v4 = _cx(v3, v4)
            v5, v6 = _cx(v5, v6); v7, v8 = _cx(v7, v8); v9, v10 = _cx(v9, v10); v11, v12 = _cx(v11, v12)
            v13 = min(v13, v14); v17, v18 = _cx(v17, v18); v19, v20 = _cx(v19, v20); v21, v22 = _cx(v21, v22)
            v23, v24 = _cx(v23, v24); v16 = max(v0, v16); v17 = max(v1, v17); v18 = max(v2, v18)
            v19 = max(v3, v19); v20 = max(v4, v20); v21 = max(v5, v21); v6 = min(v6, v22); v7 = min(v7, v23)
            v8 = min(v8, v24); v16 = max(v8, v16); v17 = max(v9, v17); v10 = min(v10, v18)
            v11 = min(v11, v19); v12 = min(v12, v20); v13 = min(v13, v21); v10 = max(v6, v10)
            v11 = max(v7, v11); v12 = min(v12, v16); v13 = min(v13, v17); v12 = max(v10, v12)
            v11 = min(v11, v13); v12 = max(v11, v12)
            # fmt: on
            out[y, x] = v12


@njit(**JIT)
def _median(u, k, scratch):
    """OpenCV's ``medianBlur(u, u, k)`` for k = 3 or 5 (replicated border), in place; ``scratch`` holds at
    least (h + 4)·(w + 4) floats."""
    h, w = u.shape
    r = k // 2
    p = scratch[: (h + 2 * r) * (w + 2 * r)].reshape((h + 2 * r, w + 2 * r))
    for y in range(h + 2 * r):
        yy = min(max(y - r, 0), h - 1)
        for x in range(w + 2 * r):
            p[y, x] = u[yy, min(max(x - r, 0), w - 1)]
    if k == 3:
        _median9(p, u)
    else:
        _median25(p, u)


# ---------------------------------------------------------------------------------------- the iteration
@njit(inline="always", **JIT)
def _primal(gx, gy, o1, o2, rc, div1, div2, l_t, theta):
    """estimateV and estimateU at one pixel: the new (u1, u2) and the squared update, rounded as OpenCV."""
    rho = rc + (gx * o1 + gy * o2)
    grad = gx * gx + gy * gy
    lg = l_t * grad
    fi = -rho / grad
    if rho < -lg:
        d1, d2 = l_t * gx, l_t * gy
    elif rho > lg:
        d1, d2 = (-l_t) * gx, (-l_t) * gy
    elif grad > FLT_EPSILON:
        d1, d2 = fi * gx, fi * gy
    else:
        d1, d2 = F32(0.0), F32(0.0)
    n1 = (o1 + d1) + theta * div1
    n2 = (o2 + d2) + theta * div2
    e1, e2 = n1 - o1, n2 - o2
    return n1, n2, e1 * e1 + e2 * e2


@njit(inline="always", **JIT)
def _dual(ux, uy, pa, pb, taut):
    """estimateDualVariables at one pixel, one flow component (the hypot in double, rounded once to float)."""
    g = F32(np.sqrt(np.float64(ux) * np.float64(ux) + np.float64(uy) * np.float64(uy)))
    ng = F32(1.0) + taut * g
    return (pa + taut * ux) / ng, (pb + taut * uy) / ng


@njit(**JIT)
def _iteration(u1, u2, p11, p12, p21, p22, wx, wy, rc, e, l_t, theta, taut):
    """One inner iteration in one pass: per row y, estimateV + divergence + estimateU (the squared updates
    into ``e``, row-major), then forwardGradient + estimateDualVariables of row y − 1, which needs the new u
    of rows y − 1 and y. ``p12`` and ``p22`` carry a row of zeros on top (array row y + 1 is field row y),
    so the first row's divergence needs no case of its own."""
    h, w = u1.shape
    zero = F32(0.0)
    for y in range(h + 1):
        if y < h:
            q = y + 1
            div1 = (p11[y, 0] + p12[q, 0]) - p12[y, 0]  # OpenCV's first column: (v1 + v2) − v2[y − 1]
            div2 = (p21[y, 0] + p22[q, 0]) - p22[y, 0]
            u1[y, 0], u2[y, 0], e[y * w] = _primal(
                wx[y, 0], wy[y, 0], u1[y, 0], u2[y, 0], rc[y, 0], div1, div2, l_t, theta
            )
            for x in range(1, w):
                div1 = (p11[y, x] - p11[y, x - 1]) + (p12[q, x] - p12[y, x])
                div2 = (p21[y, x] - p21[y, x - 1]) + (p22[q, x] - p22[y, x])
                u1[y, x], u2[y, x], e[y * w + x] = _primal(
                    wx[y, x], wy[y, x], u1[y, x], u2[y, x], rc[y, x], div1, div2, l_t, theta
                )
        if y > 0:
            r = y - 1
            q, d = y, min(y, h - 1)  # the row of p12 / p22; the next row of u (the last row's is itself: 0)
            for x in range(w - 1):
                p11[r, x], p12[q, x] = _dual(
                    u1[r, x + 1] - u1[r, x], u1[d, x] - u1[r, x], p11[r, x], p12[q, x], taut
                )
                p21[r, x], p22[q, x] = _dual(
                    u2[r, x + 1] - u2[r, x], u2[d, x] - u2[r, x], p21[r, x], p22[q, x], taut
                )
            x = w - 1
            p11[r, x], p12[q, x] = _dual(zero, u1[d, x] - u1[r, x], p11[r, x], p12[q, x], taut)
            p21[r, x], p22[q, x] = _dual(zero, u2[d, x] - u2[r, x], p21[r, x], p22[q, x], taut)


@njit(fastmath={"reassoc"}, **JIT)
def _sum64(e):
    """The values of ``e`` summed in double in any order (vectorised)."""
    s = 0.0
    for i in range(e.size):
        s += np.float64(e[i])
    return s


@njit(**JIT)
def _above(e, scaled_eps):
    """Whether OpenCV's error — the values of ``e`` summed in float one after another — exceeds
    ``scaled_eps``. That float sum lies within γ_n·Σe (γ_n = n·u / (1 − n·u), u = 2⁻²⁴) of the exact sum,
    so the double sum decides unless it is within that margin of the threshold; only then does the serial
    float sum run. NaN or inf: the float sum decides, as in OpenCV."""
    n = e.size
    nu = n * 2.0**-24
    if nu < 0.5:
        s = _sum64(e)
        margin = s * (nu / (1.0 - nu) + n * 2.0**-52)  # and the double sum's own rounding
        if s - margin > scaled_eps:
            return True
        if s + margin <= scaled_eps:
            return False
    error = F32(0.0)
    for i in range(n):
        error += e[i]
    return error > scaled_eps


# ------------------------------------------------------------------------------------------- the solver
@njit(**JIT)
def _solve_level(i0, i1, u1, u2, ws, warps, outer, inner, k, l_t, theta, taut, scaled_eps):
    """OpenCV's ``procOneScale``: all warps at one pyramid level; u1 and u2 are updated in place. ``ws``
    holds the level's fields (``WORKSPACE_FIELDS`` slots of at least (H + 8)·(W + 8) floats)."""
    h, w = i0.shape
    a, n = h * w, ws.size // WORKSPACE_FIELDS  # n: floats per field
    p11 = ws[0:a].reshape((h, w))
    p21 = ws[n : n + a].reshape((h, w))
    p12 = ws[2 * n : 2 * n + a + w].reshape((h + 1, w))
    p22 = ws[3 * n : 3 * n + a + w].reshape((h + 1, w))
    wx = ws[4 * n : 4 * n + a].reshape((h, w))
    wy = ws[5 * n : 5 * n + a].reshape((h, w))
    rc = ws[6 * n : 6 * n + a].reshape((h, w))
    e = ws[7 * n : 7 * n + a]
    hp, wp = h + 2 * PAD, w + 2 * PAD
    imgs = ws[8 * n : 8 * n + 3 * hp * wp].reshape((3, hp, wp))
    scratch = ws[11 * n :]
    for f in (p11, p21, p12, p22):
        f[:] = 0.0
    _warp_sources(i1, imgs)
    for _ in range(warps):
        _warp(i0, imgs, u1, u2, wx, wy, rc)
        running = True  # OpenCV restarts its error at FLT_MAX for every warp
        n_outer = 0
        while running and n_outer < outer:
            if k > 1:
                _median(u1, k, scratch)
                _median(u2, k, scratch)
            n_inner = 0
            while running and n_inner < inner:
                _iteration(u1, u2, p11, p12, p21, p22, wx, wy, rc, e, l_t, theta, taut)
                running = _above(e, scaled_eps)
                n_inner += 1
            n_outer += 1


@njit(**JIT)
def _flow(prev, nxt, out, sizes, offsets, pyr, ws, step, up, warps, outer, inner, k, l_t, theta, taut, eps):
    """The flow of one pair into ``out`` (H, W, 2). Level s is ``sizes[s]`` at ``offsets[s]`` of the rows of
    ``pyr`` (I0, I1, u1, u2 of every level); ``ws``: the levels' scratch."""
    n = sizes.shape[0]
    scratch = ws[(WORKSPACE_FIELDS - 1) * (ws.size // WORKSPACE_FIELDS) :]

    def level(row, s):
        return pyr[row, offsets[s] : offsets[s] + sizes[s, 0] * sizes[s, 1]].reshape(
            (sizes[s, 0], sizes[s, 1])
        )

    level(0, 0)[:] = prev
    level(1, 0)[:] = nxt
    for s in range(1, n):
        _resize(level(0, s - 1), level(0, s), scratch, step, step)
        _resize(level(1, s - 1), level(1, s), scratch, step, step)
    level(2, n - 1)[:] = 0.0
    level(3, n - 1)[:] = 0.0
    for s in range(n - 1, -1, -1):
        h, w = sizes[s, 0], sizes[s, 1]
        scaled_eps = F32(eps * eps * (h * w))
        u1, u2 = level(2, s), level(3, s)
        _solve_level(
            level(0, s), level(1, s), u1, u2, ws, warps, outer, inner, k, l_t, theta, taut, scaled_eps
        )
        if s > 0:
            nh, nw = sizes[s - 1, 0], sizes[s - 1, 1]
            for row, u in ((2, u1), (3, u2)):
                finer = level(row, s - 1)
                _resize(u, finer, scratch, h / nh, w / nw)
                for y in range(nh):
                    for x in range(nw):
                        finer[y, x] = F32(np.float64(finer[y, x]) * up)  # exact in double, rounded once
    out[:, :, 0] = level(2, 0)
    out[:, :, 1] = level(3, 0)


# ---------------------------------------------------------------------------------------------- the API
class Workspace:
    """The buffers of one frame size, allocated once and reused pair after pair (warm in the caches).

    The pyramid (``pyr``) and the fields (``ws``) are views of one buffer with ``GUARD`` floats before, between
    and after them. Where the allocator put them end to end, the last level's u2 (the pyramid's end) ran straight
    into p11 (the fields' start), and the inner iteration, which streams both, ran several times slower at that
    level (docs/benchmarks.md has the figures); the guards make the layout the same whatever the allocator does."""

    def __init__(self, height: int, width: int, params: TVL1Params) -> None:
        self.shape = (height, width)
        sizes = level_sizes(height, width, params)
        self.sizes = np.array(sizes, np.int64)
        self.offsets = np.cumsum([0] + [h * w for h, w in sizes[:-1]]).astype(np.int64)
        n_pyr = 4 * sum(h * w for h, w in sizes)
        n_ws = WORKSPACE_FIELDS * (height + 2 * PAD) * (width + 2 * PAD)
        self.buffer = np.empty(n_pyr + n_ws + 3 * GUARD, np.float32)
        self.pyr = self.buffer[GUARD : GUARD + n_pyr].reshape((4, n_pyr // 4))
        self.ws = self.buffer[2 * GUARD + n_pyr : 2 * GUARD + n_pyr + n_ws]


def check_params(params: TVL1Params) -> None:
    """Refuse parameters the native backend does not support (ValueError): ``gamma`` ≠ 0 (OpenCV's
    illumination term), a median filter other than off (0, 1), 3 or 5, or an empty pyramid or warp count."""
    if params.gamma != 0.0:
        raise ValueError("gamma != 0 is not supported by the native backend (use --flow-backend opencv)")
    if params.median_filtering not in (0, 1, 3, 5):
        raise ValueError("median_filtering must be 0/1 (off), 3 or 5 (as OpenCV for float)")
    if not 0 < params.scale_step < 1 or params.scales < 1 or params.warps < 1:
        raise ValueError("need 0 < scale_step < 1, scales ≥ 1 and warps ≥ 1")


def tvl1_flow(
    prev: np.ndarray, nxt: np.ndarray, params: TVL1Params = TVL1Params(), workspace: Workspace | None = None
) -> np.ndarray:
    """OpenCV's CPU dual TV-L1 flow from ``prev`` to ``next``, (H, W) uint8 each → (H, W, 2) float32 (x, y)
    pixels; bit for bit. ``workspace``: buffers of this frame size to reuse (default: new ones)."""
    if prev.shape != nxt.shape or prev.ndim != 2 or prev.dtype != np.uint8 or nxt.dtype != np.uint8:
        raise ValueError(
            f"tvl1_flow: need two (H, W) uint8 frames of one shape, got {prev.shape} {prev.dtype} and "
            f"{nxt.shape} {nxt.dtype}"
        )
    check_params(params)
    prev, nxt = np.ascontiguousarray(prev), np.ascontiguousarray(nxt)  # one compiled signature for all frames
    if workspace is None or workspace.shape != prev.shape:
        workspace = Workspace(*prev.shape, params)
    out = np.empty((*prev.shape, 2), np.float32)
    _flow(
        prev,
        nxt,
        out,
        workspace.sizes,
        workspace.offsets,
        workspace.pyr,
        workspace.ws,
        1.0 / params.scale_step,
        params.flow_scale(),
        params.warps,
        params.outer_iterations,
        params.inner_iterations,
        params.median_filtering,
        F32(params.lambda_ * params.theta),
        F32(params.theta),
        F32(params.tau / params.theta),
        params.epsilon,
    )
    return out


@functools.cache
def unavailable_reason(params: TVL1Params = TVL1Params()) -> str | None:
    """Why the native backend cannot run here (None: it can): switched off by ``MEMDPC_NATIVE_FLOW=0``, or
    its compilation fails, or its flow on a check pair (with ``params``' pyramid step and median) differs
    from the installed OpenCV's by a bit."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return f"switched off by {ENV_SWITCH}=0"
    rng = np.random.default_rng(0)
    base = cv2.GaussianBlur(rng.integers(0, 256, (40, 44), dtype=np.uint8), (5, 5), 1.5)
    pair = base[2:38, 1:41], base[:36, 3:43]  # a 2-px diagonal shift
    check = TVL1Params(
        scales=2,
        warps=2,
        outer_iterations=2,
        inner_iterations=10,
        scale_step=params.scale_step,
        median_filtering=params.median_filtering,
    )
    try:
        ours = tvl1_flow(*pair, check)
    except Exception as e:  # any failure to compile or run means: not usable here
        return f"the native TV-L1 failed: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
    if not np.array_equal(ours, check.to_opencv().calc(*pair, None)):
        tested = ", ".join(TESTED_OPENCV)
        return f"the native TV-L1 differs from OpenCV {cv2.__version__}'s here (tested against {tested})"
    return None


class NativeTVL1:
    """The native TV-L1 as a flow backend: one pair at a time on one core (one worker process per core, as
    the opencv backend), buffers reused while the frame size stays the same."""

    batch_size = 1

    def __init__(self, params: TVL1Params = TVL1Params(), device: str = "cpu") -> None:
        if device != "cpu":
            raise UserError(f"the native flow backend runs on the CPU only, not on '{device}'")
        try:
            check_params(params)
        except ValueError as e:
            raise UserError(f"flow backend native: {e}") from None
        reason = unavailable_reason(params)
        if reason:
            raise UserError(f"flow backend native is unavailable: {reason} (use --flow-backend opencv)")
        self._params, self._workspace = params, None

    def __call__(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        # (B, H, W) uint8 ×2 -> (B, H, W, 2) float32
        if self._workspace is None or self._workspace.shape != prev.shape[1:]:
            self._workspace = Workspace(*prev.shape[1:], self._params)
        return np.stack(
            [tvl1_flow(a, b, self._params, self._workspace) for a, b in zip(prev, nxt, strict=True)]
        )


__all__ = ["ENV_SWITCH", "NativeTVL1", "Workspace", "tvl1_flow", "unavailable_reason"]
