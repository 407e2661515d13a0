"""Run by tests/test_lifecycle.py under torchrun: scenarios execute in-process on the launcher's world."""
import os

import pytest

from pytest_zero3 import scenario


def where_am_i():
    import torch
    import torch.distributed as dist
    t = torch.ones(1)
    dist.all_reduce(t)
    return scenario.rank(), os.getpid(), t.item()


@pytest.mark.zero3_contract("990-a", "scenarios run in the launcher's own processes")
def test_in_process(zero3_world):
    out = zero3_world.run(where_am_i)
    assert [o[0] for o in out] == [0, 1] and all(o[2] == 2.0 for o in out)
    assert out[int(os.environ["RANK"])][1] == os.getpid()
