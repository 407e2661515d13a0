"""The life of one rank: set up, join the world, run the scenario, write the outcome, exit.

Runs in a process forked from the forkserver (or spawned).  It reports through files in the
world's run directory, never through pipes, so a rank that hangs or dies cannot block the parent:

* ``rank<N>.log``     - the rank's stdout and stderr;
* ``rank<N>.stack``   - faulthandler output: on a fatal signal, and on SIGUSR1 from the parent;
* ``rank<N>.joining`` - made when the rank starts joining the process group;
* ``rank<N>.started`` - made when the world formed and the scenario is about to start;
* ``rank<N>.result``  - the pickled :class:`~pytest_zero3.outcome.RankOutcome`, written atomically.

The two markers let the parent tell a world that did not form (retried with fresh ranks) from a
scenario that failed (never retried).
"""

from __future__ import annotations

import ctypes
import datetime
import faulthandler
import os
import pickle
import signal
import sys
import traceback

from pytest_zero3 import accel, impl, scenario
from pytest_zero3.job import Attempt
from pytest_zero3.outcome import (
    HUNG,
    PASSED,
    RAISED,
    SKIPPED,
    UNFORMED,
    UNSUPPORTED,
    XFAILED,
    GroupNotFormed,
    RankOutcome,
)
from pytest_zero3.scenario import Unsupported

STACK_SIGNAL = signal.SIGUSR1


def paths(run_dir: str, rank: int) -> dict:
    kinds = ("log", "stack", "joining", "started", "result")
    return {kind: os.path.join(run_dir, f"rank{rank}.{kind}") for kind in kinds}


def main(attempt: Attempt, rank: int) -> None:
    """Entry point of a rank process (the ``target`` of its ``multiprocessing.Process``)."""
    files = paths(attempt.run_dir, rank)
    scenario._ends_with_scenario = True  # os._exit below
    _die_with(attempt.job.parent_pid)
    _redirect_output(files["log"])
    stack_file = open(files["stack"], "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    outcome = _run(attempt, rank, files)
    _write_outcome(files["result"], outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: nothing of a finished rank is worth waiting for


def _run(attempt: Attempt, rank: int, files: dict) -> RankOutcome:
    outcome = _run_scenario(attempt, rank, files)
    if rank == 0:
        try:
            outcome.identity = {"backend": accel.backend(attempt.backend), **impl.identity()}
        except Exception:
            pass
    return outcome


def _run_scenario(attempt: Attempt, rank: int, files: dict) -> RankOutcome:
    try:
        sys.path[:] = attempt.job.sys_path
        _set_env(attempt, rank)
        one_thread_unless_chosen()
        _short_tensor_reprs()
        impl.apply(attempt.job.spec)
        fn, args, kwargs = pickle.loads(attempt.call)
        short = accel.place(rank, attempt.world_size)  # one node: the local rank is the rank
        if short:
            raise Unsupported(short)
    except BaseException as exc:  # set-up failures are this rank's result too (not retried: they repeat)
        return ending(rank, exc)
    _touch(files["joining"])
    try:
        _join_world(attempt, rank)
    except BaseException as exc:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RankOutcome(
            rank, UNFORMED, message=f"could not join the world: {type(exc).__name__}: {exc}", traceback=tb
        )
    _touch(files["started"])
    return call(rank, fn, args, kwargs)


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


class Timeout(BaseException):
    """Raised into a scenario that ran past its timeout (launcher mode's watchdog); reported as hung."""


def call(rank: int, fn, args=(), kwargs=None, passthrough=()) -> RankOutcome:
    """Run ``fn`` and turn however it ends into this rank's outcome; nothing escapes.

    Every ending counts: a return, ``pytest.skip``/``xfail``/``fail``, ``Unsupported``, any
    ``Exception``, and ``SystemExit``/``KeyboardInterrupt``/other ``BaseException``, so that every
    rank always has an outcome to exchange (launcher mode) or to write (forked ranks).  Exceptions
    of the ``passthrough`` types (the harness's own stop signal) are re-raised.
    """
    try:
        value = fn(*args, **(kwargs or {}))
        pickle.dumps(value)  # fail here, with a clear message, rather than silently in the parent
        return RankOutcome(rank, PASSED, value=value)
    except passthrough:
        raise
    except BaseException as exc:
        return ending(rank, exc)


def ending(rank: int, exc: BaseException) -> RankOutcome:
    """The outcome of a scenario that ended with ``exc``."""
    import _pytest.outcomes as pytest_outcomes

    if isinstance(exc, Unsupported):  # first: it is a kind of skip
        return RankOutcome(rank, UNSUPPORTED, message=str(exc))
    if isinstance(exc, pytest_outcomes.Skipped):
        return RankOutcome(rank, SKIPPED, message=str(exc.msg))
    if isinstance(exc, pytest_outcomes.XFailed):
        return RankOutcome(rank, XFAILED, message=str(exc.msg))
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None))
    if isinstance(exc, Timeout):
        return RankOutcome(rank, HUNG, message=str(exc), traceback=tb)
    if isinstance(exc, GroupNotFormed):
        return RankOutcome(rank, UNFORMED, message=str(exc), traceback=tb)
    return RankOutcome(rank, RAISED, message=f"{type(exc).__name__}: {exc}".strip(), traceback=tb)


