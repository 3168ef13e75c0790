from __future__ import annotations

import pytest
import torch

from memdpc.common.errors import UserError
from memdpc.model import MODEL_NAMES, create_model
from memdpc.model.factory import has_memory

from .conftest import TINY


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_match_reference():
    assert (
        _params(create_model("memdpc_r18", bidirectional=True, mem_size=1024, input_size=128)) == 15_436_608
    )
    assert (
        _params(create_model("memdpc_r34", bidirectional=True, mem_size=1024, input_size=224)) == 33_801_280
    )


def test_config_rebuilds_identical_model():
    model = create_model("memdpc_r18", widths=TINY, mem_size=32, seed=3)
    again = create_model(**model.config)
    assert again.config == model.config
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_seed_gives_deterministic_init_and_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    a = create_model("dpc_r18", widths=TINY, seed=1)
    assert torch.equal(torch.rand(1), expected)
    b = create_model("dpc_r18", widths=TINY, seed=1)
    c = create_model("dpc_r18", widths=TINY, seed=2)
    assert torch.equal(a.backbone.conv1.weight, b.backbone.conv1.weight)
    assert not torch.equal(a.backbone.conv1.weight, c.backbone.conv1.weight)


def test_all_names_build_and_defaults():
    assert set(MODEL_NAMES) >= {"memdpc_r18", "memdpc_r34", "dpc_r18", "dpc_r34"}
    assert create_model("memdpc_r18", widths=TINY).config["bidirectional"] is True
    assert create_model("dpc_r18", widths=TINY).config["bidirectional"] is False
    assert create_model("classifier_r18", widths=TINY, num_classes=7).head.final_fc[1].out_features == 7


@pytest.mark.parametrize(
    "name, kw", [("memdpc_r50", {}), ("memdpc_r18", {"bogus": 1}), ("memdpc_r18", {"pred_steps": 8})]
)
def test_bad_names_and_options_are_user_errors(name, kw):
    with pytest.raises(UserError, match="model"):
        create_model(name, **kw)


def test_has_memory_follows_the_family():
    assert has_memory("memdpc_r18") and has_memory("memdpc_r34")
    assert not has_memory("dpc_r18") and not has_memory("classifier_r18")
    with pytest.raises(UserError, match="unknown model"):
        has_memory("dpc_r50")
