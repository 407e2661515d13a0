"""The verdict against upstream (issue 22): ``--zero3-baseline=SPEC`` runs the same contracts on the
baseline first, and only a regression (passes there, fails here) fails the run.

Cost: two fork runs of two cheap contracts (each a baseline pytest and the candidate's, ~15 s of
worlds and imports each on a quiet 2-core box), and in-process checks that start no world.
"""

import importlib.util
import re

import pytest
from forks import BREAK_002A, FIX_001A

from conftest import ROOT
from pytest_zero3 import baseline

USAGE = pytest.ExitCode.USAGE_ERROR


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    """Copies of the installed deepspeed 0.19.8: unchanged (an upstream checkout), with 001-a fixed,
    and with 001-a fixed and 002-a broken."""
    from forks import ForkCache

    return ForkCache(
        tmp_path_factory,
        {"upstream": [], "fixed": FIX_001A, "fixed_and_broken": [*FIX_001A, BREAK_002A]},
    )


def _schema_problems(doc):
    spec = importlib.util.spec_from_file_location("render_matrix", ROOT / "scripts" / "render_matrix.py")
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    return render.validate(doc, render.schema())


@pytest.mark.slow
def test_a_fork_with_one_fix_and_one_break_shows_the_improvement_and_fails_on_the_regression_only(
    run_suite, forks, tmp_path
):
    """Why: a fork maintainer asks what the fork changes against upstream; the gate must go red for
    the contract it broke, and show, not hide, the one it fixed (stock 0.19.8 fails 001-a)."""
    md = tmp_path / "verdict.md"
    run = run_suite(forks("fixed_and_broken"), "001-a,002-a", "--zero3-baseline=installed", f"--zero3-report-md={md}")
    assert run.returncode == 1, run.stdout[-4000:]
    assert run.outcomes() == {"001-a": "unexpected_pass", "002-a": "fail"}, run.stdout[-4000:]
    rows = {c["id"]: c for c in run.report["contracts"]}
    assert rows["001-a"]["verdict"] == "improvement" and rows["001-a"]["baseline"]["outcome"] == "fail"
    assert rows["002-a"]["verdict"] == "regression" and rows["002-a"]["baseline"]["outcome"] == "pass"
    assert rows["001-a"]["reason"].startswith("fails on the baseline installed: AssertionError")
    base = run.report["baseline"]
    assert base["implementation"]["spec"] == "installed" and base["run"]["exit_status"] == 1
    assert base["verdict"] == {"regression": 1, "improvement": 1, "changed": 0}
    assert _schema_problems(run.report) == []
    out = run.stdout
    assert "zero3: running the baseline installed first" in out
    assert "against the baseline installed: 1 regression (002-a), 1 improvement (001-a)" in out
    assert re.search(r"=+ 1 failed, \d+ deselected, 1 xpassed in", out)  # pytest made the outcomes: FAIL and XPASS
    assert "zero3: baseline=installed (installed deepspeed), judged against it" in out  # the header
    text = md.read_text()
    assert "| candidate | baseline | change |" in text and "| **FAIL** | pass | **regression** |" in text


@pytest.mark.slow
def test_a_fork_with_only_the_fix_passes_against_an_upstream_checkout(run_suite, forks):
    """Why: a fork that only fixes passes its gate with no expectations file; the baseline may be a
    checkout (DIR) as well as the installed package."""
    upstream = forks("upstream")
    run = run_suite(forks("fixed"), "001-a", f"--zero3-baseline={upstream}")
    assert run.returncode == 0, run.stdout[-4000:]
    assert run.outcomes() == {"001-a": "unexpected_pass"}
    (row,) = run.report["contracts"]
    assert row["verdict"] == "improvement"
    assert run.report["baseline"]["implementation"]["deepspeed_path"] == f"{upstream}/deepspeed"
    assert f"against the baseline {upstream}: 1 improvement (001-a)" in run.stdout


def test_a_bad_baseline_is_a_usage_error_before_anything_runs(pytester, tmp_path):
    """Why: the error names the option and the fix, before a baseline or a world starts."""
    pytester.makepyfile(test_trivial="def test_one():\n    pass\n")
    result = pytester.runpytest_inprocess("test_trivial.py", f"--zero3-baseline={tmp_path}")
    assert result.ret == USAGE, result.outlines
    assert f"--zero3-baseline='{tmp_path}': directory has no 'deepspeed/__init__.py'" in result.stderr.str()
    assert "running the baseline" not in result.stdout.str()


def test_the_baseline_run_shares_the_selection_but_not_the_candidate_s_own_options(pytester):
    """The baseline run gets the candidate's arguments (tests, -k, --zero3-select, profiles, world size)
    without the options that are the candidate's alone; its own impl and report come last."""
    args = [
        "conformance",
        "--zero3-impl",
        "/fork",
        "--zero3-select=001-a",
        "--zero3-expect=e.toml",
        "--zero3-strict",
        "--zero3-baseline=installed",
        "--zero3-report",
        "r.json",
        "--zero3-report-md=r.md",
        "-k",
        "not slow",
        "--zero3-world-size=3",
    ]
    assert baseline.shared_args(args) == [
        "conformance",
        "--zero3-select=001-a",
        "-k",
        "not slow",
        "--zero3-world-size=3",
    ]


