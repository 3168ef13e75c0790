"""`memdpc eval compare` (eval/compare.py) on results of real `memdpc eval` runs: the same test videos paired
(the differences and McNemar's discordant videos counted by hand from the arrays), results on other videos or
of another kind refused in one line; McNemar's exact p-value on a hand-counted case."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.eval.compare import compare_results, verdict
from memdpc.eval.results import load_result, save_result
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings

from ..conftest import run_memdpc
from .conftest import CLIP

OPTS = ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu"]


def _eval(*args) -> None:
    res = run_memdpc("eval", *map(str, args), *OPTS)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="module")
def results(eval_data, checkpoints, other_rgb, tmp_path_factory) -> dict[str, object]:
    """Probe and retrieval results of two rgb checkpoints on the same test videos (a, b), and a probe on the
    same dataset and split with one test video fewer (fewer)."""
    root = tmp_path_factory.mktemp("compare")
    for name, ckpt in (("a", checkpoints["rgb"]), ("b", other_rgb)):
        _eval("probe", ckpt, "--shards", eval_data.shards, "--out", root / name, "--epochs", "20")
        _eval("retrieve", ckpt, "--shards", eval_data.shards, "--out", root / name)  # the probe's features
    dropped = next(r for r in eval_data.records if r.split == "test")
    fewer = root / "fewer" / eval_data.shards.name  # the same dataset name: the shard folder's
    for split in ("train", "test"):
        records = [r for r in eval_data.records if r is not dropped]
        shard_stream(
            eval_data.shards.parent / "archives",
            records,
            "rgb",
            fewer,
            split,
            ShardSettings(clip=CLIP, window_step=6, max_count=4),
        )
    _eval("probe", checkpoints["rgb"], "--shards", fewer, "--out", root / "fewer", "--epochs", "2")
    return {
        "probe": [root / n / "probe-linear-rgb.json" for n in "ab"],
        "retrieval": [root / n / "retrieval-rgb.json" for n in "ab"],
        "fewer": root / "fewer" / "probe-linear-rgb.json",
        "dropped": dropped.id,
        "root": root,
    }


@pytest.mark.slow
def test_the_same_test_videos_are_paired_video_by_video(results):
    a, b = results["probe"]
    out = results["root"] / "compare.json"
    res = run_memdpc("eval", "compare", str(a), str(b), "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    comparison = json.loads(out.read_text())
    (ra, arr_a), (rb, arr_b) = load_result(a), load_result(b)
    order = [list(arr_b["video_ids"]).index(v) for v in arr_a["video_ids"]]
    right_a = arr_a["probs"].argmax(axis=1) == arr_a["labels"]
    right_b = (arr_b["probs"].argmax(axis=1) == arr_b["labels"])[order]
    only_a, only_b = int(np.sum(right_a & ~right_b)), int(np.sum(right_b & ~right_a))
    top1 = comparison["metrics"]["top1"]
    assert comparison["videos"] == 6 and (top1["a"], top1["b"]) == (
        ra["metrics"]["top1"],
        rb["metrics"]["top1"],
    )
    assert top1["difference"] == pytest.approx(right_a.mean() - right_b.mean())
    assert top1["discordant"] == {"a_only": only_a, "b_only": only_b} and top1["test"] == "mcnemar exact"
    n = only_a + only_b
    assert top1["p"] == pytest.approx(
        min(1, 2 * sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n)
    )
    assert top1["interval"][0] <= top1["difference"] <= top1["interval"][1]
    assert comparison["metrics"]["top5"] == {
        "undefined": "top-5 of 3 classes: every class is among the first 5"
    }
    assert comparison["metrics"]["mean_class_top1"]["test"] == "paired bootstrap"
    lines = res.stdout.splitlines()
    assert verdict("top1", top1, "A", "B", 6) in lines
    assert "top5: not compared (top-5 of 3 classes: every class is among the first 5)" in lines
    assert lines[-1] == f"wrote {out}"
    r = compare_results(*results["retrieval"])  # retrieval: the same gallery too
    assert r["metrics"]["R@1"]["test"] == "mcnemar exact" and "undefined" in r["metrics"]["R@10"]
    same = compare_results(a, a)["metrics"]
    for name in ("top1", "mean_class_top1"):  # no discordant video: said so, not "+0.0 to +0.0"
        assert same[name]["interval"] is None and same[name]["p"] is None
        assert same[name]["discordant"] == {"a_only": 0, "b_only": 0}
        assert verdict(name, same[name], "A", "B", 6) == (
            f"{name}: +0.0 points; no discordant video: A and B are right on the same test videos; 6 test videos"
        )


@pytest.mark.slow
def test_results_on_other_videos_or_of_another_kind_are_refused_in_one_line(results):
    a = results["probe"][0]
    res = run_memdpc("eval", "compare", str(a), str(results["fewer"]))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"Error: {a} and {results['fewer']}: the test video sets differ (1 only in the first, 0 only in the "
        f"second, e.g. ['{results['dropped']}'])"
    ]
    retrieval = results["retrieval"][1]
    with pytest.raises(UserError) as e:
        compare_results(a, retrieval)
    assert str(e.value) == (
        f"{a} is a probe-linear result and {retrieval} a retrieval result: compare needs results scored the "
        "same way (classifiers, retrieval or Oops) on the same test videos"
    )
    res = run_memdpc("eval", "compare", str(a), str(results["probe"][1]), "--out", str(a))
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "is one of the results being compared; give another --out"
    )


def test_mcnemar_on_a_hand_counted_case(tmp_path):
    """8 videos: 2 right in both, 1 only by A, 5 only by B: p = 2 · P(X ≤ 1), X ~ Binomial(6, 1/2) = 14/64."""
    labels = np.zeros(8, int)
    right = np.array([[1, 0], [0, 1]], np.float32)  # class 0 first / class 1 first
    a_right = [1, 1, 1, 0, 0, 0, 0, 0]
    b_right = [1, 1, 0, 1, 1, 1, 1, 1]
    result = {"kind": "probe-linear", "stream": "rgb", "dataset": "d", "split": "test", "classes": ["x", "y"]}
    ids = np.array([f"v{i}" for i in range(8)])
    pa = save_result(
        tmp_path / "a.json",
        result,
        {"video_ids": ids, "labels": labels, "probs": right[[1 - r for r in a_right]]},
    )
    pb = save_result(
        tmp_path / "b.json",
        {**result, "kind": "finetune"},
        {"video_ids": ids[::-1], "labels": labels, "probs": right[[1 - r for r in b_right[::-1]]]},
    )
    top1 = compare_results(pa, pb)["metrics"]["top1"]
    assert (top1["a"], top1["b"], top1["difference"]) == (3 / 8, 7 / 8, -0.5)
    assert top1["discordant"] == {"a_only": 1, "b_only": 5} and top1["p"] == 14 / 64
    assert verdict("top1", top1, "A", "B", 8).startswith(
        "top1: no reliable difference between A and B (-50.0 points"
    )
