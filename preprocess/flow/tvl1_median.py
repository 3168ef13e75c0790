"""The 3×3 and 5×5 medians of the Triton TV-L1 kernels, as selection networks written out.

Triton kernels cannot loop over Python lists of comparators, so the networks of the torch port
(``sorting_networks.selection_network(9, (4,))`` and ``(25, (12,))``: Batcher's odd-even merge sort, pruned
to the comparators the median depends on) are spelled out here, one window tap per ``v`` and four comparators
per line; ``tests/preprocess/flow/test_tvl1_median.py`` checks them against that generator and against OpenCV.
"""

# ruff: noqa: E702

import triton
import triton.language as tl

__all__ = ["median25", "median9"]


@triton.jit
def _cx(a, b):
    """A comparator: (min, max)."""
    return tl.minimum(a, b), tl.maximum(a, b)


@triton.jit
def _tap(ptr, base, y, x, dy, dx, H, W, inside):
    """The values at (y + dy, x + dx), clamped to the image (a replicated border)."""
    yy = tl.minimum(tl.maximum(y + dy, 0), H - 1)
    xx = tl.minimum(tl.maximum(x + dx, 0), W - 1)
    return tl.load(ptr + base + yy * W + xx, mask=inside, other=0.0)


@triton.jit
def median9(ptr, base, y, x, H, W, inside):
    """Median of the 3×3 windows around (y, x) (replicated border): the comparators of
    ``sorting_networks.selection_network(9, (4,))``, written out."""
    # fmt: off
    v0 = _tap(ptr, base, y, x, -1, -1, H, W, inside); v1 = _tap(ptr, base, y, x, -1, 0, H, W, inside)
    v2 = _tap(ptr, base, y, x, -1, 1, H, W, inside); v3 = _tap(ptr, base, y, x, 0, -1, H, W, inside)
    v4 = _tap(ptr, base, y, x, 0, 0, H, W, inside); v5 = _tap(ptr, base, y, x, 0, 1, H, W, inside)
    v6 = _tap(ptr, base, y, x, 1, -1, H, W, inside); v7 = _tap(ptr, base, y, x, 1, 0, H, W, inside)
    v8 = _tap(ptr, base, y, x, 1, 1, H, W, inside)
    v0, v1 = _cx(v0, v1); v2, v3 = _cx(v2, v3); v4, v5 = _cx(v4, v5); v6, v7 = _cx(v6, v7)
    v0, v2 = _cx(v0, v2); v1, v3 = _cx(v1, v3); v4, v6 = _cx(v4, v6); v5, v7 = _cx(v5, v7)
    v1, v2 = _cx(v1, v2); v5, v6 = _cx(v5, v6); v0, v4 = _cx(v0, v4); v1, v5 = _cx(v1, v5)
    v2, v6 = _cx(v2, v6); v3 = tl.minimum(v3, v7); v2, v4 = _cx(v2, v4); v3, v5 = _cx(v3, v5)
    v2 = tl.maximum(v1, v2); v3, v4 = _cx(v3, v4); v5 = tl.minimum(v5, v6); v8 = tl.maximum(v0, v8)
    v4 = tl.minimum(v4, v8); v4 = tl.maximum(v2, v4); v3 = tl.minimum(v3, v5); v4 = tl.maximum(v3, v4)
    # fmt: on
    return v4


