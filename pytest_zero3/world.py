"""``zero3_world``: run one scenario function on every rank of a fresh torch.distributed world.

The parent (the pytest process) forks ``world_size`` rank processes, then waits on their exit with
a deadline.  It never blocks on a rank: outcomes come back through files (see
:mod:`pytest_zero3.rank`).  When a rank raises or dies, the others get a short grace period to
finish (they usually fail fast in their next collective) and are then stopped.  When the deadline
passes, every live rank is asked for its Python stack (faulthandler on SIGUSR1), and killed.

A world that does not form (a rank cannot join the process group: gloo cannot connect its ranks, the
store times out, a rank dies while joining) is no verdict on the implementation: no scenario ran.
It is tried again with fresh ranks (:data:`FORM_ATTEMPTS` in all), and if it never forms, the test
fails with :class:`WorldNotFormed`.  A scenario that started is never run again.
"""

from __future__ import annotations

import copy
import itertools
import os
import pickle
import sys
import time
import zlib
from typing import Any, Callable

import pytest
from _pytest.outcomes import Failed  # pytest.fail.Exception, named so type checkers see the class

from pytest_zero3 import accel, impl, spawner
from pytest_zero3 import rank as rank_mod
from pytest_zero3.job import Attempt, Job
from pytest_zero3.outcome import (
    DIED,
    HUNG,
    PASSED,
    SKIPPED,
    STOPPED,
    UNFORMED,
    UNSUPPORTED,
    XFAILED,
    RankOutcome,
    death_message,
    explain,
    failure_text,
    followers_note,
)
from pytest_zero3.scenario import Unsupported

#: Seconds the other ranks may still run after one rank failed.
GRACE_SECONDS = 5.0
#: Seconds to wait for the stacks of ranks being stopped (all of them together), and the poll step.
STACK_SECONDS, STACK_POLL = 3.0, 0.05
#: Tries at forming a world for one scenario call (fresh ranks each time) before it is reported.
FORM_ATTEMPTS = 3
_run_ids = itertools.count()


class WorldFailure(Failed):
    """A scenario did not pass on every rank; ``outcomes`` holds what each rank did.

    A pytest failure (``pytrace=False``): pytest shows the per-rank text itself, not this harness's
    traceback.
    """

    def __init__(self, text: str, outcomes: list[RankOutcome]):
        super().__init__(text, pytrace=False)
        self.outcomes = outcomes


class WorldNotFormed(WorldFailure):
    """No world formed in :data:`FORM_ATTEMPTS` tries (or the forkserver never became ready): the
    scenario never ran, so this says nothing about the implementation.  ``attempts`` holds the
    outcomes of each try; ``outcomes`` those of the last."""

    def __init__(self, text: str, attempts: list[list[RankOutcome]]):
        super().__init__(text, attempts[-1] if attempts else [])
        self.attempts = attempts


