"""Run by tests/test_lifecycle.py with -n 2 and a ``--zero3-*`` option, where no zygote is shared from
outside: worlds in two xdist workers at once must not collide, and each worker's forkserver is forked
from the one zygote the xdist controller started and named (``PYTEST_ZERO3_ZYGOTE``), although
pytest-xdist sets variables of its own in its workers."""

import os

import pytest

from pytest_zero3 import scenario


def shm_all_reduce():
    """Goes through deepspeed.comm (its CPU shared-memory op is keyed by MASTER_ADDR/PORT)."""
    import deepspeed
    import deepspeed.comm as dist
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    t = torch.full((4,), float(scenario.rank() + 1))
    dist.all_reduce(t)
    return t.tolist(), _parent(os.getppid())  # the rank's parent is its forkserver


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[1])


@pytest.mark.parametrize("i", range(4))
def test_world(zero3_world, i):
    shared = int(os.environ["PYTEST_ZERO3_ZYGOTE"].split("|")[1])
    assert _parent(shared) == os.getppid()  # the controller's (this worker's parent's) zygote
    assert zero3_world.run(shm_all_reduce) == [([3.0] * 4, shared)] * 2
