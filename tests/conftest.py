"""Helpers for the plugin's own tests: run pytest (the suite or a small test file) and read its report.

The plugin's behaviour is a property of whole pytest runs (options, exit codes, reports, hangs), so
most tests run a whole pytest session and read its output and JSON report.  A session that needs a
process of its own (another environment or directory, xdist, torchrun, a baseline run)
runs as ``python -m pytest`` in a subprocess; the others run in this process, as pytester's in-process
runs do, on a forkserver kept warm between them (``spawner.held``): a subprocess would pay the torch
and deepspeed imports twice (pytest's collection, the forkserver), about 10 s of CPU per run.  A fork
checkout (``--zero3-impl=DIR``) runs here too: pytest's process never imports deepspeed, and the
forkserver started for the fork puts ``DIR`` first on its path.
"""

import contextlib
import gc
import importlib.util
import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pytest_zero3 import spawner

ROOT = Path(__file__).resolve().parent.parent
# Every pytest these tests start (run_pytest, pytester) imports this checkout's packages, also where an
# installed copy of pytest-zero3 (editable or not) sits in site-packages.
# Once per process (pytest may import this file again in an in-process session): a PYTHONPATH that grew
# would make every later world's environment differ and restart the warm forkserver.
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(ROOT):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
BAD = ROOT / "tests" / "bad_coordinators"
_INSTALLED_DEEPSPEED = str(getattr(importlib.util.find_spec("deepspeed"), "origin", None))


def pytest_addoption(parser):
    parser.addoption(
        "--proofs",
        action="store_true",
        default=False,
        help="Also run the proof tests (each known-bad implementation fails only its own contracts): "
        "minutes each; scripts/proofs.sh runs them.",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "proof: a whole-suite proof run; only with --proofs (scripts/proofs.sh)")
    config.addinivalue_line("markers", "slow: a test that needs more than about 20 s (its own pytest or torchrun)")


def pytest_collection_modifyitems(config, items):
    # The slow tests first: xdist hands out the longest work while every worker is free, instead of
    # leaving one worker on a long test at the end while the other idles.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if config.getoption("--proofs"):
        return
    skip = pytest.mark.skip(reason="proof run: pass --proofs (scripts/proofs.sh runs them)")
    for item in items:
        if item.get_closest_marker("proof"):
            item.add_marker(skip)


class Run:
    def __init__(self, proc, report_path):
        self.returncode, self.stdout = proc.returncode, proc.stdout
        self.report = json.loads(report_path.read_text()) if report_path.exists() else None

    def outcomes(self) -> dict:
        """``{contract_id: outcome}`` from the JSON report (which the run must have written)."""
        assert self.report is not None, f"no JSON report; pytest output:\n{self.stdout[-4000:]}"
        return {c["id"]: c["outcome"] for c in self.report["contracts"]}

    def failed_ids(self) -> set:
        return {cid for cid, out in self.outcomes().items() if out == "fail"}


@pytest.fixture(scope="session")
def warm_forkserver():
    """Forkservers kept warm for this process's in-process pytest sessions, and its zygote shared with the
    pytests it starts (stopped at the end)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with spawner.held():
        # the pytests the tests start fork their forkservers from this process's zygote (torch imported once)
        spawner.share_zygote()
        yield


#: Arguments that need a pytest process of its own.
_OWN_PROCESS = ("-n", "--numprocesses", "-p", "--zero3-launcher")


def _needs_own_process(args, cwd, env) -> bool:
    if cwd is not None or env or os.environ.get("DS_ACCELERATOR") != "cpu":
        return True
    for arg in map(str, args):
        if arg.split("=")[0] in _OWN_PROCESS:
            return True
    return False


def _in_process(args) -> types.SimpleNamespace:
    """``pytest.main(args)`` here, its output captured; what it added to sys.path is taken out again,
    and the test modules it imported are forgotten (another run may hold a different file by the name)."""
    out, path, modules, cwd = io.StringIO(), list(sys.path), set(sys.modules), os.getcwd()
    # pytest's unraisable-exception cleanup runs gc.collect() five times at the end of every session, and
    # with torch's import graph in this process's heap that is about 1 s a session, measured.  What is
    # alive between sessions (modules, the warm forkservers' handles) is frozen out of the collector's
    # walks; the garbage of the last session is collected first, so none of it is frozen.
    gc.collect()
    gc.freeze()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            ret = pytest.main(list(args))
    finally:
        os.chdir(cwd)
        sys.path[:] = path
        deepspeed = sys.modules.get("deepspeed")
        # a fork session must leave this process's deepspeed alone (a second import is not safe)
        assert deepspeed is None or str(deepspeed.__file__) == _INSTALLED_DEEPSPEED, deepspeed
        for name in set(sys.modules) - modules:
            if name.rpartition(".")[2].startswith(("test_", "conftest")) or name.startswith("conformance"):
                del sys.modules[name]
    return types.SimpleNamespace(returncode=int(ret), stdout=out.getvalue(), stderr="")


@pytest.fixture
def run_pytest(tmp_path, warm_forkserver):
    """``run_pytest(*args, cwd=..., env=...)``: run a pytest session with a JSON report; returns a
    :class:`Run`.  In this process where it can (see the module's docstring), else in a subprocess;
    ``own_process=True`` asks for one."""

    def run(*args, cwd=None, timeout=900, env=None, own_process=False):
        report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
        full = ("-p", "no:cacheprovider", f"--zero3-report={report}", *map(str, args))
        if not any(str(a).split("=")[0] in ("-n", "--numprocesses", "--dist") or str(a).startswith("-n") for a in args):
            # serial unless asked, however these tests run: a whole-suite run outside an xdist worker
            # would start workers of its own (tests/test_workers.py tests that)
            full = (*full, "-n0")
        if not own_process and not _needs_own_process(args, cwd, env):
            return Run(_in_process(full), report)
        full_env = dict(os.environ, DS_ACCELERATOR="cpu", **(env or {}))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", *full],
            cwd=cwd or ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        proc.stdout = proc.stdout + proc.stderr
        return Run(proc, report)

    return run


@pytest.fixture(scope="session")
def fork_without_checkpoint_fix(tmp_path_factory):
    """A simulated DeepSpeed fork: the installed package copied, with the 0.19.3 checkpoint fix undone.

    One file changes: the coordinator no longer recognises forward hooks that run inside a backward
    recompute, so frozen params are partitioned while checkpoint holds them (contract 002-a).
    Session-scoped: the fork's first world builds DeepSpeed's CPU comm op for its own path.
    """
    from forks import BREAK_002A, copy_installed_deepspeed, edit

    fork = copy_installed_deepspeed(str(tmp_path_factory.mktemp("fork")))
    edit(fork, *BREAK_002A)
    return fork


@pytest.fixture
def run_suite(run_pytest):
    """``run_suite(impl, select, *extra)``: the conformance suite against ``impl`` for contracts ``select``."""

    def run(impl, select, *extra):
        return run_pytest(str(ROOT / "conformance"), f"--zero3-impl={impl}", f"--zero3-select={select}", *extra)

    return run