class BaseWorld:
    """What forked and launcher worlds share: run a scenario call, record its outcomes, judge them."""

    size: int
    _on_outcomes: Callable[[list[RankOutcome]], None] | None = None

    def run(self, fn: Callable, *args, **kwargs) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank return values in rank order.

        ``fn`` must be a module-level function (it is pickled by reference).  Fails the test with
        every rank's outcome when any rank raises, hangs past the timeout, or dies; skips when every
        rank skipped; reports ``unsupported`` when a rank declared the feature unsupported.
        """
        outcomes = self.outcomes(fn, *args, **kwargs)
        if self._on_outcomes is not None:
            self._on_outcomes(outcomes)
        return settle(outcomes, fn)

    def outcomes(self, fn: Callable, *args, **kwargs) -> list[RankOutcome]:
        """Like :meth:`run` but returns the raw per-rank outcomes instead of judging them."""
        raise NotImplementedError


class World(BaseWorld):
    """A world of ``size`` ranks under one implementation; each :meth:`run` forks fresh ranks."""

    def __init__(
        self,
        size: int,
        backend: str,
        timeout: float,
        spec: impl.Spec | str,
        base_dir: str,
        preload=(),
        on_outcomes: Callable[[list[RankOutcome]], None] | None = None,
        startup_timeout: float = spawner.DEFAULT_STARTUP_TIMEOUT,
    ):
        self.size, self.backend, self.timeout = size, backend, timeout
        self.startup_timeout = startup_timeout
        # Scripts outside pytest may give the spec's text; it is parsed here, once, never in a rank.
        self.spec = impl.parse(spec) if isinstance(spec, str) else spec
        self.base_dir, self.preload = base_dir, tuple(preload)
        self._on_outcomes = on_outcomes

    def resized(self, size: int) -> World | None:
        """This world with ``size`` ranks (ranks are forked per run, so any size costs the same), or
        None where ``size`` ranks cannot run here: more ranks than devices (accel.fits)."""
        if not accel.fits(self.backend, size):
            return None
        other = copy.copy(self)
        other.size = size
        return other

    def outcomes(self, fn: Callable, *args, **kwargs) -> list[RankOutcome]:
        job = Job(spec=self.spec, sys_path=tuple(sys.path), parent_pid=os.getpid(), preload=self.preload)
        call = pickle.dumps((fn, args, kwargs))
        tries = []
        for _ in range(FORM_ATTEMPTS):
            outcomes, joined, started = self._attempt(job, call)
            if started or not not_formed(outcomes, joined):
                return outcomes
            tries.append(outcomes)
        name = getattr(fn, "__qualname__", repr(fn))
        raise WorldNotFormed(not_formed_text(tries, name, self.size), tries)

    def _attempt(self, job: Job, call: bytes):
        """Fork fresh ranks for one try; return their outcomes, the ranks that began joining the world,
        and whether any rank started the scenario."""
        run_dir = self._new_run_dir()
        attempt = Attempt(
            job=job,
            run_dir=run_dir,
            world_size=self.size,
            backend=self.backend,
            # the parent's deadline is the authority: a rank's collectives give up only after
            # the parent has stopped it and read its stack (no race between "hung" and "raised")
            timeout=self.timeout + GRACE_SECONDS + STACK_SECONDS,
            port=20000 + zlib.crc32(run_dir.encode()) % 40000,
            call=call,
        )
        ctx = spawner.context(job)
        try:
            procs = spawner.start_all(
                ctx, rank_mod.main, [(attempt, r) for r in range(self.size)], self.startup_timeout
            )
        except spawner.ForkserverStuck as exc:
            raise WorldNotFormed(f"the world did not form: {exc}", []) from None
        try:
            outcomes = _collect(procs, run_dir, self.timeout)
        finally:
            for proc in procs:
                spawner.kill(proc)
        files = [rank_mod.paths(run_dir, r) for r in range(self.size)]
        joined = {r for r in range(self.size) if os.path.exists(files[r]["joining"])}
        return outcomes, joined, any(os.path.exists(f["started"]) for f in files)

    def _new_run_dir(self) -> str:
        run_dir = os.path.join(self.base_dir, f"run{next(_run_ids)}")
        os.makedirs(run_dir)
        return run_dir


def not_formed(outcomes: list[RankOutcome], joined: set[int]) -> bool:
    """Whether a try in which no rank started its scenario failed because the world did not form:
    some rank could not join, or died or hung while joining (it is in ``joined``), and no rank failed
    for another reason (an error in its set-up, which a new try would only repeat)."""
    forming = {o.rank for o in outcomes if o.status == UNFORMED or (o.status in (DIED, HUNG) and o.rank in joined)}
    return bool(forming) and all(o.rank in forming or o.status == STOPPED for o in outcomes)


def not_formed_text(tries: list[list[RankOutcome]], name: str, size: int) -> str:
    lines = [
        f"the world did not form: {size} ranks could not form a process group in {len(tries)} tries "
        f"(fresh ranks each time), so scenario {name} never ran. This is the machine, its load or its "
        "network, not the implementation under test: rerun, or give the machine fewer jobs at once.",
        "",
    ]
    for i, outcomes in enumerate(tries[:-1], 1):
        lines += [f"try {i}:", ""] + [
            f"  rank {o.rank}: {o.status}: {o.message.splitlines()[0] if o.message else ''}" for o in outcomes
        ]
        lines.append("")
    return "\n".join(lines) + "\n" + failure_text(tries[-1], f"try {len(tries)}:")


def settle(outcomes: list[RankOutcome], fn: Callable) -> list[Any]:
    """Turn outcomes into return values, a skip, an unsupported declaration, or a failure.

    A rank that failed only on a communication error after a peer left unsupported, skipped or as an
    expected failure takes that peer's outcome first (:func:`pytest_zero3.outcome.explain`), and the
    reason says so: the peer's exit is not a failure of the world."""
    outcomes = explain(outcomes)
    note = followers_note(outcomes)
    statuses = {o.status for o in outcomes}
    if statuses == {PASSED}:
        return [o.value for o in outcomes]
    if statuses == {SKIPPED}:
        pytest.skip(_leader(outcomes).message + note)
    if statuses == {XFAILED}:
        pytest.xfail(_leader(outcomes).message + note)
    unsupported = [o for o in outcomes if o.status == UNSUPPORTED]
    if unsupported and statuses <= {UNSUPPORTED, PASSED, SKIPPED, STOPPED}:
        raise Unsupported(_leader(unsupported).message + note)
    name = getattr(fn, "__qualname__", repr(fn))
    raise WorldFailure(failure_text(outcomes, f"scenario {name} failed on {len(outcomes)}-rank world:"), outcomes)


