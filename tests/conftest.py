"""Helpers for the plugin's own tests: run pytest (the suite or a small test file) in a subprocess.

The plugin's behaviour is a property of whole pytest runs (options, exit codes, reports, hangs), so
most tests run a real ``python -m pytest`` in a subprocess and read its output and JSON report.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every pytest these tests start (run_pytest, pytester) imports this checkout's packages, also where an
# installed copy of pytest-zero3 (editable or not) sits in site-packages.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
BAD = ROOT / "tests" / "bad_coordinators"


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


@pytest.fixture
def run_pytest(tmp_path):
    """``run_pytest(*args, cwd=...)``: run pytest in a subprocess with a JSON report; returns a :class:`Run`."""

    def run(*args, cwd=None, timeout=900, env=None):
        report = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
        full_env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1", **(env or {}))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--zero3-report={report}", *args],
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
