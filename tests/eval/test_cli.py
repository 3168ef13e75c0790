"""`memdpc eval` from the command line: torchrun with two ranks, and one-line errors (exit 2) for bad input.

Most calls go through click's in-process runner (the real command, without paying a torch import per
call on a 2-core machine); one bad-input case and the torchrun run are real subprocesses.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.eval.results import load_result, save_result
from memdpc.eval.run import evaluate

from ..conftest import run_memdpc, torchrun_command

pytestmark = pytest.mark.slow
OPTS = ["--backend", "torch", "--workers", "0", "--batch-size", "4", "--device", "cpu"]


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_line_error(result, text: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and text in result.output, result.output


def test_torchrun_two_ranks_gives_the_single_process_result(eval_data, checkpoints, tmp_path):
    evaluate(
        "retrieve",
        checkpoints["flow"],
        shards=eval_data.shards,
        out=tmp_path / "one",
        backend="torch",
        num_workers=0,
        batch_size=4,
        device="cpu",
    )
    two = subprocess.run(
        torchrun_command(
            "eval",
            "retrieve",
            str(checkpoints["flow"]),
            "--shards",
            str(eval_data.shards),
            "--out",
            str(tmp_path / "two"),
            *OPTS,
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr
    assert "R@1" in two.stdout
    (r1, a1) = load_result(tmp_path / "one/retrieval-flow.json")
    (r2, a2) = load_result(tmp_path / "two/retrieval-flow.json")
    assert r1["metrics"] == r2["metrics"]
    np.testing.assert_array_equal(a1["neighbours"], a2["neighbours"])
    np.testing.assert_allclose(a1["query"], a2["query"], atol=1e-5)


def test_wrong_stream_is_one_line_and_exit_2_in_a_real_process(eval_data, checkpoints, tmp_path):
    proc = run_memdpc(
        "eval",
        "retrieve",
        str(checkpoints["rgb"]),
        "--shards",
        str(eval_data.shards),
        "--out",
        str(tmp_path),
        "--stream",
        "flow",
        *OPTS,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "trained on the rgb stream, not flow" in proc.stderr


def test_empty_split_and_differing_label_sets_are_refused(eval_data, checkpoints, tmp_path):
    ck = str(checkpoints["rgb"])
    test_manifest = json.loads((eval_data.shards / "rgb/manifest-test.json").read_text())
    copy = tmp_path / "shards"
    shutil.copytree(eval_data.shards, copy)
    (copy / "rgb/manifest-empty.json").write_text(
        json.dumps({**test_manifest, "split": "empty", "num_samples": 0, "shards": []})
    )
    _one_line_error(
        _cli(
            "eval",
            "retrieve",
            ck,
            "--shards",
            str(copy),
            "--out",
            str(tmp_path),
            "--test-split",
            "empty",
            *OPTS,
        ),
        "the empty split is empty",
    )
    (copy / "rgb/manifest-test.json").write_text(json.dumps({**test_manifest, "classes": ["a", "b", "c"]}))
    _one_line_error(
        _cli("eval", "probe", ck, "--shards", str(copy), "--out", str(tmp_path), *OPTS), "classes differ"
    )


def _probs_result(path, stream, probs, **over):
    result = {
        "kind": "probe-linear",
        "stream": stream,
        "dataset": "syn",
        "split": "test",
        "classes": ["a", "b"],
        **over,
    }
    arrays = {
        "video_ids": np.array(["v1", "v2"]),
        "labels": np.array([0, 1]),
        "probs": np.array(probs, np.float32),
    }
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


def test_files_given_in_the_wrong_place_are_one_line_errors(eval_data, checkpoints, tmp_path):
    """A run folder, its metrics.jsonl and config.yaml, a results file and a truncated copy given as the
    checkpoint; a checkpoint given to --fuse. Each names the file, what it looks like and what to give."""
    ck = checkpoints["rgb"]
    run = ck.parent.parent  # the real run folder of `memdpc train`
    out = tmp_path / "out"
    ok = _cli("eval", "retrieve", str(ck), "--shards", str(eval_data.shards), "--out", str(out), *OPTS)
    assert ok.exit_code == 0, ok.output
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ck.read_bytes()[: ck.stat().st_size // 3])
    cases = [
        (run, f"{run} is a run folder: give one of its checkpoints, e.g. {ck} (it holds last.pt)"),
        (
            run / "metrics.jsonl",
            f"{run / 'metrics.jsonl'}: not a memdpc checkpoint (it looks like a run's metrics); "
            f"give a checkpoint, e.g. {ck}",
        ),
        (
            run / "config.yaml",
            f"{run / 'config.yaml'}: not a memdpc checkpoint (it looks like a run config); give a "
            f"checkpoint, e.g. {ck}",
        ),
        (
            out / "retrieval-rgb.json",
            f"{out / 'retrieval-rgb.json'}: not a memdpc checkpoint (it looks like a results "
            f"file of `memdpc eval`); it was made from {ck}",
        ),
        (cut, f"{cut}: not a readable checkpoint (truncated or damaged: its zip directory is missing)"),
    ]
    for given, text in cases:
        res = _cli(
            "eval",
            "retrieve",
            str(given),
            "--shards",
            str(eval_data.shards),
            "--out",
            str(tmp_path / "x"),
            *OPTS,
        )
        _one_line_error(res, text)
        assert any(line.startswith("Error: ") and text in line for line in res.output.splitlines())
    res = _cli("eval", "--fuse", str(ck), str(out / "retrieval-rgb.json"))
    _one_line_error(
        res,
        f"{ck}: not a results file (it looks like a PyTorch file, such as a checkpoint); give the "
        ".json files eval wrote",
    )
    assert not (tmp_path / "x").exists()


def test_fusing_a_stream_with_itself_is_refused(tmp_path):
    rgb = _probs_result(tmp_path / "rgb.json", "rgb", [[0.8, 0.2], [0.6, 0.4]])
    _one_line_error(
        _cli("eval", "--fuse", str(rgb), str(rgb)),
        f"{rgb} is given twice; fusion combines the results of two streams",
    )
    (tmp_path / "again").mkdir()
    _one_line_error(
        _cli("eval", "fuse", str(rgb), str(tmp_path / "again" / ".." / "rgb.json")), "is given twice"
    )
    other = _probs_result(tmp_path / "again" / "probe-rgb.json", "rgb", [[0.1, 0.9], [0.6, 0.4]])
    _one_line_error(
        _cli("eval", "fuse", str(rgb), str(other)), f"{rgb} and {other} are both results of the rgb stream"
    )
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == [
        "probe-rgb.json",
        "rgb.json",
    ]  # nothing written


def test_fusion_never_replaces_other_results_or_its_inputs_silently(tmp_path):
    rgb = _probs_result(tmp_path / "rgb.json", "rgb", [[0.8, 0.2], [0.6, 0.4]])
    flow = _probs_result(tmp_path / "flow.json", "flow", [[0.2, 0.8], [0.0, 1.0]])
    other = _probs_result(tmp_path / "other-flow.json", "flow", [[0.4, 0.6], [0.0, 1.0]])
    fused = tmp_path / "fused.json"
    for _ in range(2):  # the same fusion again: written again
        assert _cli("eval", "--fuse", str(rgb), str(flow), "--out", str(fused)).exit_code == 0
    before = fused.read_bytes()
    _one_line_error(
        _cli("eval", "fuse", str(rgb), str(other), "--out", str(fused)),
        f"{fused}: holds other results (a results file of `memdpc eval`, not this fusion of {rgb} and "
        f"{other}); add --overwrite to replace them, or give another --out",
    )
    assert fused.read_bytes() == before
    _one_line_error(
        _cli("eval", "fuse", str(rgb), str(flow), "--out", str(rgb), "--overwrite"),
        f"{rgb}: is one of the results being fused; give another --out",
    )
    res = _cli("eval", "--fuse", str(rgb), str(other), "--out", str(fused), "--overwrite")
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(load_result(fused)[1]["probs"], [[0.6, 0.4], [0.3, 0.7]])


def test_one_spelling_per_option_and_the_old_ones_still_work(tmp_path):
    rgb = _probs_result(tmp_path / "rgb.json", "rgb", [[0.8, 0.2], [0.6, 0.4]])
    flow = _probs_result(tmp_path / "flow.json", "flow", [[0.2, 0.8], [0.0, 1.0]])
    for args, name in (
        (["eval", "--fuse", str(rgb), str(flow), "--out"], "a.json"),
        (["eval", "--fuse", str(rgb), str(flow), "--fuse-out"], "b.json"),
        (["eval", "fuse", str(rgb), str(flow), "--out"], "c.json"),
        (["eval", "fuse", str(rgb), str(flow), "--fuse-out"], "d.json"),
    ):
        res = _cli(*args, str(tmp_path / name))
        assert res.exit_code == 0 and f"wrote {tmp_path / name}" in res.output, res.output
        np.testing.assert_allclose(load_result(tmp_path / name)[1]["probs"], [[0.5, 0.5], [0.3, 0.7]])
    res = _cli("eval", "--out", str(tmp_path / "e.json"), "retrieve", "ck.pt", "--shards", "s", "--out", "o")
    _one_line_error(res, "--out and --overwrite before the verb go with --fuse")
    help_text = _cli(
        "eval", "probe", "--help"
    ).output  # train's spellings: --workers (and --num-workers), --lr-min
    assert "--workers, --num-workers" in help_text and "--lr-min" in help_text and "--overwrite" in help_text


def _named_files(output: str) -> set[Path]:
    """Every path an eval verb named at its end: 'wrote A and B' and '<what>: C D …' lines."""
    named = set()
    for line in output.splitlines():
        if line.startswith("wrote "):
            named |= {Path(p) for p in line[len("wrote ") :].split(" and ")}
        elif re.match(r"^(feature caches|finetuned classifier|finetune state|plots)\b.*: ", line):
            named |= {Path(p) for p in line.split(": ", 1)[1].split()}
    return named


def test_every_file_written_is_named(eval_data, checkpoints, tmp_path):
    ck, out = str(checkpoints["rgb"]), tmp_path / "out"
    named = set()
    for verb, *extra in (
        ("retrieve",),
        ("probe", "--epochs", "1"),
        ("finetune", "--epochs", "1"),
        ("classify",),
    ):
        given = str(out / "finetune-rgb.pt") if verb == "classify" else ck
        res = _cli(
            "eval", verb, given, "--shards", str(eval_data.shards), "--out", str(out), "--plot", *extra, *OPTS
        )
        assert res.exit_code == 0, res.output
        named |= _named_files(res.output)
    on_disk = {p for p in out.iterdir()}
    assert named == on_disk, (sorted(named - on_disk), sorted(on_disk - named))
    assert {p.suffix for p in on_disk} == {".json", ".npz", ".png", ".pt"}
    assert (out / "memory-norms-rgb.png") in named and (out / "finetune-rgb.state.pt") in named


def test_results_of_another_checkpoint_are_not_replaced_without_overwrite(
    eval_data, checkpoints, other_rgb, tmp_path
):
    a, out = checkpoints["rgb"], tmp_path / "out"

    def retrieve(ck, *extra):
        return _cli(
            "eval", "retrieve", str(ck), "--shards", str(eval_data.shards), "--out", str(out), *extra, *OPTS
        )

    assert retrieve(a).exit_code == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    _one_line_error(
        retrieve(other_rgb),
        f"{out / 'retrieval-rgb.json'} holds results of another checkpoint, {a}; "
        f"give another --out for {other_rgb}, or --overwrite to replace them",
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # results and caches untouched
    again = retrieve(a)  # the same checkpoint again: its own results, the caches reused
    assert again.exit_code == 0, again.output
    assert (
        load_result(out / "retrieval-rgb.json")[0]["metrics"]
        == json.loads(first["retrieval-rgb.json"])["metrics"]
    )
    assert (out / "features-rgb-train.npz").read_bytes() == first["features-rgb-train.npz"]
    assert retrieve(checkpoints["flow"]).exit_code == 0  # the other stream's checkpoint writes beside them
    replaced = retrieve(other_rgb, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    result = load_result(out / "retrieval-rgb.json")[0]
    assert result["source"]["checkpoint"] == str(other_rgb.resolve())
    # the features of the other checkpoint were computed, not taken from the first one's cache
    with (
        np.load(out / "features-rgb-train.npz") as z,
        np.load(io.BytesIO(first["features-rgb-train.npz"])) as y,
    ):
        assert not np.allclose(z["values"], y["values"])
    changed = tmp_path / "changed.pt"  # one file, rewritten with other weights: no longer the same checkpoint
    changed.write_bytes(other_rgb.read_bytes())
    out = tmp_path / "out2"
    assert retrieve(changed).exit_code == 0
    changed.write_bytes(a.read_bytes())
    _one_line_error(retrieve(changed), f"holds results of {changed.resolve()} as it was before it changed")


def test_fusion_weights_chosen_on_the_training_videos(eval_data, checkpoints, tmp_path):
    """Real retrieval results of both streams: --choose-weights records the weights and what they were chosen
    on (the gallery's videos); the same fusion again is written again. Given with --weights, or for results of
    classifiers, it is a one-line error."""
    results = []
    for stream in ("rgb", "flow"):
        out = tmp_path / stream
        res = _cli(
            "eval",
            "retrieve",
            str(checkpoints[stream]),
            "--shards",
            str(eval_data.shards),
            "--out",
            str(out),
            *OPTS,
        )
        assert res.exit_code == 0, res.output
        results.append(str(out / f"retrieval-{stream}.json"))
    fused = tmp_path / "fused.json"
    for _ in range(2):
        res = _cli("eval", "--fuse", *results, "--choose-weights", "--out", str(fused))
        assert res.exit_code == 0, res.output
    config = json.loads(fused.read_text())["config"]
    gallery = load_result(results[0])[1]["gallery_ids"]
    assert config["chosen_on"]["videos"] == len(gallery) and sum(config["weights"]) == 1
    assert config["weights"][1] in config["chosen_on"]["shares"]
    _one_line_error(
        _cli("eval", "fuse", *results, "--choose-weights", "--weights", "3", "1"),
        "give --weights or --choose-weights, not both",
    )
    rgb = _probs_result(tmp_path / "rgb.json", "rgb", [[0.8, 0.2], [0.6, 0.4]])
    flow = _probs_result(tmp_path / "flow.json", "flow", [[0.2, 0.8], [0.0, 1.0]])
    _one_line_error(
        _cli("eval", "fuse", str(rgb), str(flow), "--choose-weights"),
        f"{rgb}, {flow}: weights are chosen on the training videos of retrieval results only",
    )
