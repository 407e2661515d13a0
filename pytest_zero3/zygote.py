"""A forkserver that holds torch, from which each deepspeed's forkserver is forked.

A rank forkserver imports torch, ``torch._dynamo`` and the inductor modules DeepSpeed's optimizer
pulls in (about 8 s of CPU, measured) before its one deepspeed (under 1 s).  A process that keeps
forkservers warm (:func:`pytest_zero3.spawner.held`: the suite's own tests, which switch between
the installed deepspeed and fork checkouts) pays the torch part once: the zygote imports it, and each
rank forkserver is a child of the zygote that imports only its deepspeed and preloads, then serves
as multiprocessing's forkserver for that deepspeed (:func:`serve`).

Every level dies with the one above it (``PR_SET_PDEATHSIG``): pytest, the zygote, the rank
forkservers, the ranks.  The zygote is keyed by the environment like any forkserver (torch reads
some of it at import), less :data:`LAZY_ENV`.  A process may also share its zygote with the pytests
it starts (:func:`share`, :func:`shared`; this repository's tests do): their forkservers are then
the zygote's children, not theirs, and each watches its requester's pid instead (:func:`_die_with`).

The forkserver classes live here with what :mod:`pytest_zero3.spawner` needs of them to pick one:
:func:`swap` (which forkserver multiprocessing starts processes from) and :data:`DRIFT_ENV`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import select
import signal
import threading
import zlib
from multiprocessing import reduction
from typing import Any

from pytest_zero3.rank import alive, die_with_parent

#: Variables a zygote may differ in from its rank forkservers: nothing it imports reads them (torch
#: reads TORCH_EXTENSIONS_DIR when it builds an op, deepspeed reads DS_ACCELERATOR, and the plugin
#: sets them per session, DS_ACCELERATOR only where the user left it unset; COLUMNS and LINES are the terminal's size, which pytest-xdist sets in its
#: workers).  Each rank forkserver takes its requester's whole environment (serve).
LAZY_ENV = frozenset({"TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR", "COLUMNS", "LINES"})

#: Variables that torch and deepspeed set in pytest's own process as a side effect, each to the value
#: the forkserver and its ranks compute for themselves (inductor's cache dir, the first time anything
#: asks for it; deepspeed's import, NVML's CUDA check): keying forkservers by them (a zygote, or a
#: forkserver in :func:`pytest_zero3.spawner.context`) restarted the forkserver in the middle of a
#: suite run (about 12 s) after a test computed a plain-torch reference.
DRIFT_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR", "PYTORCH_NVML_BASED_CUDA_CHECK"})


def swap(srv) -> Any:
    """Make ``srv`` the forkserver that multiprocessing's forkserver context starts processes from;
    return the one it replaces.

    multiprocessing keeps one forkserver per process, a module-level instance whose bound methods the
    module re-exports; :mod:`multiprocessing.popen_forkserver` looks them up at each start, so swapping
    the five names switches the server new processes are forked from."""
    from multiprocessing import forkserver

    old = forkserver._forkserver
    forkserver._forkserver = srv
    forkserver.ensure_running = srv.ensure_running
    forkserver.get_inherited_fds = srv.get_inherited_fds
    forkserver.connect_to_new_process = srv.connect_to_new_process
    forkserver.set_forkserver_preload = srv.set_forkserver_preload
    return old


@contextlib.contextmanager
def using(srv):
    """Start processes from ``srv`` inside (a zygote, while it forks a rank forkserver)."""
    old = swap(srv)
    try:
        yield
    finally:
        swap(old)


class Fd:
    """A file descriptor handed to a process the zygote forks (sent with it, as multiprocessing sends
    a Connection's)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


#: Set in a rank forkserver's environment (so in its ranks'): the pid it was forked from, the zygote or a
#: loaded rank forkserver (which may have exited since: the process's parent is then another).
FORKED_FROM = "PYTEST_ZERO3_FORKED_FROM"


def serve(job, env: dict, listener_fd: int, alive_r: int, zygote_pid: int = 0) -> None:
    """In a child of the zygote: load ``job`` (its deepspeed, preloads, ops) and serve as the forkserver
    its ranks are forked from, until the pytest process that asked for it closes its end of ``alive_r``
    (multiprocessing's own protocol) or ends, or the zygote dies.  With ``zygote_pid``, in a child of
    another pytest's rank forkserver that loaded the same job (:meth:`RankForkServer.start`): loading
    finds everything loaded, and the process outlives its parent, watching the zygote instead."""
    from multiprocessing import forkserver

    # Not at import: importing preload is the forkserver's start-up (it loads torch and deepspeed); here,
    # in the zygote's child, the zygote imported it already, so this only names it.
    from pytest_zero3 import preload

    born_of = os.getppid()
    if zygote_pid:
        _die_with(zygote_pid)
    else:
        zygote = os.getppid()
        die_with_parent()
        if os.getppid() != zygote:
            os._exit(1)
    _die_with(job.parent_pid)
    os.environ.clear()
    os.environ.update(env)  # the requester's, as a forkserver it started itself would have inherited
    # whom it was forked from, for its ranks to read: a forkserver forked from a loaded one outlives it
    os.environ[FORKED_FROM] = str(born_of)
    preload.load(job)
    # preloads: none left to import; main_path/sys_path: the job set sys.path already
    forkserver.main(listener_fd, alive_r, [])


def _die_with(pid: int) -> None:
    """End this process when ``pid`` (the pytest that asked for it) ends: a shared zygote's parent is
    another process (:func:`shared`), so the kernel's parent-death signal cannot tell."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        return  # no pidfd here: shared() is never used without one

    def watch() -> None:
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="pytest-zero3-requester", daemon=True).start()


#: Where a shared zygote is found by the pytest processes a process starts (:func:`share`):
#: ``address|pid|tag``, tag naming the environment it loaded torch under.
ENV_VAR = "PYTEST_ZERO3_ZYGOTE"


def torch_env(environ=None) -> tuple:
    """The part of the environment a zygote is keyed by: all but pytest's own, :data:`LAZY_ENV` and
    :data:`DRIFT_ENV`."""
    environ = os.environ if environ is None else environ
    skip = LAZY_ENV | DRIFT_ENV
    return tuple(sorted((k, v) for k, v in environ.items() if not k.startswith("PYTEST_") and k not in skip))


def tag(env: tuple) -> str:
    return f"{zlib.crc32(repr(env).encode()):08x}"


class SharedZygote(multiprocessing.forkserver.ForkServer):
    """The client side of a zygote another process started and shared (:func:`shared`): it forks this
    process's rank forkservers as its own zygote would; it is never stopped from here."""

    def __init__(self, address: str, pid: int):
        super().__init__()
        r, w = os.pipe()  # sent along as multiprocessing's alive fd; the zygote never reads it
        os.close(r)
        self._forkserver_address: Any = address
        self._forkserver_pid: Any = pid
        self._forkserver_alive_fd: Any = w

    def ensure_running(self) -> None:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        if not alive(self._forkserver_pid):
            raise RuntimeError(f"the shared zygote (pid {self._forkserver_pid}, {ENV_VAR}) is gone")


def shared() -> SharedZygote | None:
    """The zygote named by :data:`ENV_VAR`, when it runs and loaded torch under this environment."""
    value = os.environ.get(ENV_VAR, "")
    address, _, rest = value.partition("|")
    pid, _, want = rest.partition("|")
    if not (address and pid.isdigit() and want == tag(torch_env()) and can_share()):
        return None
    if not alive(int(pid)):
        return None
    return SharedZygote(address, int(pid))


def can_share() -> bool:
    """Whether another process can fork from a zygote this one starts: it needs a pidfd to watch its
    requester (:func:`_die_with`), and a forkserver that does not authenticate its clients (newer
    Pythons give the key to the starter only)."""
    return hasattr(os, "pidfd_open") and "_forkserver_authkey" not in vars(multiprocessing.forkserver.ForkServer())


def share(server: Any) -> None:
    """Start ``server`` (this process's zygote) and name it in :data:`ENV_VAR` for the processes this
    one starts from now on (opt-in: a test suite that runs many pytests, each of which would import
    torch for a forkserver of its own)."""
    server.ensure_running()
    os.environ[ENV_VAR] = f"{server._forkserver_address}|{server._forkserver_pid}|{tag(torch_env())}"


def _await_exit(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` s for ``pid`` (not this process's child) to end; kill it if it has not."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, AttributeError, OSError):
        return
    try:
        if not select.select([fd], [], [], timeout)[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        os.close(fd)


class _Loaded:
    """Where the rank forkserver that loaded a job is found by the other users of a shared zygote: a file
    named by the job's key in a directory beside the zygote's socket (it goes with the process that
    started the zygote), written by the first user once its forkserver forked a rank, under a lock the
    others wait on meanwhile (their forkservers would load the same things on the same cores); one that
    never answers is stopped by its start-up budget, which lets the lock go."""

    def __init__(self, zygote: SharedZygote, key: str):
        self._dir = os.path.join(os.path.dirname(zygote._forkserver_address), "pytest-zero3-loaded")
        self._name = f"{zlib.crc32(key.encode()):08x}"
        self._lock = -1

    def wait(self) -> SharedZygote | None:
        """The loaded forkserver (its client), if one runs; else None, this process holding the lock
        until :meth:`publish`."""
        import fcntl

        try:
            os.makedirs(self._dir, exist_ok=True)
            self._lock = os.open(os.path.join(self._dir, self._name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            with open(os.path.join(self._dir, self._name)) as fh:
                address, _, pid = fh.read().partition("|")
        except OSError:
            return None
        if not (pid.isdigit() and alive(int(pid)) and os.path.exists(address)):
            return None
        return SharedZygote(address, int(pid))

    def publish(self, address: str, pid: int) -> None:
        if self._lock < 0:
            return
        path = os.path.join(self._dir, self._name)
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as fh:
                fh.write(f"{address}|{pid}")
            os.replace(path + ".tmp", path)
        self.release()

    def release(self) -> None:
        if self._lock >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock)  # closing the file releases its lock
            self._lock = -1


class RankForkServer(multiprocessing.forkserver.ForkServer):
    """multiprocessing's ForkServer for a rank forkserver forked from a zygote: the same client side
    (``connect_to_new_process``), started by asking the zygote (:meth:`start`), watched through its
    Process handle (it is the zygote's child, not this process's, so ``waitpid`` cannot).

    Where the zygote is shared (the workers of a pytest-xdist run), the first rank forkserver of a job
    (``key``: what it loads, :func:`pytest_zero3.spawner._fits`) is found by the others in the
    zygote's directory once it has loaded (:class:`_Loaded`), and theirs are forked from it: its
    deepspeed import, preloads and warm-ups (about 4 s of CPU each under the compile profile) are paid
    once per run, not once per worker.  One that is gone, or cannot fork, leaves it to the zygote."""

    def __init__(self, zygote: multiprocessing.forkserver.ForkServer, job, env: dict, key: str = ""):
        super().__init__()
        self._zygote, self._job, self._env = zygote, job, env
        self._process: Any = None
        self._start_lock = threading.Lock()
        self._loaded = _Loaded(zygote, key) if key and isinstance(zygote, SharedZygote) else None
        self._forked_from_loaded = False

    def ensure_running(self) -> None:
        """The zygote must be running (started from the caller's thread: see spawner.start_all); the
        rank forkserver itself starts at :meth:`start`, from the thread whose start-up is timed."""
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        self._zygote.ensure_running()

    def start(self) -> None:
        """Ask the zygote for this forkserver, unless it runs; blocks until the zygote is ready."""
        from multiprocessing import util

        with self._start_lock:
            if self._process is not None and self._running():
                return
            if self._process is not None:
                raise RuntimeError(f"the rank forkserver exited with {self._process.exitcode}")
            parent = self._loaded.wait() if self._loaded is not None else None
            try:
                forked = self._fork_from_loaded(parent) if parent is not None else None
                self._forked_from_loaded = forked is not None
                proc, address, alive_w = forked or self._fork(self._zygote)
            except BaseException:
                self._release()
                raise
            if self._forked_from_loaded:  # the lock is held on only while this one loads
                self._release()
            self._process = proc
            self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, proc.pid
            util.debug(f"rank forkserver {proc.pid} forked from {'a loaded one' if parent else 'the zygote'}")

    def _fork_from_loaded(self, parent: SharedZygote) -> tuple | None:
        """:meth:`_fork` from another pytest's loaded forkserver; None where it is gone or cannot fork
        (between the lookup and the fork): the zygote forks this one then."""
        try:
            return self._fork(parent)
        except Exception:  # noqa: BLE001 - see the docstring
            return None
        finally:
            with contextlib.suppress(OSError):
                os.close(parent._forkserver_alive_fd)

    def _release(self) -> None:
        if self._loaded is not None:
            self._loaded.release()

    def _fork(self, parent) -> tuple:
        """A child of ``parent`` (the zygote, or a loaded rank forkserver) serving this job: its Process
        handle, its address and the write end of its alive pipe."""
        import socket
        from multiprocessing import connection

        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            try:
                zygote_pid = getattr(self._zygote, "_forkserver_pid", 0) if parent is not self._zygote else 0
                with using(parent):
                    ctx = multiprocessing.get_context("forkserver")
                    proc = ctx.Process(
                        target=serve,
                        args=(self._job, self._env, Fd(listener.fileno()), Fd(alive_r), zygote_pid),
                        daemon=True,
                        name="pytest-zero3-forkserver",
                    )
                    proc.start()
            except BaseException:
                os.close(alive_w)
                with contextlib.suppress(OSError):
                    os.unlink(address)
                raise
            finally:
                os.close(alive_r)
        return proc, address, alive_w

    def _running(self) -> bool:
        """Whether the forkserver runs: its Process handle says so for a child of the zygote; one forked
        from another pytest's forkserver outlives that parent, whose end the handle would report."""
        if self._forked_from_loaded:
            return self._forkserver_pid is not None and alive(self._forkserver_pid)
        return self._process.exitcode is None

    def connect_to_new_process(self, fds):
        self.start()
        return super().connect_to_new_process(fds)

    def answered(self) -> None:
        """A rank was forked (:func:`pytest_zero3.spawner.start_all`): this forkserver has loaded, and the
        other users of the zygote waiting for it may fork theirs from it."""
        if self._loaded is not None and not self._forked_from_loaded and self._forkserver_pid is not None:
            self._loaded.publish(self._forkserver_address, self._forkserver_pid)

    def _stop_unlocked(self) -> None:
        self._release()  # stopped before it answered (stuck, or failed): the others load theirs
        proc = self._process
        if proc is None:
            return
        self._process = None
        pid = self._forkserver_pid
        os.close(self._forkserver_alive_fd)
        vars(self).update(_forkserver_alive_fd=None, _forkserver_pid=None)
        if self._forked_from_loaded:  # not a child of a live process this one can wait on
            self._forked_from_loaded = False
            if pid is not None:
                _await_exit(pid, 10)
        else:
            proc.join(10)  # it exits once its alive pipe is closed by every holder (the ranks are gone)
            if proc.exitcode is None:
                proc.kill()
                proc.join(10)
        address, self._forkserver_address = self._forkserver_address, None
        if address and os.path.exists(address):
            os.unlink(address)
