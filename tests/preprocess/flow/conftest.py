"""The flow tests' Triton interpreter rounds ``tl.fma`` once, as a GPU does.

Triton's interpreter before 3.9 computes ``tl.fma(a, b, c)`` as ``a * b + c`` in float32, rounding twice,
where a GPU rounds once. requirements.lock holds the Triton that torch's release pins (3.7.1), so without this
the interpreter checks of the kernels (against the torch port, which fuses) would measure that difference
rather than the kernels. Where the interpreter rounds twice, these tests give it an fma that rounds once (the
float64 product of two floats is exact; the sum rounds through float64, as the torch port's own fallback does).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter


@triton.jit
def _fma_kernel(a_ptr, b_ptr, c_ptr, out_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(out_ptr + i, tl.fma(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i)))


def interpreter_fuses_fma() -> bool:
    """Whether the interpreter's ``tl.fma`` rounds once, checked on random floats where the two ways differ."""
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(256, generator=g) for _ in range(3))
    out = torch.empty(256)
    _fma_kernel[(1,)](a, b, c, out, 256)
    return torch.equal(out, (a.double() * b.double() + c.double()).float())


def _fma_rounding_once(self, x, y, z):
    if z.data.dtype != np.float32:
        return _unfused(self, x, y, z)
    exact = x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)
    return interpreter.TensorHandle(exact.astype(np.float32), z.dtype.scalar)


_unfused = interpreter.InterpreterBuilder.create_fma
if not torch.cuda.is_available() and not interpreter_fuses_fma():
    interpreter.InterpreterBuilder.create_fma = _fma_rounding_once
    assert interpreter_fuses_fma(), f"Triton {triton.__version__}: the interpreter's fma could not be fused"
