"""Process lifecycle: no orphans after SIGTERM, pytest -n, torchrun launcher mode (issue: foundation §3)."""
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT

DATA = ROOT / "tests" / "data"


def _wait_for(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)  # polling an external process; nothing to synchronise on
    pytest.fail(f"timed out waiting for {what}")


def test_no_rank_or_forkserver_outlives_sigterm_of_pytest(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    env = dict(os.environ, ZERO3_MARKER_DIR=str(markers), DS_ACCELERATOR="cpu")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(DATA / "hang_case.py"),
                             "--zero3-timeout=600"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: len(list(markers.iterdir())) == 2, 120, "both ranks to start")
        ranks = [int(p.name.split("-")[1]) for p in markers.iterdir()]
        forkserver = int((markers / f"rank-{ranks[0]}").read_text())
        descendants = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        assert set(ranks) | {forkserver} <= descendants
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                              for p in descendants), 20, "every rank and the forkserver to exit")
    assert "KeyboardInterrupt" in out or "SIGTERM" in out


def test_pytest_xdist_workers_run_worlds_side_by_side(run_pytest):
    run = run_pytest(str(DATA / "two_worlds_case.py"), "-n", "2")
    assert run.returncode == 0, run.stdout
    assert "4 passed" in run.stdout


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_torchrun_launcher_mode_runs_in_process(tmp_path):
    report = tmp_path / "r.json"
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", "-m", "pytest", "-p",
                           "no:cacheprovider", str(DATA / "torchrun_case.py"), f"--zero3-report={report}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("ZeRO-3 conformance") == 1  # only rank 0 prints the summary
    assert '"outcome": "pass"' in report.read_text()


def test_stuck_forkserver_preload_is_a_reported_failure_not_a_hang(run_pytest):
    run = run_pytest(str(DATA / "stuck_preload_case.py"), "--zero3-timeout=20", timeout=200)
    assert run.returncode == 1, run.stdout
    assert "the forkserver that preloads torch and deepspeed did not become ready within 20 s" in run.stdout
    assert "in _block_forever_at_import" in run.stdout  # its stack shows where it waits
