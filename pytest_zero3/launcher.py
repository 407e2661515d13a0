"""Launcher mode: pytest itself runs on every rank of an existing world (torchrun, across nodes).

When ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` are set, ``zero3_world.run`` executes the scenario
in this process on the existing world, and gathers every rank's outcome so that each rank reports
the same verdict.  Hang protection here is the process group's own timeout (``--zero3-timeout``).
"""
from __future__ import annotations

import datetime
import os
import traceback
from typing import Callable, List

from pytest_zero3.outcome import PASSED, RAISED, SKIPPED, UNSUPPORTED, RankOutcome

ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def active() -> bool:
    return all(k in os.environ for k in ENV_KEYS)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class LauncherWorld:
    """Stands in for :class:`pytest_zero3.world.World` when pytest runs under torchrun."""

    _applied = False

    def __init__(self, spec, backend: str, timeout: float, on_outcomes=None):
        self.spec, self.backend, self.timeout = spec, backend, timeout
        self.size = int(os.environ["WORLD_SIZE"])
        self._on_outcomes = on_outcomes

    def run(self, fn: Callable, *args, **kwargs) -> list:
        from pytest_zero3.world import settle
        outcomes = self.outcomes(fn, *args, **kwargs)
        if self._on_outcomes is not None:
            self._on_outcomes(outcomes)
        return settle(outcomes, fn)

    def outcomes(self, fn: Callable, *args, **kwargs) -> List[RankOutcome]:
        import _pytest.outcomes as pytest_outcomes
        import torch
        import torch.distributed as dist
        from pytest_zero3 import impl
        from pytest_zero3.scenario import Unsupported

        if not LauncherWorld._applied:
            impl.apply(self.spec)
            LauncherWorld._applied = True
        if not dist.is_initialized():
            if self.backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=self.timeout))
        r = dist.get_rank()
        try:
            outcome = RankOutcome(r, PASSED, value=fn(*args, **kwargs))
        except pytest_outcomes.Skipped as exc:
            outcome = RankOutcome(r, SKIPPED, message=str(exc.msg))
        except Unsupported as exc:
            outcome = RankOutcome(r, UNSUPPORTED, message=str(exc))
        except Exception as exc:
            outcome = RankOutcome(r, RAISED, message=f"{type(exc).__name__}: {exc}",
                                  traceback=traceback.format_exc())
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, outcome)
        return gathered
