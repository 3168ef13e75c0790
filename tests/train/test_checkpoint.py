from __future__ import annotations

import random
import resource
import signal

import numpy as np
import pytest
import torch

from memdpc.errors import UserError
from memdpc.model import create_model
from memdpc.train import checkpoint as ck

TINY = dict(widths=(4, 8, 16, 16), num_blocks=5, block_len=3, pred_steps=2, input_size=32, bidirectional=False)


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_rng_state_round_trip_through_a_weights_only_checkpoint(tmp_path):
    ck.seed_everything(3)
    _draws()
    state = ck.rng_state()
    expected = _draws()
    ck.write_checkpoint(ck.serialize({"rng": state}), tmp_path / "r.pt")
    _draws()
    ck.set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    assert _draws() == expected


def _checkpoint(model, stream="rgb") -> dict:
    return {"format": ck.FORMAT, "model": model.state_dict(), "model_config": model.config, "stream": stream,
            "config": {}, "step": 0}


def test_load_pretrained_rebuilds_the_same_model(tmp_path):
    model = create_model("memdpc_r18", seed=1, mem_size=8, **TINY).eval()
    ck.write_checkpoint(ck.serialize(_checkpoint(model)), tmp_path / "m.pt")
    loaded, ckpt = ck.load_pretrained(tmp_path / "m.pt")
    clips = torch.randn(2, 5, 3, 3, 32, 32)
    assert ckpt["stream"] == "rgb" and not loaded.training
    assert torch.equal(loaded.features(clips), model.features(clips))
    assert ck.param_digest(loaded) == ck.param_digest(model)


def test_foreign_and_missing_files_are_refused(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="junk.pt: not a readable checkpoint"):
        ck.read_checkpoint(tmp_path / "junk.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="other.pt: not a memdpc training checkpoint"):
        ck.read_checkpoint(tmp_path / "other.pt")
    with pytest.raises(UserError, match="nope.pt: checkpoint not found"):
        ck.read_checkpoint(tmp_path / "nope.pt")


def test_checkpoints_of_another_stream_or_architecture_are_refused(tmp_path):
    model = create_model("dpc_r18", seed=0, **TINY)
    ckpt = _checkpoint(model, stream="flow")
    with pytest.raises(UserError, match="trained on the flow stream, not rgb"):
        ck.check_compatible(ckpt, tmp_path / "c.pt", "rgb", model.config)
    other = create_model("memdpc_r18", seed=0, mem_size=8, **TINY)
    with pytest.raises(UserError, match=r"another architecture: .*name .dpc_r18. \(this run: .memdpc_r18.\)"):
        ck.check_compatible(ckpt, tmp_path / "c.pt", "flow", other.config)
    ck.check_compatible(ckpt, tmp_path / "c.pt", "flow", {**model.config, "seed": 7})  # the seed is no architecture


def test_disk_full_leaves_the_previous_checkpoint_valid(tmp_path):
    """A real write failure (file-size limit, EFBIG) while the bigger second checkpoint is written."""
    path = tmp_path / "last.pt"
    small = create_model("dpc_r18", seed=0, **TINY)
    ck.write_checkpoint(ck.serialize(_checkpoint(small)), path)
    before = path.read_bytes()
    big = ck.serialize(_checkpoint(create_model("memdpc_r18", seed=0, mem_size=4096, **TINY)))
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 1000, old_limit[1]))
    try:
        with pytest.raises(UserError, match="could not write the checkpoint .*previous last.pt is unchanged"):
            ck.write_checkpoint(big, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left
    assert ck.read_checkpoint(path)["stream"] == "rgb"


def test_unwrap_and_digest_see_weight_changes():
    model = create_model("dpc_r18", seed=0, **TINY)
    digest = ck.param_digest(model)
    assert ck.unwrap(torch.nn.Sequential(model)[0]) is model
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-6
    assert ck.param_digest(model) != digest