def _set_env(attempt: Attempt, rank: int) -> None:
    size = attempt.world_size
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(attempt.port),
    )


def one_thread_unless_chosen() -> None:
    """One intra-op thread per rank unless the user chose a number (``OMP_NUM_THREADS``), as torchrun
    does for several ranks on a node: the ranks' thread pools would otherwise oversubscribe the cores
    and spin on tiny ops (measured: 15-20 % of the suite's CPU time on a 2-core machine)."""
    if "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(1)


#: The most elements a tensor prints whole in a rank (torch's default: 1000).
REPR_WHOLE = 64


def _short_tensor_reprs() -> None:
    """Tensors of more than :data:`REPR_WHOLE` elements print summarized in a rank (torch's own form,
    its edge items and "...").  DeepSpeed builds debug messages eagerly, logged or not: 0.19.8's stage 3
    formats ``locals()``, its ``param_names`` dict with every param in it, each time an engine is built
    (``runtime/zero/stage3.py``, ``print_rank_0(f"... {locals()}")``): 4 % of the ranks' CPU time in the
    default suite, sampled, and 10.5 ms to 4.1 ms for eight ``Linear(16, 16)``.  Nothing is computed
    from a repr; what a rank reports stays readable."""
    import torch

    torch.set_printoptions(threshold=REPR_WHOLE)


def _join_world(attempt: Attempt, rank: int) -> None:
    """Form the process group, then wait until every rank formed it: no rank starts the scenario
    while a peer may still fail to join (that would make a scenario failure of a world that never formed)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=attempt.timeout)
    store = dist.FileStore(os.path.join(attempt.run_dir, "store"), attempt.world_size)
    dist.init_process_group(
        accel.backend(attempt.backend), store=store, rank=rank, world_size=attempt.world_size, timeout=timeout
    )
    store.set(f"pytest-zero3/formed/{rank}", "1")
    store.wait([f"pytest-zero3/formed/{r}" for r in range(attempt.world_size)], timeout)


def _write_outcome(path: str, outcome: RankOutcome) -> None:
    tmp = path + ".tmp"
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:
        data = pickle.dumps(RankOutcome(outcome.rank, RAISED, message=f"result could not be pickled: {exc}"))
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _die_with(pytest_pid: int) -> None:
    """Make the kernel kill this rank when the forkserver that forked it dies (Linux); the forkserver
    itself dies with pytest (it asks the same in :mod:`pytest_zero3.preload`), so however pytest ends,
    SIGKILL included, no rank is left, even one stuck in C code.  Exits at once if pytest is gone."""
    die_with_parent()
    if os.getppid() == 1 or not alive(pytest_pid):
        os._exit(1)


def die_with_parent() -> None:
    """Ask the kernel for SIGKILL when this process's parent (the thread that started it) ends (Linux)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
