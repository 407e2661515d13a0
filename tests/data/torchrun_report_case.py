"""Run by tests/test_lifecycle.py under ``torchrun --nproc_per_node=2``: a test that fails on rank 1 only,
and a rank stuck where the watchdog's signal cannot reach it.  Rank 0 must still print the table and
write the report (rank 1 ends with a failure, which must not stop rank 0 while it reports), and the
stuck rank's stack must be in the failure."""

import os
import signal
import threading

import pytest

from pytest_zero3 import scenario

ME = int(os.environ["RANK"])


def shm_comm_op_is_off():
    """DeepSpeed's comm backend, as deepspeed.initialize builds it: its CPU shm op must be left out."""
    import deepspeed
    from deepspeed.comm import comm

    deepspeed.init_distributed(dist_backend="gloo")
    return comm.cdb.shm_comm_op is None


@pytest.mark.zero3_contract("990-a", "nothing is compiled inside a scenario")
def test_no_op_is_built_in_a_scenario(zero3_world):
    assert zero3_world.run(shm_comm_op_is_off) == [True, True]


@pytest.mark.zero3_contract("990-b", "a test that fails on rank 1 only")
def test_fails_on_rank_one_only():
    assert ME != 1, "fails on rank 1 only"


def stuck_where_no_signal_reaches(seconds):
    threading.Event().wait(seconds)


def stuck_on_rank_one(seconds):
    if scenario.rank() == 1:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as in C code: the watchdog cannot interrupt
        try:
            stuck_where_no_signal_reaches(seconds)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    return "fine"


@pytest.mark.zero3_contract("990-c", "a rank stuck past the timeout")
@pytest.mark.zero3_timeout(3)
def test_rank_stuck_past_the_timeout(zero3_world):
    zero3_world.run(stuck_on_rank_one, 7.0)  # past the stack watch (3 + 2 s), within rank 0's wait (3 + 5 s)


def _refuse_joins(monkeypatch, count):
    """The next ``count`` joins of a process group fail on this rank, as gloo's do when a peer's
    connection is refused on a loaded machine ("Gloo connectFullMesh failed")."""
    import torch.distributed as dist

    real, calls = dist.init_process_group, []

    def join(*args, **kwargs):
        calls.append(1)
        if len(calls) <= count:
            raise RuntimeError("Gloo connectFullMesh failed with [...] Connection refused (refused by the test)")
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", join)
    return calls


@pytest.mark.zero3_contract("990-d", "a world that forms at its second try")
def test_world_forms_at_its_second_try(zero3_world, monkeypatch):
    calls = _refuse_joins(monkeypatch, 1)
    assert zero3_world.run(scenario.rank) == [0, 1]
    assert len(calls) == 2


@pytest.mark.zero3_contract("990-e", "a world that never forms")
def test_world_never_forms(zero3_world, monkeypatch):
    _refuse_joins(monkeypatch, 99)
    zero3_world.run(scenario.rank)
