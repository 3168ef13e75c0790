"""The written-out median networks of the Triton kernels: the torch port's networks, and OpenCV's medians."""

from __future__ import annotations

import inspect
import re

import cv2
import numpy as np
import pytest
import torch
import triton

from memdpc.preprocess.flow import tvl1_median
from memdpc.preprocess.flow.sorting_networks import selection_network
from memdpc.preprocess.flow.tvl1_triton import TILES, _median_kernel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("fn", "n"), [(tvl1_median.median9, 9), (tvl1_median.median25, 25)])
def test_the_written_networks_are_the_generated_ones(fn, n):
    source = inspect.getsource(fn.fn)
    written = []
    for stmt in re.split(r"[;\n]", source):
        stmt = stmt.strip()
        if m := re.fullmatch(r"v(\d+), v(\d+) = _cx\(v\1, v\2\)", stmt):
            written.append((int(m[1]), int(m[2]), True, True))
        elif m := re.fullmatch(r"v(\d+) = tl\.minimum\(v\1, v(\d+)\)", stmt):
            written.append((int(m[1]), int(m[2]), True, False))
        elif m := re.fullmatch(r"v(\d+) = tl\.maximum\(v(\d+), v\1\)", stmt):
            written.append((int(m[2]), int(m[1]), False, True))
    assert written == list(selection_network(n, (n // 2,)))
    taps = re.findall(r"v(\d+) = _tap\(ptr, base, y, x, (-?\d), (-?\d),", source)
    k = int(round(n**0.5))
    assert [(int(i), int(dy), int(dx)) for i, dy, dx in taps] == [
        (i, i // k - k // 2, i % k - k // 2) for i in range(n)
    ]
    assert re.search(rf"return v{n // 2}\n", source)


@pytest.mark.parametrize("ksize", [3, 5])
def test_median_kernel_equals_opencv_and_copies_stopped_pairs(ksize):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 6, (2, 2, 21, 26)).astype(np.float32)  # many ties
    x[:, 1] += rng.normal(0, 1, (2, 21, 26)).astype(np.float32)
    src = [torch.from_numpy(x[i]).to(DEVICE) for i in range(2)]  # u1, u2 of two pairs
    dst = [torch.full_like(s, -1.0) for s in src]
    flags = torch.tensor([1, 0], dtype=torch.int32, device=DEVICE)  # the second pair has stopped
    run = TILES[torch.device(DEVICE).type][3]
    _median_kernel[(triton.cdiv(21 * 26, run), 2)](*src, *dst, flags, 21, 26, K=ksize, BLOCK=run)
    for i in range(2):
        expected = cv2.medianBlur(x[i, 0], ksize)
        np.testing.assert_array_equal(dst[i][0].cpu().numpy(), expected)
        np.testing.assert_array_equal(dst[i][1].cpu().numpy(), x[i, 1])  # copied unchanged
