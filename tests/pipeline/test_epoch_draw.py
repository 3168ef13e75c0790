"""Epochs of k windows per video on real shards: the catalog read from the DALI indexes, the draw, the indexes
of the drawn samples, and samples read by their byte range."""

from __future__ import annotations

import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.pipeline.epoch_draw import (
    Catalog,
    draw,
    rank_slice,
    read_catalog,
    read_sample,
    shuffled,
    write_drawn_indexes,
)
from memdpc.pipeline.manifest import shard_paths
from memdpc.pipeline.sample import parse_key
from memdpc.pipeline.shard_set import open_split
from memdpc.pipeline.wds_index import read_index

from .test_loader import shard_keys


def catalog_of(shards: Path):
    return read_catalog(shard_paths(shards, open_split(shards, "rgb", "train").manifest))


def keys_of(catalog, samples) -> list[str]:
    return [f"{catalog.videos[catalog.video[i]]}_{catalog.start[i]:05d}" for i in samples]


def test_the_catalog_lists_every_sample_of_the_shards_with_its_video_and_start(windowed_shards):
    catalog = catalog_of(windowed_shards)
    assert keys_of(catalog, range(len(catalog))) == shard_keys(windowed_shards, "rgb", "train")
    assert (len(catalog), catalog.num_videos) == (26, 7)
    assert sorted(Counter(catalog.video.tolist()).values()) == [2, 4, 4, 4, 4, 4, 4]


def test_a_sample_read_by_its_byte_range_holds_the_members_tar_holds(windowed_shards):
    catalog = catalog_of(windowed_shards)
    for i in (0, len(catalog) - 1):
        tar_path = catalog.shards[catalog.shard[i]][0]
        with open(tar_path, "rb") as f:
            sample = read_sample(f, catalog.span[i])
        key = keys_of(catalog, [i])[0]
        with tarfile.open(tar_path) as t:
            want = {
                m.name.split(".", 1)[1]: t.extractfile(m).read() for m in t if m.name.startswith(key + ".")
            }
        assert sample.pop("__key__") == key and sample == want and len(want) == 8 + 2


@pytest.mark.parametrize("k", [1, 3])
def test_each_epoch_draws_k_windows_of_every_video_anew_from_seed_and_epoch(windowed_shards, k):
    catalog = catalog_of(windowed_shards)
    windows = Counter(catalog.video.tolist())
    epochs = [draw(catalog, k, seed=0, epoch=e) for e in range(40)]
    for drawn in epochs:
        assert len(drawn) == catalog.drawn_count(k) == sum(min(k, n) for n in windows.values())
        assert len(set(drawn.tolist())) == len(drawn)
        assert Counter(catalog.video[drawn].tolist()) == {v: min(k, n) for v, n in windows.items()}
    assert np.array_equal(
        epochs[0], draw(catalog, k, seed=0, epoch=0)
    )  # the same seed and epoch: the same draw
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[0], draw(catalog, k, 1, 0))
    assert set(np.concatenate(epochs).tolist()) == set(range(len(catalog)))  # every window gets its turn


def test_the_drawn_samples_divide_among_ranks_once_each():
    order = shuffled(np.arange(0, 50, 2), seed=0, epoch=3)
    parts = [order[rank_slice(len(order), r, 3)] for r in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(0, 50, 2))
    assert [len(p) for p in parts] == [8, 8, 9]


def test_the_drawn_indexes_list_the_drawn_samples_only_with_the_shards_offsets(windowed_shards, tmp_path):
    catalog = catalog_of(windowed_shards)
    drawn = draw(catalog, 1, seed=0, epoch=0)
    pairs = write_drawn_indexes(catalog, drawn, tmp_path)
    listed = []
    for tar, idx in pairs:
        full = {min(m): m for m in read_index(tar.with_suffix(".idx"))}
        for members in read_index(idx):
            assert members == full[min(members)]  # the shard's own line, offsets and all
            listed.append(parse_key(min(members).split(".")[0]))
    assert listed == [(catalog.videos[catalog.video[i]], catalog.start[i]) for i in drawn]
    assert len(pairs) == len(set(catalog.shard[drawn].tolist()))  # shards without a drawn sample are left out


def test_a_damaged_index_is_named(windowed_shards, tmp_path):
    tar, idx = shard_paths(windowed_shards, open_split(windowed_shards, "rgb", "train").manifest)[0]
    bad = tmp_path / idx.name
    bad.write_text(idx.read_text().splitlines()[0] + "\nnot a sample line\n")
    with pytest.raises(UserError, match=rf"{bad.name}: line 2 is not a sample of a DALI index"):
        read_catalog([(tar, bad)])


class _Counted(np.ndarray):
    """An array that counts the elements every numpy operation on it takes in (its ufuncs and functions, e.g. a
    comparison with a scalar, ``argsort``), so a test can tell work linear in the samples from quadratic work."""

    elements = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return self._count(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return self._count(func, args, kwargs)

    @classmethod
    def _count(cls, func, args, kwargs):
        arrays = [a for a in args if isinstance(a, np.ndarray)] + [
            a for arg in args if isinstance(arg, (tuple, list)) for a in arg if isinstance(a, np.ndarray)
        ]
        cls.elements += sum(a.size for a in arrays)
        plain = [_plain(a) for a in args]
        result = func(*plain, **{k: _plain(v) for k, v in kwargs.items()})
        return result.view(cls) if isinstance(result, np.ndarray) else result


def _plain(value):
    if isinstance(value, _Counted):
        return value.view(np.ndarray)
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def _counted_catalog(folder: Path, shards: int, per_shard: int) -> Catalog:
    """A catalog of ``shards`` shards of ``per_shard`` samples of one video each, whose DALI indexes are lines
    of text (the drawn indexes copy them)."""
    folder.mkdir()
    pairs = []
    for s in range(shards):
        idx = folder / f"train-{s:06d}.idx"
        idx.write_text("v1.2 x\n" + "".join(f"line {s} {i}\n" for i in range(per_shard)))
        pairs.append((folder / f"train-{s:06d}.tar", idx))
    n = shards * per_shard
    return Catalog(
        pairs,
        np.repeat(np.arange(shards, dtype=np.int32), per_shard).view(_Counted),
        np.tile(np.arange(per_shard, dtype=np.int32), shards).view(_Counted),
        (np.arange(n, dtype=np.int32) // 2).view(_Counted),  # two windows per video
        np.zeros(n, np.int32).view(_Counted),
        np.zeros((n, 2), np.int64).view(_Counted),
        [f"v{i}" for i in range(n // 2)],
    )


def test_an_epochs_draw_and_its_indexes_take_work_linear_in_the_samples(tmp_path):
    """The elements numpy operations take in, drawing an epoch and writing its indexes, at 4× the shards and the
    samples: 4× as many (16× where each shard's samples were picked by comparing every drawn sample's shard)."""
    work = {}
    for shards in (100, 400):
        catalog = _counted_catalog(tmp_path / str(shards), shards, 6)
        _Counted.elements = 0
        drawn = draw(catalog, 1, seed=0, epoch=0)
        pairs = write_drawn_indexes(catalog, drawn, tmp_path / str(shards))
        work[shards] = _Counted.elements
        assert len(pairs) == shards
        assert sum(len(idx.read_text().splitlines()) - 1 for _, idx in pairs) == len(drawn) == shards * 3
    assert work[400] < 5 * work[100], work
