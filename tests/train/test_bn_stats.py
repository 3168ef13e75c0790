"""train/bn_stats.py: an untrained encoder gets the data's BatchNorm statistics, and nothing else changes."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.distenv import DistEnv
from memdpc.model.checkpoint import load_model, read_checkpoint
from memdpc.train.bn_stats import data_batchnorm_stats
from memdpc.train.checkpoint import initial_model, param_digest
from memdpc.train.config import config_from_dict
from memdpc.train.parts import run_loader

from ..conftest import TINY_TRAIN
from .conftest import CLIP

OPTIONS = {**TINY_TRAIN, "arch": "memdpc_r18"}


def test_statistics_are_the_average_over_the_batches_and_weights_stay(train_shards):
    config = config_from_dict(dict(shards=str(train_shards), out="unused", **OPTIONS))
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    model = initial_model(config)
    before = param_digest(model)
    norm = model.backbone.bn1  # the stem's BatchNorm: its input is easy to catch
    seen = []
    hook = norm.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().clone()))
    loader = run_loader(config, env, "train", CLIP, train=False)
    data_batchnorm_stats(model, loader, env.device, max_batches=3)
    hook.remove()
    assert len(seen) == 3 and not model.training and param_digest(model) == before
    means = torch.stack([x.transpose(0, 1).flatten(1).mean(1) for x in seen])
    variances = torch.stack(
        [x.transpose(0, 1).flatten(1).var(1) for x in seen]
    )  # unbiased, as BatchNorm keeps
    torch.testing.assert_close(norm.running_mean, means.mean(0))
    torch.testing.assert_close(norm.running_var, variances.mean(0))
    assert norm.momentum == 0.1  # restored for whoever trains the model next


def test_cli_writes_the_baseline_with_the_datas_statistics(train_shards, tmp_path):
    args = [
        "train",
        "--stream",
        "rgb",
        "--shards",
        str(train_shards),
        "--widths",
        "4,8,16,16",
        "--size",
        "32",
        "--num-blocks",
        "5",
        "--block-len",
        "3",
        "--pred-steps",
        "2",
        "--batch-size",
        "4",
        "--backend",
        "torch",
        "--num-workers",
        "0",
        "--init-only",
    ]
    plain = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "plain")])
    data = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "data"), "--bn-from-data"])
    assert plain.exit_code == 0 and data.exit_code == 0, plain.output + data.output
    a, _ = load_model(tmp_path / "plain" / "checkpoints" / "init.pt")
    b, _ = load_model(tmp_path / "data" / "checkpoints" / "init.pt")
    assert read_checkpoint(tmp_path / "data" / "checkpoints" / "init.pt")["bn_from_data"] is True
    weights = {k: v for k, v in a.state_dict().items() if "running" not in k and "num_batches" not in k}
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in weights.items())
    assert torch.all(a.backbone.bn1.running_var == 1) and not torch.all(b.backbone.bn1.running_var == 1)
    changed = [
        k for k, v in a.state_dict().items() if "running_mean" in k and not torch.equal(v, b.state_dict()[k])
    ]
    assert changed, "no BatchNorm statistic changed"
    res = CliRunner().invoke(main, [*args[:-1], "--out", str(tmp_path / "x"), "--bn-from-data"])
    assert res.exit_code == 2 and "--bn-from-data goes with --init-only" in res.output
