"""README's "Your own videos" block, run verbatim (only its three settings at the top changed) on a messy folder
of generated videos, on the DALI loader, to the fused tables."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memdpc.preprocess.report import read_report

from .conftest import MESSY_BROKEN, MESSY_VIDEOS

README = Path(__file__).resolve().parents[1] / "README.md"
MEMDPC = str(Path(sys.executable).parent / "memdpc")


def readme_block(marker: str) -> str:
    """The ```bash block that follows ``<!-- marker -->`` in README.md."""
    text = README.read_text()
    match = re.search(rf"<!-- {re.escape(marker)} -->\n```bash\n(.*?)```", text, re.S)
    assert match, f"README.md has no bash block after <!-- {marker} -->"
    return match[1]


def with_settings(block: str, **settings: str) -> str:
    """The block with the values of its ``NAME=value`` setting lines replaced; each must be there."""
    for name, value in settings.items():
        block, n = re.subn(rf"^{name}=\S+", f"{name}={value}", block, flags=re.M)
        assert n == 1, f"README's block sets {name} {n} times"
    return block


@pytest.mark.slow
def test_readme_own_videos_block_runs_on_a_messy_folder_to_the_fused_tables(messy_folder, tmp_path):
    """README's block on the DALI loader, which ``BACKEND=auto`` takes where it is installed (the torch loader on
    frames of mixed sizes: tests/pipeline/test_loader.py; its whole chain: the tiny quickstart's test)."""
    work = tmp_path / "work"
    backend = "dali"
    script = with_settings(
        readme_block("ci:own-videos"), VIDEOS=str(messy_folder), WORK=str(work), BACKEND=backend
    )
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "200",
        "OMP_NUM_THREADS": "2",
    }
    res = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, env=env, timeout=1500)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    assert "VIDEOIO" not in output and "[mjpeg @" not in output  # FFmpeg's messages went to the report

    # one test and one val video per class, among the files that read
    index = [json.loads(line) for line in (work / "index.jsonl").read_text().splitlines()]
    assert len(index) == len(MESSY_VIDEOS) + len(MESSY_BROKEN)
    for split in ("test", "val"):
        assert sorted(r["label_name"] for r in index if r["split"] == split) == [
            "jumping",
            "spinning",
            "zooming",
        ]

    # the broken files are reported with their reason, every real video made it
    failures = [v for v in read_report(work / "frames").entries("flow").values() if v["status"] == "failed"]
    failed = {Path(f["path"]).relative_to(messy_folder).as_posix(): f["reason"] for f in failures}
    assert sorted(failed) == sorted(MESSY_BROKEN)
    assert {f["split"] for f in failures} == {"train"}  # the held-out splits lost nothing
    assert "truncated" in failed[MESSY_BROKEN[0]] and "not a readable video" in failed[MESSY_BROKEN[1]]
    for name in MESSY_BROKEN:
        assert f"failed {name.replace('/', '__').rsplit('.', 1)[0]}" in output
    assert len(list((work / "frames" / "flow").glob("*.tar"))) == len(MESSY_VIDEOS)

    # frames of several sizes, a portrait one among them, go through shards, training and evaluation
    sizes = json.loads((work / "shards" / "rgb" / "manifest-train.json").read_text())["frame_sizes"]
    assert len(sizes) == 3 and any(s["height"] > s["width"] for s in sizes)
    for stream in ("rgb", "flow"):
        config = (work / "runs" / stream / "config.yaml").read_text()
        assert re.search(r"^val_split: val$", config, re.M) and f"backend: {backend}" in config
    fused = {
        kind: json.loads((work / "eval" / f"fused-{kind}.json").read_text())
        for kind in ("retrieval", "probe")
    }
    assert {f["stream"] for f in fused.values()} == {"rgb+flow"}
    assert {"R@1", "R@5"} <= fused["retrieval"]["metrics"].keys() and fused["probe"]["counts"]["videos"] == 3
    for kind in fused:
        assert f"wrote {work / 'eval' / f'fused-{kind}.json'}" in output

    # the RGB run again, taught by the flow run: the teacher embeds every training video, of every frame size
    flow = work / "runs" / "flow" / "checkpoints" / "last.pt"
    config, out = work / "runs" / "rgb" / "config.yaml", work / "runs" / "rgb-taught"
    args = [
        "--config",
        config,
        "--teacher",
        flow,
        "--out",
        out,
        "--epochs",
        1,
        "--log-every",
        1,
        "--no-progress",
    ]
    taught = subprocess.run([MEMDPC, "train", *map(str, args)], capture_output=True, text=True, env=env)
    assert taught.returncode == 0, taught.stderr[-3000:]
    videos = json.loads((work / "shards" / "flow" / "manifest-train.json").read_text())["num_videos"]
    assert f"teacher: {flow} (flow), its features of {videos} training videos" in taught.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    relation = [r["relation"] for r in metrics if r["kind"] == "train"]
    assert relation and all(math.isfinite(r) and r > 0 for r in relation)


# an example recipe of one's own at tiny sizes: the shipped example-flow-pool's kind, run on a user's folders
TINY_RECIPE = """\
row: a tiny pooled run on one's own videos
expect: {synthetic: {R@1: 0, top1: 0}}
quickstart:
  data: {videos_per_class: 5, frames: 24, size: 32}
  clip: {num_blocks: 4, block_len: 4, stride: 1}
  window_step: 4
  max_count: 1
  streams: [flow]
  checkpoint: last
  train: {size: 32, crop_size: 0, widths: [8, 16, 16, 16], batch_size: 4, epochs: 2, pred_steps: 1,
          mem_size: 64, val_split: val, knn_every: 1, jitter_flow: false, temperature: 0.1,
          negatives: other_clips}
  probe: {epochs: 30, lr: 0.003, lr_min: 0.0003}
"""


@pytest.fixture(scope="module")
def own_folders(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A labelled folder (<class>/<video>) of the directions family, which the project's settings were not
    chosen on, a flat folder of unlabelled videos of another draw of it, and the tiny recipe's file."""
    root = tmp_path_factory.mktemp("own")
    sizes = ["--videos-per-class", "4", "--frames", "24", "--size", "32", "--classes", "3"]
    for name, seed in (("labelled", "0"), ("drawn", "7")):
        run = subprocess.run(
            [MEMDPC, "data", "directions", str(root / name), *sizes, "--seed", seed], capture_output=True
        )
        assert run.returncode == 0, run.stderr
    pool = root / "pool"
    pool.mkdir()
    for i, video in enumerate(sorted((root / "drawn" / "UCF-101").rglob("*.avi"))):
        video.rename(pool / f"clip{i:02d}.avi")  # no classes: a flat folder
    recipe = root / "tiny.yaml"
    recipe.write_text(TINY_RECIPE)
    return root / "labelled" / "UCF-101", pool, recipe


@pytest.mark.slow
def test_an_example_recipes_commands_for_ones_own_folders_run_as_printed(own_folders, tmp_path):
    """``memdpc recipes NAME --videos --pool`` prints the chain: the flat folder indexed as unlabelled,
    preprocessed, sharded and pretrained on, the labelled folder evaluated with its checkpoint against both
    random-init baselines, every command as printed; evaluation on the unlabelled split is refused in one line."""
    videos, pool, recipe = own_folders
    work = tmp_path / "work"
    listing = subprocess.run(
        [MEMDPC, "recipes", str(recipe), "--videos", str(videos), "--pool", str(pool), "--work", str(work)],
        capture_output=True,
        text=True,
    )
    assert listing.returncode == 0, listing.stderr
    commands = [line for line in listing.stdout.splitlines() if line.startswith("memdpc ")]
    assert (
        f"memdpc index {pool} --layout unlabelled --val-per-class 1 --out {work}/pool/index.jsonl" in commands
    )
    (pretrain,) = [c for c in commands if c.startswith("memdpc train") and "--init-only" not in c]
    assert pretrain.endswith(f"--shards {work}/pool/shards --out {work}/runs/flow --knn-shards {work}/shards")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in commands:
        res = subprocess.run([MEMDPC, *command.split()[1:]], capture_output=True, text=True, env=env)
        assert res.returncode == 0, f"{command}\n{res.stderr[-3000:]}"
    assert "p " in res.stdout or "no discordant" in res.stdout  # the last paired comparison's table
    pool_index = [json.loads(line) for line in (work / "pool" / "index.jsonl").read_text().splitlines()]
    assert {r["label"] for r in pool_index} == {-1} and len(pool_index) == 12
    run = [json.loads(line) for line in (work / "runs" / "flow" / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in run if r["kind"] == "knn"]  # the monitor read the labelled folder's splits
    for kind in ("retrieval", "probe-linear"):
        result = json.loads((work / "eval" / "memdpc-flow" / f"{kind}-flow.json").read_text())
        assert result["counts"]["classes"] == 3

    refused = subprocess.run(
        [
            MEMDPC,
            "eval",
            "retrieve",
            str(work / "runs/flow/checkpoints/last.pt"),
            "--shards",
            str(work / "pool/shards"),
            "--test-split",
            "val",
            "--out",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "the train split is unlabelled (its videos have no classes)" in refused.stderr
    assert not (tmp_path / "nope").exists()


@pytest.mark.slow
def test_one_command_runs_an_example_recipe_on_ones_own_labelled_folder_and_unlabelled_pool(
    own_folders, tmp_path
):
    """``memdpc quickstart --recipe R --videos DIR --pool DIR``: the pool pretrains (with the monitor on the labelled
    videos), the labelled folder is evaluated, the same tables as on the example data; a rerun resumes, and one with
    another folder in its place is refused."""
    videos, pool, recipe = own_folders
    out = tmp_path / "mine"
    args = [
        "quickstart",
        "--recipe",
        str(recipe),
        "--videos",
        str(videos),
        "--pool",
        str(pool),
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([MEMDPC, *args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    labelled = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert {r["split"] for r in labelled} == {"train", "val", "test"} and {r["label"] for r in labelled} == {
        0,
        1,
        2,
    }
    unlabelled = [json.loads(line) for line in (out / "pool" / "index.jsonl").read_text().splitlines()]
    assert {r["label"] for r in unlabelled} == {-1} and {r["split"] for r in unlabelled} == {"train", "val"}
    config = yaml.safe_load((out / "runs" / "flow" / "config.yaml").read_text())
    assert config["shards"] == str(out / "pool" / "shards") and config["knn_shards"] == str(out / "shards")
    rows = json.loads((out / "quickstart.json").read_text())
    assert {(r["model"], r["stream"]) for r in rows} == {
        (m, "flow") for m in ("MemDPC", "random init", "random init, data BN")
    }
    summary = json.loads((out / "quickstart-compare.json").read_text())["summary"]
    assert f"paired on the same {rows[0]['n']} test videos" in summary
    assert (out / "report" / "index.html").is_file()
    again = subprocess.run([MEMDPC, *args], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and json.loads((out / "quickstart.json").read_text()) == rows
    other = subprocess.run(
        [MEMDPC, *args[:3], "--videos", str(pool), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 2 and "holds a quickstart run of" in other.stderr.strip().splitlines()[-1]
