"""Run by tests/test_lifecycle.py with -n 2: worlds in two xdist workers at once must not collide."""

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
    return t.tolist()


@pytest.mark.parametrize("i", range(4))
def test_world(zero3_world, i):
    assert zero3_world.run(shm_all_reduce) == [[3.0] * 4] * 2
