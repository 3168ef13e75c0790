from __future__ import annotations

import pytest
import torch

from memdpc.common.distenv import first_slurm_host, pick_device, read_env
from memdpc.common.errors import UserError


def test_torchrun_variables_win():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert read_env(env) == (3, 8, 1)


def test_slurm_fallback_sets_the_rendezvous():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
    }
    assert read_env(env) == (5, 8, 1)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu07", "29500")


def test_alone_is_a_world_of_one():
    assert read_env({}) == (0, 1, 0)
    assert read_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) == (0, 1, 0)


@pytest.mark.parametrize(
    "nodes, host", [("node[03-05,09],gpu1", "node03"), ("a1,b2", "a1"), ("solo", "solo"), ("n[1,4]", "n1")]
)
def test_first_slurm_host(nodes, host):
    assert first_slurm_host(nodes) == host


def test_bad_rank_variable():
    with pytest.raises(UserError, match="RANK='x'"):
        read_env({"RANK": "x", "WORLD_SIZE": "2"})


def test_cpu_device_and_refused_cuda():
    assert pick_device("cpu", 0) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert pick_device("auto", 0) == torch.device("cpu")
        with pytest.raises(UserError, match="no CUDA device"):
            pick_device("cuda", 0)