@pytest.mark.parametrize(
    "candidate, base, verdict",
    [
        ("fail", "pass", "regression"),
        ("known_failure", "pass", "regression"),  # listed in the expectations file: still a regression
        ("unexpected_pass", "fail", "improvement"),
        ("pass", "fail", "improvement"),
        ("known_failure", "fail", ""),
        ("pass", "pass", ""),
        ("unsupported", "pass", "changed"),
        ("fail", "unsupported", "changed"),
        ("world_error", "pass", "changed"),
        ("not_run", "fail", ""),
        ("fail", None, ""),
    ],
)
def test_the_verdict_of_each_pair_of_outcomes(candidate, base, verdict):
    assert baseline.verdict(candidate, base) == verdict


def test_only_the_baseline_s_failures_are_expected():
    """A contract the baseline could not judge expects nothing: failing it here fails the run."""
    doc = {
        "contracts": [
            {"id": "001-a", "outcome": "fail", "reason": "AssertionError: leaked\nmore"},
            {"id": "003-a", "outcome": "unsupported", "reason": "config rejects the keys"},
            {"id": "base-a", "outcome": "world_error", "reason": "rank 1 unformed"},
            {"id": "002-a", "outcome": "pass", "reason": ""},
        ]
    }
    expected = baseline.expected_failures(doc, "installed")
    assert list(expected) == ["001-a"]
    assert expected["001-a"].reason == "fails on the baseline installed: AssertionError: leaked"
    assert not expected["001-a"].from_file and expected["001-a"].cause == ""  # any failure, never strict
    assert baseline.rows(doc)["003-a"] is doc["contracts"][1]


def test_a_problem_the_baseline_does_not_have_is_a_regression_inside_a_contract_failing_on_both():
    """Issue 53: the baseline's failure explains the problems it had, by their keys (the measured values
    left out), and no other: a second problem on the fork fails the run, and the verdict says regression."""
    from pytest_zero3.fixtures import verdicts

    from pytest_zero3 import expectations

    def failure(*lines):
        try:
            verdicts.assert_clean([list(lines)], "tensor-fragment writes (offload)")
        except AssertionError as exc:
            return exc
        raise AssertionError("assert_clean passed")

    there = failure(
        "step 3: safe_set_full_grad(mid.bias) raised RuntimeError: start (4) + length (4) exceeds",
        "after step 3: safe_get_full_fp32_param of mid.weight: 45 of 91 elements differ; rel 0.0391",
    )
    keys = [expectations.problem_key(p) for p in expectations.problems(there)]
    assert "mid.weight: <value> differ; rel <value>" in keys[1] and "step 3" in keys[1]  # where stays, values go
    doc = {"contracts": [{"id": "008-b", "outcome": "fail", "reason": "AssertionError", "problems": keys}]}
    entry = baseline.expected_failures(doc, "installed")["008-b"]
    assert entry.cause == "has only the 2 problem(s) it has on the baseline"
    same = failure(
        "step 3: safe_set_full_grad(mid.bias) raised RuntimeError: start (4) + length (4) exceeds",
        "after step 3: safe_get_full_fp32_param of mid.weight: 46 of 91 elements differ; rel 0.315",
    )
    assert entry.matches(same)  # other values, the same problems: no news
    new = failure(
        "step 3: safe_set_full_grad(mid.bias) raised RuntimeError: start (4) + length (4) exceeds",
        "after step 1: engine.get_global_grad_norm() is 0.33, the twin's norm before clipping 0.56",
    )
    assert entry.unexplained(new) == [expectations.problems(new)[1]]
    assert baseline.verdict("fail", "fail", new_problems=True) == "regression"
    assert baseline.verdict("fail", "fail") == ""


def test_a_record_is_judged_by_what_was_checked_and_where_not_by_its_values():
    """Issue 53 item 1: a problem is a record, its key the check and its places (variant, step, param,
    rank); the values stay in its text.  A masked text kept the first differing element's index; the
    record's key does not, and it survives the rank boundary (pickle), the merge of ranks and the
    assertion's subject."""
    import pickle

    from pytest_zero3.fixtures import verdicts

    from pytest_zero3 import expectations

    def differs(step, first, rel):
        text = (
            f"step {step}: gradient of 0.weight: 3 of 16 elements differ from the twin's; first at {first}: rel {rel}"
        )
        return verdicts.record(text, "values differ from the twin's", at=f"step {step}: gradient of 0.weight")

    def failure(*per_rank):
        try:
            verdicts.assert_clean([pickle.loads(pickle.dumps(lines)) for lines in per_rank], "reads (offload)")
        except AssertionError as exc:
            return exc
        raise AssertionError("assert_clean passed")

    there = failure([differs(2, 5, 0.1)], [differs(2, 5, 0.1)])
    (problem,) = expectations.problems(there)
    assert problem.startswith("reads (offload):\n  ranks 0, 1: step 2: gradient of 0.weight")
    key = expectations.problem_key(problem)
    assert key == "values differ from the twin's | what=reads (offload) | at=step 2: gradient of 0.weight | rank=0, 1"
    doc = {"contracts": [{"id": "008-a", "outcome": "fail", "reason": "AssertionError", "problems": [key]}]}
    entry = baseline.expected_failures(doc, "installed")["008-a"]
    assert entry.matches(failure([differs(2, 11, 0.7)], [differs(2, 9, 0.3)]))  # other values: no news
    later = failure([differs(3, 5, 0.1)], [differs(3, 5, 0.1)])
    assert entry.unexplained(later) == expectations.problems(later)  # another step: a new problem
    one_rank = failure([differs(2, 5, 0.1)], [])
    assert entry.unexplained(one_rank) == expectations.problems(one_rank)  # another set of ranks
