"""The example families by name (``memdpc quickstart --data``): each one's config and the function that
writes it. The built-in ``synthetic`` family comes first (the default); ``photos`` is the held-out one;
``directions`` the one whose classes are directions of motion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memdpc.preprocess.examples.directions import DirectionConfig, make_directions
from memdpc.preprocess.examples.layout import ExampleConfig
from memdpc.preprocess.examples.photos import PhotoConfig, make_photos
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic

__all__ = ["EXAMPLE_FAMILIES", "POOL_SEED"]

EXAMPLE_FAMILIES: dict[str, tuple[type[ExampleConfig], Callable[..., Path]]] = {
    "synthetic": (SyntheticConfig, make_synthetic),
    "photos": (PhotoConfig, make_photos),
    "directions": (DirectionConfig, make_directions),
}
# a pool of unlabelled videos to pretrain on is a draw of its family seeded this far from the labelled draw's,
# apart from every labelled seed (``memdpc quickstart --recipe``, the learning scan)
POOL_SEED = 1000
