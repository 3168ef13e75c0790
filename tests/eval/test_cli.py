"""`memdpc eval` from the command line: torchrun with two ranks, and one-line errors (exit 2) for bad input.

Most calls go through click's in-process runner (the real command, without paying a torch import per
call on a 2-core machine); one bad-input case and the torchrun run are real subprocesses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.eval.results import load_result, save_result
from memdpc.eval.run import evaluate

from .conftest import run_cli

pytestmark = pytest.mark.slow
OPTS = ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu"]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_line_error(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and text in result.output, result.output


def test_torchrun_two_ranks_gives_the_single_process_result(eval_data, checkpoints, tmp_path):
    evaluate("retrieve", checkpoints["flow"], shards=eval_data.shards, out=tmp_path / "one", backend="torch",
             num_workers=0, batch_size=4, device="cpu")
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
         "-m", "memdpc.cli", "eval", "retrieve", str(checkpoints["flow"]), "--shards", str(eval_data.shards),
         "--out", str(tmp_path / "two"), *OPTS], capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert "R@1" in two.stdout
    (r1, a1) = load_result(tmp_path / "one/retrieval-flow.json")
    (r2, a2) = load_result(tmp_path / "two/retrieval-flow.json")
    assert r1["metrics"] == r2["metrics"]
    np.testing.assert_array_equal(a1["neighbours"], a2["neighbours"])
    np.testing.assert_allclose(a1["query"], a2["query"], atol=1e-5)


def test_wrong_stream_is_one_line_and_exit_2_in_a_real_process(eval_data, checkpoints, tmp_path):
    proc = run_cli("eval", "retrieve", str(checkpoints["rgb"]), "--shards", str(eval_data.shards),
                   "--out", str(tmp_path), "--stream", "flow", *OPTS)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "trained on the rgb stream, not flow" in proc.stderr


def test_empty_split_and_differing_label_sets_are_refused(eval_data, checkpoints, tmp_path):
    ck = str(checkpoints["rgb"])
    test_manifest = json.loads((eval_data.shards / "rgb/manifest-test.json").read_text())
    copy = tmp_path / "shards"
    shutil.copytree(eval_data.shards, copy)
    (copy / "rgb/manifest-empty.json").write_text(json.dumps({**test_manifest, "split": "empty",
                                                              "num_samples": 0, "shards": []}))
    _one_line_error(_cli("eval", "retrieve", ck, "--shards", str(copy), "--out", str(tmp_path),
                         "--test-split", "empty", *OPTS), "the empty split is empty")
    (copy / "rgb/manifest-test.json").write_text(json.dumps({**test_manifest, "classes": ["a", "b", "c"]}))
    _one_line_error(_cli("eval", "probe", ck, "--shards", str(copy), "--out", str(tmp_path), *OPTS),
                    "classes differ")


def _probs_result(path, stream, probs, **over):
    result = {"kind": "probe-linear", "stream": stream, "dataset": "syn", "split": "test", "classes": ["a", "b"],
              "metrics": {}, **over}
    arrays = {"video_ids": np.array(["v1", "v2"]), "labels": np.array([0, 1]), "probs": np.array(probs, np.float32)}
    return save_result(path, result, arrays)


def test_fuse_writes_the_mean_and_refuses_other_datasets_and_splits(tmp_path):
    # the fusion math is tested in test_fusion.py; here: the two spellings of the command and their errors
    rgb = _probs_result(tmp_path / "rgb.json", "rgb", [[0.8, 0.2], [0.6, 0.4]])
    flow = _probs_result(tmp_path / "flow.json", "flow", [[0.2, 0.8], [0.0, 1.0]])
    res = _cli("eval", "--fuse", str(rgb), str(flow), "--fuse-out", str(tmp_path / "fused.json"))
    assert res.exit_code == 0 and "top1" in res.output, res.output
    np.testing.assert_allclose(load_result(tmp_path / "fused.json")[1]["probs"], [[0.5, 0.5], [0.3, 0.7]])
    res = _cli("eval", "fuse", str(rgb), str(flow), "--weights", "3", "1", "--out", str(tmp_path / "w.json"))
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(load_result(tmp_path / "w.json")[1]["probs"][1], [0.45, 0.55], atol=1e-6)
    other = _probs_result(tmp_path / "val.json", "flow", [[0, 1], [0, 1]], split="val")
    _one_line_error(_cli("eval", "fuse", str(rgb), str(other)), "split 'val' differs")
    other = _probs_result(tmp_path / "ds.json", "flow", [[0, 1], [0, 1]], dataset="hmdb51")
    _one_line_error(_cli("eval", "--fuse", str(rgb), str(other)), "dataset 'hmdb51' differs")
