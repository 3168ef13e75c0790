"""Released weights end to end: a reference-layout file, `memdpc convert`, then every `memdpc eval` verb; and
the checkpoints that evaluation refuses, each in one line with exit 2."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate
from memdpc.model import checkpoint as mc
from memdpc.model import create_model

from .conftest import REFERENCE_WIDTHS

pytestmark = pytest.mark.slow
OPTS = ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu"]
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def _cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def _ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def _one_line_error(result, *texts: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output, result.output
    assert all(t in result.output for t in texts), result.output


@pytest.fixture(scope="module")
def converted(released, tmp_path_factory):
    """`memdpc convert` of the released MemDPC (rgb, trained at 32 px) and of it without a stream."""
    root = tmp_path_factory.mktemp("converted")
    src = released["memdpc"][0]
    out = _ok(_cli("convert", src, root / "rgb.pt", "--stream", "rgb", "--size", "32"))
    assert f"next: memdpc eval retrieve {root / 'rgb.pt'}" in out
    _ok(_cli("convert", src, root / "nostream.pt"))
    return root


def test_converted_weights_evaluate_as_the_same_weights_loaded_directly(
    eval_data, released, converted, tmp_path
):
    """Retrieval and a linear probe of the converted file equal those of the weights put straight into the model."""
    model = create_model("memdpc_r18", widths=REFERENCE_WIDTHS, mem_size=16, input_size=32)
    model.load_state_dict(released["memdpc"][1])
    direct = tmp_path / "direct.pt"
    mc.write_checkpoint(mc.serialize(mc.build_checkpoint(model, "rgb", "init")), direct)
    ckpt = converted / "rgb.pt"
    for verb, extra in (("retrieve", []), ("probe", ["--linear", "--epochs", "3"])):
        _ok(_cli("eval", verb, ckpt, "--shards", eval_data.shards, "--out", tmp_path / "conv", *extra, *OPTS))
        _ok(
            _cli(
                "eval",
                verb,
                direct,
                "--shards",
                eval_data.shards,
                "--out",
                tmp_path / "direct",
                *extra,
                *OPTS,
            )
        )
    for name, arrays in (
        ("retrieval-rgb", ("query", "gallery", "neighbours")),
        ("probe-linear-rgb", ("probs",)),
    ):
        (conv, a_conv), (dir_, a_dir) = (
            load_result(tmp_path / d / f"{name}.json") for d in ("conv", "direct")
        )
        assert conv["metrics"] == dir_["metrics"]
        for key in arrays:
            np.testing.assert_array_equal(a_conv[key], a_dir[key])
    assert (
        load_result(tmp_path / "conv" / "retrieval-rgb.json")[0]["config"]["size"] == 32
    )  # from convert --size
    features = np.load(tmp_path / "conv" / "features-rgb-test.npz")["values"]
    assert np.isfinite(features).all() and features.std(axis=0).min() > 0  # not constant: the check can fail


def test_converted_weights_run_in_every_other_verb(eval_data, converted, tmp_path):
    ckpt = converted / "rgb.pt"
    kw = dict(shards=eval_data.shards, out=tmp_path, fit={"epochs": 1}, **COMMON)
    assert load_result(evaluate("probe", ckpt, head="mlp", **kw))[0]["kind"] == "probe-mlp"
    finetune, _ = load_result(evaluate("finetune", ckpt, label_fraction=0.5, **kw))
    assert finetune["kind"] == "finetune" and len(finetune["train_loss"]) == 1
    oops, _ = load_result(evaluate("oops", ckpt, index=eval_data.index, mode="frozen", **kw))
    assert oops["kind"] == "oops-frozen" and oops["stream"] == "rgb" and oops["config"]["size"] == 32


def test_stream_of_a_converted_checkpoint_is_kept_unless_stream_overrides_it(eval_data, converted, tmp_path):
    only_flow = tmp_path / "flow_shards"
    shutil.copytree(eval_data.shards / "flow", only_flow / "flow")
    ckpt = converted / "rgb.pt"
    _one_line_error(
        _cli("eval", "retrieve", ckpt, "--shards", only_flow, "--out", tmp_path / "a", *OPTS),
        f"{ckpt}: holds rgb weights, but {only_flow} has no rgb shards, only flow; pass --stream flow",
    )
    out = _ok(
        _cli(
            "eval",
            "retrieve",
            ckpt,
            "--shards",
            only_flow,
            "--out",
            tmp_path / "b",
            "--stream",
            "flow",
            *OPTS,
        )
    )
    assert (
        f"warning: {ckpt}: converted as rgb weights; used on the flow stream because --stream says so" in out
    )
    assert load_result(tmp_path / "b" / "retrieval-flow.json")[0]["stream"] == "flow"
    nostream = converted / "nostream.pt"
    _one_line_error(
        _cli("eval", "retrieve", nostream, "--shards", eval_data.shards, "--out", tmp_path / "c", *OPTS),
        f"{nostream}: the checkpoint does not record its stream; pass --stream",
    )


def test_checkpoints_evaluation_cannot_use_are_one_line_errors(eval_data, released, converted, tmp_path):
    clf = tmp_path / "lc.pt"
    _ok(_cli("convert", released["classifier"][0], clf, "--stream", "rgb"))
    verbs = (("retrieve",), ("probe",), ("finetune",), ("oops", "--index", eval_data.index))
    for verb, *extra in verbs:
        _one_line_error(
            _cli("eval", verb, clf, "--shards", eval_data.shards, "--out", tmp_path / verb, *extra, *OPTS),
            f"{clf}: holds a finetuned classifier (classifier_r18), not a pretrained MemDPC/DPC model",
        )
    cut = tmp_path / "cut.pt"
    cut.write_bytes((converted / "rgb.pt").read_bytes()[:4096])
    _one_line_error(
        _cli("eval", "probe", cut, "--shards", eval_data.shards, "--out", tmp_path / "cut", *OPTS),
        f"{cut}: not a readable checkpoint",
    )
    _one_line_error(
        _cli(
            "eval",
            "retrieve",
            released["memdpc"][0],
            "--shards",
            eval_data.shards,
            "--out",
            tmp_path / "ref",
            *OPTS,
        ),
        "not a memdpc checkpoint",
        "memdpc convert",
    )
    assert not any((tmp_path / d).exists() for d in ("retrieve", "probe", "finetune", "oops", "cut", "ref"))
