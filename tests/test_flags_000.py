"""The conformance suite flags the prefetch-skip retention (family 000's known-bad coordinator).

``tests/bad_coordinators/prefetch_skip_retention.py`` is the reference coordinator with the bug of
DeepSpeed issue 7670 put back.  One run of the whole suite against it must report 000-a as FAIL and
nothing outside family 000 that the reference passes: a contract of another family failing would
mean the suite blames the wrong contract (or the known-bad coordinator carries more than one bug).
"""
from pathlib import Path

BAD_COORDINATOR = f"{Path(__file__).parent / 'bad_coordinators' / 'prefetch_skip_retention.py'}:PrefetchSkipRetention"


def test_suite_flags_prefetch_skip_retention_with_000a(run_suite):
    """Why: a contract that misses this bug does not test PR 9003; a contract of another family that
    fails only because of it would send a developer after the wrong fix."""
    run = run_suite(BAD_COORDINATOR, "")
    assert run.report is not None, f"no JSON report; pytest output:\n{run.stdout[-4000:]}"
    outcomes = run.outcomes()
    assert outcomes.get("000-a") == "FAIL", (
        f"000-a should flag the prefetch-skip retention, got {outcomes.get('000-a')!r}; all outcomes: {outcomes}\n"
        f"{run.stdout[-4000:]}")
    elsewhere = {cid: out for cid, out in outcomes.items() if not cid.startswith("000-")}
    assert "pass" in elsewhere.values(), (
        f"no contract outside family 000 passed, so none was really checked: {outcomes}")
    failed_elsewhere = sorted(cid for cid, out in elsewhere.items() if out == "FAIL")
    assert not failed_elsewhere, (f"contracts outside family 000 fail on a coordinator whose only bug is the "
                                  f"prefetch-skip retention: {failed_elsewhere}\n{run.stdout[-4000:]}")
