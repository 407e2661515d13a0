"""Run by tests/test_lifecycle.py with -n 2: worlds in two xdist workers at once must not collide, and
each worker's forkserver is forked from the zygote the test process shares (``PYTEST_ZERO3_ZYGOTE``),
although pytest-xdist sets variables of its own in its workers."""

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
    with open(f"/proc/{os.getppid()}/stat") as fh:  # the rank's parent is its forkserver
        zygote = int(fh.read().rpartition(")")[2].split()[1])
    return t.tolist(), zygote


@pytest.mark.parametrize("i", range(4))
def test_world(zero3_world, i):
    shared = int(os.environ["PYTEST_ZERO3_ZYGOTE"].split("|")[1])
    assert zero3_world.run(shm_all_reduce) == [([3.0] * 4, shared)] * 2
