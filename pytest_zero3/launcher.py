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
import traceback
from typing import Any, Callable

import pytest

from pytest_zero3 import accel, dsops, impl
from pytest_zero3 import rank as rank_mod
from pytest_zero3.outcome import HUNG, UNFORMED, GroupNotFormed, RankOutcome
from pytest_zero3.world import FORM_ATTEMPTS, BaseWorld, WorldNotFormed, not_formed_text

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
#: Seconds a rank whose join used up the timeout still waits for its peers' word on the try.
AGREE_SECONDS = 0.5
#: Seconds past the watchdog before a scenario it could not interrupt is reported hung with its stack
#: from a thread (well within the others' :data:`EXCHANGE_GRACE`).
STACK_WATCH_AFTER = 1.0


def active() -> bool:
    return all(k in os.environ for k in ENV_KEYS)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class LauncherStopped(KeyboardInterrupt):
    """The launcher terminated this pytest process (typically because another rank's process ended)."""


class LauncherWorld(BaseWorld):
    """Stands in for :class:`pytest_zero3.world.World` when pytest runs under torchrun."""

    _applied = False

    def __init__(self, spec, backend: str, timeout: float, on_outcomes=None):
        self.spec, self.backend, self.timeout = spec, backend, timeout
        self.size = int(os.environ["WORLD_SIZE"])
        self._on_outcomes = on_outcomes
        self._test = _current_test()
        self._calls = 0

    def resized(self, size: int) -> LauncherWorld | None:
        """The launcher fixed the world size: only that size runs (None for any other)."""
        return self if size == self.size else None

    def outcomes(self, fn: Callable, *args, **kwargs) -> list[RankOutcome]:
        _install_stop_handler()
        store = self._base_store()
        key = f"{self._test}/{self._calls}"
        self._calls += 1
        r = rank()
        start = time.monotonic()
        post = _Post(store, f"{KEY_PREFIX}/{key}")
        # A scenario stuck where the SIGALRM watchdog cannot reach it (C code, the signal blocked) is
        # reported from a thread, with its stack, while the other ranks still wait for its outcome.
        stack_watch = threading.Timer(
            self.timeout + WATCHDOG_SLACK + STACK_WATCH_AFTER, _post_stack, (post, r, self.timeout)
        )
        stack_watch.daemon = True
        stack_watch.start()
        try:
            mine = _call_with_watchdog(
                r, _in_fresh_group, (key, self.backend, self.timeout, store, fn, args, kwargs), {}, self.timeout
            )
        finally:
            stack_watch.cancel()
        if r == 0:
            mine.identity = {"backend": self.backend, **_identity()}  # the group's, where one formed
        mine = post(mine)  # or what the stack watch posted already: every rank sees the same verdict
        deadline = max(start + self.timeout, time.monotonic()) + EXCHANGE_GRACE
        outcomes = gather(store, f"{KEY_PREFIX}/{key}", mine, self.size, deadline, self.timeout)
        if any(o.status == UNFORMED for o in outcomes):  # every rank agreed on it (see _form_group)
            name = getattr(fn, "__qualname__", repr(fn))
            raise WorldNotFormed(not_formed_text([outcomes], name, self.size), [outcomes])
        return outcomes

    def _base_store(self):
        """The launcher's key-value store, reached once through an ``env://`` rendezvous (and kept)."""
        global _store
        import torch.distributed as dist

        if not LauncherWorld._applied:
            dsops.probe()  # as the forkserver does: nothing is compiled inside a scenario's timeout
            dsops.skip_cpu_shm_comm_op()
            impl.apply(self.spec)
            LauncherWorld._applied = True
        self.backend = accel.backend(self.backend)
        if _store is None:
            accel.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            if dist.is_initialized():  # the user's code joined the world already: use its store
                _store = dist.distributed_c10d._get_default_store()
            else:  # only the store: every scenario builds its own process group on it
                _store, _, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=self.timeout)))
            _store.set(f"{PRESENT_PREFIX}/{rank()}", "1")
        return _store


