"""model/names.py: the registry's names, ``<family>_r<depth>``, and splitting them."""

from __future__ import annotations

import pytest

from memdpc.model import MemDPC, create_model
from memdpc.model.names import DEPTHS, FAMILIES, MODEL_NAMES, PRETRAIN_FAMILIES, PRETRAIN_NAMES, split_name

from .conftest import TINY


def test_names_are_every_family_at_every_depth():
    assert MODEL_NAMES == (
        "memdpc_r18",
        "memdpc_r34",
        "dpc_r18",
        "dpc_r34",
        "classifier_r18",
        "classifier_r34",
    )
    assert PRETRAIN_NAMES == ("memdpc_r18", "memdpc_r34", "dpc_r18", "dpc_r34")
    assert set(PRETRAIN_FAMILIES) < set(FAMILIES) and DEPTHS == (18, 34)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_split_name_round_trips(name):
    fam, depth = split_name(name)
    assert fam in FAMILIES and depth in DEPTHS
    assert f"{fam}_r{depth}" == name


def test_split_name_gives_family_and_integer_depth():
    assert split_name("classifier_r34") == ("classifier", 34)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_registered_name_builds(name):
    kw = {"num_classes": 3} if name not in PRETRAIN_NAMES else {}
    model = create_model(name, widths=TINY, **kw)
    assert model.config["name"] == name
    assert isinstance(model, MemDPC) == (name in PRETRAIN_NAMES)
