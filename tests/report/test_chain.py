"""chain.py: the chain that made a result, read from what real files record — a user's messy folder (two files
that fail in preprocess) indexed, preprocessed, sharded, trained on for a step and evaluated — and each link
checked against what is there now, after the index, the shards and the checkpoint change; the page shows the
chain and leaves out a scratch folder beside it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from memdpc.eval.run import evaluate
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import hold_out, read_index, write_index
from memdpc.report.chain import AS_RECORDED, CHANGED, GONE, chains
from memdpc.report.page import PAGE, write_report
from memdpc.train.config import config_from_dict
from memdpc.train.loop import train

from ..conftest import MESSY_BROKEN, TINY_TRAIN

CLIP = ClipSpec(num_blocks=4, block_len=2, stride=1)
TINY = {
    **TINY_TRAIN,
    "arch": "memdpc_r18",
    "size": 24,
    "crop_size": 0,
    "num_blocks": 4,
    "block_len": 2,
    "pred_steps": 1,
    "mem_size": 8,
    "max_steps": 1,
    "val_split": "none",
}
EVAL = dict(backend="torch", num_workers=0, batch_size=4, device="cpu")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def one_thread_module():
    """Torch on one CPU thread for the module's runs, its thread count restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def made(messy_folder, tmp_path_factory, one_thread_module) -> Path:
    """A folder as a user leaves it: index.jsonl (one test video per class held out), frames/ (RGB at 24 px;
    two files failed), shards/ (train, test), runs/rgb (one step), eval/ (retrieval), and a scratch copy of the
    shards (old-shards/) that no result was made from."""
    root = tmp_path_factory.mktemp("chain")
    write_index(hold_out(build_index(messy_folder, "folder"), test_per_class=1), root / "index.jsonl")
    preprocess(root / "index.jsonl", root / "frames", "rgb", size=24, workers=1, progress=False)
    for split in ("train", "test"):
        run_shard(
            root / "frames",
            root / "index.jsonl",
            "rgb",
            root / "shards",
            split,
            ShardSettings(clip=CLIP, max_count=4),
        )
    shutil.copytree(root / "shards", root / "old-shards")
    run = train(config_from_dict({**TINY, "shards": str(root / "shards"), "out": str(root / "runs" / "rgb")}))
    evaluate("retrieve", run / "checkpoints" / "last.pt", shards=root / "shards", out=root / "eval", **EVAL)
    return root


def test_the_chain_runs_from_the_index_to_the_result_with_the_videos_that_failed(made, messy_folder):
    (chain,) = chains([made / "eval" / "retrieval-rgb.json"])
    ckpt = made / "runs" / "rgb" / "checkpoints" / "last.pt"
    assert chain.checkpoint == ckpt.resolve()
    assert [link.stage for link in chain.links] == [
        "index",
        "archives",
        "shards",
        "shards",
        "run",
        "checkpoint",
        "result",
    ]
    index, archives, train_shards, test_shards, run, checkpoint, result = chain.links
    assert (index.path, index.digest, index.now) == (
        (made / "index.jsonl").resolve(),
        sha(made / "index.jsonl")[:12],
        AS_RECORDED,
    )
    assert index.what == "15 videos: 12 train, 3 test"
    assert archives.path == (made / "frames").resolve()
    assert archives.what.startswith("frame archives: rgb 13; 2 videos failed in preprocess: ")
    broken = [
        r.id
        for r in read_index(made / "index.jsonl")
        if Path(r.path).relative_to(messy_folder).as_posix() in MESSY_BROKEN
    ]
    assert len(broken) == 2 and all(
        f"{vid} (" in archives.what for vid in broken
    )  # named, with their reasons
    manifest = made / "shards" / "rgb" / "manifest-train.json"
    assert (train_shards.path, train_shards.digest, train_shards.now) == (
        manifest.resolve(),
        sha(manifest)[:12],
        AS_RECORDED,
    )
    assert train_shards.what.startswith("trained on, evaluated on (train): rgb/train, 10 videos")
    assert "left out: 2 failed" in train_shards.what  # the failed videos, where the shards left them out
    assert test_shards.what.startswith("evaluated on (test): rgb/test, 3 videos")
    assert run.path == (made / "runs" / "rgb").resolve() and run.what.startswith("memdpc_r18, rgb stream")
    assert (checkpoint.digest, checkpoint.now, checkpoint.what) == (
        sha(ckpt)[:12],
        AS_RECORDED,
        "trained: step 1, 0 epochs done",
    )
    assert result.path == made / "eval" / "retrieval-rgb.json" and result.what.startswith(
        "retrieval, rgb, on test, R@1 "
    )
    assert chain.folders == {(made / p).resolve() for p in ("frames", "shards", "runs/rgb")}


