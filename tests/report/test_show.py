"""show.py: `memdpc show` on what each stage really writes — frame archives of real videos with real TV-L1 flow
(preprocess), shards of them (the shard writer), a run and eval results (a real tiny quickstart) — and its
one-line error for anything else, through real `memdpc` processes."""

from __future__ import annotations

import json
import tarfile

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from memdpc.common import file_kinds
from memdpc.common.errors import UserError
from memdpc.eval.results import save_result
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.archive import archive_path, read_archive, write_archive
from memdpc.preprocess.datasets import build_index
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import write_index
from memdpc.report.show import (
    CHANCE,
    LEGEND,
    archive_candidates,
    archives_in,
    curve_series,
    has_archives,
    show,
)
from memdpc.report.show_options import ShowOptions
from memdpc.train.metrics import KNN_BASELINE, read_metrics
from memdpc.viz.flow_colours import codes_colours
from memdpc.viz.pictures import GAP, MIN_WIDTH, decode_frames

from ..conftest import TINY, run_memdpc, tars_opened


@pytest.fixture(scope="module")
def frames(tiny_dataset, tmp_path_factory):
    """Real archives of the tiny dataset's 9 videos (3 classes: MoveRight, MoveLeft, MoveUp; 30 frames, 32²):
    RGB and OpenCV's TV-L1 flow, and the index they were made from."""
    root = tmp_path_factory.mktemp("show")
    records = build_index(tiny_dataset, "ucf101", 1)
    write_index(records, root / "index.jsonl")
    preprocess(
        root / "index.jsonl",
        root / "frames",
        "rgb,flow",
        size=32,
        tvl1={"scales": 3, "warps": 3},
        flow_backend="opencv",
        workers=1,
        progress=False,
    )
    return root / "frames", records


@pytest.fixture(scope="module")
def shards(frames):
    root, records = frames
    out = root.parent / "shards"
    for stream in ("rgb", "flow"):
        shard_stream(root, records, stream, out, "train", ShardSettings(max_count=2, seed=0))
    return out


def read_gif(path) -> tuple[list[np.ndarray], int]:
    with Image.open(path) as im:
        frames = []
        for k in range(im.n_frames):
            im.seek(k)
            frames.append(np.asarray(im.convert("RGB")))
        return frames, im.info["duration"]


