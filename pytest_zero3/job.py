"""What pytest hands to the forkserver and to every rank: typed, parsed once, pickled as it is.

The implementation spec is parsed once, in pytest (:func:`pytest_zero3.options.settings_from`); the
forkserver and the ranks receive the :class:`~pytest_zero3.impl.Spec` itself, never its text.  A
:class:`Job` reaches the forkserver in a file of the session's directory (:func:`payload_path`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import tempfile

from pytest_zero3.impl import Spec


@dataclasses.dataclass(frozen=True)
class Named:
    """A scenario function named by its module and name, imported where it is called: in the rank.

    Why: pytest's side of the fixtures (``pytest_zero3.fixtures.pytest_side``) imports neither torch nor
    deepspeed, yet starts worlds that run rank functions (the rule family's examples, the config probe);
    a function pickles by reference, which would import its module, and torch, in pytest's process."""

    module: str
    name: str

    def __call__(self, *args, **kwargs):
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)

    def __repr__(self) -> str:  # how a world names the scenario in its messages
        return self.name


#: How the temp files and directories of pytest-zero3 sessions are named (:func:`session_dir`).
TEMP_PREFIX = "pytest-zero3-"


def session_dir(pid: int) -> str:
    """The temp directory of the pytest process ``pid``: the forkserver's payload and stack live here.

    Named by pid so that the forkserver finds its payload by its parent's pid, and so that a later
    session can tell the directory of a session that ended without cleaning up (SIGKILL) by its pid.
    """
    return os.path.join(tempfile.gettempdir(), f"{TEMP_PREFIX}{os.getuid()}-{pid}")


def payload_path(parent_pid: int) -> str:
    """The forkserver's :class:`Job`, written by its parent (pid ``parent_pid``) before it starts.  It
    travels in this file, not in environment variables: nothing leaks into the environment of pytest or
    of anything else it starts."""
    return os.path.join(session_dir(parent_pid), "forkserver.pickle")


@dataclasses.dataclass(frozen=True)
class Job:
    """The session's part, the same for every world: what to load and whom to die with."""

    spec: Spec
    sys_path: tuple[str, ...]  # pytest's import path, in its order (a fork checkout first)
    parent_pid: int  # pytest: the forkserver and the ranks never outlive it
    preload: tuple[str, ...] = ()  # extra modules the forkserver imports once
    forkserver_stack: str = ""  # where the forkserver writes its stack when asked (SIGUSR1)
    zygote: bool = False  # the forkserver is a zygote: torch only, rank forkservers fork from it (zygote.py)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One try at forming a world and running one scenario call on it (fresh rank processes)."""

    job: Job
    run_dir: str  # the ranks' log, stack, marker and result files, and the world's store
    world_size: int
    backend: str
    timeout: float  # the process group's timeout
    port: int  # MASTER_PORT (DeepSpeed reads it; the world itself forms through a file store)
    call: bytes  # pickled (fn, args, kwargs): unpickled in the rank, where a failure is its result
