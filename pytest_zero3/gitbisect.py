"""``zero3-conformance bisect GOOD BAD [pytest args]``: the commit of a DeepSpeed fork that broke a contract.

Run it in the fork's git checkout, usually with one contract selected::

    zero3-conformance bisect v0.19.8 HEAD --zero3-select=002-a

It runs ``git bisect start BAD GOOD``, then ``git bisect run`` with the per-commit command below,
prints the first bad commit, and always ends with ``git bisect reset``.  It exits 0 when it names the
first bad commit, 1 when git could not (e.g. only commits that cannot be judged are left), 4 on a
usage error (not in a git checkout, local changes, GOOD or BAD missing).

The per-commit command, ``zero3-conformance bisect-step [pytest args]`` (for a ``git bisect run`` of
your own), runs the suite against the checked-out commit (``--zero3-impl=`` the checkout's root) and
exits with the codes ``git bisect run`` reads:

* 0: the commit is good: a selected contract ran and none failed (a failure the expectations file
  lists is no failure);
* 1: the commit is bad: a contract failed;
* 125: the commit cannot be judged, git skips it: a usage error, an import failure or any other error
  that stops pytest, no test collected, a world that never formed, or every selected contract
  unsupported, skipped or not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

from pytest_zero3 import baseline
from pytest_zero3.outcome import Outcome

GOOD, BAD, SKIP = 0, 1, 125
USAGE = 4
WORDS = {GOOD: "good", BAD: "bad (a contract failed)", SKIP: "cannot be judged: skipped"}
_JUDGED = {Outcome.PASS.value, Outcome.KNOWN_FAILURE.value, Outcome.UNEXPECTED_PASS.value}
_FIRST_BAD = re.compile(r"^([0-9a-f]{7,64}) is the first bad commit", re.MULTILINE)


def exit_status(returncode: int, doc: dict | None) -> int:
    """What ``git bisect run`` should read from one suite run: its pytest exit status ``returncode``
    and its JSON report ``doc`` (None when it wrote none)."""
    if returncode not in (0, 1) or doc is None:  # interrupted, internal or usage error, nothing collected, a signal
        return SKIP
    outcomes = {row["outcome"] for row in doc["contracts"]}
    if Outcome.FAIL.value in outcomes:
        return BAD
    if Outcome.WORLD_ERROR.value in outcomes:  # no verdict on that contract, and none failed
        return SKIP
    if returncode == 1:  # something else failed: a strict unexpected pass, a test that is no contract
        return BAD
    return GOOD if outcomes & _JUDGED else SKIP


def step(args) -> int:
    """Judge the commit checked out in the working directory's git checkout (see the module's doc)."""
    root = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "--short", "HEAD")
    if root is None or commit is None:
        print("zero3 bisect-step: run it inside the fork's git checkout.", file=sys.stderr)
        return SKIP
    with tempfile.TemporaryDirectory(prefix="zero3-bisect-") as tmp:
        path = os.path.join(tmp, "report.json")
        argv = baseline.pytest_command(
            ["--pyargs", "pytest_zero3.conformance", f"--zero3-impl={root}", *args, f"--zero3-report={path}"]
        )
        proc = subprocess.run(argv, cwd=root, env=_bisect_env(), stdin=subprocess.DEVNULL, check=False)
        code = exit_status(proc.returncode, baseline.read(path))
    print(f"zero3 bisect-step: {commit}: {WORDS[code]} (pytest exit status {proc.returncode})", flush=True)
    return code


def bisect(args) -> int:
    """``GOOD BAD [pytest args]``: find the first bad commit between them (see the module's doc)."""
    if len(args) < 2 or any(a.startswith("-") for a in args[:2]):
        return _usage(
            "give the last good and the first known bad commit: zero3-conformance bisect GOOD BAD [pytest args]"
        )
    good, bad, rest = args[0], args[1], list(args[2:])
    root = _git("rev-parse", "--show-toplevel")
    if root is None:
        return _usage("run it inside the fork's git checkout (git rev-parse found none here).")
    if _git("status", "--porcelain", "--untracked-files=no", cwd=root):
        return _usage(
            "the checkout has local changes, which git bisect would carry across commits: commit or stash them."
        )
    for name in (good, bad):
        if _git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=root) is None:
            return _usage(f"{name!r} is no commit of this checkout.")
    if not any(a.startswith("--zero3-select") for a in rest):
        print("zero3 bisect: no --zero3-select: every commit runs the whole suite and any contract failure is bad.")
    started = subprocess.run(["git", "bisect", "start", bad, good], cwd=root, capture_output=True, text=True)
    if started.returncode != 0:
        return _usage(f"git bisect start {bad} {good} failed: {(started.stderr or started.stdout).strip()}")
    saved = tempfile.NamedTemporaryFile("w", prefix="zero3-bisect-env-", suffix=".json", delete=False)
    with saved:
        json.dump(dict(os.environ), saved)
    try:
        per_commit = [sys.executable, "-c", _STEP, "bisect-step", *rest]
        proc = subprocess.Popen(
            ["git", "bisect", "run", *per_commit],
            cwd=root,
            env=dict(os.environ, **{ENV_FILE: saved.name}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        output = []
        for line in proc.stdout:
            sys.stdout.write(line)
            output.append(line)
        proc.wait()
    finally:
        subprocess.run(["git", "bisect", "reset"], cwd=root, capture_output=True)
        os.unlink(saved.name)
    found = _FIRST_BAD.search("".join(output))
    if found is None:
        print(f"zero3 bisect: git bisect named no first bad commit (git bisect run exit status {proc.returncode}).")
        return 1
    subject = _git("log", "-1", "--format=%h %s", found.group(1), cwd=root)
    print(f"zero3 bisect: first bad commit: {found.group(1)} ({subject})")
    return 0


#: Names the file where ``bisect`` saved its environment for the per-commit runs.
ENV_FILE = "PYTEST_ZERO3_BISECT_ENV"


def _bisect_env() -> dict | None:
    """The environment ``zero3-conformance bisect`` was started in, for the suite run of one commit:
    ``git bisect run`` adds its own variables (``GIT_EXEC_PATH``, ``GIT_PREFIX``, git-core first on
    ``PATH``, ``TEXTDOMAIN``), and each commit should be judged as the user's own pytest would judge it
    (a forkserver forked from a zygote the user's process shares, which only serves the environment it
    loaded torch under).  None (git's environment) for a ``git bisect run`` of the user's own."""
    path = os.environ.get(ENV_FILE)
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


#: The per-commit command's start: the working directory (the fork's root) is not on the import path.
_STEP = "import sys; del sys.path[0]; from pytest_zero3.cli import main; sys.exit(main())"


def _usage(message: str) -> int:
    print(f"zero3 bisect: {message}", file=sys.stderr)
    return USAGE


def _git(*args, cwd=None) -> str | None:
    """``git args`` output, stripped; None when git fails."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None
