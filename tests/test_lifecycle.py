"""Process lifecycle: no orphans after SIGTERM, pytest -n, torchrun launcher mode (issue: foundation §3)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


@pytest.fixture
def short_temp():
    """A temp dir with a short path: multiprocessing's unix sockets live under TMPDIR, and a socket path
    over 107 bytes (pytest's tmp_path under xdist is that long) cannot be bound."""
    path = tempfile.mkdtemp(prefix="z3-")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _start_hanging_session(tmp_path, temp, held=False):
    """pytest on a scenario that blocks on both ranks, in its own temp dir; returns it once both ranks
    run, with the pids of the ranks and of every process pytest started (forkserver, resource tracker;
    ``held``: the zygote too)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    if temp is not None:  # its own temp dir: an environment no shared zygote was started under
        env.update(TMPDIR=str(temp), ZERO3_MARKER_DIR=str(markers))
    plugin = ("-p", "held_plugin") if held else ()
    if held:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(DATA), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            *plugin,
            str(DATA / "hang_case.py"),
            "--zero3-timeout=600",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # generous for a loaded box; a pytest that ended meanwhile fails at once, with its output
        _wait_for(lambda: len(list(markers.iterdir())) == 2 or proc.poll() is not None, 600, "both ranks to start")
        assert proc.poll() is None, "pytest ended before both ranks started"
        ranks = [int(p.name.split("-")[1]) for p in markers.iterdir()]
        forkserver = int((markers / f"rank-{ranks[0]}").read_text())
        descendants = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        if temp is None:  # forked from the shared zygote: not pytest's descendants
            return proc, set(ranks) | {forkserver}, None
        assert set(ranks) | {forkserver} <= descendants
    except BaseException:
        proc.kill()
        out = proc.communicate()[0]
        print(f"pytest's output:\n{out[-4000:]}")  # shown with the failure
        raise
    return proc, descendants, temp


def _depth(process) -> int:
    return max((1 + _depth(child) for child in process.children()), default=0)


def _running(pid) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _session_files(temp):
    return sorted(p.name for p in temp.iterdir() if p.name.startswith("pytest-zero3-"))


def test_no_rank_or_forkserver_outlives_sigterm_of_pytest(tmp_path, short_temp):
    proc, descendants, temp = _start_hanging_session(tmp_path, short_temp)
    assert _session_files(temp) == [f"pytest-zero3-{os.getuid()}-{proc.pid}"]
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _wait_for(lambda: not any(map(_running, descendants)), 20, "every rank and the forkserver to exit")
    assert "KeyboardInterrupt" in out or "SIGTERM" in out
    assert _session_files(temp) == []  # its temp files went with it


@pytest.mark.slow  # a pytest of its own, whose forkserver imports torch and deepspeed: about 30 s
@pytest.mark.parametrize("held", [False, True], ids=["forkserver", "zygote"])
def test_no_rank_forkserver_or_tracker_outlives_sigkill_of_pytest(tmp_path, short_temp, held):
    """SIGKILL (a CI job past its limit, the OOM killer) leaves pytest no chance to clean up: the ranks,
    the forkserver (and the zygote it was forked from, in a process that holds its forkservers) and
    multiprocessing's resource tracker must still go, within 10 s; the session's temp files are
    removed by the next session (by its pid being gone)."""
    from pytest_zero3 import spawner

    proc, descendants, temp = _start_hanging_session(tmp_path, short_temp, held)
    # pytest -> forkserver -> ranks; held: pytest -> zygote -> forkserver -> ranks
    assert _depth(psutil.Process(proc.pid)) == (3 if held else 2)
    proc.kill()
    proc.wait(timeout=10)
    _wait_for(lambda: not any(map(_running, descendants)), 10, "every rank, the forkserver and the tracker to exit")
    left = _session_files(temp)
    assert left == [f"pytest-zero3-{os.getuid()}-{proc.pid}"]
    live = temp / f"pytest-zero3-{os.getuid()}-{os.getpid()}"  # a live session's (this one's pid) is kept
    live.mkdir()
    assert spawner.remove_leftovers(str(temp)) == [str(temp / left[0])]  # what a session does at its first world
    assert _session_files(temp) == [live.name]


@pytest.mark.slow
def test_sigkill_of_a_pytest_using_a_shared_zygote_takes_its_forkserver_and_ranks_along(tmp_path, warm_forkserver):
    """A pytest started where a zygote is shared (``spawner.share_zygote``, as these tests do) forks its
    forkserver from that zygote, another process's child: SIGKILL of that pytest still ends its
    forkserver and ranks within 10 s (the forkserver watches its requester), and the zygote lives on."""
    from pytest_zero3 import zygote

    zygote_pid = int(os.environ[zygote.ENV_VAR].split("|")[1])
    proc, processes, _ = _start_hanging_session(tmp_path, None)
    ranks = processes - {p for p in processes if psutil.Process(p).ppid() == zygote_pid}
    assert len(ranks) == 2 and len(processes) == 3, (processes, zygote_pid)  # 2 ranks, their forkserver
    proc.kill()
    proc.wait(timeout=10)
    _wait_for(lambda: not any(map(_running, processes)), 10, "the ranks and their forkserver to exit")
    assert _running(zygote_pid)


def test_pytest_xdist_workers_run_worlds_side_by_side(run_pytest, tmp_path):
    """Two workers' worlds at once; the workers' forkservers load their job once: the first worker's is
    the zygote's child, the other's is forked from it (its deepspeed, preloads and warm-ups loaded)."""
    # an empty PYTEST_ZERO3_ZYGOTE: this process's shared zygote is not offered, so the controller
    # starts one for its workers
    log = tmp_path / "forkservers.txt"
    run = run_pytest(
        str(DATA / "two_worlds_case.py"),
        "-n",
        "2",
        "--zero3-impl=installed",
        env={"PYTEST_ZERO3_ZYGOTE": "", "ZERO3_CASE_LOG": str(log)},
    )
    assert run.returncode == 0, run.stdout
    assert "4 passed" in run.stdout
    # each line: the zygote, the world's forkserver, its parent, its grandparent
    forkservers = {
        int(fs): (int(parent), int(grand), int(zygote))
        for zygote, fs, parent, grand in map(str.split, log.read_text().splitlines())
    }
    assert len(forkservers) == 2, forkservers  # one per worker
    loaded = [fs for fs, (parent, _, zygote) in forkservers.items() if parent == zygote]
    assert len(loaded) == 1, forkservers  # one loaded from the zygote ...
    (other,) = set(forkservers) - set(loaded)
    assert forkservers[other][0] == loaded[0], forkservers  # ... the other forked from it


def _torchrun(tmp_path, case, *args, timeout=300, env=None):
    # PYTHONPATH: the plugin of this checkout, not whichever one is installed (cwd is not the checkout)
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **(env or {}),
    )
    start = time.monotonic()
    proc = subprocess.run(
        [
            "torchrun",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            str(DATA / case),
            *args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


needs_torchrun = pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")


@needs_torchrun
def test_torchrun_launcher_mode_every_ending_is_every_ranks_outcome(tmp_path):
    """One torchrun world for every way a scenario can end on rank 1 (see tests/data/torchrun_case.py):
    both ranks pass every test only if both saw the same per-rank verdicts, within the timeouts, and
    stayed in step for the tests after each failure."""
    report = tmp_path / "r.json"
    rc, out, _ = _torchrun(tmp_path, "torchrun_case.py", f"--zero3-report={report}", "--zero3-timeout=120")
    assert rc == 0, out
    assert out.count("14 passed") == 2, out  # on both ranks
    assert out.count("ZeRO-3 conformance") == 1  # only rank 0 prints the summary
    assert '"outcome": "pass"' in report.read_text()


@needs_torchrun
@pytest.mark.slow  # two pytest processes under torchrun: about 60 s
def test_torchrun_rank_zero_reports_whatever_failed_on_which_rank(tmp_path):
    """A test failing on rank 1 only, a rank stuck where the watchdog cannot reach, a fresh (empty)
    extensions cache, and process groups that fail to form: rank 0 prints the table and writes the
    report, the stuck rank's stack is in the failure, no op is compiled, a group that failed to form
    is formed again, and one that never forms is a world error (tests/data/torchrun_report_case.py)."""
    report, extensions = tmp_path / "r.json", tmp_path / "extensions"
    rc, out, _ = _torchrun(
        tmp_path,
        "torchrun_report_case.py",
        f"--zero3-report={report}",
        "--zero3-timeout=60",
        env={"TORCH_EXTENSIONS_DIR": str(extensions)},
    )
    assert rc != 0, out
    assert out.count("ZeRO-3 conformance") == 1, out  # rank 0's table
    assert "LauncherStopped: " not in out and "PluggyTeardownRaisedWarning" not in out, out
    assert "zero3: rank 1 ended its session with exit status 1" in out, out
    rows = {c["id"]: c for c in json.loads(report.read_text())["contracts"]}
    assert {cid: row["outcome"] for cid, row in rows.items()} == {
        "990-a": "pass",
        "990-b": "pass",
        "990-c": "fail",
        "990-d": "pass",  # a try that did not form was dropped by both ranks and tried again
        "990-e": "world_error",  # never formed: no verdict, counted apart from failures
    }
    assert "process group did not form in 3 tries" in rows["990-e"]["message"], rows["990-e"]
    stuck = rows["990-c"]["ranks"][1]
    assert stuck["status"] == "hung" and "in stuck_where_no_signal_reaches" in stuck["traceback"], stuck
    assert not list(extensions.rglob("*.so")), list(extensions.rglob("*"))


@needs_torchrun
def test_torchrun_rank_process_exit_stops_the_others_with_the_reason(tmp_path):
    """A rank whose process ends (os._exit) cannot report; the others must not wait for the timeout."""
    rc, out, took = _torchrun(tmp_path, "torchrun_exit_case.py", "--zero3-timeout=600")
    assert rc != 0, out
    assert "exitcode  : 7" in out, out  # the launcher names the rank that ended
    assert "LauncherStopped: pytest on rank 0 received SIGTERM from the launcher" in out, out
    assert took < 300, out


def test_stuck_forkserver_preload_is_a_reported_failure_not_a_hang(run_pytest):
    # 15 s: the user's preloads come first, so it blocks a second or two after the forkserver starts
    run = run_pytest(
        str(DATA / "stuck_preload_case.py"), "--zero3-timeout=5", "--zero3-startup-timeout=15", timeout=300
    )
    assert run.returncode == 1, run.stdout
    assert (
        "the forkserver that preloads torch and deepspeed did not become ready within 15 s (its start-up "
        "budget, separate from the scenario timeout: raise it with --zero3-startup-timeout=SECONDS)"
    ) in run.stdout
    assert "in _block_forever_at_import" in run.stdout  # its stack shows where it waits
    # The next session of this process (run_pytest runs it here, on the forkserver kept warm between
    # sessions) starts a forkserver of its own preloads, not a restart of the stuck one.
    after = run_pytest(str(DATA / "identity_case.py"), "--zero3-startup-timeout=120")
    assert after.returncode == 0, after.stdout


def test_forkserver_start_up_does_not_count_against_the_scenario_timeout(run_pytest):
    """A preload of 8 s (plus deepspeed) under a 4 s scenario timeout: the test passes.  The knob is a
    ``PYTEST_`` variable, which zygotes are not keyed by, so the forkserver forks from the shared one."""
    run = run_pytest(
        str(DATA / "slow_preload_case.py"),
        "--zero3-timeout=4",
        env={"PYTEST_ZERO3_SLOW_IMPORT_SECONDS": "8"},
        timeout=300,
    )
    assert run.returncode == 0, run.stdout
    assert "1 passed" in run.stdout
