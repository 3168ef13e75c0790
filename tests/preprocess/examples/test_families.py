"""example_families.py: the example families by name, each with its config and the function that writes it
(what ``memdpc quickstart --data`` looks up)."""

from __future__ import annotations

import pytest

from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.preprocess.examples.layout import ExampleConfig


def test_the_built_in_family_comes_first():
    assert list(EXAMPLE_FAMILIES) == [
        "synthetic",
        "photos",
        "directions",
    ]  # the first: the quickstart's default


@pytest.mark.parametrize("name", list(EXAMPLE_FAMILIES))
def test_each_family_writes_its_config_in_the_ucf101_layout(tmp_path, name):
    config, make = EXAMPLE_FAMILIES[name]
    cfg = config(videos_per_class=2, frames=4, size=16, num_classes=2, seed=0)
    assert isinstance(cfg, ExampleConfig)
    records = build_index(make(tmp_path / name, cfg), "ucf101", 1)
    assert len(records) == 2 * 2
    assert sorted({r.label_name for r in records}) == sorted(cfg.classes[:2])
