from __future__ import annotations

import math

import pytest
import torch

from bench import step_profile
from memdpc.model import create_model
from memdpc.model.layout import channels_innermost
from memdpc.model.loss import dense_infonce
from memdpc.model.memdpc import encode, objective

from .conftest import TINY


def test_bidirectional_loss_at_init_is_twice_log_of_candidates(clips):
    model = create_model("memdpc_r18", widths=TINY, seed=0)
    b, hw = clips.shape[0], (clips.shape[-1] // 32) ** 2
    with torch.no_grad():
        out = model(clips)
    assert out["loss"].item() == pytest.approx(2 * math.log(b * 3 * hw), rel=0.03)
    assert out["loss"].item() == pytest.approx(out["loss_f"].item() + out["loss_b"].item())
    assert set(out) == {f"{k}{s}" for k in ("loss", "top1", "top5") for s in ("", "_f", "_b")} | {
        "chance",
        "content_share",
    }
    assert out["chance"].item() == pytest.approx(2 * math.log(b * 3 * hw))  # a uniform guess, both directions
    assert 0 < out["content_share"].item() <= 1
    assert all(v.dim() == 0 for v in out.values())


def test_unidirectional_has_forward_entries_only(clips):
    out = create_model("memdpc_r18", widths=TINY, bidirectional=False, seed=0)(clips)
    assert set(out) == {"loss", "top1", "top5", "loss_f", "top1_f", "top5_f", "chance", "content_share"}
    assert out["loss"].item() == pytest.approx(math.log(2 * 3 * 4), rel=0.03)
    assert out["chance"].item() == pytest.approx(math.log(2 * 3 * 4))


def test_backward_step_reaches_the_memory_bank_and_every_parameter(clips):
    model = create_model("memdpc_r18", widths=TINY, mem_size=64, seed=0)
    model(clips)["loss"].backward()
    assert model.memory.grad is not None and model.memory.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_a_teacher_adds_the_relation_of_the_pooled_context_to_the_objective(clips):
    """Given a teacher's features, the forward gives ``relation`` apart from the pretext ``loss`` (which keeps its
    chance), the objective is their sum, and the relation's gradient reaches the encoder and the aggregators."""
    model = create_model("memdpc_r18", widths=TINY, seed=0)
    clips = torch.cat([clips, clips[:1].flip(-1)])  # the relation needs 3 clips or more
    teacher = torch.randn(clips.shape[0], 7, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    out = model(clips, teacher)
    torch.manual_seed(0)
    plain = model(clips)
    assert "relation" not in plain and out["relation"].item() > 0
    assert out["loss"].item() == pytest.approx(plain["loss"].item())
    assert objective(out).item() == pytest.approx(out["loss"].item() + out["relation"].item())
    assert objective(out, 3.0).item() == pytest.approx(out["loss"].item() + 3 * out["relation"].item())
    assert objective(plain) is plain["loss"]
    model.zero_grad()
    out["relation"].backward()
    for part in (model.backbone, model.agg_f, model.agg_b):
        assert sum(p.grad.abs().sum() for p in part.parameters() if p.grad is not None) > 0


def test_encoder_targets_beat_shuffled_targets(clips):
    model = create_model("memdpc_r18", widths=TINY, seed=0).eval()
    with torch.no_grad():
        target = model.backbone_features(clips)[:, -3:]
    shuffled = target.flatten(0, 1)[torch.tensor([3, 5, 0, 4, 1, 2])].view_as(target)
    assert dense_infonce(target, target)["loss"] < dense_infonce(shuffled, target)["loss"]


def _shared(dpc, mem):
    """DPC takes all of MemDPC's weights that it has a place for."""
    own = dpc.state_dict()
    dpc.load_state_dict(
        {k: v for k, v in mem.state_dict().items() if k in own and own[k].shape == v.shape}, strict=False
    )


def test_dpc_and_memdpc_differ_only_in_predictor_output_and_memory(clips):
    mem = create_model("memdpc_r18", widths=TINY, mem_size=32, bidirectional=False, seed=0).eval()
    dpc = create_model("dpc_r18", widths=TINY, mem_size=32, seed=0).eval()
    a, b = mem.state_dict(), dpc.state_dict()
    assert set(a) - set(b) == {"memory"} and set(b) <= set(a)
    assert [k for k in b if a[k].shape != b[k].shape] == ["predictor.2.weight", "predictor.2.bias"]
    assert {k: v for k, v in mem.config.items() if k != "name"} == {
        k: v for k, v in dpc.config.items() if k != "name"
    }
    _shared(dpc, mem)
    with torch.no_grad():
        torch.testing.assert_close(dpc.features(clips), mem.features(clips))
        (z1, zh1), (z2, zh2) = mem.step_features(clips), dpc.step_features(clips)
        torch.testing.assert_close(z1, z2)
        assert zh1.shape == zh2.shape and not torch.allclose(zh1, zh2)
        assert dpc(clips)["loss"] != mem(clips)["loss"]
    assert dpc.memory is None


def test_memdpc_prediction_is_a_convex_combination_of_memory_rows():
    model = create_model("memdpc_r18", widths=TINY, mem_size=8, seed=0)
    with torch.no_grad():
        model.memory.copy_(torch.eye(8, 64) * 5)
        zhat = model.predict_next(torch.randn(2, 64, 3, 3))
    weights = zhat[:, :8] / 5  # rows of M are scaled unit vectors: ẑ holds the weights
    assert (weights >= 0).all() and torch.allclose(weights.sum(1), torch.ones(2, 3, 3))
    assert (zhat[:, 8:] == 0).all()


def test_step_features_are_causal(clips):
    model = create_model("memdpc_r18", widths=TINY, seed=0).eval()
    changed = clips.clone()
    changed[:, 5] += 1.0
    with torch.no_grad():
        (z, zhat), (z2, zhat2) = model.step_features(clips), model.step_features(changed)
    assert z.shape == zhat.shape == (2, 8, 64)
    unchanged = [t for t in range(8) if t != 5]
    torch.testing.assert_close(z[:, unchanged], z2[:, unchanged])
    torch.testing.assert_close(zhat[:, :6], zhat2[:, :6])  # ẑ_t sees blocks < t only
    assert not torch.allclose(zhat[:, 6:], zhat2[:, 6:])


def test_features_shape_and_determinism_in_eval(clips):
    bi = create_model("memdpc_r18", widths=TINY, seed=0).eval()
    uni = create_model("dpc_r18", widths=TINY, seed=0).eval()
    with torch.no_grad():
        assert bi.features(clips).shape == (2, 128) and uni.features(clips).shape == (2, 64)
        torch.testing.assert_close(bi.features(clips), bi.features(clips))
    assert bi.feature_dim == 128 and uni.feature_dim == 64


def test_temperature_option_and_channels_last_give_the_same_kind_of_output(clips):
    model = create_model("memdpc_r18", widths=TINY, temperature=0.1, seed=0).eval()
    with torch.no_grad():
        ref = model(clips)["loss"]
        model.backbone.to(memory_format=torch.channels_last_3d)
        cl = model(clips)["loss"]
    torch.testing.assert_close(ref, cl, rtol=1e-4, atol=1e-4)


def _channels_last(model: torch.nn.Module, clips: torch.Tensor) -> torch.Tensor:
    model.backbone.to(memory_format=torch.channels_last_3d)
    return clips.flatten(0, 1).contiguous(memory_format=torch.channels_last_3d).view(clips.shape)


def test_an_encoder_in_channels_last_3d_keeps_the_head_in_channels_last(clips):
    """Features, GRU states, memory read-out and the stacked predictions keep D innermost (the loss flattens them
    as a view), and the head computes what it computes in the default layout: the loss and its gradients (the
    encoder's own differ more between CPU layouts, as they did before the head kept the layout)."""
    results = []
    for layout in ("contiguous", "channels_last"):
        model = create_model("memdpc_r18", widths=TINY, mem_size=32, gru_dropout=0.0, seed=0)
        x = _channels_last(model, clips) if layout == "channels_last" else clips
        out = model(x)
        out["loss"].backward()
        results.append((out, [p.grad for n, p in model.named_parameters() if not n.startswith("backbone.")]))
    z = encode(model.backbone, x)
    state = model.agg_f(z[:, :5])
    preds = model.rollout(model.agg_f, z)
    assert (
        channels_innermost(z[:, 0])
        and channels_innermost(state)
        and channels_innermost(model.predict_next(state))
    )
    assert preds.permute(0, 1, 3, 4, 2).is_contiguous()  # the loss's (B·P·h·w, D) rows: a view
    (ref, ref_grads), (cl, cl_grads) = results
    torch.testing.assert_close(cl["loss"], ref["loss"], rtol=1e-5, atol=1e-5)
    for a, b in zip(cl_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3 * float(b.abs().max()))


def test_a_channels_last_forward_pass_copies_only_the_loss_targets(clips):
    """The profile's count of layout copies in a forward pass: in channels_last_3d only the loss's gather of
    the target blocks (one per direction); in the default layout the memory read converts too."""
    copies = {}
    for layout in ("contiguous", "channels_last"):
        model = create_model("memdpc_r18", widths=TINY, mem_size=32, seed=0)
        x = _channels_last(model, clips) if layout == "channels_last" else clips
        with torch.no_grad():
            trace = step_profile.record(lambda m=model, x=x: m(x), 1, torch.device("cpu"))
        copies[layout] = step_profile.analyse(trace, "cpu")["layout_copies_by_part"]
    assert copies["channels_last"] == {"loss": 2}
    assert copies["contiguous"]["memory read"] == 6  # 3 predictions per direction


def test_wrong_input_shape_is_refused():
    model = create_model("memdpc_r18", widths=TINY)
    with pytest.raises(ValueError, match="clips"):
        model(torch.zeros(2, 3, 3, 5, 64, 64))
    with pytest.raises(ValueError, match="clips"):
        model(torch.zeros(2, 8, 3, 64, 64))
