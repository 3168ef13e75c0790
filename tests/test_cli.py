import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from memdpc import __version__
from memdpc.cli import main

from .conftest import run_memdpc

# the console script installed beside the running interpreter (works with or without an activated venv)
MEMDPC = str(Path(sys.executable).parent / "memdpc")


def test_console_script_lists_verbs_and_version():
    out = subprocess.run([MEMDPC, "--help"], capture_output=True, text=True, check=True).stdout
    listed = [
        line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.startswith("  ")
    ]
    verbs = [
        "bench",
        "convert",
        "data",
        "eval",
        "index",
        "preprocess",
        "quickstart",
        "recipes",
        "report",
        "shard",
        "show",
        "train",
    ]
    assert listed == verbs
    for verb in verbs:  # each verb's own help works (its options build, its lazy imports resolve)
        subprocess.run([MEMDPC, verb, "--help"], capture_output=True, text=True, check=True)
    version = subprocess.run([MEMDPC, "--version"], capture_output=True, text=True, check=True).stdout
    assert __version__ in version


def test_a_verb_imports_only_its_own_module_of_the_command_line():
    """A verb's start does not import the other verbs' modules (their options and what those import)."""
    code = (
        "import sys\nfrom memdpc.cli import main\ntry:\n    main(['shard', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('memdpc.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "['memdpc.commands.options', 'memdpc.commands.shard']"
    res = subprocess.run([MEMDPC, "shards"], capture_output=True, text=True)
    assert res.returncode == 2 and "No such command 'shards'" in res.stderr


def test_unknown_path_is_one_line_error(tmp_path):
    res = subprocess.run(
        [MEMDPC, "index", str(tmp_path / "nope"), "--layout", "ucf101"], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert "dataset root is not a folder" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["data", "synthetic", "{out}"],
        ["data", "photos", "{out}"],
        ["preprocess", "flow", "index.jsonl", "--out", "{out}"],
        ["shard", "frames", "--index", "index.jsonl", "--stream", "rgb", "--out", "{out}", "--split", "test"],
        ["eval", "retrieve", "last.pt", "--shards", "shards", "--out", "{out}"],
        ["quickstart", "--out", "{out}"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_an_output_folder_that_is_a_file_is_a_usage_error(tmp_path, args):
    out = tmp_path / "taken"
    out.write_text("keep me")
    res = subprocess.run(
        [MEMDPC, *(a.format(out=out) for a in args)], capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode == 2, res.stderr
    assert f"'{out}' is a file" in res.stderr and "Traceback" not in res.stderr
    assert out.read_text() == "keep me"


@pytest.mark.parametrize(
    "verb, given, message",
    [
        (
            "flow",
            "clip.mp4",
            "{given}: is a video file, not a video index; give the JSONL file `memdpc index",
        ),
        (
            "frames",
            "videos",
            "{given}: is a folder, not a video index; `memdpc index {given} --layout folder`",
        ),
        ("frames", "notes.jsonl", "{given}: is a binary file, not a video index; give the JSONL file"),
    ],
)
def test_preprocess_given_something_else_than_an_index_is_a_one_line_error(tmp_path, verb, given, message):
    (tmp_path / "videos" / "jump").mkdir(parents=True)
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)))
    (tmp_path / "notes.jsonl").write_bytes(bytes(range(256)))
    res = CliRunner().invoke(
        main, ["preprocess", verb, str(tmp_path / given), "--out", str(tmp_path / "frames")]
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.splitlines()[-1].startswith("Error: " + message.format(given=tmp_path / given))
    assert not (tmp_path / "frames").exists()


@pytest.mark.slow
def test_train_and_every_eval_kind_on_shards_of_mixed_frame_sizes(mixed_size_frames, tmp_path):
    """README's short-side --size on videos of three aspect ratios (portrait included) gives frames of three
    sizes; shards of them train (torch loader) and evaluate (DALI loader): retrieval with its frame-strip
    plot, a linear probe on ten crops per window, finetuning (random crops again) and scoring its classifier
    on five crops."""
    shards, run, out = tmp_path / "shards", tmp_path / "run", tmp_path / "eval"
    geometry = ["--blocks", "4", "--block-len", "3", "--clip-stride", "1"]
    for split in ("train", "test"):
        res = run_memdpc(
            "shard",
            mixed_size_frames / "frames",
            "--index",
            mixed_size_frames / "index.jsonl",
            "--stream",
            "rgb",
            "--out",
            shards,
            "--split",
            split,
            "--window-step",
            "4",
            *geometry,
        )
        assert res.returncode == 0, res.stderr
    manifest = json.loads((shards / "rgb" / "manifest-train.json").read_text())
    assert len(manifest["frame_sizes"]) == 3 and manifest["frame_size"] is None
    res = run_memdpc(
        "train",
        "--stream",
        "rgb",
        "--shards",
        shards,
        "--out",
        run,
        "--widths",
        "8,16,32,32",
        "--size",
        "32",
        "--batch-size",
        "2",
        "--max-steps",
        "2",
        "--epochs",
        "1",
        "--num-blocks",
        "4",
        "--block-len",
        "3",
        "--pred-steps",
        "2",
        "--mem-size",
        "16",
        "--crop-size",
        "0",
        "--backend",
        "torch",
        "--workers",
        "1",
        "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    ckpt = run / "checkpoints" / "last.pt"
    common = ["--shards", shards, "--out", out, "--backend", "dali", "--workers", "1", "--batch-size", "4"]
    res = run_memdpc("eval", "retrieve", ckpt, *common, "--plot")
    assert res.returncode == 0, res.stderr
    retrieval = json.loads((out / "retrieval-rgb.json").read_text())
    assert 0 <= retrieval["metrics"]["R@1"] <= 1 and list(out.glob("*.png"))
    res = run_memdpc("eval", "probe", ckpt, *common, "--linear", "--crops", "10", "--epochs", "2")
    assert res.returncode == 0, res.stderr
    assert "top1" in json.loads((out / "probe-linear-rgb.json").read_text())["metrics"]
    res = run_memdpc("eval", "finetune", ckpt, *common, "--epochs", "1")
    assert res.returncode == 0, res.stderr
    res = run_memdpc(
        "eval",
        "classify",
        out / "finetune-rgb.pt",
        *common[:2],
        "--out",
        tmp_path / "scored",
        *common[4:],
        "--crops",
        "5",
    )
    assert res.returncode == 0, res.stderr
    assert "top1" in json.loads(next((tmp_path / "scored").glob("*.json")).read_text())["metrics"]
