"""Starting and stopping rank processes: a forkserver that preloads torch and deepspeed once.

Every scenario gets fresh rank processes (ZeRO-3 leaves hooks, registries and module stacks behind
in a process, and DeepSpeed's own reused worlds leaked and hung).  Forking them from a warm
forkserver makes "fresh" cheap.  This module also keeps the list of live ranks so that none
outlives pytest, whatever ends it.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from typing import List

#: Comma-separated extra modules for the forkserver to import (read by :mod:`pytest_zero3.preload`).
PRELOAD_ENV = "PYTEST_ZERO3_PRELOAD"
_context = None
_live: set = set()


def context(extra_preload: List[str]):
    """The forkserver context, started on first use with ``extra_preload`` modules loaded."""
    global _context
    if _context is None:
        os.environ[PRELOAD_ENV] = ",".join(sorted(set(extra_preload)))
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["pytest_zero3.preload"])
        _context = ctx
    return _context


def start(ctx, target, args) -> multiprocessing.Process:
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    _live.add(proc)
    return proc


def forget(proc) -> None:
    _live.discard(proc)


def kill(proc) -> None:
    if proc.pid is not None and proc.exitcode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.join(timeout=10)
    forget(proc)


def kill_all() -> None:
    """Kill every live rank; then stop the forkserver.  Safe to call twice."""
    for proc in list(_live):
        kill(proc)
    if _context is not None:
        from multiprocessing import forkserver
        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop is not None:
            try:
                stop()
            except Exception:
                pass


def install_signal_handlers() -> None:
    """Turn SIGTERM into a clean stop: kill the ranks, then let pytest end as on Ctrl-C."""
    def on_term(signum, frame):
        kill_all()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")

    if hasattr(signal, "SIGTERM") and sys.platform != "win32":
        try:
            signal.signal(signal.SIGTERM, on_term)
        except ValueError:
            pass  # not the main thread: pytest embedded somewhere; atexit still cleans up
