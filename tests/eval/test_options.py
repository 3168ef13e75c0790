"""The eval verbs' own settings: each task's defaults, the values they take, and how the command line shows
them (one declaration each: the probe's and the finetuning's dropout is one setting with two defaults)."""

from __future__ import annotations

import pytest

from memdpc.common.errors import UserError
from memdpc.common.settings import flat, from_flat, options_of
from memdpc.eval.fit import FINETUNE_DROPOUT, PROBE_DROPOUT
from memdpc.eval.options import Crops, FinetuneOptions, FuseOptions, HeadDropout, ProbeOptions


def test_each_task_nests_the_shared_settings_with_its_own_defaults():
    assert ProbeOptions().head.dropout == PROBE_DROPOUT and FinetuneOptions().head.dropout == FINETUNE_DROPOUT
    shown = {
        cls: {f.name: default for f, _, default in options_of(cls)} for cls in (ProbeOptions, FinetuneOptions)
    }
    assert shown[ProbeOptions]["dropout"] == 0.5 and shown[FinetuneOptions]["dropout"] == 0.9
    assert [f for f, _, _ in options_of(ProbeOptions) if f.name == "dropout"] == [
        f for f, _, _ in options_of(FinetuneOptions) if f.name == "dropout"
    ]  # the same field
    assert {f.name for f, _, _ in options_of(HeadDropout)} == {"dropout"}


def test_values_from_the_command_line_or_a_recipe_become_the_tasks_keywords():
    probe = from_flat(ProbeOptions, {"crops": "5", "linear": False, "dropout": 0.25})
    assert flat(probe) == {"linear": False, "crops": 5, "dropout": 0.25}
    with pytest.raises(UserError, match="^crops must be one of 1, 5, 10, not 7$"):
        Crops(crops=7)
    assert flat(FuseOptions()) == {
        "weights": [1.0, 1.0],
        "choose_weights": False,
        "out": None,
        "overwrite": False,
    }
    with pytest.raises(UserError, match="^give --weights or --choose-weights, not both$"):
        FuseOptions(weights=(3.0, 1.0), choose_weights=True)
