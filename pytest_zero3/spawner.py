"""Starting and stopping rank processes: a forkserver that preloads torch and deepspeed once.

Every scenario gets fresh rank processes (ZeRO-3 leaves hooks, registries and module stacks behind
in a process, and DeepSpeed's own reused worlds leaked and hung).  Forking them from a warm
forkserver makes "fresh" cheap.  This module also keeps the list of live ranks so that none
outlives pytest, whatever ends it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time

from pytest_zero3.job import Job


def session_dir(pid: int) -> str:
    """The temp directory of the pytest process ``pid``: the forkserver's payload and stack live here.

    Named by pid so that the forkserver finds its payload by its parent's pid, and so that a later
    session can tell the directory of a session that ended without cleaning up (SIGKILL) by its pid.
    """
    return os.path.join(tempfile.gettempdir(), f"{_PREFIX}{os.getuid()}-{pid}")


def payload_path(parent_pid: int) -> str:
    """The forkserver's :class:`~pytest_zero3.job.Job`, written by its parent (pid ``parent_pid``) before
    it starts.  It travels in this file, not in environment variables: nothing leaks into the
    environment of pytest or of anything else it starts."""
    return os.path.join(session_dir(parent_pid), "forkserver.pickle")


_PREFIX = "pytest-zero3-"
_LEFTOVER = re.compile(re.escape(_PREFIX) + r"(\d+)-(?:forkserver-)?(\d+)(?:\.pickle)?$")


def remove_leftovers(directory: str = "") -> list[str]:
    """Remove the temp files and directories of sessions of this user whose process is gone; return them."""
    directory = directory or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _LEFTOVER.match(name)
        if not m or int(m.group(1)) != os.getuid() or alive(int(m.group(2))):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
        removed.append(path)
    return removed


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Seconds the forkserver may take to become ready (its preload imports torch and deepspeed, and may
#: build DeepSpeed's CPU comm op): a budget of its own (``--zero3-startup-timeout``), never taken from
#: a scenario's timeout.
DEFAULT_STARTUP_TIMEOUT = 600.0


class ForkserverStuck(Exception):
    """The forkserver did not become ready (its preload hung or crashed); the message has its stack."""


_context = None
_stack_path = ""
_live: set = set()
_held = 0  # > 0 while held(): the forkserver outlives the pytest sessions run in this process
_loaded: tuple = ()  # what the running forkserver was started with (see _fits)


def _fits(job: Job) -> tuple:
    """What a forkserver must share with ``job`` to fork its ranks: the deepspeed it imported (a fork
    checkout's path), the environment it inherited, and a superset of the modules it preloaded.  The
    spec's coordinator is not part of it: ranks load and install that themselves (preload.py)."""
    from pytest_zero3 import impl

    # pytest's own variables change between tests and sessions (PYTEST_CURRENT_TEST, PYTEST_VERSION)
    env = tuple(sorted((k, v) for k, v in os.environ.items() if not k.startswith("PYTEST_")))
    return impl.import_path(job.spec), env, frozenset(job.preload)


def context(job: Job):
    """The forkserver context, started on first use with what ``job`` names loaded.

    A held forkserver (:func:`held`) is reused by a later session whose job fits it, and replaced by
    a fresh one when the job does not (another deepspeed, another environment, more preloads).
    """
    global _context, _stack_path, _loaded
    if _context is not None:
        place, env, preload = _fits(job)
        if (place, env) != _loaded[:2] or not preload <= _loaded[2]:
            _stop_server()
    if _context is None:
        _loaded = _fits(job)
        remove_leftovers()
        here = session_dir(os.getpid())
        shutil.rmtree(here, ignore_errors=True)  # a dead session's, under a pid now reused by this one
        os.makedirs(here)
        _stack_path = os.path.join(here, "forkserver.stack")
        job = dataclasses.replace(job, preload=tuple(sorted(set(job.preload))), forkserver_stack=_stack_path)
        with open(payload_path(os.getpid()), "wb") as fh:
            pickle.dump(job, fh)
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["pytest_zero3.preload"])
        _context = ctx
    return _context


