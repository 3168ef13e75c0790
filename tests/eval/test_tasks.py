"""End-to-end evaluations on real shards with real (one-step) pretrained checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.errors import UserError
from memdpc.eval.features import load_windows, video_mean
from memdpc.eval.oops_labels import step_labels
from memdpc.eval.results import load_result
from memdpc.eval.run import evaluate, fuse
from memdpc.eval.shard_meta import window_info
from memdpc.model.retrieval import retrieve
from memdpc.pipeline.clip import ClipSpec

pytestmark = pytest.mark.slow
COMMON = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def test_retrieval_matches_recomputation_from_cached_features(eval_data, checkpoints, tmp_path):
    path = evaluate("retrieve", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, plot=True, **COMMON)
    result, arrays = load_result(path)
    assert result["kind"] == "retrieval" and result["stream"] == "rgb" and result["split"] == "test"
    assert result["metrics"]["queries"] == 6 and result["metrics"]["gallery"] == 6
    feats = {}
    for split in ("train", "test"):
        with np.load(tmp_path / f"features-rgb-{split}.npz") as z:
            windows = load_windows(tmp_path / f"features-rgb-{split}.npz", str(z["fingerprint"]))
        feats[split] = video_mean(windows)
    metrics, neighbours = retrieve([feats["test"][2]], [feats["train"][2]], feats["test"][1], feats["train"][1])
    assert {k: result["metrics"][k] for k in metrics} == metrics
    np.testing.assert_array_equal(arrays["neighbours"], neighbours)
    np.testing.assert_allclose(np.linalg.norm(arrays["query"], axis=1), 1, atol=1e-5)
    for png in ("retrieval-rgb.png", "memory-norms-rgb.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_ten_crop_and_fusion_of_two_streams(eval_data, checkpoints, tmp_path):
    # ten crops for RGB, one for flow: fusion needs the same videos, not the same test protocol
    paths = {s: evaluate("probe", checkpoints[s], shards=eval_data.shards, out=tmp_path, head="mlp", crops=k,
                         fit={"epochs": 3}, plot=s == "rgb", **COMMON) for s, k in (("rgb", 10), ("flow", 1))}
    (rgb, a_rgb), (_, a_flow) = load_result(paths["rgb"]), load_result(paths["flow"])
    assert rgb["kind"] == "probe-mlp" and a_rgb["probs"].shape == (6, 3)
    np.testing.assert_allclose(a_rgb["probs"].sum(axis=1), 1, atol=1e-5)
    with np.load(tmp_path / "features-rgb-test-crops10.npz") as z:
        assert z["values"].shape[:2] == (12, 10)  # every test window, ten crops
    out = fuse(paths["rgb"], paths["flow"], out=tmp_path / "fused.json")
    fused, a_fused = load_result(out)
    np.testing.assert_array_equal(a_rgb["video_ids"], a_flow["video_ids"])
    np.testing.assert_allclose(a_fused["probs"], (a_rgb["probs"] + a_flow["probs"]) / 2, atol=1e-6)
    assert fused["stream"] == "rgb+flow" and (tmp_path / "probe-mlp-rgb-confusion.png").is_file()


def test_finetune_on_a_label_fraction_resumes(eval_data, checkpoints, tmp_path):
    kw = dict(shards=eval_data.shards, out=tmp_path, label_fraction=0.5, fit={"epochs": 1}, **COMMON)
    path = evaluate("finetune", checkpoints["rgb"], **kw)
    result, arrays = load_result(path)
    assert path.name == "finetune-rgb-frac0.5.json" and result["config"]["train_videos"] == 3  # 1 of 2 per class
    assert len(result["train_loss"]) == 1 and arrays["probs"].shape == (6, 3)
    again, arrays2 = load_result(evaluate("finetune", checkpoints["rgb"], **kw))  # resumes: nothing left to train
    assert again["train_loss"] == result["train_loss"]
    np.testing.assert_allclose(arrays2["probs"], arrays["probs"], atol=1e-6)
    with pytest.raises(UserError, match="other settings"):
        evaluate("finetune", checkpoints["rgb"], **{**kw, "fit": {"epochs": 1, "lr": 0.01}})


@pytest.mark.parametrize("mode", ["frozen", "finetune"])
def test_oops_step_labels_and_metrics(eval_data, checkpoints, tmp_path, mode):
    path = evaluate("oops", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, index=eval_data.index,
                    mode=mode, fit={"epochs": 2}, **COMMON)
    result, arrays = load_result(path)
    assert result["kind"] == f"oops-{mode}" and result["classes"][1] == "transitional"
    info = window_info(eval_data.shards, "rgb", "test")
    times = {r.id: r.extra["t"] for r in eval_data.records}
    spec = ClipSpec(5, 3, 1)
    for key, labels in zip(arrays["keys"], arrays["labels"], strict=True):
        w = info[str(key)]
        assert labels.tolist() == step_labels(w["start"], w["fps"], times[w["video_id"]], spec)[1:].tolist()
    assert result["metrics"]["steps"] == 12 * 4
    assert 0 <= result["metrics"]["accuracy"] <= 1 and arrays["pred"].shape == arrays["labels"].shape


def test_checkpoint_of_the_wrong_stream_is_refused(eval_data, checkpoints, tmp_path):
    with pytest.raises(UserError, match="trained on the rgb stream, not flow"):
        evaluate("retrieve", checkpoints["rgb"], stream="flow", shards=eval_data.shards, out=tmp_path, **COMMON)


def test_random_init_baseline_is_a_separate_result(eval_data, checkpoints, tmp_path):
    path = evaluate("finetune", checkpoints["rgb"], shards=eval_data.shards, out=tmp_path, random_init=True,
                    label_fraction=0.5, fit={"epochs": 1}, **COMMON)
    result, _ = load_result(path)
    assert path.name == "finetune-rgb-scratch-frac0.5.json" and result["config"]["random_init"] is True