def test_each_link_says_what_changed_since(made, tmp_path):
    """The records name the files where they were made: those are changed, then put back as they were."""
    index = (made / "index.jsonl").read_bytes()
    ckpt = made / "runs" / "rgb" / "checkpoints" / "last.pt"
    moved = tmp_path / "last.pt"
    try:
        (made / "index.jsonl").write_text((made / "index.jsonl").read_text().replace('"test"', '"train"', 1))
        run_shard(
            made / "frames",
            made / "index.jsonl",
            "rgb",
            made / "shards",
            "test",
            ShardSettings(clip=CLIP, max_count=1),
            overwrite=True,
        )
        ckpt.rename(moved)
        (chain,) = chains([made / "eval" / "retrieval-rgb.json"])
        now = [(link.stage, link.path.name if link.path else None, link.now) for link in chain.links]
        assert now[
            :4
        ] == [  # the index as the train shards recorded it (the test shards are not those recorded)
            ("index", "index.jsonl", CHANGED),
            ("archives", "frames", ""),
            ("shards", "manifest-train.json", AS_RECORDED),
            ("shards", "manifest-test.json", CHANGED),
        ]
        assert now[4] == ("checkpoint", "last.pt", GONE)  # and no run: no checkpoint to read it from
    finally:
        moved.rename(ckpt)
        (made / "index.jsonl").write_bytes(index)
        run_shard(
            made / "frames",
            made / "index.jsonl",
            "rgb",
            made / "shards",
            "test",
            ShardSettings(clip=CLIP, max_count=4),
            overwrite=True,
        )
    (chain,) = chains([made / "eval" / "retrieval-rgb.json"])
    assert {link.now for link in chain.links} == {AS_RECORDED, ""}


def test_the_page_shows_the_chain_and_leaves_scratch_folders_out(made, tmp_path):
    page = write_report(made, tmp_path / "page")
    text = page.read_text()
    assert "<h2>Provenance</h2>" in text and "<h3>runs/rgb/checkpoints/last.pt</h3>" in text
    assert sha(made / "index.jsonl")[:12] in text and "failed in preprocess" in text
    assert "1 run, 1 results file, 1 shard folder, 1 frame archive folder." in text
    assert "Left out, not part of any result&#x27;s chain: old-shards." in text
    assert not (tmp_path / "page" / "old-shards").exists() and (tmp_path / "page" / "shards").is_dir()
    assert (tmp_path / "page" / PAGE) == page
    # the retrieval strips at their own size (96-px frames; scrolled sideways, not shrunk to the page), every
    # picture linked to itself at full size
    strip = "eval/retrieval-rgb-strips-rgb.png"
    assert (
        f'<figure class=wide><a href="{strip}"><img src="{strip}"' in text
        and (tmp_path / "page" / strip).is_file()
    )
    assert text.count("<img ") == text.count("><img ") == text.count("</a><figcaption>")


def test_shards_cut_again_keep_the_index_and_archives_rows_and_a_replaced_video_flags_the_results(
    made, tmp_path
):
    """Every split cut again (no manifest is what the result read): the index and archive rows stay, from what the
    result recorded of its shards. A video replaced since its archives were made marks the archive folder as
    changed, naming it; the page's results table flags the result whose chain is not as recorded."""
    records = [r for r in read_index(made / "index.jsonl") if r.split == "train"]
    video = Path(records[0].path)
    body, stat = video.read_bytes(), video.stat()
    try:
        for split in ("train", "test"):
            run_shard(
                made / "frames",
                made / "index.jsonl",
                "rgb",
                made / "shards",
                split,
                ShardSettings(clip=CLIP, max_count=2),
                overwrite=True,
            )
        shutil.copyfile(records[1].path, video)
        (chain,) = chains([made / "eval" / "retrieval-rgb.json"])
        now = [(link.stage, link.path.name if link.path else None, link.now) for link in chain.links]
        assert now[:4] == [
            ("index", "index.jsonl", AS_RECORDED),
            ("archives", "frames", CHANGED),
            ("shards", "manifest-train.json", CHANGED),
            ("shards", "manifest-test.json", CHANGED),
        ]
        assert (
            f"the source of 1 video changed since its archives were made: {records[0].id} ({video}: size "
            f"{stat.st_size} → {video.stat().st_size} bytes" in chain.links[1].what
        )
        text = write_report(made, tmp_path / "page").read_text()
        assert (
            "its chain is not as recorded (archives frames changed since; shards manifest-train.json changed "
            "since; shards manifest-test.json changed since): see Provenance" in text
        )
    finally:
        video.write_bytes(body)
        os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        for split in ("train", "test"):
            run_shard(
                made / "frames",
                made / "index.jsonl",
                "rgb",
                made / "shards",
                split,
                ShardSettings(clip=CLIP, max_count=4),
                overwrite=True,
            )
    (chain,) = chains([made / "eval" / "retrieval-rgb.json"])
    assert {link.now for link in chain.links} == {AS_RECORDED, ""}
