"""The example families by name (``memdpc quickstart --data``): each one's config and the function that
writes it. The built-in ``synthetic`` family comes first (the default); ``photos`` is the held-out one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memdpc.preprocess.examples.layout import ExampleConfig
from memdpc.preprocess.examples.photos import PhotoConfig, make_photos
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic

__all__ = ["EXAMPLE_FAMILIES"]

EXAMPLE_FAMILIES: dict[str, tuple[type[ExampleConfig], Callable[..., Path]]] = {
    "synthetic": (SyntheticConfig, make_synthetic),
    "photos": (PhotoConfig, make_photos),
}
