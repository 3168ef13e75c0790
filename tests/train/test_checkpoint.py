from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from memdpc.common.errors import UserError
from memdpc.model import checkpoint as mc
from memdpc.model import create_model
from memdpc.model.convert import convert_file
from memdpc.train import checkpoint as ck
from memdpc.train.checkpoint import (
    OPTIONAL,
    TRAINING_KEYS,
    is_training_checkpoint,
    read_training_entries,
    training_entries,
)
from memdpc.train.config import config_from_dict
from memdpc.train.seeding import seed_everything

from ..conftest import reference_weights

TINY = dict(
    widths=(4, 8, 16, 16), num_blocks=5, block_len=3, pred_steps=2, input_size=32, bidirectional=False
)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_rng_state_round_trip_through_a_weights_only_checkpoint(tmp_path):
    seed_everything(3)
    _draws()
    state = ck.rng_state()
    expected = _draws()
    mc.write_checkpoint(mc.serialize({"rng": state}), tmp_path / "r.pt")
    _draws()
    ck.set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    assert _draws() == expected


def test_unwrap_and_digest_see_weight_changes():
    model = create_model("dpc_r18", seed=0, **TINY)
    digest = ck.param_digest(model)
    assert ck.unwrap(torch.nn.Sequential(model)[0]) is model
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    assert ck.param_digest(model) != digest


CONFIG = dict(
    arch="memdpc_r18", widths=[4, 8, 16, 16], mem_size=8, num_blocks=5, block_len=3, pred_steps=2, size=32
)


def _converted(tmp_path, name="memdpc_r18", stream="rgb", **kw):
    """A reference-layout checkpoint of ``name`` converted by convert.py; returns (path, memdpc weights)."""
    ours, ref = reference_weights(name, widths=(4, 8, 16, 16), **kw)
    torch.save({"epoch": 5, "state_dict": ref}, tmp_path / f"{name}.pth.tar")
    convert_file(tmp_path / f"{name}.pth.tar", tmp_path / f"{name}-{stream}.pt", stream=stream)
    return tmp_path / f"{name}-{stream}.pt", ours


def test_init_weights_start_the_run_and_the_init_only_checkpoint(tmp_path):
    path, weights = _converted(tmp_path, mem_size=8, bidirectional=False)
    config = config_from_dict(dict(init=str(path), out=str(tmp_path / "run"), **CONFIG))
    init, warning = ck.read_init(path, config)
    assert warning is None
    model = ck.initial_model(config, init)
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert model.config["pred_steps"] == 2  # the run's settings, the checkpoint's weights
    written = mc.read_checkpoint(ck.write_initial_checkpoint(config, tmp_path / "init.pt"))
    assert written["origin"] == "init" and written["input_size"] == 32
    assert all(torch.equal(v, weights[k]) for k, v in written["model"].items())
    seeded = ck.initial_model(config_from_dict(CONFIG))
    assert not torch.equal(seeded.memory, weights["memory"])


def test_a_reference_dpc_without_batchnorm_statistics_starts_a_dpc_run(tmp_path):
    """The reference DPC tracks no BatchNorm statistics; its weights start the run, its statistics are fresh."""
    path, weights = _converted(tmp_path, "dpc_r18", track_running_stats=False)
    config = config_from_dict(
        dict(**{**CONFIG, "arch": "dpc_r18"})
    )  # its mem_size (not the file's 1024) is moot for DPC
    init, _ = ck.read_init(path, config)
    state = ck.initial_model(config, init).state_dict()
    assert not any("running" in k for k in weights)  # the file is what the reference writes
    assert all(torch.equal(state[k], v) for k, v in weights.items())
    fresh = create_model(**config.model_kwargs()).state_dict()
    stats = [k for k in state if k not in weights]
    assert stats and all(
        k.rsplit(".", 1)[-1] in ck.BN_STATS and torch.equal(state[k], fresh[k]) for k in stats
    )


def test_init_checkpoints_that_cannot_start_the_run_are_refused(tmp_path):
    config = config_from_dict(CONFIG)
    dpc, _ = _converted(tmp_path, "dpc_r18", bidirectional=False)
    with pytest.raises(
        UserError,
        match=rf"{dpc}: checkpoint is of another architecture: name 'dpc_r18' "
        r"\(this run: 'memdpc_r18'\)",
    ):
        ck.read_init(dpc, config)
    clf, _ = _converted(tmp_path, "classifier_r18", num_classes=3)
    with pytest.raises(UserError, match=f"{clf}: holds a finetuned classifier"):
        ck.read_init(clf, config)
    wide, _ = _converted(tmp_path, mem_size=16, bidirectional=False)
    with pytest.raises(UserError, match=r"mem_size 16 \(this run: 8\)"):
        ck.read_init(wide, config)
    flow, _ = _converted(tmp_path, stream="flow", mem_size=8, bidirectional=False)
    _, warning = ck.read_init(flow, config)
    assert "converted as flow weights; used on the rgb stream" in warning
    own = tmp_path / "own.pt"
    ck.write_initial_checkpoint(config_from_dict(dict(**CONFIG, stream="flow")), own)
    with pytest.raises(UserError, match=f"{own}: checkpoint was trained on the flow stream, not rgb"):
        ck.read_init(own, config)
    (tmp_path / "cut.pt").write_bytes(own.read_bytes()[:1000])
    with pytest.raises(UserError, match="cut.pt: not a readable checkpoint"):
        ck.read_init(tmp_path / "cut.pt", config)


def test_the_training_entries_have_one_home():
    entries = {k: k for k in TRAINING_KEYS}
    assert training_entries(**entries) == entries
    with pytest.raises(ValueError, match="best_epoch"):
        training_entries(**{k: v for k, v in entries.items() if k != "best_epoch"})
    with pytest.raises(ValueError, match="extra"):
        training_entries(**entries, extra=1)
    older = {k: k for k in TRAINING_KEYS if k not in OPTIONAL}  # written before the optional ones existed
    assert is_training_checkpoint(older) and not is_training_checkpoint({"model": {}})
    assert read_training_entries(older) == {**older, **OPTIONAL}
