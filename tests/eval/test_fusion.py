"""Late fusion: the fused probabilities equal the (weighted) mean, retrieval's weights chosen on the gallery;
mismatched results are refused."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.eval.fusion import SHARES, choose_weights, fuse_results
from memdpc.eval.results import load_result, save_result
from memdpc.model.retrieval import RECALL_KS, center_normalize, topk_neighbours

CLASSES = ["a", "b", "c"]


def _classify(path, stream, ids, probs, labels, **over):
    result = {
        "kind": "finetune",
        "stream": stream,
        "dataset": "syn",
        "split": "test",
        "classes": CLASSES,
        **over,
    }
    arrays = {"video_ids": np.array(ids), "labels": np.array(labels), "probs": np.array(probs, np.float32)}
    return save_result(path, result, arrays)


def test_fused_probabilities_are_the_mean_matched_by_video_id(tmp_path):
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1", "v2"], [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]], [0, 1])
    # flow lists the videos in the other order
    flow = _classify(tmp_path / "flow.json", "flow", ["v2", "v1"], [[0.1, 0.8, 0.1], [0.2, 0.7, 0.1]], [1, 0])
    result, arrays = fuse_results(rgb, flow)
    np.testing.assert_allclose(arrays["probs"], [[0.4, 0.5, 0.1], [0.15, 0.5, 0.35]], atol=1e-6)
    assert arrays["video_ids"].tolist() == ["v1", "v2"]
    # v1 (class 0) -> argmax 1: miss; v2 (class 1) -> argmax 1: hit
    fused = load_result(save_result(tmp_path / "fused.json", result, arrays))[0]
    assert fused["metrics"]["top1"] == 0.5 and fused["stream"] == "rgb+flow"
    _, weighted = fuse_results(rgb, flow, weights=(3, 1))
    np.testing.assert_allclose(
        weighted["probs"][0], [0.75 * 0.6 + 0.25 * 0.2, 0.75 * 0.3 + 0.25 * 0.7, 0.1], atol=1e-6
    )


def test_the_fused_result_names_each_streams_checkpoint_and_its_run(tmp_path):
    """A fusion of a trained stream and an untrained one says so: each stream's checkpoint, its SHA-256 and the
    run folder it came from (none for an init.pt written outside a run)."""
    trained = {"checkpoint": str(tmp_path / "runs" / "rgb" / "checkpoints" / "last.pt"), "sha256": "ab" * 32}
    untrained = {"checkpoint": str(tmp_path / "init.pt"), "sha256": "cd" * 32}
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1"], [[0.6, 0.3, 0.1]], [0], source=trained)
    flow = _classify(tmp_path / "flow.json", "flow", ["v1"], [[0.1, 0.8, 0.1]], [0], source=untrained)
    result, arrays = fuse_results(rgb, flow)
    fused = load_result(save_result(tmp_path / "fused.json", result, arrays))[0]
    assert fused["checkpoints"] == {
        "rgb": {**trained, "run": str(tmp_path / "runs" / "rgb")},
        "flow": {**untrained, "run": None},
    }


@pytest.mark.parametrize(
    "field,value,match",
    [("dataset", "other", "dataset"), ("split", "train", "split"), ("classes", ["a", "b", "x"], "classes")],
)
def test_results_of_other_datasets_or_splits_are_refused(tmp_path, field, value, match):
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1"], [[1, 0, 0]], [0])
    flow = _classify(tmp_path / "flow.json", "flow", ["v1"], [[1, 0, 0]], [0], **{field: value})
    with pytest.raises(UserError, match=match):
        fuse_results(rgb, flow)


def test_different_video_sets_are_refused(tmp_path):
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1", "v2"], [[1, 0, 0]] * 2, [0, 0])
    flow = _classify(tmp_path / "flow.json", "flow", ["v1", "v3"], [[1, 0, 0]] * 2, [0, 0])
    with pytest.raises(UserError, match="video sets differ"):
        fuse_results(rgb, flow)


def test_retrieval_fusion_uses_the_sum_of_similarities(tmp_path):
    def save(name, q, g, neighbours):
        result = {
            "kind": "retrieval",
            "stream": name,
            "dataset": "syn",
            "split": "test",
            "classes": CLASSES,
        }
        arrays = {
            "video_ids": np.array(["q"]),
            "labels": np.array([0]),
            "query": np.array(q, np.float32),
            "gallery": np.array(g, np.float32),
            "gallery_ids": np.array(["g0", "g1", "g2", "g3"]),
            "gallery_labels": np.array([0, 1, 2, 2]),
            "neighbours": np.array([neighbours]),
        }
        return save_result(tmp_path / f"{name}.json", result, arrays)

    # stored features are already normalised; with a query [1] the similarities are the gallery values:
    # stream A ranks g1 first (.96), stream B ranks g2 first; their sums [1.8, 1.46, 1.46, -2] rank g0 first
    a = save("rgb", [[1.0]], [[0.9], [0.96], [0.5], [-1]], [1, 0, 2, 3])
    b = save("flow", [[1.0]], [[0.9], [0.5], [0.96], [-1]], [2, 0, 1, 3])
    assert load_result(a)[0]["metrics"]["R@1"] == 0.0  # g1 is of another class
    result, arrays = fuse_results(a, b)
    assert arrays["neighbours"][0].tolist() == [0, 1, 2, 3]
    path = save_result(tmp_path / "fused.json", result, arrays)
    assert load_result(path)[0]["metrics"]["R@1"] == 1.0 and result["kind"] == "fusion-retrieval"


def test_classifier_and_retrieval_results_do_not_fuse(tmp_path):
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1"], [[1, 0, 0]], [0])
    retrieval = {"kind": "retrieval", "stream": "flow", "dataset": "syn", "split": "test", "classes": CLASSES}
    arrays = {
        "video_ids": np.array(["v1"]),
        "labels": np.array([0]),
        "gallery_ids": np.array(["g0", "g1"]),
        "gallery_labels": np.array([0, 1]),
        "neighbours": np.array([[0, 1]]),
    }
    flow = save_result(tmp_path / "flow.json", retrieval, arrays)
    with pytest.raises(UserError, match="cannot fuse"):
        fuse_results(rgb, flow)
    assert center_normalize(np.eye(2)).shape == (2, 2)


def _retrieval(path, stream, query, gallery, labels, gallery_labels):
    result = {"kind": "retrieval", "stream": stream, "dataset": "syn", "split": "test", "classes": CLASSES}
    query, gallery = center_normalize(query), center_normalize(gallery)
    arrays = {
        "video_ids": np.array([f"q{i}" for i in range(len(query))]),
        "labels": np.array(labels),
        "query": query,
        "gallery": gallery,
        "gallery_ids": np.array([f"g{i}" for i in range(len(gallery))]),
        "gallery_labels": np.array(gallery_labels),
        "neighbours": topk_neighbours([(query, gallery)], max(RECALL_KS))[0],
    }
    return save_result(path, result, arrays)


def _two_streams(folder, seed, test_labels=None):
    """rgb: noise; flow: its class's direction plus noise; 30 gallery (training) and 30 test videos."""
    rng = np.random.default_rng(seed)
    folder.mkdir(exist_ok=True)
    g_labels, q_labels = np.arange(30) % 3, np.arange(30) % 3
    centres = 3 * np.eye(3, 16)
    flow_g = centres[g_labels] + rng.normal(size=(30, 16))
    flow_q = centres[q_labels] + rng.normal(size=(30, 16))
    rgb_g, rgb_q = 4 * rng.normal(size=(30, 16)), 4 * rng.normal(size=(30, 16))
    shown = q_labels if test_labels is None else test_labels
    rgb = _retrieval(folder / "rgb.json", "rgb", rgb_q, rgb_g, shown, g_labels)
    flow = _retrieval(folder / "flow.json", "flow", flow_q, flow_g, shown, g_labels)
    return rgb, flow


