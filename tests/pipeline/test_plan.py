"""The loader plan: how many views of a clip a backend makes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.plan import LoaderPlan


def test_views_are_one_in_training_and_the_crops_in_evaluation():
    plan = LoaderPlan(
        shards=[(Path("a.tar"), Path("a.idx"))],
        shard_samples=[4],
        stream="rgb",
        frame_sizes=((64, 64),),
        encoding="jpeg-q90-420",
        num_frames=40,
        num_blocks=8,
        train=False,
        batch_size=2,
        size=32,
        crops=5,
        rank=0,
        world_size=1,
        seed=0,
        num_workers=0,
        device="cpu",
        spec=AugmentSpec(),
    )
    assert plan.views == 5
    assert replace(plan, train=True).views == 1
