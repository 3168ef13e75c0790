from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.model import create_model
from memdpc.model.checkpoint import read_checkpoint
from memdpc.model.convert import convert_file, export_reference, import_reference

from ..conftest import reference_weights
from .conftest import TINY


def _reference_memdpc(seed: int = 0) -> dict[str, torch.Tensor]:
    """A MemDPC_BD state dict in the reference layout, independent of convert.py."""
    return reference_weights("memdpc_r18", seed, widths=TINY, mem_size=16)[1]


def _save_as_numpy1(obj: dict, path: Path) -> None:
    """torch.save, then rename numpy's scalar constructor as numpy 1 pickled it (reference-era files)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    src = zipfile.ZipFile(buf)
    with zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"numpy._core.multiarray\nscalar", b"numpy.core.multiarray\nscalar")
            dst.writestr(info, data)


def test_imports_a_reference_layout_checkpoint_file(tmp_path):
    sd = _reference_memdpc()
    sd["backbone.fc.weight"] = torch.zeros(1)  # a stray key must be reported, not used
    del sd["backbone.layer4.1.bn2.num_batches_tracked"]
    src = tmp_path / "epoch99.pth.tar"
    _save_as_numpy1(
        {"epoch": 99, "state_dict": sd, "best_acc": np.float64(0.4), "optimizer": {}, "iteration": 7}, src
    )
    report = convert_file(src, tmp_path / "out" / "memdpc.pt", stream="rgb", input_size=112)
    assert report.kind == "memdpc" and report.unused == ["backbone.fc.weight"]
    assert report.missing == ["backbone.layer4.1.bn2.num_batches_tracked"]
    ckpt = read_checkpoint(tmp_path / "out" / "memdpc.pt")
    assert (ckpt["origin"], ckpt["stream"], ckpt["input_size"], ckpt["epoch"]) == (
        "converted",
        "rgb",
        112,
        99,
    )
    assert ckpt["source"] == str(src) and ckpt["model_config"]["input_size"] == 112
    model = create_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    assert model.config["mem_size"] == 16 and model.config["bidirectional"] is True
    assert torch.equal(model.memory, sd["mb"])
    assert torch.equal(model.agg_b.cell.out_gate.weight, sd["agg_b.cell_list.0.out_gate.weight"])
    assert torch.equal(model.predictor[2].bias, sd["network_pred.2.bias"])
    assert torch.equal(
        model.backbone.layer3[0].downsample[1].running_var, sd["backbone.layer3.0.downsample.1.running_var"]
    )
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["memdpc.pt"]


@pytest.mark.parametrize(
    "name, kw",
    [
        ("memdpc_r18", {}),
        ("memdpc_r18", {"bidirectional": False}),
        ("dpc_r18", {"track_running_stats": False}),
        ("classifier_r18", {"num_classes": 5}),
        ("classifier_r18", {"num_classes": 5, "bidirectional": False}),
    ],
)
def test_export_then_import_round_trips_exactly(name, kw, clips):
    model = create_model(name, widths=TINY, seed=0, **kw).eval()
    ref, _ = export_reference(model.state_dict(), model.config)
    back, report = import_reference(ref)
    assert report.unused == [] and report.missing == []
    assert back.config == {**model.config, "seed": None}
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    back.eval()
    with torch.no_grad():
        out, again = (
            (model(clips), back(clips))
            if name.startswith("classifier")
            else (model.features(clips), back.features(clips))
        )
    assert torch.equal(out, again)


def test_export_layouts_follow_the_reference():
    dpc = create_model("dpc_r18", widths=TINY)
    ref, _ = export_reference(dpc.state_dict(), dpc.config)
    assert all(k.startswith("module.") for k in ref)
    assert (
        "module.agg.ConvGRUCell_00.reset_gate.weight" in ref and "module.agg.cell_list.0.out_gate.bias" in ref
    )
    clf = create_model("classifier_r18", widths=TINY, num_classes=3)
    ref, _ = export_reference(clf.state_dict(), clf.config)
    assert {"final_bn.running_mean", "final_fc.1.weight", "agg_b.cell_list.0.update_gate.weight"} <= set(ref)
    mem = create_model("memdpc_r18", widths=TINY)
    ref, _ = export_reference(mem.state_dict(), mem.config)
    assert {"mb", "network_pred.0.weight", "network_pred.2.bias", "backbone.conv1.weight"} <= set(ref)
    assert ref["agg_f.ConvGRUCell_00.out_gate.weight"] is ref["agg_f.cell_list.0.out_gate.weight"]


def test_cli_converts_both_ways(tmp_path):
    src = tmp_path / "ref.pth.tar"
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in _reference_memdpc().items()}}, src)
    runner = CliRunner()
    res = runner.invoke(main, ["convert", str(src), str(tmp_path / "m.pt"), "--stream", "flow"])
    assert res.exit_code == 0, res.output
    assert "memdpc_r18" in res.output and "unused" in res.output
    res = runner.invoke(
        main, ["convert", str(tmp_path / "m.pt"), str(tmp_path / "back.pth.tar"), "--to", "reference"]
    )
    assert res.exit_code == 0, res.output
    back = torch.load(tmp_path / "back.pth.tar", weights_only=True)
    assert set(back) == {"epoch", "state_dict", "best_acc", "optimizer", "iteration"}
    original = _reference_memdpc()
    assert set(back["state_dict"]) == set(original)
    assert all(torch.equal(back["state_dict"][k], v) for k, v in original.items())


def _user_error(tmp_path: Path, obj=None, raw: bytes | None = None, to: str = "memdpc") -> str:
    src = tmp_path / "bad.pt"
    if raw is not None:
        src.write_bytes(raw)
    else:
        torch.save(obj, src)
    with pytest.raises(UserError) as e:
        convert_file(src, tmp_path / "out.pt", to=to)
    assert not (tmp_path / "out.pt").exists()
    return str(e.value)


def test_bad_checkpoints_are_user_errors(tmp_path):
    assert "x: checkpoint not found" in str(
        pytest.raises(UserError, convert_file, tmp_path / "x", tmp_path / "y").value
    )
    assert (
        "not a readable checkpoint (not a PyTorch file: damaged, or a file of another kind); download or copy "
        "it again"
    ) in _user_error(tmp_path, raw=b"\x80\x02}q\x00garbage")
    whole = tmp_path / "whole.pth.tar"
    torch.save({"epoch": 1, "state_dict": _reference_memdpc()}, whole)
    # the wording read_checkpoint gives a truncated file too
    assert (
        "not a readable checkpoint (truncated or damaged: its zip directory is missing); download or copy it "
        "again" in _user_error(tmp_path, raw=whole.read_bytes()[:4096])
    )
    assert "expected a dict" in _user_error(tmp_path, [1, 2])
    assert "no 'state_dict'" in _user_error(tmp_path, {"epoch": 1})
    assert "no 2D3D-ResNet" in _user_error(tmp_path, {"state_dict": {"mb": torch.zeros(2, 2)}})
    sd = _reference_memdpc()
    sd["agg_f.cell_list.0.reset_gate.bias"] = sd["agg_f.cell_list.0.reset_gate.bias"] + 1
    assert "differs from its twin" in _user_error(tmp_path, {"state_dict": sd})
    sd = _reference_memdpc()
    sd["network_pred.2.bias"] = torch.zeros(3)
    assert (
        "network_pred" not in (msg := _user_error(tmp_path, {"state_dict": sd})) and "predictor.2.bias" in msg
    )
    assert "not a memdpc checkpoint" in _user_error(
        tmp_path, {"state_dict": _reference_memdpc()}, to="reference"
    )


def test_cli_reports_bad_file_in_one_line(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "junk.pt"), str(tmp_path / "o.pt")])
    assert res.exit_code == 2 and "junk.pt" in res.output and "Traceback" not in res.output
