"""Run by tests/test_lifecycle.py under ``torchrun --nproc_per_node=2``: rank 1's process ends inside a
scenario (``os._exit``) while rank 0 waits in a collective.  Rank 0 must not hang: the launcher stops
it, and it says why."""

import os

from pytest_zero3 import scenario


def exit_process_on_rank_one():
    import torch.distributed as dist

    if scenario.rank() == 1:
        os._exit(7)
    dist.barrier()


def test_process_exit(zero3_world):
    zero3_world.run(exit_process_on_rank_one)