@pytest.mark.parametrize("motion", ["MoveRight", "MoveUp"])
def test_an_archive_gives_a_sheet_and_a_gif_of_its_video_with_flow_in_the_one_colouring(
    frames, tmp_path, motion
):
    root, _ = frames
    archive = root / "rgb" / f"v_{motion}_g01_c01.tar"
    written = show(archive, tmp_path)
    assert [p.name for p in written] == [f"{archive.stem}-sheet.png", f"{archive.stem}.gif", LEGEND]
    sheet = np.asarray(Image.open(written[0]))
    assert sheet.shape[1] >= MIN_WIDTH  # 8 frames a row, enlarged
    gif, duration = read_gif(written[1])
    meta, flow_jpegs = read_archive(root / "flow" / f"{archive.stem}.tar")
    assert len(gif) == meta["num_frames"] == TINY.frames - 1  # every flow frame, its RGB frame beside it
    assert duration == round(1000 / meta["fps"])
    # each frame's flow half (below the caption, right of the RGB frame; two 32² frames enlarged alike), back at
    # 32²: the archive's flow in flow_colours' colours, on one scale for the whole video (up to the GIF's palette)
    factor = -(-360 // (2 * 32 + GAP))
    drawn = np.stack([f[-32 * factor :: factor, (32 + GAP) * factor :: factor] for f in gif]).astype(int)
    expected = codes_colours(decode_frames(flow_jpegs))
    assert drawn.shape == expected.image.shape
    off = np.abs(drawn - expected.image).max(axis=-1)
    assert off.mean() < 3 and np.percentile(off, 95) < 8, (off.mean(), np.percentile(off, 95))
    assert (drawn.max(axis=-1) - drawn.min(axis=-1) > 60).mean() > 0.2  # in colour, not grey codes
    assert f"{expected.max_flow:.3g} px" in expected.note  # the scale its caption states


def test_a_long_video_decodes_only_the_frames_it_shows_and_its_gif_keeps_the_pace(tmp_path):
    """A 1000-frame archive whose frames are garbage but for the 16 of the sheet and the GIF's every 5th (so
    decoding any other frame would fail): the sheet and a 200-frame GIF at 1/5 of the video's 25 fps."""
    shown = set(np.linspace(0, 999, 16).round().astype(int).tolist()) | set(range(0, 1000, 5))

    def good(k: int) -> bytes:  # frames that differ, so that the GIF writer merges none
        return cv2.imencode(".jpg", np.full((24, 32, 3), k % 250, np.uint8))[1].tobytes()

    path = archive_path(tmp_path / "frames", "rgb", "long")
    write_archive(
        path,
        (good(k) if k in shown else b"not a jpeg" for k in range(1000)),
        {"stream": "rgb", "fps": 25.0, "height": 24, "width": 32},
    )
    written = show(path, tmp_path / "out")
    with Image.open(next(p for p in written if p.suffix == ".gif")) as gif:
        assert (gif.n_frames, gif.info["duration"]) == (200, 200)  # 1000 / 5 frames, 5 × 40 ms


def test_a_folder_of_archives_shows_its_first_videos_once_each(frames, tmp_path):
    root, _ = frames
    written = show(root, tmp_path, ShowOptions(samples=2))
    assert [p.name for p in written] == [
        "v_MoveLeft_g01_c01-sheet.png",
        "v_MoveLeft_g01_c01.gif",
        LEGEND,
        "v_MoveLeft_g02_c01-sheet.png",
        "v_MoveLeft_g02_c01.gif",
    ]


def test_shard_samples_are_the_blocks_by_frames_the_model_reads(shards, tmp_path):
    written = show(shards, tmp_path, ShowOptions(samples=2))
    names = [p.name for p in written]
    assert len(names) == 5 and names[-1] == LEGEND
    assert all(n.startswith("rgb-train-v_") for n in names[:2])
    assert names[2:4] == [n.replace("rgb-", "flow-") for n in names[:2]]  # the same keys in both streams
    keys = [json.loads(line)["id"] for line in (shards.parent / "index.jsonl").read_text().splitlines()]
    assert all(n.split("-train-")[1].rsplit("_", 1)[0] in keys for n in names[:4])  # <video id>_<start>
    picture = np.asarray(Image.open(written[0]))
    factor = -(-MIN_WIDTH // (5 * 32 + 4 * GAP))  # 5 frames of 32² a row, 8 rows (blocks)
    assert picture.shape[1] == (5 * 32 + 4 * GAP) * factor
    assert picture.shape[0] > (8 * 32 + 7 * GAP) * factor  # and a caption above


def test_samples_of_a_split_come_from_several_videos_and_classes_not_the_first_videos_windows(
    frames, tmp_path
):
    """The test split in index order, 13 windows of each video: the first samples would all be the first
    video's; show spreads them over the videos, one class after another."""
    root, records = frames
    shard_stream(
        root, records, "rgb", tmp_path / "shards", "test", ShardSettings(clip=ClipSpec(2, 2, 1), max_count=8)
    )
    labels = {r.id: r.label_name for r in records}
    written = show(tmp_path / "shards", tmp_path / "pics", ShowOptions(samples=3, split="test"))
    videos = [p.name.removeprefix("rgb-test-").rsplit("_", 1)[0] for p in written]
    assert sorted(videos) == sorted(r.id for r in records if r.split == "test")  # 3 videos, one per class
    assert len({labels[v] for v in videos}) == 3
    more = show(tmp_path / "shards", tmp_path / "more", ShowOptions(samples=5, split="test"))
    keys = [p.name.removeprefix("rgb-test-").removesuffix(".png") for p in more]
    assert len(set(keys)) == 5 and {k.rsplit("_", 1)[0] for k in keys} == set(videos)  # then other windows


def test_augment_crops_to_the_shards_frame_size_unless_told_and_warns_of_a_crop_larger_than_the_frames(
    shards, tmp_path
):
    tar = sorted((shards / "flow").glob("train-*.tar"))[0]
    args = ["show", tar, "--augment", "--size", "16", "--samples", "1"]
    res = run_memdpc(*args, "--out", tmp_path / "default")
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    own = show(
        tar, tmp_path / "own", ShowOptions(samples=1, augment=True, size=16, crop_size=32)
    )  # 32² frames
    default = sorted((tmp_path / "default").glob("*.png"))
    assert [p.read_bytes() for p in default if p.name != LEGEND] == [own[0].read_bytes()]
    res = run_memdpc(*args, "--crop-size", "224", "--out", tmp_path / "large")
    assert res.returncode == 0, res.stderr
    assert [line for line in res.stderr.splitlines() if line.startswith("warning")] == [
        f"warning: --crop-size 224 exceeds the 32×32 frames of {shards / 'flow'} (train): each crop is enlarged "
        "to 224, then resized to --size 16; without --crop-size, show crops to the frames' short side (32), and "
        "`memdpc train --crop-size 0` resizes straight to --size"
    ]
    assert ShowOptions().crop_size is None  # the library's default too


def test_a_split_the_shard_folder_lacks_is_named_with_those_it_has(shards, tmp_path):
    with pytest.raises(
        UserError, match=r"shards: no val shards \(it holds train\); give one of them with --split"
    ):
        show(shards, tmp_path, ShowOptions(split="val"))
    assert not any(tmp_path.iterdir())  # nothing drawn


def test_augmented_samples_go_through_the_training_transform(shards, tmp_path):
    tar = sorted((shards / "flow").glob("train-*.tar"))[0]
    options = ShowOptions(samples=1, augment=True, size=16, crop_size=0, seed=3)
    first = show(tar, tmp_path / "a", options)
    again = show(tar, tmp_path / "b", options)
    other = show(tar, tmp_path / "c", ShowOptions(samples=1, augment=True, size=16, crop_size=0, seed=4))
    assert first[0].name.endswith("-augmented.png") and first[0].read_bytes() == again[0].read_bytes()
    assert other[0].read_bytes() != first[0].read_bytes()  # other draws: another crop, flip or jitter
    picture = np.asarray(Image.open(first[0]))
    factor = -(-MIN_WIDTH // (5 * 16 + 4 * GAP))
    assert picture.shape[1] == (5 * 16 + 4 * GAP) * factor  # the training size, not the stored 32²
    plain = np.asarray(Image.open(show(tar, tmp_path / "d", ShowOptions(samples=1))[0]))
    assert plain.shape[1] != picture.shape[1]


def test_augmented_flow_is_drawn_without_the_colour_jitter_unless_asked(shards, tmp_path):
    """`memdpc show --augment` draws flow as README's recipes train it, without the colour jitter (which moves
    flow's zero by more than small motions move it); --jitter-flow adds it, as `memdpc train`'s default."""
    from click.testing import CliRunner

    from memdpc.cli import main

    tar = sorted((shards / "flow").glob("train-*.tar"))[0]
    res = CliRunner().invoke(
        main, ["show", str(tar), "--augment", "--samples", "1", "--out", str(tmp_path / "cli")]
    )
    assert res.exit_code == 0, res.output
    drawn = sorted((tmp_path / "cli").glob("*-augmented.png"))
    off = show(tar, tmp_path / "off", ShowOptions(samples=1, augment=True, jitter_flow=False))
    on = show(tar, tmp_path / "on", ShowOptions(samples=1, augment=True, jitter_flow=True))
    assert drawn[0].read_bytes() == off[0].read_bytes() != on[0].read_bytes()


@pytest.mark.slow
def test_each_loss_curve_has_its_own_chance_and_the_knn_monitor_the_r1_of_both_baselines(tiny_quickstart):
    """Train and validation batches differ in size (the last validation batch is short), so each loss curve gets
    the chance level of its own records, named in the legend; the kNN curve the R@1 of the untrained encoder and
    of the untrained encoder with the data's BatchNorm statistics, which training has to beat."""
    records = read_metrics(tiny_quickstart / "runs" / "flow")
    panels = curve_series(records)
    by_label = {s.label: s for s in panels["loss"]}
    for kind, label in (("train", "train"), ("val", "validation")):
        chance = by_label[label + CHANCE]
        assert chance.chance_of == label
        assert chance.values == tuple(r["chance"] for r in records if r["kind"] == kind)
        assert chance.steps == by_label[label].steps
    knn = [r["r1"] for r in records if r["kind"] == "knn"]
    (baseline,) = [r["r1"] for r in records if r["kind"] == KNN_BASELINE]
    references = {s.label: s.values for s in panels["kNN R@1 (validation videos)"] if s.reference}
    assert references == {"untrained": (knn[0],), "untrained, data BN": (baseline,)}


@pytest.mark.slow
def test_a_run_folder_gives_its_curves_and_an_eval_folder_its_strips_and_matrix(tiny_quickstart, tmp_path):
    run = show(tiny_quickstart / "runs" / "flow", tmp_path)
    assert [p.name for p in run] == ["flow-curves.png"] and Image.open(run[0]).size == (1000, 650)
    written = show(tiny_quickstart / "eval" / "memdpc-flow", tmp_path)
    assert [p.name for p in written] == [
        "probe-linear-flow-confusion.png",
        "retrieval-flow-strips-rgb.png",
        "retrieval-flow-strips-flow.png",
        LEGEND,
    ]
    flow = np.asarray(Image.open(written[2]).convert("RGB")).astype(int)
    assert (flow.max(axis=-1) - flow.min(axis=-1) > 80).mean() > 0.05  # flow in colour, no longer grey
    fused = show(tiny_quickstart / "eval" / "memdpc-fused" / "retrieval.json", tmp_path)
    assert [p.name for p in fused] == ["retrieval-strips-rgb.png", "retrieval-strips-flow.png", LEGEND]


def test_a_result_whose_shards_moved_asks_for_them(tmp_path):
    result = {
        "kind": "retrieval",
        "stream": "rgb",
        "dataset": "d",
        "split": "test",
        "classes": ["a"],
        "config": {"shards": str(tmp_path / "gone")},
    }
    path = save_result(
        tmp_path / "retrieval-rgb.json",
        result,
        {
            "video_ids": np.array(["v"]),
            "labels": np.zeros(1),
            "gallery_ids": np.array(["w"]),
            "gallery_labels": np.zeros(1),
            "neighbours": np.zeros((1, 1), int),
        },
    )
    with pytest.raises(
        UserError, match="records .*gone, which is not there; give the shards .* with --shards"
    ):
        show(path, tmp_path / "out")


def test_the_command_prints_every_file_it_wrote(frames, tmp_path):
    archive = frames[0] / "flow" / "v_MoveUp_g01_c01.tar"
    res = run_memdpc("show", archive, "--out", tmp_path / "out", "--max-flow", "2")
    assert res.returncode == 0, res.stderr
    wrote = [line.removeprefix("wrote ") for line in res.stdout.splitlines()]
    assert sorted(wrote) == sorted(str(p) for p in (tmp_path / "out").iterdir()) and len(wrote) == 3
    assert "memdpc report" in res.stderr


@pytest.mark.parametrize(
    "given, kind",
    [
        ("v.avi", "a video file"),
        ("best.pt", "a PyTorch file, such as a checkpoint"),
        ("empty", "a folder of nothing memdpc show knows"),
        ("qs", "a quickstart folder; `memdpc report"),
        ("run/metrics.jsonl", "a run's metrics; give its run folder"),
        ("notes.tar", "a tar archive"),
    ],
)
def test_anything_else_is_a_one_line_error_saying_what_it_is(tiny_dataset, tmp_path, given, kind):
    (tmp_path / "v.avi").write_bytes(next(tiny_dataset.rglob("*.avi")).read_bytes())
    torch.save({"model": {}}, tmp_path / "best.pt")
    (tmp_path / "empty").mkdir()
    (tmp_path / "qs").mkdir()
    (tmp_path / "qs" / file_kinds.QUICKSTART_RECORD).write_text("{}")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text("stream: rgb\nshards: s\n")
    (tmp_path / "run" / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 1, "loss": 1.0}) + "\n"
    )
    with tarfile.open(tmp_path / "notes.tar", "w") as tar:
        tar.add(tmp_path / "qs" / file_kinds.QUICKSTART_RECORD, "notes.txt")
    res = run_memdpc("show", tmp_path / given, "--out", tmp_path / "out")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    error = res.stderr.strip().splitlines()[-1]
    assert error.startswith(f"Error: {tmp_path / given}: {kind}") and "memdpc show takes " in error
    assert not (tmp_path / "out").exists()


def test_a_folder_of_archives_is_listed_and_only_the_archives_looked_at_are_opened(tmp_path):
    """Thousands of archives: which are there is answered by listing the folder; a tar is opened (for its first
    header) only to tell an archive from another tar, and only as far as the answer needs."""
    root = tmp_path / "frames"
    for i in range(40):
        write_archive(archive_path(root, "rgb", f"v{i:03d}"), [b"jpeg"], {"stream": "rgb"})
    write_archive(archive_path(root, "flow", "v000"), [b"jpeg"], {"stream": "flow"})
    with tarfile.open(root / "rgb" / "notes.tar", "w") as tar:  # a tar, not an archive
        tar.addfile(tarfile.TarInfo("notes.txt"))
    assert len(archive_candidates(root)) == 41
    found, opened = tars_opened(lambda: archives_in(root, 2))
    assert found == [root / "rgb" / "v000.tar", root / "rgb" / "v001.tar"]  # the first stream's, by id
    assert opened == ["notes.tar", "v000.tar", "v001.tar"]
    found, opened = tars_opened(lambda: has_archives(root / "rgb"))
    assert found and 1 <= len(opened) <= 2
    assert not has_archives(tmp_path) and archives_in(root / "rgb") == archives_in(root)