def _r1(tmp_path, result, arrays, name):
    return load_result(save_result(tmp_path / name, result, arrays))[0]["metrics"]["R@1"]


def test_chosen_weights_keep_a_stream_that_tells_nothing_from_spoiling_the_other(tmp_path):
    """An uninformative RGB stream drags the equal-weight fusion below flow alone; the weights chosen on the
    training videos give flow most of the weight and the fused R@1 is back at flow's (or above)."""
    rgb, flow = _two_streams(tmp_path, 0)
    flow_alone = load_result(flow)[0]["metrics"]["R@1"]
    equal = _r1(tmp_path, *fuse_results(rgb, flow), "equal.json")
    result, arrays = fuse_results(rgb, flow, choose=True)
    chosen = _r1(tmp_path, result, arrays, "chosen.json")
    assert equal < flow_alone <= chosen
    weights, on = result["config"]["weights"], result["config"]["chosen_on"]
    assert weights[1] > 0.5 and sum(weights) == pytest.approx(1) and on["videos"] == 30
    assert on["shares"] == list(SHARES) and max(on["precision"]) == on["precision"][SHARES.index(weights[1])]


def test_chosen_weights_read_no_test_label(tmp_path):
    """The same features with the test videos' labels shuffled: the same weights are chosen."""
    rgb, flow = _two_streams(tmp_path / "a", 1)
    shuffled = np.random.default_rng(2).permutation(np.arange(30) % 3)
    rgb2, flow2 = _two_streams(tmp_path / "b", 1, test_labels=shuffled)
    a, b = fuse_results(rgb, flow, choose=True)[0], fuse_results(rgb2, flow2, choose=True)[0]
    assert (
        a["config"]["weights"] == b["config"]["weights"]
        and a["config"]["chosen_on"] == b["config"]["chosen_on"]
    )


def test_of_equally_good_weights_the_nearest_to_equal_is_chosen():
    """Two streams of the same features: every share but those that drop a stream ranks alike; 0.5 is chosen.
    Each video's own similarity is the highest, so leave-one-out must skip it (else every share scores more)."""
    g = center_normalize(np.random.default_rng(3).normal(size=(12, 8)))
    labels = np.arange(12) % 4
    weights, on = choose_weights(g, g, labels)
    assert weights == (0.5, 0.5) and on["k"] == 10 and len(set(on["precision"][1:-1])) == 1
    # by hand: each video's 10 nearest others (all but the farthest), the share of its class among them
    sim = g @ g.T
    np.fill_diagonal(sim, -np.inf)
    nearest = np.argsort(-sim, axis=1, kind="stable")[:, :10]
    assert on["precision"][5] == pytest.approx(np.mean(labels[nearest] == labels[:, None]), abs=1e-4)
    with pytest.raises(UserError, match="at least two"):
        choose_weights(g[:1], g[:1], labels[:1])


def test_weights_are_chosen_for_retrieval_results_only(tmp_path):
    rgb = _classify(tmp_path / "rgb.json", "rgb", ["v1"], [[1, 0, 0]], [0])
    flow = _classify(tmp_path / "flow.json", "flow", ["v1"], [[1, 0, 0]], [0])
    with pytest.raises(UserError, match="retrieval results only"):
        fuse_results(rgb, flow, choose=True)
