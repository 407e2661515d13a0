"""Run by tests/test_lifecycle.py with -n 2 and a ``--zero3-*`` option, where no zygote is shared from
outside: worlds in two xdist workers at once must not collide, and each worker's forkserver descends
from the one zygote the xdist controller started and named (``PYTEST_ZERO3_ZYGOTE``), although
pytest-xdist sets variables of its own in its workers: the first worker's is the zygote's child, the
other's is forked from that one, loaded already."""

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
    forkserver = os.getppid()  # the rank's parent
    # the process it was forked from (a loaded forkserver forked from may have exited since, its child
    # then reparented): as the forkserver recorded it at its birth
    parent = int(os.environ["PYTEST_ZERO3_FORKED_FROM"])
    return t.tolist(), [forkserver, parent, _parent(parent)]


def _parent(pid: int) -> int:
    """``pid``'s parent, 0 where ``pid`` has exited."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[1])
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("i", range(4))
def test_world(zero3_world, i):
    shared = int(os.environ["PYTEST_ZERO3_ZYGOTE"].split("|")[1])
    assert _parent(shared) == os.getppid()  # the controller's (this worker's parent's) zygote
    (values, ancestors), other = zero3_world.run(shm_all_reduce)
    assert values == [3.0] * 4 and other == (values, ancestors)
    # the zygote's child, or the child of a forkserver that is (or was: it may have exited, its worker done;
    # tests/test_lifecycle.py checks, from every world's line, that its parent was the zygote's child)
    assert ancestors[1] == shared or ancestors[2] in (shared, 0), ancestors
    if os.environ.get("ZERO3_CASE_LOG"):  # what tests/test_lifecycle.py reads: each world's forkserver line
        with open(os.environ["ZERO3_CASE_LOG"], "a") as fh:
            fh.write(" ".join(map(str, [shared, *ancestors])) + "\n")