@triton.jit
def median25(ptr, base, y, x, H, W, inside):
    """Median of the 5×5 windows around (y, x) (replicated border): the comparators of
    ``sorting_networks.selection_network(25, (12,))``, written out."""
    # fmt: off
    v0 = _tap(ptr, base, y, x, -2, -2, H, W, inside); v1 = _tap(ptr, base, y, x, -2, -1, H, W, inside)
    v2 = _tap(ptr, base, y, x, -2, 0, H, W, inside); v3 = _tap(ptr, base, y, x, -2, 1, H, W, inside)
    v4 = _tap(ptr, base, y, x, -2, 2, H, W, inside); v5 = _tap(ptr, base, y, x, -1, -2, H, W, inside)
    v6 = _tap(ptr, base, y, x, -1, -1, H, W, inside); v7 = _tap(ptr, base, y, x, -1, 0, H, W, inside)
    v8 = _tap(ptr, base, y, x, -1, 1, H, W, inside); v9 = _tap(ptr, base, y, x, -1, 2, H, W, inside)
    v10 = _tap(ptr, base, y, x, 0, -2, H, W, inside); v11 = _tap(ptr, base, y, x, 0, -1, H, W, inside)
    v12 = _tap(ptr, base, y, x, 0, 0, H, W, inside); v13 = _tap(ptr, base, y, x, 0, 1, H, W, inside)
    v14 = _tap(ptr, base, y, x, 0, 2, H, W, inside); v15 = _tap(ptr, base, y, x, 1, -2, H, W, inside)
    v16 = _tap(ptr, base, y, x, 1, -1, H, W, inside); v17 = _tap(ptr, base, y, x, 1, 0, H, W, inside)
    v18 = _tap(ptr, base, y, x, 1, 1, H, W, inside); v19 = _tap(ptr, base, y, x, 1, 2, H, W, inside)
    v20 = _tap(ptr, base, y, x, 2, -2, H, W, inside); v21 = _tap(ptr, base, y, x, 2, -1, H, W, inside)
    v22 = _tap(ptr, base, y, x, 2, 0, H, W, inside); v23 = _tap(ptr, base, y, x, 2, 1, H, W, inside)
    v24 = _tap(ptr, base, y, x, 2, 2, H, W, inside)
    v0, v1 = _cx(v0, v1); v2, v3 = _cx(v2, v3); v4, v5 = _cx(v4, v5); v6, v7 = _cx(v6, v7)
    v8, v9 = _cx(v8, v9); v10, v11 = _cx(v10, v11); v12, v13 = _cx(v12, v13); v14, v15 = _cx(v14, v15)
    v16, v17 = _cx(v16, v17); v18, v19 = _cx(v18, v19); v20, v21 = _cx(v20, v21); v22, v23 = _cx(v22, v23)
    v0, v2 = _cx(v0, v2); v1, v3 = _cx(v1, v3); v4, v6 = _cx(v4, v6); v5, v7 = _cx(v5, v7)
    v8, v10 = _cx(v8, v10); v9, v11 = _cx(v9, v11); v12, v14 = _cx(v12, v14); v13, v15 = _cx(v13, v15)
    v16, v18 = _cx(v16, v18); v17, v19 = _cx(v17, v19); v20, v22 = _cx(v20, v22); v21, v23 = _cx(v21, v23)
    v1, v2 = _cx(v1, v2); v5, v6 = _cx(v5, v6); v9, v10 = _cx(v9, v10); v13, v14 = _cx(v13, v14)
    v17, v18 = _cx(v17, v18); v21, v22 = _cx(v21, v22); v0, v4 = _cx(v0, v4); v1, v5 = _cx(v1, v5)
    v2, v6 = _cx(v2, v6); v3, v7 = _cx(v3, v7); v8, v12 = _cx(v8, v12); v9, v13 = _cx(v9, v13)
    v10, v14 = _cx(v10, v14); v11, v15 = _cx(v11, v15); v16, v20 = _cx(v16, v20); v17, v21 = _cx(v17, v21)
    v18, v22 = _cx(v18, v22); v19, v23 = _cx(v19, v23); v2, v4 = _cx(v2, v4); v3, v5 = _cx(v3, v5)
    v10, v12 = _cx(v10, v12); v11, v13 = _cx(v11, v13); v18, v20 = _cx(v18, v20); v19, v21 = _cx(v19, v21)
    v1, v2 = _cx(v1, v2); v3, v4 = _cx(v3, v4); v5, v6 = _cx(v5, v6); v9, v10 = _cx(v9, v10)
    v11, v12 = _cx(v11, v12); v13, v14 = _cx(v13, v14); v17, v18 = _cx(v17, v18); v19, v20 = _cx(v19, v20)
    v21, v22 = _cx(v21, v22); v0, v8 = _cx(v0, v8); v1, v9 = _cx(v1, v9); v2, v10 = _cx(v2, v10)
    v3, v11 = _cx(v3, v11); v4, v12 = _cx(v4, v12); v5, v13 = _cx(v5, v13); v6, v14 = _cx(v6, v14)
    v7 = tl.minimum(v7, v15); v16, v24 = _cx(v16, v24); v4, v8 = _cx(v4, v8); v5, v9 = _cx(v5, v9)
    v6, v10 = _cx(v6, v10); v7, v11 = _cx(v7, v11); v20, v24 = _cx(v20, v24); v2, v4 = _cx(v2, v4)
    v3, v5 = _cx(v3, v5); v6, v8 = _cx(v6, v8); v7, v9 = _cx(v7, v9); v10, v12 = _cx(v10, v12)
    v11, v13 = _cx(v11, v13); v18, v20 = _cx(v18, v20); v19, v21 = _cx(v19, v21); v22, v24 = _cx(v22, v24)
    v1, v2 = _cx(v1, v2); v3, v4 = _cx(v3, v4); v5, v6 = _cx(v5, v6); v7, v8 = _cx(v7, v8)
    v9, v10 = _cx(v9, v10); v11, v12 = _cx(v11, v12); v13 = tl.minimum(v13, v14); v17, v18 = _cx(v17, v18)
    v19, v20 = _cx(v19, v20); v21, v22 = _cx(v21, v22); v23, v24 = _cx(v23, v24); v16 = tl.maximum(v0, v16)
    v17 = tl.maximum(v1, v17); v18 = tl.maximum(v2, v18); v19 = tl.maximum(v3, v19); v20 = tl.maximum(v4, v20)
    v21 = tl.maximum(v5, v21); v6 = tl.minimum(v6, v22); v7 = tl.minimum(v7, v23); v8 = tl.minimum(v8, v24)
    v16 = tl.maximum(v8, v16); v17 = tl.maximum(v9, v17); v10 = tl.minimum(v10, v18); v11 = tl.minimum(v11, v19)
    v12 = tl.minimum(v12, v20); v13 = tl.minimum(v13, v21); v10 = tl.maximum(v6, v10); v11 = tl.maximum(v7, v11)
    v12 = tl.minimum(v12, v16); v13 = tl.minimum(v13, v17); v12 = tl.maximum(v10, v12); v11 = tl.minimum(v11, v13)
    v12 = tl.maximum(v11, v12)
    # fmt: on
    return v12
