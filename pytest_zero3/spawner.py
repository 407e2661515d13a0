"""Starting and stopping rank processes: a forkserver that preloads torch and deepspeed once.

Every scenario gets fresh rank processes (ZeRO-3 leaves hooks, registries and module stacks behind
in a process, and DeepSpeed's own reused worlds leaked and hung).  Forking them from a warm
forkserver makes "fresh" cheap.  This module also keeps the list of live ranks so that none
outlives pytest, whatever ends it.

The forkservers themselves are in :mod:`pytest_zero3.zygote`, imported here only inside the functions
that start or stop one: importing it imports ``multiprocessing.forkserver``, whose import registers an
atexit hook, and a run that does not use the plugin must see none added (tests/test_inert.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
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
from typing import Any

from pytest_zero3 import impl
from pytest_zero3.job import TEMP_PREFIX, Job, payload_path, session_dir
from pytest_zero3.rank import alive

_LEFTOVER = re.compile(re.escape(TEMP_PREFIX) + r"(\d+)-(?:forkserver-)?(\d+)(?:\.pickle)?$")


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


#: Seconds the forkserver may take to become ready (its preload imports torch and deepspeed, and may
#: build DeepSpeed's CPU comm op): a budget of its own (``--zero3-startup-timeout``), never taken from
#: a scenario's timeout.
DEFAULT_STARTUP_TIMEOUT = 600.0


class ForkserverStuck(Exception):
    """The forkserver did not become ready (its preload hung or crashed); the message has its stack."""


#: Forkservers kept warm at once in one process (each holds torch and one deepspeed: about 0.5 GB).
#: Sessions that alternate between the installed deepspeed and a fork checkout (a suite's own tests)
#: would otherwise restart one, at about 8 s of imports, at every switch.
MAX_WARM = 3


@dataclasses.dataclass
class _Server:
    """A forkserver of this process: what it was started with (see :func:`_fits`) and its stack file."""

    fits: tuple
    server: Any  # multiprocessing.forkserver.ForkServer
    stack_path: str


_servers: list = []  # warm forkservers, the most recently used first; _servers[0] is the active one
_live: set = set()
_held = 0  # > 0 while held(): the forkservers outlive the pytest sessions run in this process


def _fits(job: Job) -> tuple:
    """What a forkserver must share with ``job`` to fork its ranks: the deepspeed it imported (a fork
    checkout's path), the environment it inherited, and a superset of the modules it preloaded.  The
    spec's coordinator is not part of it: ranks load and install that themselves (preload.py)."""
    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    # pytest's own variables change between tests and sessions (PYTEST_CURRENT_TEST, PYTEST_VERSION)
    env = tuple(
        sorted((k, v) for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in zygote.DRIFT_ENV)
    )
    return impl.import_path(job.spec), env, frozenset(job.preload)


def _activate(entry: _Server) -> None:
    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    zygote.swap(entry.server)
    _servers.remove(entry)
    _servers.insert(0, entry)


_zygotes: dict = {}  # zygote.torch_env() -> (zygote forkserver, its stack file; "" for a shared one)
_shared = ""  # what share_zygote() set in the environment


def _zygote(job: Job):
    """The zygote this process's forkservers fork from (:mod:`pytest_zero3.zygote`), or None where they
    start directly: the one shared with this process for its environment, else, while :func:`held`,
    its own (made if there is none; it starts at its first use)."""
    from multiprocessing.forkserver import ForkServer

    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    env = zygote.torch_env()
    if env not in _zygotes:
        found = zygote.shared()
        if found is not None:
            _zygotes[env] = (found, "")
            return found
        if not _held:
            return None
        stack_path = os.path.join(session_dir(os.getpid()), f"zygote-{next(_ids)}.stack")
        # torch only: no fork checkout on its path, which a rank forkserver of another deepspeed inherits
        payload = dataclasses.replace(job, preload=(), sys_path=(), forkserver_stack=stack_path, zygote=True)
        with open(payload_path(os.getpid()), "wb") as fh:
            pickle.dump(payload, fh)
        server = ForkServer()
        server.set_forkserver_preload(["pytest_zero3.preload"])
        _zygotes[env] = (server, stack_path)
    return _zygotes[env][0]


def context(job: Job):
    """The forkserver context, with a forkserver that has what ``job`` names loaded.

    Up to :data:`MAX_WARM` forkservers stay warm while :func:`held`: a later session whose job fits one
    (the same deepspeed and environment, its preloads a superset) forks from it; a job that fits none
    gets a fresh one (replacing one of the same deepspeed with fewer preloads, else the least recently
    used).  The forkserver itself starts at the first :func:`start_all`.
    """
    from multiprocessing.forkserver import ForkServer

    place, env, preload = _fits(job)
    entry = next((e for e in _servers if e.fits[:2] == (place, env) and preload <= e.fits[2]), None)
    if entry is None:
        for old in [e for e in _servers if e.fits[:2] == (place, env)]:
            preload |= old.fits[2]  # the next session may need either set again
            _stop_one(old)
        while len(_servers) >= MAX_WARM:
            _stop_one(_servers[-1])
        _fresh_session_dir()
        stack_path = os.path.join(session_dir(os.getpid()), f"forkserver-{next(_ids)}.stack")
        job = dataclasses.replace(job, preload=tuple(sorted(preload)), forkserver_stack=stack_path)
        server: Any
        # the forkservers of a process that keeps them, or of one started where a zygote is shared,
        # fork from a zygote (zygote.py)
        parent = _zygote(job)
        if parent is not None:
            from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

            key = repr((place, env, tuple(sorted(preload))))  # what it loads: another pytest's may fork it
            server = zygote.RankForkServer(parent, job, dict(os.environ), key=key)
        else:
            # read by the forkserver's preload when it starts (at the next start_all), before any other write
            with open(payload_path(os.getpid()), "wb") as fh:
                pickle.dump(job, fh)
            server = ForkServer()
            server.set_forkserver_preload(["pytest_zero3.preload"])
        entry = _Server((place, env, frozenset(preload)), server, stack_path)
        _servers.insert(0, entry)
    _activate(entry)
    return multiprocessing.get_context("forkserver")


_ids = itertools.count(1)  # names each forkserver's stack file in the session directory


def _fresh_session_dir() -> None:
    """Before this process's first forkserver or zygote: its session directory, empty (a dead
    session's under a pid now reused by this one is removed), and other dead sessions' leftovers gone."""
    if _servers or _zygotes:
        return
    remove_leftovers()
    here = session_dir(os.getpid())
    shutil.rmtree(here, ignore_errors=True)
    os.makedirs(here)


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
    answered = getattr(forkserver._forkserver, "answered", None)  # a rank forkserver of a shared zygote

    def go():
        try:
            for args in args_list:
                proc = ctx.Process(target=target, args=args, daemon=True)
                proc.start()
                _live.add(proc)
                procs.append(proc)
                if answered is not None:
                    answered()
        except BaseException as exc:  # reported below, in the caller's thread
            errors.append(exc)

    starter = threading.Thread(target=go, name="pytest-zero3-start", daemon=True)
    starter.start()
    starter.join(timeout)
    stuck = starter.is_alive()
    if stuck or errors:
        stack = _stop_forkserver()
        # the next world writes its payload again: a restart must not inherit this one's
        if _servers:
            _stop_one(_servers[0])
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

    srv = forkserver._forkserver
    pid = getattr(srv, "_forkserver_pid", None)
    path = _servers[0].stack_path if _servers else ""
    zygote = getattr(srv, "_zygote", None)
    if not pid and zygote is not None:  # stuck before the zygote answered: its stack; a fresh one next time
        pid = zygote._forkserver_pid
        for env, (server, stack) in list(_zygotes.items()):
            if server is zygote:
                path = stack
                del _zygotes[env]
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
    if zygote is not None and pid == zygote._forkserver_pid:
        _stop_zygote(zygote)
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


def share_zygote() -> None:
    """Start this process's zygote now and share it with the pytest processes it starts from now on
    (:func:`pytest_zero3.zygote.share`): each of them forks its forkserver from it instead of importing
    torch for one.  Inside :func:`held` only; the zygote goes when this process stops its forkservers."""
    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    global _shared
    assert _held, "share_zygote() needs held()"
    _fresh_session_dir()
    zygote.share(_zygote(Job(spec=impl.Spec("installed", "installed"), sys_path=(), parent_pid=os.getpid())))
    _shared = os.environ[zygote.ENV_VAR]


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


def _stop_one(entry: _Server) -> None:
    """Stop one warm forkserver (its ranks were killed by the session that used them)."""
    stop = getattr(entry.server, "_stop", None)
    if stop is not None:
        try:
            stop()
        except Exception:
            pass
    with contextlib.suppress(ValueError):
        _servers.remove(entry)


def _stop_zygote(server) -> None:
    """Kill a zygote (it holds nothing but imports; its rank forkservers were stopped first); one that
    another process shares with this one is only let go."""
    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    if isinstance(server, zygote.SharedZygote):
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        return
    pid, server._forkserver_pid = server._forkserver_pid, None
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.close(server._forkserver_alive_fd)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    with contextlib.suppress(OSError, TypeError):
        os.unlink(server._forkserver_address)
    server._forkserver_alive_fd = server._forkserver_address = None


def _stop_server() -> None:
    """Stop every forkserver of this process and remove the session's temp directory."""
    for entry in list(_servers):
        _stop_one(entry)
    for server, _ in _zygotes.values():
        _stop_zygote(server)
    _zygotes.clear()
    global _shared
    from pytest_zero3 import zygote  # lazy: its import adds an atexit hook (see the module docstring)

    if _shared and os.environ.get(zygote.ENV_VAR) == _shared:  # the zygote it named is gone
        del os.environ[zygote.ENV_VAR]
    _shared = ""
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
