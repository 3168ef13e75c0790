"""`memdpc eval finetune` (eval/finetune.py) on real shards with a real (one-step) pretrained checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.errors import UserError
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate
from memdpc.model.checkpoint import read_checkpoint

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_finetune_on_a_label_fraction_resumes(eval_data, checkpoints, tmp_path):
    kw = dict(shards=eval_data.shards, out=tmp_path, label_fraction=0.5, fit={"epochs": 1}, **COMMON)
    path = evaluate("finetune", checkpoints["rgb"], **kw)
    result, arrays = load_result(path)
    assert path.name == "finetune-rgb-frac0.5.json" and result["config"]["train_videos"] == 3  # 1 of 2 per class
    assert len(result["train_loss"]) == 1 and arrays["probs"].shape == (6, 3)
    # the finetuned classifier is kept as a checkpoint that `eval classify` scores to the same probabilities
    ckpt = read_checkpoint(tmp_path / "finetune-rgb-frac0.5.pt")
    assert (ckpt["origin"], ckpt["stream"], ckpt["model_config"]["num_classes"]) == ("finetune", "rgb", 3)
    scored, scored_arrays = load_result(evaluate("classify", tmp_path / "finetune-rgb-frac0.5.pt",
                                                 shards=eval_data.shards, out=tmp_path / "classify", **COMMON))
    assert scored["metrics"] == result["metrics"]
    np.testing.assert_allclose(scored_arrays["probs"], arrays["probs"], atol=1e-6)
    again, arrays2 = load_result(evaluate("finetune", checkpoints["rgb"], **kw))  # resumes: nothing left to train
    assert again["train_loss"] == result["train_loss"]
    np.testing.assert_allclose(arrays2["probs"], arrays["probs"], atol=1e-6)
    with pytest.raises(UserError, match="other settings"):
        evaluate("finetune", checkpoints["rgb"], **{**kw, "fit": {"epochs": 1, "lr": 0.01}})


def test_random_init_baseline_is_a_separate_result(eval_data, checkpoints, tmp_path):
    path = evaluate("finetune", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, random_init=True,
                    label_fraction=0.5, fit={"epochs": 1}, **COMMON)
    result, _ = load_result(path)
    assert path.name == "finetune-rgb-scratch-frac0.5.json" and result["config"]["random_init"] is True
    assert read_checkpoint(tmp_path / "finetune-rgb-scratch-frac0.5.pt")["model_config"]["name"] == "classifier_r18"
