"""Window outputs over real shards: every window exactly once, per-video means, the feature cache."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from memdpc.common.distenv import DistEnv
from memdpc.common.errors import UserError
from memdpc.common.settings import from_flat
from memdpc.eval.data import EvalData
from memdpc.eval.features import cached_windows, fingerprint, run_windows, same_classes, video_mean
from memdpc.eval.outputs import checkpoint_source
from memdpc.eval.shard_meta import window_info

ENV = DistEnv(0, 1, 0, torch.device("cpu"))


def _data(eval_data, stream="rgb", **kw) -> EvalData:
    return from_flat(
        EvalData,
        dict(
            shards=eval_data.shards,
            stream=stream,
            size=32,
            batch_size=3,
            backend="torch",
            num_workers=0,
            **kw,
        ),
    )


def _mean_pixel(clips: torch.Tensor) -> torch.Tensor:
    """A feature that identifies a clip: its mean over all but the channel axis -> (B, 3)."""
    return clips.mean(dim=(1, 3, 4, 5))


def test_every_window_once_and_video_means(eval_data):
    data = _data(eval_data)
    w = run_windows(_mean_pixel, data, "test", ENV)
    info = window_info(data.loader.shards, "rgb", "test")
    assert w.keys == sorted(info) and len(set(w.keys)) == len(w.keys)
    assert w.values.shape == (len(info), 1, 3)
    counts = Counter(w.video_ids)
    assert counts == Counter(i["video_id"] for i in info.values())
    # test videos of 21 and 33 frames: windows over the n − 1 frames both streams have, every 6: 1 and 3
    assert sorted(set(counts.values())) == [1, 3]
    ids, labels, feats = video_mean(w)
    for vid, feat in zip(ids, feats, strict=True):
        rows = [i for i, v in enumerate(w.video_ids) if v == vid]
        np.testing.assert_allclose(feat, w.values[rows, 0].mean(axis=0), rtol=1e-6)
    assert labels.tolist() == [
        r.label for r in sorted(eval_data.records, key=lambda r: r.id) if r.split == "test"
    ]


def test_crops_give_one_output_per_crop(eval_data):
    w = run_windows(_mean_pixel, _data(eval_data), "test", ENV, crops=5)
    assert w.values.shape[1:] == (5, 3)
    assert not np.allclose(w.values[:, 0], w.values[:, 1])  # centre and a corner differ


def test_cache_is_reused_only_for_the_same_fingerprint(eval_data, tmp_path):
    data, cache = _data(eval_data), tmp_path / "f.npz"
    calls = []

    def fn(clips):
        calls.append(len(clips))
        return _mean_pixel(clips)

    a = cached_windows(fn, data, "test", ENV, cache=cache, stamp="one")
    n = len(calls)
    b = cached_windows(fn, data, "test", ENV, cache=cache, stamp="one")
    assert len(calls) == n and b.keys == a.keys and np.array_equal(a.values, b.values)
    cached_windows(fn, data, "test", ENV, cache=cache, stamp="two")
    assert len(calls) == 2 * n


def test_a_split_evaluated_with_windows_missing_is_refused(eval_data, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(eval_data.shards, shards)
    manifest = shards / "rgb" / "manifest-test.json"
    held = json.loads(manifest.read_text())
    manifest.write_text(
        json.dumps({**held, "num_samples": held["num_samples"] + 1})
    )  # one window the loader lacks
    data = from_flat(
        EvalData, dict(shards=shards, stream="rgb", size=32, batch_size=3, backend="torch", num_workers=0)
    )
    n = held["num_samples"]
    with pytest.raises(UserError, match=f"evaluated {n} distinct windows, but the shards hold {n + 1}"):
        run_windows(_mean_pixel, data, "test", ENV)


def test_label_sets_and_empty_splits_are_checked(eval_data, tmp_path):
    assert same_classes(_data(eval_data)) == ["MoveRight", "MoveLeft", "MoveUp"]
    with pytest.raises(UserError, match="manifest not found"):
        same_classes(_data(eval_data, test_split="val"))


def test_dali_cpu_pipeline_gives_the_same_windows_as_the_torch_loader(eval_data):
    # 12 test windows in batches of 5: DALI pads the last batch by repeating samples; each counts once
    kw = dict(size=32, batch_size=5, num_workers=1)
    torch_w = run_windows(
        _mean_pixel,
        from_flat(EvalData, dict(shards=eval_data.shards, stream="rgb", backend="torch", **kw)),
        "test",
        ENV,
        crops=5,
    )
    dali_w = run_windows(
        _mean_pixel,
        from_flat(EvalData, dict(shards=eval_data.shards, stream="rgb", backend="dali", **kw)),
        "test",
        ENV,
        crops=5,
    )
    assert dali_w.keys == torch_w.keys and dali_w.video_ids == torch_w.video_ids
    np.testing.assert_allclose(dali_w.values, torch_w.values, atol=0.02)  # JPEG decoders differ slightly


def test_the_cache_fingerprint_follows_the_checkpoint_bytes_and_the_split_manifest(
    eval_data, checkpoints, tmp_path
):
    data = _data(eval_data)
    same = {"checkpoint": "/a/best.pt", "sha256": checkpoint_source(checkpoints["rgb"])["sha256"]}
    moved = {**same, "checkpoint": "/b/copy.pt"}
    other = checkpoint_source(checkpoints["flow"])
    assert fingerprint(same, data, "test") == fingerprint(
        moved, data, "test"
    )  # the bytes count, not the path
    assert fingerprint(other, data, "test") != fingerprint(same, data, "test")
    assert fingerprint(same, data, "train") != fingerprint(same, data, "test")
    shards = tmp_path / "shards"
    shutil.copytree(eval_data.shards, shards)
    assert fingerprint(same, _data(eval_data), "test") == fingerprint(
        same, data.with_loader(shards=shards), "test"
    )
    manifest = shards / "rgb" / "manifest-test.json"  # resharded: other shards, another manifest
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "seed": 1}))
    assert fingerprint(same, data.with_loader(shards=shards), "test") != fingerprint(same, data, "test")


def test_a_split_whose_videos_changed_since_their_archives_were_made_is_refused(tiny_dataset, tmp_path):
    """Every task reads a split through ``eval_split``, before a feature cache is looked at: shards holding a
    video replaced since its archive was made are refused in one line naming it and the commands that remake
    its archives and the shards; remade, the split is read."""
    from click.testing import CliRunner

    from memdpc.cli import main
    from memdpc.pipeline.shard import shard_stream
    from memdpc.preprocess.datasets import build_index
    from memdpc.preprocess.run import preprocess
    from memdpc.preprocess.video_index import write_index

    records = build_index(shutil.copytree(tiny_dataset, tmp_path / "data"), "ucf101", 1)
    index, frames, shards = tmp_path / "index.jsonl", tmp_path / "frames", tmp_path / "shards"
    write_index(records, index)
    preprocess(index, frames, "rgb", size=24, workers=1, progress=False)
    for split in ("train", "test"):
        shard_stream(frames, index, "rgb", shards, split)
    data = from_flat(EvalData, dict(shards=shards, stream="rgb", size=24, backend="torch", num_workers=0))
    classes = same_classes(data)
    test = [r for r in records if r.split == "test"]
    sizes = [Path(r.path).stat().st_size for r in test[:2]]
    shutil.copyfile(test[1].path, test[0].path)  # another video at the path of the first test video
    with pytest.raises(UserError) as e:
        same_classes(data)
    remake = f"memdpc preprocess frames {index} --out {frames} --streams rgb --size 24 --overwrite"
    assert str(e.value).startswith(
        f"{shards / 'rgb' / 'manifest-test.json'}: its shards hold {test[0].id}, whose video {test[0].path} changed "
        f"since its archive was made (size {sizes[0]} → {sizes[1]} bytes, modified "
    )
    assert str(e.value).endswith(
        f"; remake its archives with `{remake}` and the test shards with the same `memdpc shard` command and "
        "--overwrite"
    )
    assert "\n" not in str(e.value) and sizes[0] != sizes[1]
    assert CliRunner().invoke(main, remake.split()[1:]).exit_code == 0
    shard_stream(frames, index, "rgb", shards, "test", overwrite=True)
    assert same_classes(data) == classes
