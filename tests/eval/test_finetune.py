"""`memdpc eval finetune` (eval/finetune.py) on real shards with a real (one-step) pretrained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate
from memdpc.model.checkpoint import read_checkpoint

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_finetune_on_a_label_fraction_resumes(eval_data, checkpoints, tmp_path):
    kw = dict(shards=eval_data.shards, out=tmp_path, label_fraction=0.5, fit={"epochs": 1}, **COMMON)
    path = evaluate("finetune", checkpoints["rgb"], **kw)
    result, arrays = load_result(path)
    assert (
        path.name == "finetune-rgb-frac0.5.json" and result["config"]["train_videos"] == 3
    )  # 1 of 2 per class
    assert len(result["train_loss"]) == 1 and arrays["probs"].shape == (6, 3)
    # the finetuned classifier is kept as a checkpoint that `eval classify` scores to the same probabilities
    ckpt = read_checkpoint(tmp_path / "finetune-rgb-frac0.5.pt")
    assert (ckpt["origin"], ckpt["stream"], ckpt["model_config"]["num_classes"]) == ("finetune", "rgb", 3)
    scored, scored_arrays = load_result(
        evaluate(
            "classify",
            tmp_path / "finetune-rgb-frac0.5.pt",
            shards=eval_data.shards,
            out=tmp_path / "classify",
            **COMMON,
        )
    )
    assert scored["metrics"] == result["metrics"]
    np.testing.assert_allclose(scored_arrays["probs"], arrays["probs"], atol=1e-6)
    again, arrays2 = load_result(
        evaluate("finetune", checkpoints["rgb"], **kw)
    )  # resumes: nothing left to train
    assert again["train_loss"] == result["train_loss"]
    np.testing.assert_allclose(arrays2["probs"], arrays["probs"], atol=1e-6)
    with pytest.raises(
        UserError,
        match=r"finetune-rgb-frac0.5.state.pt: a finetune with other settings is there "
        r"\(lr 0.001 → 0.01; lr_min 0.0001 → 0.001\); the same command as before "
        r"resumes it, --overwrite starts over",
    ):
        evaluate("finetune", checkpoints["rgb"], **{**kw, "fit": {"epochs": 1, "lr": 0.01}})
    with pytest.raises(UserError, match="a finetune of 1 epochs is there, more than --epochs 0"):
        evaluate("finetune", checkpoints["rgb"], **{**kw, "fit": {"epochs": 0}})
    longer, _ = load_result(evaluate("finetune", checkpoints["rgb"], **{**kw, "fit": {"epochs": 2}}))
    assert (
        longer["train_loss"][:1] == result["train_loss"] and len(longer["train_loss"]) == 2
    )  # one more epoch
    over, _ = load_result(
        evaluate("finetune", checkpoints["rgb"], overwrite=True, **{**kw, "fit": {"epochs": 1, "lr": 0.01}})
    )
    assert over["config"]["lr"] == 0.01 and len(over["train_loss"]) == 1  # started over


def test_an_unfinished_finetune_of_another_checkpoint_is_not_resumed(
    eval_data, checkpoints, other_rgb, tmp_path
):
    kw = dict(shards=eval_data.shards, out=tmp_path, fit={"epochs": 1}, **COMMON)
    evaluate("finetune", checkpoints["rgb"], **kw)
    for name in ("finetune-rgb.json", "finetune-rgb.npz", "finetune-rgb.pt"):  # as if stopped after an epoch
        (tmp_path / name).unlink()
    with pytest.raises(
        UserError,
        match=r"finetune-rgb.state.pt: a finetune with other settings is there "
        r"\(checkpoint_sha256 '",
    ):
        evaluate("finetune", other_rgb, **kw)
    assert evaluate("finetune", other_rgb, overwrite=True, **kw).is_file()


def test_random_init_baseline_is_a_separate_result(eval_data, checkpoints, tmp_path):
    path = evaluate(
        "finetune",
        checkpoints["rgb"],
        shards=eval_data.shards,
        out=tmp_path,
        random_init=True,
        label_fraction=0.5,
        fit={"epochs": 1},
        **COMMON,
    )
    result, _ = load_result(path)
    assert path.name == "finetune-rgb-scratch-frac0.5.json" and result["config"]["random_init"] is True
    assert (
        read_checkpoint(tmp_path / "finetune-rgb-scratch-frac0.5.pt")["model_config"]["name"]
        == "classifier_r18"
    )