_store: Any = None  # torch.distributed.Store, imported lazily


def _in_fresh_group(key: str, backend: str, timeout: float, store, fn, args, kwargs):
    """Run ``fn`` on a default process group of its own, like a forked world's fresh processes.

    A scenario can leave the process group broken (gloo closes every pair after a collective times
    out) or mid-collective; a new group per scenario, rendezvoused under the scenario's key, keeps
    that from failing the tests after it, and a rank that never arrives fails this scenario's join
    (after ``timeout``, the process group's timeout too) instead of pairing with a later one.
    """
    _form_group(key, backend, timeout, store)
    return fn(*args, **kwargs)


def _form_group(key: str, backend: str, timeout: float, store) -> None:
    """Form a fresh default group, as a forked world forms with fresh ranks: a try that fails on any
    rank (a gloo connect error under load) is dropped by every rank and tried again under a new key,
    and the ranks agree on each try's result through the launcher's store before anyone goes on."""
    import torch.distributed as dist

    size, me = int(os.environ["WORLD_SIZE"]), rank()
    wait = datetime.timedelta(seconds=timeout)
    why = ""
    for attempt in range(FORM_ATTEMPTS):
        if dist.is_initialized():
            dist.destroy_process_group()
        # Group names come from a counter that must agree across ranks; a failed join counted a group
        # that does not exist (destroy_process_group resets the counter only when there was a group).
        dist.distributed_c10d._world.group_count = 0
        _forget_deepspeed_groups()
        prefix = f"{GROUP_PREFIX}/{key}/try{attempt}"
        deadline = time.monotonic() + timeout
        _await_arrivals(store, prefix, me, size, deadline, timeout)
        try:
            dist.init_process_group(
                backend, store=dist.PrefixStore(prefix, store), rank=me, world_size=size, timeout=wait
            )
            mine = ""
        except Exception as exc:
            mine = f"rank {me} could not join within {timeout:g} s: {type(exc).__name__}: {exc}".replace("\n", " ")
        store.set(f"{prefix}/formed/{me}", mine or "ok")
        # A rank that never came to this scenario (it skipped it) never posts either: that is the
        # scenario's failure, not the machine's, so it is not tried again.  Its peers have waited for it
        # in the join already, so they only wait out what is left of this try's timeout here.
        try:
            left = max(deadline - time.monotonic(), AGREE_SECONDS)
            store.wait([f"{prefix}/formed/{r}" for r in range(size)], datetime.timedelta(seconds=left))
        except Exception:
            if dist.is_initialized():
                dist.destroy_process_group()
            raise RuntimeError(
                f"rank {me} could not join this scenario's process group within {timeout:g} s: another rank "
                f"did not arrive ({mine or 'it never reported its join'})"
            ) from None
        failed = [text for r in range(size) if (text := store.get(f"{prefix}/formed/{r}").decode()) != "ok"]
        if not failed:
            return
        why = "; ".join(failed)
    if dist.is_initialized():
        dist.destroy_process_group()
    raise GroupNotFormed(f"this scenario's process group did not form in {FORM_ATTEMPTS} tries: {why}")


def _await_arrivals(store, prefix: str, me: int, size: int, deadline: float, timeout: float) -> None:
    """Say this rank arrived at the try ``prefix`` and wait, until ``deadline``, for every rank to arrive,
    in slices of a second (the watchdog's and the launcher's signals act between them), before the join.

    A rank that never arrives fails the scenario's join within its timeout: a world error when it never
    joined any world in this session (its node never came, or its pytest never reached a world: no
    verdict), else this scenario's failure (it skipped the scenario)."""
    store.set(f"{prefix}/arrived/{me}", "1")
    keys = [f"{prefix}/arrived/{r}" for r in range(size)]
    while not store.check(keys):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = [r for r in range(size) if not store.check([keys[r]])]
            absent = [r for r in missing if r in never_joined(store, size)]
            if absent and absent == missing:
                raise GroupNotFormed(
                    f"{_ranks_text(absent)} never joined a world in this session (their pytest did not reach "
                    f"one within {timeout:g} s: see their node's output), so this scenario could not run"
                )
            raise RuntimeError(
                f"rank {me} could not join this scenario's process group within {timeout:g} s: another rank "
                f"did not arrive ({_ranks_text(missing)} did not)"
            )
        with contextlib.suppress(RuntimeError):  # DistStoreError: this slice ended without them
            store.wait(keys, datetime.timedelta(seconds=min(1.0, left)))


