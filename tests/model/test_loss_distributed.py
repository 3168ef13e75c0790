"""Global negatives across ranks with a real gloo process group (two CPU processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
import torch.nn.functional as F

from memdpc.common.distenv import DistEnv, cleanup
from memdpc.model.loss import dense_infonce
from memdpc.model.names import NEGATIVES


def _tensors(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(2, 3, 8, 2, 2, generator=g), torch.randn(2, 3, 8, 2, 2, generator=g)


def _gloo_threads() -> list[str]:
    return [
        n
        for n in (Path(t, "comm").read_text().strip() for t in Path("/proc/self/task").iterdir())
        if "gloo" in n
    ]


def _worker(rank: int, world: int, init: str, out: str, negatives: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    finished = False
    try:
        pred, tgt = (t.requires_grad_() for t in _tensors(rank))
        res = dense_infonce(pred, tgt, global_negatives=True, negatives=negatives)
        res["loss"].backward()
        got = {"loss": res["loss"].detach(), "pred_grad": pred.grad, "tgt_grad": tgt.grad}
        finished = True
    finally:
        cleanup(DistEnv(rank, world, 0, torch.device("cpu")), finished)
    # A group kept alive past cleanup keeps gloo's threads running into the interpreter's shutdown, where
    # freeing a collective's tensors aborts the process, now and then.
    torch.save({**got, "gloo_threads": _gloo_threads()}, Path(out) / f"rank{rank}.pt")


def _joint_losses(preds, tgts, negatives: str) -> list[torch.Tensor]:
    """Each rank's loss, computed in one process over both ranks' targets."""
    if negatives == "all":
        rows = [p.permute(0, 1, 3, 4, 2).reshape(-1, 8) for p in preds]
        cols = torch.cat([t.permute(0, 1, 3, 4, 2).reshape(-1, 8) for t in tgts])
        return [F.cross_entropy(r @ cols.t(), torch.arange(24) + 24 * k) for k, r in enumerate(rows)]
    if (
        negatives == "own_clip"
    ):  # per clip and map position: its steps against its own targets, on its own rank
        return [
            torch.stack(
                [
                    F.cross_entropy(p[b, :, :, i, j] @ t[b, :, :, i, j].t(), torch.arange(3))
                    for b in range(2)
                    for i in range(2)
                    for j in range(2)
                ]
            ).mean()
            for p, t in zip(preds, tgts, strict=True)
        ]
    losses = []
    for k, p in enumerate(preds):  # per map position (and step): rows of rank k against (rank, b[, t]) there
        groups = []
        for i in range(2):
            for j in range(2):
                for ts in [list(range(3))] if negatives == "same_position" else [[t] for t in range(3)]:
                    cols = torch.cat([t[:, ts, :, i, j].reshape(-1, 8) for t in tgts])
                    rows = p[:, ts, :, i, j].reshape(-1, 8)
                    groups.append(F.cross_entropy(rows @ cols.t(), torch.arange(len(rows)) + len(rows) * k))
        losses.append(torch.stack(groups).mean())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("negatives", NEGATIVES)
def test_global_negatives_match_one_process_over_the_joint_batch(tmp_path, negatives):
    tmp.spawn(_worker, args=(2, f"file://{tmp_path / 'rdv'}", str(tmp_path), negatives), nprocs=2, join=True)
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    preds, tgts = zip(*(tuple(t.requires_grad_() for t in _tensors(r)) for r in range(2)), strict=True)
    losses = _joint_losses(preds, tgts, negatives)
    sum(losses).backward()
    for r in range(2):
        assert got[r]["gloo_threads"] == []  # the gather holds nothing of the group once the run has left it
        torch.testing.assert_close(got[r]["loss"], losses[r].detach())
        torch.testing.assert_close(got[r]["pred_grad"], preds[r].grad)
        torch.testing.assert_close(got[r]["tgt_grad"], tgts[r].grad)  # negatives of the other rank count too
    local = dense_infonce(*_tensors(0), negatives=negatives)["loss"]
    if negatives == "own_clip":  # a clip's own targets only: the other rank's add nothing
        torch.testing.assert_close(local, got[0]["loss"])
    else:
        assert local < got[0]["loss"]  # more negatives, harder task
