"""Run by tests/test_workers.py with -n 2 and a ``--zero3-*`` option, where no zygote is shared from
outside: the xdist controller starts one, and each worker's rank forkserver is forked from it."""

import os


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[1])


def forkserver_parent():
    """The parent of this rank's forkserver (the rank's parent)."""
    return _parent(os.getppid())


def test_forkserver_forks_from_the_controllers_zygote(zero3_world):
    zygotes = set(zero3_world.run(forkserver_parent))
    assert len(zygotes) == 1, zygotes
    (zygote,) = zygotes
    assert zygote != os.getpid() and _parent(zygote) == os.getppid(), (zygote, os.getpid(), os.getppid())
