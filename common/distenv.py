"""Process-group setup for one entry point that runs alone, under ``torchrun`` or under SLURM ``srun``.

Rank, world size and local rank come from torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, else from
``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``; with neither the process is a world of one and no
process group is created. NCCL is used on GPU, gloo on CPU; decisions taken on the host (whether to stop) go
through gloo on both, so that they never wait for the GPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from memdpc.common.errors import UserError

__all__ = ["DistEnv"]

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    host_group: Any = None  # the gloo group of host-side decisions in an NCCL run; None: the default group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int_env(env: dict[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise UserError(f"environment variable {name}={env[name]!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list: ``node[03-05,09],gpu1`` → ``node03``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise UserError(f"cannot read the SLURM node list {nodelist!r}; set MASTER_ADDR")
    prefix, ranges = m.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def read_env(env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun or SLURM variables; (0, 1, 0) without either.

    Under SLURM, ``MASTER_ADDR`` defaults to the first node of the job and ``MASTER_PORT`` to 29500
    (both written into ``env``) so that ``srun memdpc train …`` needs no wrapper script.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), int(env.get("LOCAL_RANK", "0"))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        env.setdefault("MASTER_ADDR", first_slurm_host(nodes) if nodes else "127.0.0.1")
        env.setdefault("MASTER_PORT", "29500")
        return (
            _int_env(env, "SLURM_PROCID"),
            _int_env(env, "SLURM_NTASKS"),
            int(env.get("SLURM_LOCALID", "0")),
        )
    return 0, 1, 0


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but no CUDA device is available")
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise UserError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}")
    return torch.device("cuda", local_rank)


def setup(device: str = "auto") -> DistEnv:
    """Read the environment, pick the device and, for a world larger than one, join the process group."""
    rank, world_size, local_rank = read_env()
    dev = pick_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    host_group = None
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=dev)
            host_group = dist.new_group(backend="gloo")
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return DistEnv(rank, world_size, local_rank, dev, host_group)


def cleanup(env: DistEnv, finished: bool = True) -> None:
    """Leave the process group. After a finished run every rank first waits for the others: a gloo rank
    that tears its connections down while a peer is still in its last collective aborts the peer
    (SIGABRT). After an error there is no waiting, since the other ranks may never arrive."""
    if env.distributed and dist.is_initialized():
        if finished:
            _meet(env, "leave")
        dist.destroy_process_group()


def _meet(env: DistEnv, name: str) -> None:
    """Wait until every rank has come here, through the rendezvous store rather than a collective: gloo frees
    a collective's work in its own thread after the collective returns, and when that happens while the
    interpreter shuts down (as after a last barrier it may) the process aborts ("terminate called without
    an active exception")."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"memdpc/{name}/{env.rank}", "1")
    store.wait([f"memdpc/{name}/{r}" for r in range(env.world_size)])


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def all_mean(env: DistEnv, values: dict[str, float]) -> dict[str, float]:
    """Mean of each value over ranks (identity for one process)."""
    if not env.distributed or not values:
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=env.device)
    dist.all_reduce(t)
    return dict(zip(values, (t / env.world_size).tolist(), strict=True))


def all_true(env: DistEnv, flag: bool) -> bool:
    """True when ``flag`` holds on every rank."""
    if not env.distributed:
        return flag
    t = torch.tensor([int(flag)], device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def agree_on_signal(env: DistEnv, signum: int | None) -> int | None:
    """The signal some rank has received (the highest number: SIGTERM over SIGINT), or None; the same answer on
    every rank, so that all of them stop at the same step. A host tensor over gloo: it never waits for the GPU."""
    if not env.distributed:
        return signum
    t = torch.tensor([signum or 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=env.host_group)
    return int(t.item()) or None


def from_main(env: DistEnv, value: T) -> T:
    """Rank 0's ``value`` on every rank (an error message, a monitor reading), so all ranks decide alike."""
    if not env.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
