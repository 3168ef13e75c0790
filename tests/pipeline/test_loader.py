"""make_loader on real shards, both backends: the Batch contract, identity with augmentation off, exact
epochs across ranks, eval windows, and the checks that run before the first batch."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from memdpc.common.errors import UserError
from memdpc.pipeline.augment import AugmentSpec, denormalise
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.epoch_draw import draw, read_catalog
from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.manifest import shard_paths
from memdpc.pipeline.plan import Batch
from memdpc.pipeline.shard import shard_stream
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.pipeline.shard_set import open_split
from memdpc.pipeline.wds_index import read_index
from memdpc.preprocess.encode import decode_rgb

from .conftest import PLANES_HW, PLANES_THIRD, WINDOWED_CLIP

BACKENDS = ["dali", "torch"]


def shard_keys(shard_dir: Path, stream: str, split: str) -> list[str]:
    """Sample keys as the tar files hold them (from the ``.cls`` member names)."""
    keys = []
    for tar in sorted((shard_dir / stream).glob(f"{split}-*.tar")):
        with tarfile.open(tar) as t:
            keys += [m.name[: -len(".cls")] for m in t if m.name.endswith(".cls")]
    return keys


def one_epoch(loader) -> dict[str, tuple[torch.Tensor, int, str]]:
    """key → (clip, label, video id) for one epoch; fails on a repeated key or a wrong batch count."""
    out, batches = {}, 0
    for b in loader:
        batches += 1
        assert isinstance(b, Batch) and b.clips.dtype == torch.float32 and b.labels.dtype == torch.int64
        for key, clip, label, vid in zip(b.keys, b.clips, b.labels.tolist(), b.video_ids, strict=True):
            assert key not in out, f"{key} came twice"
            assert key.rsplit("_", 1)[0] == vid
            out[key] = (clip, label, vid)
    assert batches == len(loader)
    return out


@pytest.mark.parametrize("stream", ["rgb", "flow"])
def test_augmentation_off_gives_identical_tensors_from_both_backends(tiny_shards, stream):
    kw = dict(train=True, batch_size=4, size=32, num_workers=1, spec=AugmentSpec.off())
    dali = one_epoch(make_loader(tiny_shards, stream, "train", backend="dali", **kw))
    ref = one_epoch(make_loader(tiny_shards, stream, "train", backend="torch", **kw))
    assert sorted(dali) == sorted(ref) == sorted(shard_keys(tiny_shards, stream, "train"))
    for key in ref:
        assert dali[key][0].shape == (8, 3, 5, 32, 32)
        assert torch.equal(dali[key][0], ref[key][0]), key
        assert dali[key][1:] == ref[key][1:]


def test_augmentation_off_is_plain_decoding(tiny_shards):
    """Both backends decode exactly what an OpenCV decode of the shard's JPEG members gives (RGB order)."""
    key = shard_keys(tiny_shards, "rgb", "test")[0]
    want = sample_frames(tiny_shards, "rgb", "test")[key]
    for backend in BACKENDS:
        got = one_epoch(
            make_loader(
                tiny_shards, "rgb", "test", train=False, batch_size=2, size=32, backend=backend, num_workers=1
            )
        )[key][0]
        assert np.array_equal(denormalise(got, AugmentSpec()).numpy(), want), backend


