"""The verdict against a baseline (``--zero3-baseline=SPEC``): what a fork changes against upstream.

Before the candidate's contracts run, the same pytest run (its arguments and its ini file, so the same
tests, ``--zero3-select``, profiles, config overlay, world size and timeouts) runs once against the
baseline in a subprocess that writes a JSON report.  Each contract that fails there becomes an
:class:`~pytest_zero3.expectations.Expectation` of the problems it had there (their keys, the measured
values left out), which the expectations machinery makes a non-strict ``xfail`` on the candidate.
pytest then makes every outcome:

* passes on the baseline, fails on the candidate: a plain failure, a **regression** (exit 1);
* fails on both with only the baseline's problems: XFAIL, no news; with a problem the baseline does not
  have: a failure, a **regression** too;
* fails on the baseline, passes on the candidate: XPASS, an **improvement** (exit 0).

Only a failure of the baseline is expected: a contract it could not judge (unsupported, skipped, a world
that did not form) expects nothing, so a candidate failure there fails the run too.  An entry of
``--zero3-expect`` wins over the baseline's for its contract.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from typing import Callable

import pytest

from pytest_zero3 import expectations, options
from pytest_zero3.outcome import Outcome

#: The candidate's options that the baseline run does not share: it runs another implementation, with no
#: expectations, no baseline of its own, and reports only to the file the verdict reads.
NOT_SHARED = ("impl", "baseline", "expect", "strict", "report", "report_md")
#: ini settings the baseline run must not read from the shared ini file (its command line sets the rest).
_INI_RESET = ("zero3_baseline=", "zero3_expect=", "zero3_strict=false", "zero3_report_md=")
#: Verdict words of a contract whose outcome differs between baseline and candidate.
REGRESSION, IMPROVEMENT, CHANGED = "regression", "improvement", "changed"
_PASSED = {Outcome.PASS.value, Outcome.UNEXPECTED_PASS.value}
_FAILED = {Outcome.FAIL.value, Outcome.KNOWN_FAILURE.value}
#: Lines of the baseline run's output shown when it gives no verdict.
TAIL = 40


def label(spec) -> str:
    """How reasons and tables name the baseline: its SPEC as given."""
    return spec.text


def shared_args(args) -> list:
    """``args`` without the options of :data:`NOT_SHARED` (``--opt=value``, ``--opt value`` and switches)."""
    own = {o.flag: o.switch for o in options.OPTIONS if o.name in NOT_SHARED}
    out, skip = [], False
    for arg in map(str, args):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in own:
            skip = "=" not in arg and not own[name]  # its value is the next argument
            continue
        out.append(arg)
    return out


def pytest_command(args) -> list:
    """A pytest of this interpreter with ``args``, the working directory not on its import path
    (``python -m pytest`` puts it first: in a fork's root, the fork's ``deepspeed`` would shadow the
    implementation the run asks for)."""
    start = "import sys; del sys.path[0]; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    return [sys.executable, "-c", start, *args]


def command(config, spec, report_path: str) -> list:
    """The baseline run: the candidate's pytest command with the baseline as implementation."""
    resets = [part for reset in _INI_RESET for part in ("-o", reset)]
    return pytest_command(
        [
            *shared_args(config.invocation_params.args),
            f"--zero3-impl={spec.text}",  # the same working directory: a relative path means the same
            f"--zero3-report={report_path}",
            *resets,
        ]
    )


def run(config, spec, directory: str, write_line: Callable[[str], None], drop_env=()) -> dict:
    """Run the baseline; return its report (the JSON document ``--zero3-report`` writes), saved as
    ``directory/baseline.json``.  :class:`pytest.UsageError` when the run gives no verdict.

    ``drop_env``: variables this session set for the candidate (its extension directory), which the
    baseline run sets for itself."""
    path = os.path.join(directory, "baseline.json")
    argv = command(config, spec, path)
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    if env.get("PYTEST_ADDOPTS"):
        env["PYTEST_ADDOPTS"] = shlex.join(shared_args(shlex.split(env["PYTEST_ADDOPTS"])))
    write_line(f"zero3: running the baseline {label(spec)} first (the same contracts; --zero3-baseline)")
    began = time.monotonic()
    proc = subprocess.run(
        argv,
        cwd=str(config.invocation_params.dir),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - began
    judged = proc.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
    doc = read(path) if judged else None
    if doc is None:
        tail = "\n".join(proc.stdout.rstrip().splitlines()[-TAIL:])
        raise pytest.UsageError(
            f"--zero3-baseline={spec.text}: the baseline run gave no verdict (pytest exit status "
            f"{proc.returncode}; its output ends below), so the candidate is not judged against it. Fix what "
            f"it reports, or run without --zero3-baseline.\n{tail}"
        )
    doc["baseline_run"] = {"exit_status": proc.returncode, "duration": round(seconds, 1), "command": shlex.join(argv)}
    with open(path, "w") as fh:
        json.dump(doc, fh)
    counts = doc.get("summary", {})
    shown = ", ".join(f"{counts[o.value]} {o.label}" for o in Outcome if counts.get(o.value))
    write_line(f"zero3: baseline {label(spec)}: {shown or 'no contract ran'} in {seconds:.0f} s")
    return doc


def read(path) -> dict | None:
    """The JSON report (``--zero3-report``) a pytest run wrote at ``path``, as a dict, or None when there is
    none (the run wrote no report)."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("contracts"), list) else None


def load(path: str) -> dict:
    """The baseline report a controller saved with :func:`run` (read by pytest-xdist workers)."""
    doc = read(path)
    if doc is None:
        raise pytest.UsageError(f"--zero3-baseline: the baseline's results at {path} are gone or unreadable.")
    return doc


def expected_failures(doc: dict, spec_text: str) -> dict:
    """``{contract_id: Expectation}``: each contract that failed on the baseline, expected to fail with
    the problems it has there and no other (its report's ``problems``, each a key that leaves the
    measured values out): a problem of the candidate's that the baseline does not have is a regression,
    also inside a contract that fails on both.  A baseline report without problems expects any failure."""
    out = {}
    for row in doc["contracts"]:
        if row.get("outcome") == Outcome.FAIL.value:
            why = (row.get("reason") or "failed").splitlines()[0]
            why = why if len(why) <= 200 else why[:199] + "…"
            keys = row.get("problems") or []
            out[row["id"]] = expectations.Expectation(
                f"fails on the baseline {spec_text}: {why}",
                keys=frozenset(keys),
                source="--zero3-baseline",
            )
    return out


def rows(doc: dict | None) -> dict:
    """``{contract_id: row}`` of the baseline's report (empty without a baseline)."""
    return {row["id"]: row for row in doc["contracts"]} if doc else {}


def verdict(candidate: str, base: str | None, new_problems: bool = False) -> str:
    """How the candidate's outcome differs from the baseline's: :data:`REGRESSION` (passes there, fails
    here, or fails on both with a problem the baseline does not have: ``new_problems``),
    :data:`IMPROVEMENT` (the other way round), :data:`CHANGED` (another difference, e.g. a pass turned
    unsupported), "" when they agree or either did not run."""
    if base is None or Outcome.NOT_RUN.value in (candidate, base):
        return ""
    if base in _PASSED and candidate in _FAILED:
        return REGRESSION
    if new_problems and base in _FAILED and candidate == Outcome.FAIL.value:
        return REGRESSION
    if base in _FAILED and candidate in _PASSED:
        return IMPROVEMENT

    def kind(outcome: str) -> str:
        return "pass" if outcome in _PASSED else "fail" if outcome in _FAILED else outcome

    return CHANGED if kind(candidate) != kind(base) else ""