def _leader(outcomes: list[RankOutcome]) -> RankOutcome:
    """The first outcome that is a rank's own (not taken from a peer): whose words the verdict gives."""
    return next((o for o in outcomes if o.follows is None), outcomes[0])


def _collect(procs, run_dir: str, timeout: float) -> list[RankOutcome]:
    from multiprocessing.connection import wait  # not at import: it registers an atexit hook (a guest adds none)

    files = [rank_mod.paths(run_dir, r) for r in range(len(procs))]
    outcomes: list[RankOutcome] = [None] * len(procs)  # type: ignore[list-item]  # each rank's, by the end
    deadline = time.monotonic() + timeout
    first_failure_at = None
    while True:
        live = [p for r, p in enumerate(procs) if outcomes[r] is None]
        if not live:
            break
        now = time.monotonic()
        stop_at = deadline if first_failure_at is None else min(deadline, first_failure_at + GRACE_SECONDS)
        if now >= stop_at:
            reason = HUNG if first_failure_at is None else STOPPED
            _stop_live(procs, files, outcomes, reason, timeout, now - (first_failure_at or now))
            break
        wait([p.sentinel for p in live], timeout=stop_at - now)
        for r, proc in enumerate(procs):
            if outcomes[r] is None and proc.exitcode is not None:
                outcomes[r] = _read_outcome(r, proc, files[r])
                if not outcomes[r].ok and first_failure_at is None:
                    first_failure_at = time.monotonic()
    return outcomes


def _read_outcome(r: int, proc, f: dict) -> RankOutcome:
    if os.path.exists(f["result"]):
        with open(f["result"], "rb") as fh:
            outcome = pickle.load(fh)
    else:
        outcome = RankOutcome(r, DIED, message=death_message(proc.exitcode), traceback=_read(f["stack"]))
    if not outcome.ok:
        outcome.log_tail = _tail(f["log"])
    return outcome


def _stop_live(procs, files, outcomes, reason, timeout, waited) -> None:
    """Ask every live rank for its stack at once, wait for all stacks together, then kill.

    A rank that finishes meanwhile (it was about to exit when the deadline came) keeps its own
    outcome: it is re-checked on every poll, and once more after the kill.
    """
    from multiprocessing.connection import wait

    live = [r for r in range(len(procs)) if outcomes[r] is None]
    for r in live:
        try:
            os.kill(procs[r].pid, rank_mod.STACK_SIGNAL)
        except ProcessLookupError:
            pass
    pending = set(live)
    sizes: dict = {}
    end = time.monotonic() + STACK_SECONDS
    while pending and time.monotonic() < end:
        for r in list(pending):
            if procs[r].exitcode is not None:
                outcomes[r] = _read_outcome(r, procs[r], files[r])
                pending.discard(r)
                continue
            path = files[r]["stack"]
            size = os.path.getsize(path) if os.path.exists(path) else 0
            if size and size == sizes.get(r):  # faulthandler writes synchronously: stable means done
                pending.discard(r)
            sizes[r] = size
        if pending:
            wait([procs[r].sentinel for r in pending], timeout=STACK_POLL)  # wakes early on an exit
    remaining = [r for r in live if outcomes[r] is None]
    for r in remaining:  # all at once: a rank must not see a peer die and report that as its own failure
        spawner.send_kill(procs[r])
    for r in remaining:
        spawner.kill(procs[r])
        if os.path.exists(files[r]["result"]):  # wrote its result between the last poll and the kill
            outcomes[r] = _read_outcome(r, procs[r], files[r])
            continue
        if reason == HUNG:
            message = f"still running after the {timeout:g} s timeout (raise it with --zero3-timeout)"
        else:
            message = f"stopped {waited:.1f} s after another rank failed"
        outcomes[r] = RankOutcome(
            r, reason, message=message, traceback=_read(files[r]["stack"]), log_tail=_tail(files[r]["log"])
        )


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _tail(path: str, lines: int = 30) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])
