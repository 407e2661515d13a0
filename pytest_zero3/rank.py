"""The life of one rank: set up, join the world, run the scenario, write the outcome, exit.

Runs in a process forked from the forkserver (or spawned).  It reports through files in the
world's run directory, never through pipes, so a rank that hangs or dies cannot block the parent:

* ``rank<N>.log``    - the rank's stdout and stderr;
* ``rank<N>.stack``  - faulthandler output: on a fatal signal, and on SIGUSR1 from the parent;
* ``rank<N>.result`` - the pickled :class:`~pytest_zero3.outcome.RankOutcome`, written atomically.
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

from pytest_zero3.outcome import HUNG, PASSED, RAISED, SKIPPED, UNSUPPORTED, XFAILED, RankOutcome

STACK_SIGNAL = signal.SIGUSR1


def paths(run_dir: str, rank: int) -> dict:
    return {kind: os.path.join(run_dir, f"rank{rank}.{kind}") for kind in ("log", "stack", "result")}


def main(payload: bytes, rank: int) -> None:
    """Entry point of a rank process (the ``target`` of its ``multiprocessing.Process``)."""
    job = pickle.loads(payload)
    files = paths(job["run_dir"], rank)
    _die_with_parent(job["parent_pid"])
    _redirect_output(files["log"])
    stack_file = open(files["stack"], "w")
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=stack_file, all_threads=True)
    outcome = _run(job, rank)
    _write_outcome(files["result"], outcome)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: nothing of a finished rank is worth waiting for


def _run(job: dict, rank: int) -> RankOutcome:
    outcome = _run_scenario(job, rank)
    if rank == 0:
        try:
            from pytest_zero3 import impl

            outcome.identity = impl.identity()
        except Exception:
            pass
    return outcome


def _run_scenario(job: dict, rank: int) -> RankOutcome:
    try:
        sys.path[:] = job["sys_path"]
        _set_env(job, rank)
        from pytest_zero3 import impl

        impl.apply(impl.parse(job["spec"]))
        _join_world(job, rank)
        fn, args, kwargs = pickle.loads(job["call"])
    except BaseException as exc:  # set-up failures are this rank's result too
        return ending(rank, exc)
    return call(rank, fn, args, kwargs)


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
    from pytest_zero3.scenario import Unsupported

    if isinstance(exc, Unsupported):  # first: it is a kind of skip
        return RankOutcome(rank, UNSUPPORTED, message=str(exc))
    if isinstance(exc, pytest_outcomes.Skipped):
        return RankOutcome(rank, SKIPPED, message=str(exc.msg))
    if isinstance(exc, pytest_outcomes.XFailed):
        return RankOutcome(rank, XFAILED, message=str(exc.msg))
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None))
    if isinstance(exc, Timeout):
        return RankOutcome(rank, HUNG, message=str(exc), traceback=tb)
    return RankOutcome(rank, RAISED, message=f"{type(exc).__name__}: {exc}".strip(), traceback=tb)


def _set_env(job: dict, rank: int) -> None:
    size = job["world_size"]
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_SIZE=str(size),
        LOCAL_WORLD_SIZE=str(size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(job["port"]),
    )


def _join_world(job: dict, rank: int) -> None:
    import torch
    import torch.distributed as dist

    if job["backend"] == "nccl":
        torch.cuda.set_device(rank)
    store = dist.FileStore(os.path.join(job["run_dir"], "store"), job["world_size"])
    dist.init_process_group(
        job["backend"],
        store=store,
        rank=rank,
        world_size=job["world_size"],
        timeout=datetime.timedelta(seconds=job["timeout"]),
    )


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


def _die_with_parent(parent_pid: int) -> None:
    """Make the kernel kill this rank when the process that forked it dies (Linux), so no rank is orphaned."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1 or not _alive(parent_pid):
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
