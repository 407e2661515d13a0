"""``zero3-conformance bisect GOOD BAD`` (issue 22): the commit of a fork that broke a contract, and
the exit codes ``git bisect run`` reads (0 good, 1 a contract failed, 125 cannot be judged).

Cost: one bisect over a four-commit fork history (two suite runs of one cheap contract), one
per-commit step that stops at its usage error (no world), and in-process checks.
"""

import os
import subprocess
import sys

import pytest
from forks import BREAK_002A, copy_installed_deepspeed, edit

from pytest_zero3 import gitbisect

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Fork Maintainer",
    "GIT_AUTHOR_EMAIL": "maintainer@example.com",
    "GIT_COMMITTER_NAME": "Fork Maintainer",
    "GIT_COMMITTER_EMAIL": "maintainer@example.com",
}


def _git(repo, *args) -> str:
    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo, message) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _cli(repo, *args, timeout=900):
    # this process's environment (git bisect makes no commit): the bisect steps' pytests then fork their
    # forkservers from the zygote these tests share (spawner.share_zygote)
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    return subprocess.run(
        [sys.executable, "-m", "pytest_zero3.cli", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_bisect_names_the_commit_that_broke_the_contract(tmp_path, warm_forkserver):
    """Why: "which commit broke 002-a?" is the fork maintainer's next question after a red gate."""
    repo = tmp_path / "fork"
    copy_installed_deepspeed(str(repo))
    _git(repo, "init", "-q")
    good = _commit(repo, "deepspeed 0.19.8")
    (repo / "NOTES.md").write_text("fork notes\n")
    _commit(repo, "notes")
    edit(str(repo), *BREAK_002A)
    breaking = _commit(repo, "coordinator: simpler recompute check")
    (repo / "NOTES.md").write_text("fork notes\nmore\n")
    bad = _commit(repo, "more notes")

    proc = _cli(repo, "bisect", good, bad, "--zero3-select=002-a", "-p", "no:cacheprovider")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"zero3 bisect: first bad commit: {breaking} ({breaking[:7]}" in out, out[-6000:]
    assert "coordinator: simpler recompute check)" in out
    assert "zero3 bisect-step: " in out and ": bad (a contract failed)" in out
    assert _git(repo, "rev-parse", "HEAD") == bad  # git bisect reset: the checkout is back
    assert _git(repo, "for-each-ref", "refs/bisect") == ""


def test_a_commit_that_cannot_be_judged_exits_125(tmp_path):
    """A commit where the suite cannot run (here: before the fork had a deepspeed package, a usage
    error) is one git bisect must skip, not call bad."""
    repo = tmp_path / "early"
    repo.mkdir()
    (repo / "README.md").write_text("before the package\n")
    _git(repo, "init", "-q")
    commit = _commit(repo, "start")
    proc = _cli(repo, "bisect-step", "--zero3-select=002-a", "-p", "no:cacheprovider", timeout=120)
    assert proc.returncode == 125, proc.stdout + proc.stderr
    assert "has no 'deepspeed/__init__.py'" in proc.stderr
    assert f"zero3 bisect-step: {commit[:7]}" in proc.stdout and "cannot be judged" in proc.stdout


def _doc(*outcomes):
    return {"contracts": [{"id": f"900-{i}", "outcome": o} for i, o in enumerate(outcomes)]}


@pytest.mark.parametrize(
    "returncode, doc, code",
    [
        (0, _doc("pass"), 0),
        (0, _doc("pass", "known_failure", "unsupported"), 0),
        (1, _doc("fail", "pass"), 1),
        (1, _doc("fail", "world_error"), 1),  # a failure is a verdict, whatever else happened
        (1, _doc("unexpected_pass"), 1),  # --zero3-strict: a listed contract that passes fails the run
        (1, _doc("world_error", "pass"), 125),  # the world never formed: no verdict on that contract
        (0, _doc("unsupported", "skipped"), 125),  # every selected contract unsupported or skipped
        (0, _doc("not_run"), 125),
        (0, _doc(), 125),
        (4, None, 125),  # usage error
        (2, None, 125),  # interrupted: an import failure at collection
        (3, _doc("pass"), 125),  # internal error
        (5, _doc(), 125),  # no test collected
        (1, None, 125),  # no report written
        (-9, None, 125),  # killed
    ],
)
def test_the_exit_status_git_bisect_run_reads(returncode, doc, code):
    assert gitbisect.exit_status(returncode, doc) == code


def test_bisect_usage_errors_name_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert gitbisect.bisect(["--zero3-select=002-a"]) == 4
    assert "zero3-conformance bisect GOOD BAD" in capsys.readouterr().err
    assert gitbisect.bisect(["v1", "v2"]) == 4
    assert "inside the fork's git checkout" in capsys.readouterr().err
    (tmp_path / "f.txt").write_text("one\n")
    _git(tmp_path, "init", "-q")
    first = _commit(tmp_path, "one")
    (tmp_path / "f.txt").write_text("changed\n")
    assert gitbisect.bisect([first, "HEAD"]) == 4
    assert "local changes" in capsys.readouterr().err
    _commit(tmp_path, "two")
    assert gitbisect.bisect([first, "nosuchref"]) == 4
    assert "'nosuchref' is no commit" in capsys.readouterr().err