#: Store key prefix under which each rank says it reached the launcher's store (its first world).
PRESENT_PREFIX = "pytest-zero3/present"


def never_joined(store, size: int) -> list[int]:
    """The ranks that never reached a world in this session (they never posted their presence)."""
    return [r for r in range(size) if not store.check([f"{PRESENT_PREFIX}/{r}"])]


def _ranks_text(ranks: list[int]) -> str:
    """``ranks 2, 3 (node 1)``: the ranks, and their nodes where torchrun's nodes are of equal size."""
    text = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
    if 0 < local < int(os.environ.get("WORLD_SIZE", "0")):
        nodes = sorted({r // local for r in ranks})
        text += f" (node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))})"
    return text


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


class _Post:
    """Posts this rank's outcome under a key once: from the scenario's end or from the stack watch,
    whichever comes first.  Returns the outcome that was posted."""

    def __init__(self, store, key: str):
        self.store, self.key = store, key
        self.posted: RankOutcome | None = None
        self._lock = threading.Lock()

    def __call__(self, outcome: RankOutcome) -> RankOutcome:
        with self._lock:
            if self.posted is None:
                self.store.set(f"{self.key}/{outcome.rank}", pickle.dumps(outcome))
                self.posted = outcome
            return self.posted


def _post_stack(post: _Post, r: int, timeout: float) -> None:
    """Post a hung outcome with the main thread's stack (called from the stack watch's thread)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    frames = traceback.extract_stack(frame) if frame is not None else []
    ours = [i for i, f in enumerate(frames) if f.name == _in_fresh_group.__name__ and f.filename == __file__]
    stack = "".join(traceback.format_list(frames[ours[-1] + 1 :] if ours else frames))  # the scenario's frames
    post(
        RankOutcome(
            r,
            HUNG,
            message=f"still running after the {timeout:g} s timeout, where the watchdog cannot interrupt it "
            "(in C code or with signals blocked); its stack below (raise the timeout with --zero3-timeout "
            "if it is only slow)",
            traceback="Stack (most recent call last):\n" + stack,
        )
    )


def gather(store, key: str, mine: RankOutcome, size: int, deadline: float, timeout: float) -> list[RankOutcome]:
    """Every rank's outcome posted under ``key`` (``mine`` is this rank's), waiting until ``deadline``.

    Waits in slices of at most a second, so a SIGTERM from the launcher is acted on promptly (a
    signal handler runs only between Python bytecodes, never inside the store's C++ wait).  A rank
    whose world did not form does not wait for ranks that never joined a world in this session.
    """
    got = {mine.rank: mine}
    while True:
        for r in range(size):
            if r not in got and store.check([f"{key}/{r}"]):
                got[r] = pickle.loads(store.get(f"{key}/{r}"))
        left = deadline - time.monotonic()
        if len(got) == size or left <= 0:
            break
        if mine.status == UNFORMED and set(range(size)) - set(got) <= set(never_joined(store, size)):
            break  # only ranks that never joined a world are missing: they have nothing to post
        missing = [f"{key}/{r}" for r in range(size) if r not in got]
        with contextlib.suppress(RuntimeError):  # DistStoreError: this slice ended without them
            store.wait(missing, datetime.timedelta(seconds=min(1.0, left)))
    absent = set(never_joined(store, size)) if len(got) < size else set()
    return [
        got.get(r)
        or (
            RankOutcome(r, UNFORMED, message="never joined a world in this session (its pytest did not reach one)")
            if r in absent
            else RankOutcome(
                r,
                HUNG,
                message=f"did not report an outcome within the {timeout:g} s timeout (its scenario never ended "
                "or never started there; raise the timeout with --zero3-timeout if it is only slow)",
            )
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
        return impl.identity()
    except Exception:
        return {}


_stop_handler_installed = False
_stopped = False  # the launcher is stopping this process: no waiting for other ranks any more


def _install_stop_handler() -> None:
    """On SIGTERM (the launcher stopping this rank), end pytest as on Ctrl-C, saying why."""
    global _stop_handler_installed
    if _stop_handler_installed or threading.current_thread() is not threading.main_thread():
        return
    _stop_handler_installed = True

    def on_term(signum, frame):
        global _stopped
        _stopped = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise LauncherStopped(
            f"pytest on rank {rank()} received {signal.Signals(signum).name} from the launcher, "
            "usually because another rank's process ended: see the launcher's report of the "
            "failed rank"
        )

    signal.signal(signal.SIGTERM, on_term)


#: Store key prefix of the end-of-session exchange.
SESSION_PREFIX = "pytest-zero3/session"
#: Seconds rank 0 waits for the other ranks to end their tests, and they for rank 0 to report.
SESSION_WAIT = 600.0


class SessionEnd:
    """A pytest plugin of launcher mode: no rank's process ends before rank 0 has reported.

    torchrun stops every rank as soon as one process exits non-zero, so a rank that failed a test and
    ended first would stop rank 0 while it prints the table and writes the reports.  Instead, every
    rank posts its exit status when its session finishes; rank 0 waits for all of them, reports as in
    forked mode (naming a rank whose session failed), then posts that it is done, and the other ranks
    exit only after that.  Inert in a process that ran no world (it never reached the store).
    """

    NAME = "zero3-launcher-end"

    def __init__(self):
        self.statuses: dict = {}
        self.absent: list[int] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        if _store is None or _stopped:
            return
        _store.set(f"{SESSION_PREFIX}/status/{rank()}", str(int(exitstatus)))
        if rank() == 0:
            size = int(os.environ["WORLD_SIZE"])
            # a rank that never reached a world by now took part in none of rank 0's: not waited for
            self.absent = never_joined(_store, size)
            keys = {r: f"{SESSION_PREFIX}/status/{r}" for r in range(1, size) if r not in self.absent}
            _wait_for(list(keys.values()), SESSION_WAIT)
            self.statuses = {r: _get(key) for r, key in keys.items()}

    def pytest_terminal_summary(self, terminalreporter):
        if self.absent:
            terminalreporter.write_line(
                f"zero3: {_ranks_text(self.absent)} never joined a world in this session; see their own output",
                red=True,
            )
        for r, status in sorted(self.statuses.items()):
            if status is None:
                terminalreporter.write_line(
                    f"zero3: rank {r} did not end its session within {SESSION_WAIT:g} s; see its own output",
                    red=True,
                )
            elif status != "0":
                terminalreporter.write_line(
                    f"zero3: rank {r} ended its session with exit status {status}; see its own output for why",
                    red=True,
                )

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config):
        if _store is None or _stopped:
            return
        if rank() == 0:
            # Reported: a stop from the launcher now (another rank ended first) would only cut the exit short.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _store.set(f"{SESSION_PREFIX}/reported", "1")
        else:
            _wait_for([f"{SESSION_PREFIX}/reported"], SESSION_WAIT)


def _wait_for(keys: list[str], seconds: float) -> None:
    """Wait until every key is in the store, or ``seconds`` passed; in slices of a second, so that a
    SIGTERM from the launcher is acted on (see :func:`gather`)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not _stopped:
        try:
            if _store.check(keys):
                return
            _store.wait(keys, datetime.timedelta(seconds=min(1.0, max(end - time.monotonic(), 0.01))))
            return
        except RuntimeError:  # DistStoreError: this slice ended without them (or the store is gone)
            continue


def _get(key: str) -> str | None:
    try:
        return _store.get(key).decode() if _store.check([key]) else None
    except RuntimeError:
        return None
