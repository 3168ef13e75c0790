import subprocess
import sys
from pathlib import Path

import pytest

from memdpc import __version__

# the console script installed beside the running interpreter (works with or without an activated venv)
MEMDPC = str(Path(sys.executable).parent / "memdpc")


def test_console_script_lists_verbs_and_version():
    out = subprocess.run([MEMDPC, "--help"], capture_output=True, text=True, check=True).stdout
    listed = [line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.startswith("  ")]
    verbs = ["bench", "convert", "data", "eval", "index", "preprocess", "quickstart", "shard", "train"]
    assert listed == verbs
    for verb in verbs:  # each verb's own help works (its options build, its lazy imports resolve)
        subprocess.run([MEMDPC, verb, "--help"], capture_output=True, text=True, check=True)
    version = subprocess.run([MEMDPC, "--version"], capture_output=True, text=True, check=True).stdout
    assert __version__ in version


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
    res = subprocess.run([MEMDPC, *(a.format(out=out) for a in args)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert f"'{out}' is a file" in res.stderr and "Traceback" not in res.stderr
    assert out.read_text() == "keep me"


@pytest.mark.parametrize(
    "verb, given, message",
    [
        ("flow", "clip.mp4", "{given}: is a video file, not a video index; give the JSONL file `memdpc index"),
        ("frames", "videos", "{given}: is a folder, not a video index; `memdpc index {given} --layout folder`"),
        ("frames", "notes.jsonl", "{given}: not a video index (binary data, not JSON lines)"),
    ],
)
def test_preprocess_given_something_else_than_an_index_is_a_one_line_error(tmp_path, verb, given, message):
    from click.testing import CliRunner

    from memdpc.cli import main

    (tmp_path / "videos" / "jump").mkdir(parents=True)
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)))
    (tmp_path / "notes.jsonl").write_bytes(bytes(range(256)))
    res = CliRunner().invoke(main, ["preprocess", verb, str(tmp_path / given), "--out", str(tmp_path / "frames")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.splitlines()[-1].startswith("Error: " + message.format(given=tmp_path / given))
    assert not (tmp_path / "frames").exists()
