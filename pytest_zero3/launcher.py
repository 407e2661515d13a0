"""Launcher mode: pytest itself runs on every rank of an existing world (torchrun, across nodes).

When ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` are set, ``zero3_world.run`` executes the scenario
in this process on the existing world.  Every rank must then report the same verdict, and no rank may
wait forever, whatever the scenario did on one of them:

* however the scenario ends here (a return, any exception, ``pytest.fail``/``skip``/``xfail``,
  ``SystemExit``, ``KeyboardInterrupt``), it becomes this rank's outcome (:func:`rank.call`);
* a scenario still running at ``--zero3-timeout`` is interrupted by a watchdog (SIGALRM) and reported
  hung with its stack; a rank blocked in a collective is freed by the process group's own timeout,
  which is set to ``--zero3-timeout`` for every scenario;
* outcomes are exchanged through the launcher's key-value store, not through a collective, under a
  key made of the test's node ID and the call's index in the test, so a rank that never arrives (or
  whose process group is broken) cannot block the others or put later tests out of step: after the
  deadline it is reported as not having reported;
* when the launcher stops this process (SIGTERM, sent when another rank's process ended), pytest
  ends as on Ctrl-C, with the reason, instead of dying silently.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import signal
import sys
import threading
import time
from typing import Callable, List, Optional

from pytest_zero3 import rank as rank_mod
from pytest_zero3.outcome import HUNG, RankOutcome

ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
#: Seconds a rank waits for the others' outcomes after the scenario deadline (their exchange itself).
EXCHANGE_GRACE = 5.0
#: Store key prefix of the outcome exchange.
KEY_PREFIX = "pytest-zero3/outcome"
#: Store key prefix of each scenario's own process group.
GROUP_PREFIX = "pytest-zero3/group"
#: Seconds past the timeout before the watchdog interrupts a scenario, so that a collective's own
#: timeout error (which names the collective) wins over the watchdog's report.
WATCHDOG_SLACK = 1.0


def active() -> bool:
    return all(k in os.environ for k in ENV_KEYS)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class LauncherStopped(KeyboardInterrupt):
    """The launcher terminated this pytest process (typically because another rank's process ended)."""


class LauncherWorld:
    """Stands in for :class:`pytest_zero3.world.World` when pytest runs under torchrun."""

    _applied = False

    def __init__(self, spec, backend: str, timeout: float, on_outcomes=None):
        self.spec, self.backend, self.timeout = spec, backend, timeout
        self.size = int(os.environ["WORLD_SIZE"])
        self._on_outcomes = on_outcomes
        self._test = _current_test()
        self._calls = 0

    def run(self, fn: Callable, *args, **kwargs) -> list:
        from pytest_zero3.world import settle

        outcomes = self.outcomes(fn, *args, **kwargs)
        if self._on_outcomes is not None:
            self._on_outcomes(outcomes)
        return settle(outcomes, fn)

    def resized(self, size: int) -> Optional["LauncherWorld"]:
        """The launcher fixed the world size: only that size runs (None for any other)."""
        return self if size == self.size else None

    def outcomes(self, fn: Callable, *args, **kwargs) -> List[RankOutcome]:
        _install_stop_handler()
        store = self._base_store()
        key = f"{self._test}/{self._calls}"
        self._calls += 1
        r = rank()
        start = time.monotonic()
        mine = _call_with_watchdog(
            r, _in_fresh_group, (key, self.backend, self.timeout, store, fn, args, kwargs), {}, self.timeout
        )
        if r == 0:
            mine.identity = _identity()
        deadline = max(start + self.timeout, time.monotonic()) + EXCHANGE_GRACE
        return exchange(store, f"{KEY_PREFIX}/{key}", mine, self.size, deadline, self.timeout)

    def _base_store(self):
        """The launcher's key-value store, reached once through an ``env://`` rendezvous (and kept)."""
        global _store
        import torch
        import torch.distributed as dist
        from pytest_zero3 import impl

        if not LauncherWorld._applied:
            impl.apply(self.spec)
            LauncherWorld._applied = True
        if _store is None:
            if self.backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            if dist.is_initialized():  # the user's code joined the world already: use its store
                _store = dist.distributed_c10d._get_default_store()
            else:  # only the store: every scenario builds its own process group on it
                _store, _, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=self.timeout)))
        return _store


_store: Optional[object] = None


