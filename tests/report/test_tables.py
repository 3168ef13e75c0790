"""report/tables.py: the evaluation-metrics tables, rendered for real (a real results file, a rich
``Console(record=True)``) and read back row by row."""

from __future__ import annotations

import numpy as np

from memdpc.eval.results import load_result, save_result
from memdpc.eval.stats import wilson
from memdpc.report.tables import metric_text, print_result

from .conftest import recording_console, table_rows


def test_result_metrics_with_intervals_counts_na_and_a_small_test_set(tmp_path):
    """R@10 of a 9-video gallery was printed as 100 %, with no count and no interval."""
    labels = np.repeat(np.arange(3), 3)  # 9 test videos of 3 classes, querying a gallery of the same 9 labels
    neighbours = np.array([[i, *(j for j in range(9) if j != i)] for i in range(9)])  # itself first: R@1 = 1
    neighbours[0] = [3, 0, 1, 2, 4, 5, 6, 7, 8]  # query 0 (class 0) finds its class second
    result = {
        "kind": "retrieval",
        "stream": "rgb",
        "dataset": "syn",
        "split": "test",
        "classes": ["a", "b", "c"],
    }
    arrays = {
        "video_ids": np.array([f"q{i}" for i in range(9)]),
        "labels": labels,
        "gallery_ids": np.array([f"g{i}" for i in range(9)]),
        "gallery_labels": labels,
        "neighbours": neighbours,
    }
    path = save_result(tmp_path / "r.json", result, arrays)
    console = recording_console()
    print_result(path, console)
    text = console.export_text()
    assert " ".join(text.split()[:5]) == "retrieval · rgb · syn/test"  # the title
    r1 = wilson(8, 9)
    r5 = wilson(9, 9)
    assert table_rows(text) == [
        ["metric", "value", "95 % interval", "method"],
        ["R@1", "88.9%", f"{100 * r1[0]:.1f}–{100 * r1[1]:.1f}%", "wilson"],
        ["R@5", "100.0%", f"{100 * r5[0]:.1f}–100.0%", "wilson"],
        ["R@10", "n/a", "", ""],
        ["R@20", "n/a", "", ""],
        ["R@50", "n/a", "", ""],
    ]
    lines = text.rstrip().splitlines()
    assert "9 test videos of 3 classes (3 in the smallest class), gallery of 9 videos" in " ".join(
        text.split()
    )
    assert lines[-5:] == [
        "R@10 n/a: R@10 with a gallery of 9 videos: every gallery video is among the first 10",
        "R@20 n/a: R@20 with a gallery of 9 videos: every gallery video is among the first 20",
        "R@50 n/a: R@50 with a gallery of 9 videos: every gallery video is among the first 50",
        "warning: small test set: 3 test videos in its smallest class, fewer than 5",
        f"wrote {path} and {tmp_path / 'r.npz'}",
    ]


def test_result_names_every_file_it_lists(tmp_path):
    result = {
        "kind": "finetune",
        "stream": "rgb",
        "dataset": "syn",
        "split": "test",
        "classes": ["a", "b"],
        "files": {"features": ["f-train.npz", "f-test.npz"], "plots": ["c.png"]},
    }
    arrays = {"video_ids": np.array(["v"]), "labels": np.array([0]), "probs": np.array([[0.9, 0.1]])}
    path = save_result(tmp_path / "finetune-rgb.json", result, arrays)
    console = recording_console()
    print_result(path, console)
    lines = console.export_text().rstrip().splitlines()[-3:]
    assert lines == [
        f"wrote {path} and {tmp_path / 'finetune-rgb.npz'}",
        f"feature caches: {tmp_path / 'f-train.npz'} {tmp_path / 'f-test.npz'}",
        f"plots: {tmp_path / 'c.png'}",
    ]


def test_an_oops_result_without_an_interval_that_holds_says_why(tmp_path):
    """One video holds every transitional step: no interval (its bootstrap shows no spread), n/a and why."""
    result = {
        "kind": "oops-frozen",
        "stream": "rgb",
        "dataset": "oops",
        "split": "val",
        "classes": ["intentional", "transitional", "unintentional"],
    }
    arrays = {
        "video_ids": np.array(["v1", "v1", "v2"]),
        "keys": np.array(["v1_00000", "v1_00006", "v2_00000"]),
        "labels": np.array([[0, 1], [1, 2], [2, 2]]),
        "pred": np.array([[0, 0], [1, 2], [2, 0]]),
    }
    path = save_result(tmp_path / "oops-rgb.json", result, arrays)
    console = recording_console()
    print_result(path, console)
    text = console.export_text()
    assert ["recall_transitional", "50.0%", "n/a", ""] in table_rows(text)
    assert metric_text(load_result(path)[0], "recall_transitional") == "50.0 [interval n/a]"
    assert (
        "recall_transitional: no interval: 1 test video holds all there is to count: a bootstrap over videos "
        "shows no spread" in text.splitlines()
    )
