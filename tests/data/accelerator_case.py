"""Run by tests/test_accel.py: one contract whose ranks say which accelerator, backend and device they
ran on (printed by rank order, for the test to read with ``-s``)."""

import os

import pytest

from pytest_zero3 import scenario


def where_it_runs():
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name(), dist.get_backend(), str(scenario.device()), os.environ.get("DS_ACCELERATOR")


@pytest.mark.zero3_contract("995-a", "the ranks run on DeepSpeed's accelerator")
def test_ranks_run_on_the_accelerator(zero3_world):
    for seen in zero3_world.run(where_it_runs):
        print("SEEN", *seen)