def two_rank_loaders(shards: Path, backend: str, **kw) -> Iterator:
    """The training loaders of rank 0, then rank 1, of two on the rgb train split of ``shards`` (batches of 2 at
    32², one worker), each made when the one before is done with."""
    for rank in (0, 1):
        yield make_loader(
            shards,
            "rgb",
            "train",
            train=True,
            batch_size=2,
            size=32,
            backend=backend,
            rank=rank,
            world_size=2,
            num_workers=1,
            **kw,
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_epoch_yields_each_sample_once_across_two_ranks(tiny_shards, backend):
    seen: list[str] = []
    for loader in two_rank_loaders(tiny_shards, backend, seed=3):
        loader.set_epoch(1)
        seen += list(one_epoch(loader))
    assert sorted(seen) == sorted(shard_keys(tiny_shards, "rgb", "train"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_drop_last_gives_every_rank_the_same_number_of_full_batches(tiny_shards, backend):
    counts = []
    for loader in two_rank_loaders(tiny_shards, backend, drop_last=True):
        batches = list(loader)
        assert all(len(b.keys) == 2 for b in batches)
        counts.append((len(loader), len(batches)))
    assert counts[0] == counts[1] and counts[0][0] == counts[0][1] >= 1


@pytest.fixture(scope="module")
def long_shards(long_archives, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("long_shards")
    for split in ("train", "test"):
        shard_stream(
            long_archives.root, long_archives.records, "rgb", out, split, ShardSettings(max_count=3, seed=0)
        )
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_yields_every_window_of_every_video_once(long_archives, long_shards, backend):
    clip = ClipSpec()
    for split in ("train", "test"):
        loader = make_loader(
            long_shards,
            "rgb",
            split,
            train=False,
            batch_size=3,
            size=16,
            crops=10,
            backend=backend,
            num_workers=1,
        )
        got = one_epoch(loader)
        want = set()
        for r in long_archives.records:
            if r.split == split:
                usable = r.num_frames - 1  # windows sit on frames with a flow partner
                starts = clip.train_starts(usable, 20) if split == "train" else clip.eval_starts(usable)
                want |= {f"{r.id}_{s:05d}" for s in starts}
        assert set(got) == want and len(want) > len({k.rsplit("_", 1)[0] for k in want}) - (split == "test")
        labels = {r.id: r.label for r in long_archives.records}
        for clip_t, label, vid in got.values():
            assert clip_t.shape == (10, 8, 3, 5, 16, 16) and label == labels[vid]


# ------------------------------------------------------------------------ k windows per video per epoch
def drawn_epoch(
    shards: Path, backend: str, epoch: int, rank: int = 0, world_size: int = 1, workers: int = 1, **kw
) -> dict[str, tuple[torch.Tensor, int, str]]:
    loader = make_loader(
        shards,
        "rgb",
        "train",
        train=True,
        batch_size=2,
        size=16,
        backend=backend,
        rank=rank,
        world_size=world_size,
        num_workers=workers,
        seed=2,
        clip=WINDOWED_CLIP,
        clips_per_video=1,
        **kw,
    )
    loader.set_epoch(epoch)
    return one_epoch(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_clip_per_video_takes_one_window_of_each_video_drawn_anew_every_epoch(windowed_shards, backend):
    videos = {k.rsplit("_", 1)[0] for k in shard_keys(windowed_shards, "rgb", "train")}
    epochs = [drawn_epoch(windowed_shards, backend, epoch) for epoch in (0, 1)]
    for got in epochs:
        assert sorted(v for _, _, v in got.values()) == sorted(
            videos
        )  # one sample per video, each video once
        assert set(got) <= set(shard_keys(windowed_shards, "rgb", "train"))
    assert set(epochs[0]) != set(epochs[1])  # other starts in the next epoch
    again = drawn_epoch(windowed_shards, backend, 1)  # a new loader (a resumed run) repeats the epoch exactly
    assert list(again) == list(epochs[1]) and all(torch.equal(again[k][0], epochs[1][k][0]) for k in again)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_clip_per_video_gives_every_drawn_sample_once_across_ranks(windowed_shards, backend):
    whole = drawn_epoch(windowed_shards, backend, 3)
    parts = [drawn_epoch(windowed_shards, backend, 3, rank=r, world_size=3, workers=2) for r in range(3)]
    keys = [k for part in parts for k in part]
    assert sorted(keys) == sorted(whole) and len(keys) == 7  # 7 videos among 3 ranks, some with 2 workers


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_clip_per_video_never_decodes_the_windows_not_drawn(windowed_shards, backend, tmp_path):
    """The frames of every sample epoch 0 does not draw are overwritten with bytes no decoder reads."""
    root = copy_stream(windowed_shards, tmp_path)
    catalog = read_catalog(shard_paths(root, open_split(root, "rgb", "train").manifest))
    drawn = set(draw(catalog, 1, seed=2, epoch=0).tolist())
    for i in set(range(len(catalog))) - drawn:
        tar, idx = catalog.shards[catalog.shard[i]]
        members = list(read_index(idx))[catalog.line[i]]
        with open(tar, "r+b") as f:
            for name, (offset, size) in members.items():
                if name.endswith(".jpg"):
                    f.seek(offset)
                    f.write(b"\xff" * size)
    assert len(drawn_epoch(root, backend, 0)) == 7
    rgb, folder = re.escape(str(root / "rgb")), re.escape(str(root))
    damaged = {
        "torch": rf"{rgb}/train-\d+\.tar: sample \w+: f\d\d\.jpg is not a decodable JPEG "
        rf".*--verify {folder}`",
        "dali": rf"{rgb}: a frame of these shards is not a decodable JPEG .*--verify {folder}`",
    }
    with pytest.raises(UserError, match=damaged[backend]) as e:  # the other epoch draws a damaged window
        drawn_epoch(root, backend, 1)
    assert "\n" not in str(e.value)  # the torch loader's worker sends the message, not its traceback


# ---------------------------------------------------------------------------------- checks up front
def copy_stream(tiny_shards: Path, tmp_path: Path, stream: str = "rgb") -> Path:
    shutil.copytree(tiny_shards / stream, tmp_path / stream)
    return tmp_path


def edit_manifest(root: Path, stream: str, split: str, **changes) -> None:
    path = root / stream / f"manifest-{split}.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_missing_manifest(tmp_path):
    with pytest.raises(UserError, match="manifest not found"):
        make_loader(tmp_path, "rgb", "train", train=True, batch_size=2, backend="torch")


def test_manifest_of_another_stream(tiny_shards, tmp_path):
    shutil.copytree(tiny_shards / "rgb", tmp_path / "flow")
    with pytest.raises(UserError, match="not a flow/train shard manifest"):
        make_loader(tmp_path, "flow", "train", train=True, batch_size=2, backend="torch")


def test_clip_shape_mismatch(tiny_shards):
    with pytest.raises(UserError, match=r"manifest-train\.json: shards hold clips"):
        make_loader(
            tiny_shards, "rgb", "train", train=True, batch_size=2, backend="dali", clip=ClipSpec(num_blocks=4)
        )


def test_missing_index(tiny_shards, tmp_path):
    root = copy_stream(tiny_shards, tmp_path)
    (root / "rgb" / "train-000001.idx").unlink()
    with pytest.raises(UserError, match=r"train-000001\.idx: DALI index .* missing"):
        make_loader(root, "rgb", "train", train=True, batch_size=2, backend="dali")


def test_empty_shard_list(tiny_shards, tmp_path):
    root = copy_stream(tiny_shards, tmp_path)
    edit_manifest(root, "rgb", "train", shards=[], num_samples=0)
    with pytest.raises(UserError, match="shard list is empty"):
        make_loader(root, "rgb", "train", train=True, batch_size=2, backend="torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fewer_shards_than_ranks_is_refused(tiny_shards, backend):
    with pytest.raises(UserError, match=r"3 shard\(s\) for 4 rank\(s\); every rank needs at least one shard"):
        make_loader(tiny_shards, "rgb", "train", train=True, batch_size=2, backend=backend, world_size=4)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine: on purpose
def test_torch_workers_are_capped_at_the_shards_of_a_rank_and_still_read_every_sample(tiny_shards):
    """A small split (e.g. a few test videos in one shard) with the default two workers: one worker reads it."""
    manifest = json.loads((tiny_shards / "rgb" / "manifest-train.json").read_text())
    assert len(manifest["shards"]) == 3
    for world_size, workers in ((1, 3), (2, 1)):
        keys = []
        for rank in range(world_size):
            loader = make_loader(
                tiny_shards,
                "rgb",
                "train",
                train=False,
                batch_size=2,
                backend="torch",
                rank=rank,
                world_size=world_size,
                num_workers=8,
            )
            assert loader.plan.num_workers == workers
            keys += [k for b in loader for k in b.keys]
        assert len(keys) == manifest["num_samples"] and len(set(keys)) == len(keys)


def test_bad_request(tiny_shards):
    with pytest.raises(UserError, match="backend"):
        make_loader(tiny_shards, "rgb", "train", train=True, batch_size=2, backend="ffcv")
    with pytest.raises(UserError, match="crops"):
        make_loader(tiny_shards, "rgb", "test", train=False, batch_size=2, crops=3)
    with pytest.raises(UserError, match="rank 2"):
        make_loader(tiny_shards, "rgb", "train", train=True, batch_size=2, rank=2, world_size=2)


# ------------------------------------------------------------------------------------- augmentation
def frames_u8(clip: torch.Tensor) -> np.ndarray:
    """A loader clip (N, 3, SL, H, W) back to its uint8 frames (F, H, W, 3)."""
    return denormalise(clip, AugmentSpec()).numpy()


def train_epoch(shards: Path, backend: str, stream: str = "rgb", seed: int = 0, epoch: int = 0, **spec):
    """One epoch (:func:`one_epoch`) of ``stream``'s train split in training, batches of 3 at 24², one worker,
    augmented by ``AugmentSpec(**spec)``."""
    loader = make_loader(
        shards,
        stream,
        "train",
        train=True,
        batch_size=3,
        size=24,
        backend=backend,
        num_workers=1,
        seed=seed,
        spec=AugmentSpec(**spec),
    )
    loader.set_epoch(epoch)
    return one_epoch(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_repeats_and_another_epoch_differs(tiny_shards, backend):
    a, b = (
        train_epoch(tiny_shards, backend, seed=5, epoch=1),
        train_epoch(tiny_shards, backend, seed=5, epoch=1),
    )
    assert list(a) == list(b) and all(torch.equal(a[k][0], b[k][0]) for k in a)
    c = train_epoch(tiny_shards, backend, seed=5, epoch=2)
    assert list(c) != list(a) or not all(torch.equal(a[k][0], c[k][0]) for k in a)


# Tiny videos have 30 frames; a window's frames 10..39 all repeat the last usable frame (padding), so that
# part of every sample is a static clip.
STATIC = slice(10, 40)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clip_consistent_ops_keep_a_static_clip_static(tiny_shards, backend):
    got = train_epoch(tiny_shards, backend, brightness=0, contrast=0, saturation=0, hue=0, grey_p=0)
    moved = 0
    for clip, _, _ in got.values():
        f = frames_u8(clip)[STATIC]
        assert (f == f[0]).all()  # crop, resize and flip are the same for all 40 frames
        moved += not np.array_equal(frames_u8(clip)[0], frames_u8(clip)[39])
    assert moved  # the clip itself is not static everywhere


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_frame_jitter_differs_between_frames(tiny_shards, backend):
    for clip, _, _ in train_epoch(tiny_shards, backend, grey_p=0.25).values():
        f = frames_u8(clip)[STATIC].astype(int)
        means = f.reshape(len(f), -1, 3).mean(1)
        assert len({tuple(m.round(1)) for m in means}) > len(f) // 2  # different colours per frame
        grey = (f == f[..., :1]).all(axis=(1, 2, 3))
        assert 0 < grey.sum() < len(f)  # random grey hits some frames, not all


@pytest.mark.parametrize("backend", BACKENDS)
def test_flipped_flow_has_negated_x(tiny_shards, backend):
    geometry = dict(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), crop_size=None, jitter_flow=False)
    plain, flipped = (
        make_loader(
            tiny_shards,
            "flow",
            "train",
            train=True,
            batch_size=3,
            size=32,
            backend=backend,
            num_workers=1,
            spec=AugmentSpec(flip_p=flip_p, **geometry),
        )
        for flip_p in (0.0, 1.0)
    )
    a, b = one_epoch(plain), one_epoch(flipped)
    for key in a:
        fa, fb = frames_u8(a[key][0]), frames_u8(b[key][0])[:, :, ::-1]  # mirror back
        assert np.array_equal(fb[..., 0], 255 - fa[..., 0])
        assert np.array_equal(fb[..., 1:], fa[..., 1:])
        assert not np.array_equal(fa[..., 0], 255 - fa[..., 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ten_crop_mirrors_negate_flow_x(tiny_shards, backend):
    loader = make_loader(
        tiny_shards,
        "flow",
        "test",
        train=False,
        batch_size=2,
        size=32,
        crops=10,
        backend=backend,
        num_workers=1,
        spec=AugmentSpec(eval_scale=1.0),
    )
    for clip, _, _ in one_epoch(loader).values():
        views = denormalise(clip, AugmentSpec()).numpy()  # (10, F, H, W, 3)
        for k in range(5):
            mirrored = views[k + 5][:, :, ::-1]
            assert np.array_equal(mirrored[..., 0], 255 - views[k][..., 0])
            assert np.array_equal(mirrored[..., 1:], views[k][..., 1:])


# ------------------------------------------------------------------------------- flow as greyscale planes
def sample_jpegs(shard_dir: Path, stream: str, split: str) -> dict[str, list[bytes]]:
    """key → the sample's 40 JPEG frames as its shard holds them."""
    out = {}
    for tar in sorted((shard_dir / stream).glob(f"{split}-*.tar")):
        with tarfile.open(tar) as t:
            members = {m.name: t.extractfile(m).read() for m in t}
        for key in sorted({name.split(".", 1)[0] for name in members}):
            out[key] = [members[f"{key}.f{i:02d}.jpg"] for i in range(40)]
    return out


def planes_frames(shard_dir: Path, split: str) -> dict[str, np.ndarray]:
    """key → the sample's 40 flow images as stored: (F, H, W, 3) x, y and the archives' third channel."""
    return {
        key: np.stack([decode_rgb(j, PLANES_THIRD) for j in jpgs])
        for key, jpgs in sample_jpegs(shard_dir, "flow", split).items()
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_flow_planes_are_read_as_the_codes_they_store(planes_shards, backend, train):
    """Flow in the default encoding (x and y as greyscale planes, the x plane padded to whole JPEG blocks) is read
    by both loaders as the (x, y, third) images it was made from, with the third channel the manifest records (0
    here): in evaluation, and in training with a full-height crop without jitter (the stored codes, mirrored with
    x negated where flipped; DALI: OpenCV's geometry on the host, and its GPU graph run on the CPU)."""
    from memdpc.pipeline.dali_loader import DaliLoader

    split = "train" if train else "test"
    assert open_split(planes_shards, "flow", split).manifest["third_channel"] == PLANES_THIRD
    side = min(PLANES_HW)
    spec = AugmentSpec(crop_area=(1.0, 1.0), crop_aspect=(1.0, 1.0), crop_size=None, jitter_flow=False)
    kw = dict(train=train, batch_size=2, size=side, backend=backend, num_workers=1, spec=spec, seed=1)
    loaders = [make_loader(planes_shards, "flow", split, **kw)]
    if backend == "dali" and train:
        loaders.append(DaliLoader(loaders[0].plan, host_geometry=False))
    x0 = (PLANES_HW[1] - side) // 2
    want = {k: v[:, :, x0 : x0 + side] for k, v in planes_frames(planes_shards, split).items()}
    for loader in loaders:
        got = one_epoch(loader)
        assert sorted(got) == sorted(want)
        flipped = 0
        for key, (clip, _, _) in got.items():
            frames = denormalise(clip, AugmentSpec()).numpy()
            if not np.array_equal(frames, want[key]):  # mirrored: x negated
                frames = frames[:, :, ::-1].copy()
                frames[..., 0] = 255 - frames[..., 0]
                flipped += 1
            assert np.array_equal(frames, want[key]), key
        assert flipped < len(got) and (flipped > 0 or not train)


# ------------------------------------------------------------------------------- mixed frame sizes
def sample_frames(shard_dir: Path, stream: str, split: str) -> dict[str, np.ndarray]:
    """key → the sample's 40 frames as OpenCV decodes its JPEG members (F, H, W, 3) RGB, at their own size."""
    return {
        key: np.stack([cv2.imdecode(np.frombuffer(j, np.uint8), cv2.IMREAD_COLOR) for j in jpgs])[..., ::-1]
        for key, jpgs in sample_jpegs(shard_dir, stream, split).items()
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train, crops", [(True, 1), (False, 1), (False, 10)])
def test_mixed_frame_sizes_give_clips_of_the_output_size(mixed_shards, backend, train, crops):
    """Shards of three frame sizes (landscape, portrait, square) load in training and evaluation."""
    loader = make_loader(
        mixed_shards,
        "rgb",
        "train",
        train=train,
        batch_size=3,
        size=24,
        crops=crops,
        backend=backend,
        num_workers=1,
    )
    got = one_epoch(loader)
    assert sorted(got) == sorted(shard_keys(mixed_shards, "rgb", "train")) and len(got) == 6
    shape = (8, 3, 5, 24, 24) if crops == 1 else (crops, 8, 3, 5, 24, 24)
    assert all(clip.shape == shape for clip, _, _ in got.values())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("crops", [1, 5, 10])
def test_eval_crops_are_cut_from_each_samples_own_frames(mixed_shards, backend, crops):
    """The test split holds a portrait (64×36) and a landscape (48×64) video. At an output size equal to the
    side of a sample's crops, its views are exact copies of the frames: the centre crop the centred square of
    its short side, five crops its corners and centre at side round(0.875 × short side), ten crops those and
    their mirror images."""
    frames = sample_frames(mixed_shards, "rgb", "test")
    for key, f in frames.items():
        h, w = f.shape[1:3]
        side = min(h, w) if crops == 1 else int(min(h, w) * 0.875 + 0.5)
        loader = make_loader(
            mixed_shards,
            "rgb",
            "test",
            train=False,
            batch_size=2,
            size=side,
            crops=crops,
            backend=backend,
            num_workers=1,
        )
        views = denormalise(one_epoch(loader)[key][0], AugmentSpec()).numpy()
        views = views.reshape(crops, 40, side, side, 3)
        if crops == 1:
            starts = [((h - side) // 2, (w - side) // 2)]
        else:
            ends = (h - side, w - side)
            starts = [(0, 0), (0, ends[1]), (ends[0], 0), ends, (ends[0] // 2, ends[1] // 2)]
        want = [f[:, y : y + side, x : x + side] for y, x in starts]
        want += [v[:, :, ::-1] for v in want] if crops == 10 else []
        for k, (got, exp) in enumerate(zip(views, want, strict=True)):
            assert np.array_equal(got, exp), f"{key} ({h}×{w}), view {k}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_crops_are_relative_to_each_samples_own_frames(mixed_shards, backend):
    """A random crop of area 1 and aspect 1 is, in every frame that is not square, the centred square of the
    short side (torchvision's fallback), and the whole frame of a square one: for each of the three sizes the
    training clip is that square resized to the output size."""
    got = train_epoch(
        mixed_shards,
        backend,
        crop_area=(1.0, 1.0),
        crop_aspect=(1.0, 1.0),
        crop_size=None,
        flip_p=0.0,
        grey_p=0.0,
        brightness=0,
        contrast=0,
        saturation=0,
        hue=0,
    )
    sizes = set()
    for key, f in sample_frames(mixed_shards, "rgb", "train").items():
        h, w = f.shape[1:3]
        s = min(h, w)
        square = f[:, (h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
        want = np.stack([cv2.resize(x, (24, 24), interpolation=cv2.INTER_AREA) for x in square])
        assert np.array_equal(frames_u8(got[key][0]), want), f"{key} ({h}×{w})"
        sizes.add((h, w))
    assert sizes == {(48, 64), (64, 36), (40, 40)}
