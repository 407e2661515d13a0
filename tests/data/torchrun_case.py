"""Run by tests/test_lifecycle.py under ``torchrun --nproc_per_node=2``: scenarios execute in-process on
the launcher's world, and however a scenario ends on rank 1, every rank reports the same outcome
within the timeout and the ranks stay in step for the tests after it.

Each test asserts, on every rank, the per-rank verdicts of the whole world, so "N passed" on both
ranks means both saw the same outcome.
"""

import os
import threading
import time

import pytest

from pytest_zero3 import scenario
from pytest_zero3.world import WorldFailure

ME = int(os.environ["RANK"])


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
    assert out[ME][1] == os.getpid()


class Custom(BaseException):
    pass


def _end(how):
    if how == "exception":
        raise ValueError("rank one broke")
    if how == "fail":
        pytest.fail("failed on purpose")
    if how == "skip":
        pytest.skip("skipped on one rank")
    if how == "xfail":
        pytest.xfail("xfailed on one rank")
    if how == "exit":
        raise SystemExit(3)
    if how == "interrupt":
        raise KeyboardInterrupt("interrupted on one rank")
    if how == "base":
        raise Custom("a bare BaseException")


def end_on_rank_one(how):
    if scenario.rank() == 1:
        _end(how)
    return "fine"


ENDINGS = {
    "exception": "raised: ValueError: rank one broke",
    "fail": "raised: Failed: failed on purpose",
    "skip": "skipped: skipped on one rank",
    "xfail": "xfailed: xfailed on one rank",
    "exit": "raised: SystemExit: 3",
    "interrupt": "raised: KeyboardInterrupt: interrupted on one rank",
    "base": "raised: Custom: a bare BaseException",
}


@pytest.mark.parametrize("how", list(ENDINGS))
def test_one_rank_ending_is_every_ranks_outcome(zero3_world, how):
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(end_on_rank_one, how)
    text = str(info.value)
    assert "rank 0: passed" in text and f"rank 1: {ENDINGS[how]}" in text, text


def end_everywhere(how):
    _end(how)


def test_skip_on_every_rank_is_a_skip(zero3_world):
    with pytest.raises(pytest.skip.Exception, match="skipped on one rank"):
        zero3_world.run(end_everywhere, "skip")


def test_xfail_on_every_rank_is_an_xfail(zero3_world):
    with pytest.raises(pytest.xfail.Exception, match="xfailed on one rank"):
        zero3_world.run(end_everywhere, "xfail")


def _failure_within(zero3_world, timeout, fn, *args) -> str:
    """The world's failure text, which must come within the timeout plus the outcome exchange's grace
    (and 10 s of slack for a loaded machine)."""
    from pytest_zero3.launcher import EXCHANGE_GRACE

    start = time.monotonic()
    with pytest.raises(WorldFailure) as info:
        zero3_world.run(fn, *args)
    assert time.monotonic() - start < timeout + EXCHANGE_GRACE + 10, str(info.value)
    return str(info.value)


def raise_while_rank_zero_waits():
    import torch.distributed as dist

    if scenario.rank() == 1:
        raise ValueError("rank one broke")
    dist.barrier()


@pytest.mark.zero3_timeout(5)
def test_rank_left_in_a_collective_is_freed_by_the_timeout(zero3_world):
    """The process group's timeout follows the marker (the run's --zero3-timeout is 120 s)."""
    text = _failure_within(zero3_world, 5, raise_while_rank_zero_waits)
    assert "rank 1: raised: ValueError: rank one broke" in text and "rank 0: raised" in text, text


def wait_forever_in_named_function():
    threading.Event().wait()


def block_on_rank_one():
    if scenario.rank() == 1:
        wait_forever_in_named_function()
    return "fine"


@pytest.mark.zero3_timeout(4)
def test_rank_that_never_returns_is_reported_hung_with_its_stack(zero3_world):
    text = _failure_within(zero3_world, 4, block_on_rank_one)
    assert "rank 0: passed" in text and "rank 1: hung: still running after the 4 s timeout" in text, text
    assert "in wait_forever_in_named_function" in text, text


@pytest.mark.zero3_timeout(3)
def test_rank_that_never_arrives_does_not_block_the_others(zero3_world):
    if ME == 1:
        return  # this rank never starts the scenario
    text = _failure_within(zero3_world, 3, end_on_rank_one, "none")
    assert "rank 0: raised: RuntimeError: rank 0 could not join this scenario's process group" in text, text
    assert "rank 1: hung: did not report an outcome within the 3 s" in text, text


def test_ranks_stay_in_step_after_all_of_the_above(zero3_world):
    out = zero3_world.run(where_am_i)
    assert [o[0] for o in out] == [0, 1] and all(o[2] == 2.0 for o in out)
