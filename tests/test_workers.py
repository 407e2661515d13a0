"""A whole-suite run spreads its worlds over pytest-xdist workers (plugin._default_workers).  That an
xdist controller shares one zygote with its workers' forkservers: tests/test_lifecycle.py's xdist test."""

import os
import subprocess
import sys

from conftest import ROOT

DATA = ROOT / "tests" / "data"


def _collect(*args, **env):
    """``pytest --collect-only`` (xdist collects in the controller then: no worker starts) in a process
    of its own, outside any xdist worker and any shared zygote (as a user's shell runs it), with ``env``
    on top; returns its output.  The suite's modules are ignored (what is decided, and the header that
    says it, comes before collection): about a second a run instead of three."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ZERO3_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-p",
            "no:cacheprovider",
            "--ignore-glob=*/test_*.py",
            *args,
        ],
        cwd=ROOT,
        env={**base, "DS_ACCELERATOR": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: no tests collected
    return proc.stdout + proc.stderr


def test_whole_suite_runs_on_workers_unless_the_user_chose():
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        import pytest

        pytest.skip("one core: the run stays serial")
    workers = min(4, cores + 1)
    # no test path, or the suite named (zero3-conformance, the main job)
    for named in ((), ("--pyargs", "pytest_zero3.conformance")):
        out = _collect("--zero3-impl=reference", *named)
        assert f"zero3 workers: {workers} (pytest-xdist" in out, out
    # the user's -n 0, and a pytest inside an xdist worker, stay serial
    # and --zero3-strict, whose whole-contract check counts one process's tests
    for args, env in ((("-n", "0"), {}), ((), {"PYTEST_XDIST_WORKER": "gw0"}), (("--zero3-strict",), {})):
        out = _collect("--zero3-impl=reference", *args, **env)
        assert "zero3 workers" not in out, out
    # a run of given tests is left as asked
    out = _collect("--zero3-impl=reference", str(DATA / "two_worlds_case.py"))
    assert "zero3 workers" not in out, out