def start_all(ctx, target, args_list, timeout: float) -> list:
    """Start one process per args tuple; raise :class:`ForkserverStuck` if that takes over ``timeout`` s.

    Starting blocks until the forkserver answers, and the forkserver answers only after its preload
    (imports, building DeepSpeed's CPU comm op).  A preload stuck on a stale build lock would block
    pytest forever, so the start runs in a thread, and a stuck forkserver is killed and reported.
    """
    procs, errors = [], []
    # Started from this (the main) thread, not the starter thread below: the forkserver dies with the
    # thread that started it (PR_SET_PDEATHSIG), and the starter thread ends after each start.
    from multiprocessing import forkserver

    forkserver.ensure_running()

    def go():
        try:
            for args in args_list:
                proc = ctx.Process(target=target, args=args, daemon=True)
                proc.start()
                _live.add(proc)
                procs.append(proc)
        except BaseException as exc:  # reported below, in the caller's thread
            errors.append(exc)

    starter = threading.Thread(target=go, name="pytest-zero3-start", daemon=True)
    starter.start()
    starter.join(timeout)
    stuck = starter.is_alive()
    if stuck or errors:
        global _context
        stack = _stop_forkserver()
        _context = None  # the next world writes its payload again: a restart must not inherit this one's
        starter.join(10)
        for proc in procs:
            kill(proc)
        why = (
            (
                f"did not become ready within {timeout:g} s (its start-up budget, separate from the scenario "
                f"timeout: raise it with --zero3-startup-timeout=SECONDS)"
            )
            if stuck
            else f"failed: {errors[0]!r}"
        )
        raise ForkserverStuck(
            f"the forkserver that preloads torch and deepspeed {why}. Its stack below shows "
            "the import it is stuck in (if it waits in torch's file_baton, an interrupted "
            "build left a stale 'lock' file under TORCH_EXTENSIONS_DIR: remove it)."
            f"\nforkserver stack:\n{stack or '(none written)'}"
        )
    return procs


def _stop_forkserver() -> str:
    """Dump the forkserver's stack, kill it (the next start launches a new one), return the stack."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    path = _stack_path
    if not pid:
        return ""
    try:
        os.kill(pid, signal.SIGUSR1)
        end = time.monotonic() + 3
        while time.monotonic() < end and not (os.path.exists(path) and os.path.getsize(path)):
            time.sleep(0.05)  # faulthandler writes from the forkserver's signal handler
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def forget(proc) -> None:
    _live.discard(proc)


def send_kill(proc) -> None:
    """SIGKILL ``proc`` without waiting for it (see :func:`kill`)."""
    if proc.pid is not None and proc.exitcode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill(proc) -> None:
    send_kill(proc)
    proc.join(timeout=10)
    forget(proc)


def kill_all() -> None:
    """Kill every live rank; then stop the forkserver, unless it is :func:`held`.  Safe to call twice;
    a later :func:`context` writes a fresh payload (the next session in this process may load other
    modules)."""
    for proc in list(_live):
        kill(proc)
    if not _held:
        _stop_server()


@contextlib.contextmanager
def held():
    """Keep the forkserver warm across the pytest sessions run in this process while inside (pytest
    runs in-process, as pytester's do): each session's end still kills its ranks, a session whose job
    does not fit the forkserver replaces it, and the outermost exit stops it.  Without it every session
    pays the forkserver's imports (seconds) again."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held:
            kill_all()


def _stop_server() -> None:
    """Stop the forkserver and remove the session's temp directory."""
    global _context
    if _context is not None:
        from multiprocessing import forkserver

        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop is not None:
            try:
                stop()
            except Exception:
                pass
    _context = None
    shutil.rmtree(session_dir(os.getpid()), ignore_errors=True)


def install_signal_handlers() -> None:
    """Turn SIGTERM into a clean stop: kill the ranks, then let pytest end as on Ctrl-C."""

    def on_term(signum, frame):
        # Only raise here: the running world's cleanup and pytest_unconfigure kill the ranks, outside
        # the signal handler (which may have interrupted multiprocessing while it holds a lock).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    if hasattr(signal, "SIGTERM") and sys.platform != "win32":
        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError:
            pass  # not the main thread: pytest embedded somewhere; atexit still cleans up
