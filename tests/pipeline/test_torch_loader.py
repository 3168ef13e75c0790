"""Torch-loader-specific behaviour: rank and DataLoader-worker splitting of shards."""

from __future__ import annotations

import webdataset as wds

from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.torch_loader import split_by_rank

from .test_loader import one_epoch, shard_keys


def test_split_by_rank_matches_wds_split_by_node(monkeypatch):
    urls = [f"s{i}.tar" for i in range(7)]
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        assert list(split_by_rank(urls, rank, 3)) == list(wds.split_by_node(urls))


def test_two_workers_read_each_sample_once(tiny_shards):
    """3 shards, 2 workers: worker 0 reads shards 0 and 2, worker 1 shard 1; partial batches per worker."""
    loader = make_loader(
        tiny_shards, "rgb", "train", train=True, batch_size=3, size=24, backend="torch", num_workers=2
    )
    assert len(loader) == 3  # 4 samples → 2 batches, 2 samples → 1 batch
    assert sorted(one_epoch(loader)) == sorted(shard_keys(tiny_shards, "rgb", "train"))


def test_in_process_loading_matches_workers(tiny_shards):
    kw = dict(train=True, batch_size=2, size=24, backend="torch", seed=4)
    a = one_epoch(make_loader(tiny_shards, "rgb", "train", num_workers=0, **kw))
    b = one_epoch(make_loader(tiny_shards, "rgb", "train", num_workers=1, **kw))
    assert list(a) == list(b) and all((a[k][0] == b[k][0]).all() for k in a)
