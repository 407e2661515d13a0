"""What a scenario function may use while it runs on a rank.

Scenario functions are plain module-level functions executed on every rank by
``zero3_world.run``.  They can use torch.distributed directly (the process group is
initialised before they start); this module adds the few things every scenario needs:

* :func:`rank` / :func:`world_size` / :func:`device`;
* :func:`agree`: an assertion that all ranks take together, so one rank's failed check is
  reported on every rank as that check instead of leaving the others waiting in a collective;
* :func:`require_ranks`: declares a contract that needs several ranks unsupported on a smaller world;
* :func:`unsupported`: declares that the implementation under test lacks a feature the contract
  needs (pytest shows a skip with the reason; the conformance report says ``unsupported``);
* ``pytest.skip(reason)`` works as usual and is reported as a skip when every rank skips.
"""

from __future__ import annotations

from typing import Any

from _pytest.outcomes import Skipped  # pytest.skip.Exception, named so type checkers see the class

from pytest_zero3 import accel


class Unsupported(Skipped):
    """The implementation under test does not offer what the contract needs.

    A kind of skip, so pytest reports it as one (SKIPPED with the reason, skipped in junitxml); the
    conformance report reads the type and shows ``unsupported``.  Only for a missing feature: a
    broken precondition is a failure that names the precondition and the contract that judges it.
    """

    def __init__(self, reason: str):
        super().__init__(msg=reason, pytrace=False, _use_item_location=True)  # the test, not the harness

    def __reduce__(self):  # pickles by its reason alone (Skipped's own state has keyword-only args)
        return (type(self), (self.msg,))


#: Set in a forked world's rank (:func:`pytest_zero3.rank.main`), which ends in ``os._exit`` once its
#: scenario returns; a launched (torchrun) rank runs the whole pytest session and leaves it unset.
_ends_with_scenario = False


def ends_with_scenario() -> bool:
    """Whether this process ends, with no interpreter teardown, once the running scenario returns: process-wide
    state that cannot be undone safely may then be left as it is (001-d's tracemalloc)."""
    return _ends_with_scenario


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


def device():
    """The torch device of this rank: its accelerator's device for its local rank, where DeepSpeed puts
    the model (``cpu`` on the CPU accelerator, and outside a world)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return torch.device("cpu")
    return accel.device()


def unsupported(reason: str) -> None:
    """Stop the scenario: the implementation lacks a feature (e.g. the config rejects its keys)."""
    raise Unsupported(reason)


def require_ranks(n: int, why: str) -> None:
    """Declare the contract unsupported on worlds of fewer than ``n`` ranks, saying ``why`` it needs them.

    For contracts whose rule only shows between ranks (a slower rank, all-gathers that a single rank
    never issues): at world size 1 they cannot be judged, which is not a failure of the implementation.
    """
    size = world_size()
    if size < n:
        raise Unsupported(
            f"needs a world of at least {n} ranks ({why}); this one has {size}: "
            f"run it with --zero3-world-size={n} or more"
        )


def gather(obj: Any) -> list:
    """Every rank's ``obj``, in rank order, on every rank."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(ok: bool, message: str = "") -> None:
    """Assert ``ok`` on every rank at once.

    All ranks must call it at the same point.  If any rank's check fails, every rank raises
    ``AssertionError`` naming the ranks that failed and their messages.
    """
    verdicts = gather((bool(ok), "" if ok else str(message)))
    bad = [(r, msg) for r, (good, msg) in enumerate(verdicts) if not good]
    if bad:
        raise AssertionError("\n".join(f"[rank {r}] {msg}" for r, msg in bad))