def _in_fresh_group(key: str, backend: str, timeout: float, store, fn, args, kwargs):
    """Run ``fn`` on a default process group of its own, like a forked world's fresh processes.

    A scenario can leave the process group broken (gloo closes every pair after a collective times
    out) or mid-collective; a new group per scenario, rendezvoused under the scenario's key, keeps
    that from failing the tests after it, and a rank that never arrives fails this scenario's join
    (after ``timeout``, the process group's timeout too) instead of pairing with a later one.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    # Group names come from a counter that must agree across ranks; a failed join counted a group
    # that does not exist (destroy_process_group resets the counter only when there was a group).
    dist.distributed_c10d._world.group_count = 0
    _forget_deepspeed_groups()
    try:
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"{GROUP_PREFIX}/{key}", store),
            rank=rank(),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=timeout),
        )
    except Exception as exc:
        raise RuntimeError(
            f"rank {rank()} could not join this scenario's process group within {timeout:g} s: "
            f"another rank did not arrive ({type(exc).__name__}: {exc})"
        ) from None
    return fn(*args, **kwargs)


def _forget_deepspeed_groups() -> None:
    """DeepSpeed caches groups it created on the old default group (its clone of the world): drop them."""
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None:
        return
    for name, value in list(vars(groups).items()):
        if name.startswith("_") and name.endswith(("_GROUP", "_GROUP_RANKS")):
            if isinstance(value, dict):
                value.clear()
            elif value is not None and not callable(value):
                setattr(groups, name, None)


def exchange(store, key: str, mine: RankOutcome, size: int, deadline: float, timeout: float) -> List[RankOutcome]:
    """Post this rank's outcome under ``key``; return every rank's, waiting for them until ``deadline``.

    Waits in slices of at most a second, so a SIGTERM from the launcher is acted on promptly (a
    signal handler runs only between Python bytecodes, never inside the store's C++ wait).
    """
    store.set(f"{key}/{mine.rank}", pickle.dumps(mine))
    got = {mine.rank: mine}
    while True:
        for r in range(size):
            if r not in got and store.check([f"{key}/{r}"]):
                got[r] = pickle.loads(store.get(f"{key}/{r}"))
        left = deadline - time.monotonic()
        if len(got) == size or left <= 0:
            break
        missing = [f"{key}/{r}" for r in range(size) if r not in got]
        with contextlib.suppress(RuntimeError):  # DistStoreError: this slice ended without them
            store.wait(missing, datetime.timedelta(seconds=min(1.0, left)))
    return [
        got.get(r)
        or RankOutcome(
            r,
            HUNG,
            message=f"did not report an outcome within the {timeout:g} s timeout (its scenario never ended "
            "or never started there; raise the timeout with --zero3-timeout if it is only slow)",
        )
        for r in range(size)
    ]


def _call_with_watchdog(r: int, fn, args, kwargs, timeout: float) -> RankOutcome:
    """:func:`rank.call` with a SIGALRM watchdog that interrupts a scenario running past ``timeout``.

    A blocking C call (a collective) is not interrupted by the signal; the process group's timeout,
    equal to ``timeout``, ends it.  Without the main thread (pytest embedded) there is no watchdog.
    """
    if threading.current_thread() is not threading.main_thread():
        return rank_mod.call(r, fn, args, kwargs, passthrough=(LauncherStopped,))
    armed = [True]

    def fire(signum, frame):
        if armed[0]:
            armed[0] = False
            raise rank_mod.Timeout(f"still running after the {timeout:g} s timeout (raise it with --zero3-timeout)")

    previous = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    their_delay, their_interval = signal.setitimer(signal.ITIMER_REAL, timeout + WATCHDOG_SLACK)
    try:
        try:
            return rank_mod.call(r, fn, args, kwargs, passthrough=(LauncherStopped,))
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if their_delay:  # a timer someone else set (pytest-timeout): give back what is left of it
                left = their_delay - (time.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), their_interval)
    except rank_mod.Timeout as exc:  # fired between the scenario's end and disarming
        return rank_mod.ending(r, exc)


def _current_test() -> str:
    """The running test's node ID (the same on every rank), from pytest's ``PYTEST_CURRENT_TEST``."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" (", 1)[0] or "outside-a-test"


def _identity() -> dict:
    try:
        from pytest_zero3 import impl

        return impl.identity()
    except Exception:
        return {}


_stop_handler_installed = False


def _install_stop_handler() -> None:
    """On SIGTERM (the launcher stopping this rank), end pytest as on Ctrl-C, saying why."""
    global _stop_handler_installed
    if _stop_handler_installed or threading.current_thread() is not threading.main_thread():
        return
    _stop_handler_installed = True

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise LauncherStopped(
            f"pytest on rank {rank()} received {signal.Signals(signum).name} from the launcher, "
            "usually because another rank's process ended: see the launcher's report of the "
            "failed rank"
        )

    signal.signal(signal.SIGTERM, on_term)
