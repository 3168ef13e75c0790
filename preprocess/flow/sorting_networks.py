"""Comparator networks for elementwise order statistics (the TV-L1 median filters of every backend).

A comparator ``(lo, hi)`` puts the smaller of two values at ``lo`` and the larger at ``hi``; a network of them
run over ``n`` values (each an array, elementwise) sorts them. The medians of ``tvl1_torch``,
``tvl1_triton`` (``tvl1_median``) and ``tvl1_native`` run the pruned networks of :func:`selection_network`.
"""

from __future__ import annotations

import functools

__all__ = ["selection_network"]


def sorting_network(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort comparators (lo, hi) for ``n`` values (padded to 2^k with +inf)."""
    p = 1 << max(n - 1, 0).bit_length()
    comps, t = [], 1
    while t < p:
        k = t
        while k >= 1:
            for j in range(k % t, p - k, 2 * k):
                for i in range(min(k, p - j - k)):
                    if (i + j) // (2 * t) == (i + j + k) // (2 * t):
                        comps.append((i + j, i + j + k))
            k //= 2
        t *= 2
    return [(a, b) for a, b in comps if b < n]


@functools.cache
def selection_network(n: int, wanted: tuple[int, ...]) -> tuple[tuple[int, int, bool, bool], ...]:
    """The comparators of ``sorting_network(n)`` that the ranks ``wanted`` depend on, each with whether
    its min and its max are still needed (a comparator of which only one output is used costs one op)."""
    need, out = set(wanted), []
    for lo, hi in reversed(sorting_network(n)):
        if lo in need or hi in need:
            out.append((lo, hi, lo in need, hi in need))
            need |= {lo, hi}
    return tuple(reversed(out))
