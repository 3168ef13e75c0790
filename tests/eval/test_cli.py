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
from memdpc.eval.results import load_result
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
    assert "trained on the rgb stream, not on the flow stream" in proc.stderr


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


def test_fuse_writes_the_mean_and_refuses_other_splits(eval_data, checkpoints, tmp_path):
    for stream in ("rgb", "flow"):
        res = _cli("eval", "probe", str(checkpoints[stream]), "--shards", str(eval_data.shards),
                   "--out", str(tmp_path), "--epochs", "2", *OPTS)
        assert res.exit_code == 0, res.output
    rgb, flow = tmp_path / "probe-linear-rgb.json", tmp_path / "probe-linear-flow.json"
    res = _cli("eval", "--fuse", str(rgb), str(flow), "--fuse-out", str(tmp_path / "fused.json"))
    assert res.exit_code == 0, res.output
    _, fused = load_result(tmp_path / "fused.json")
    mean = (load_result(rgb)[1]["probs"] + load_result(flow)[1]["probs"]) / 2
    np.testing.assert_allclose(fused["probs"], mean, atol=1e-6)
    other = json.loads(flow.read_text())
    (tmp_path / "other.json").write_text(json.dumps({**other, "split": "val"}))
    _one_line_error(_cli("eval", "fuse", str(rgb), str(tmp_path / "other.json")), "split 'val' differs")
    (tmp_path / "ds.json").write_text(json.dumps({**other, "dataset": "hmdb51"}))
    _one_line_error(_cli("eval", "--fuse", str(rgb), str(tmp_path / "ds.json")), "dataset 'hmdb51' differs")
