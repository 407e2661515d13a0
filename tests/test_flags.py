"""The suite flags each known-bad coordinator with the right contract IDs (the table: tests/flags.py).

Each coordinator in tests/bad_coordinators/ is the reference with one historical bug put back.  Two
proofs per entry, at two costs:

* **bites** (every run, CI): the suite run on just the entry's flagged contracts fails each of them;
  a rule contract is judged on the anchors that catch the bug (``Case.anchors``, replayed), not on all
  of them.  A contract that misses its bug proves nothing.  About 3-15 s per entry.
* **only its own** (``--proofs``, ``scripts/proofs.sh``): the suite run on the entry's whole selection
  fails exactly the flagged IDs (plus only those listed as may-fail), runs every contract it selected,
  and passes at least one other contract.  One that fails for another contract's bug sends a developer
  after the wrong fix.  30-110 s per entry on the 2-core box, so it runs apart, and the manual's proof
  page (docs/results/proofs.md) records its last result.
"""

import json

import pytest
from flags import ANCHORS_ONLY, CASES, Case
from pytest_zero3.fixtures.pytest_side import rule_anchors

from conftest import BAD


def _run(run_suite, case: Case, select: str, anchors: tuple = ()):
    """The suite on ``case``'s coordinator; rule contracts judged on ``anchors`` only where given (a
    replay of those anchors), else on every anchor and no drawn example."""
    file, cls = case.coordinator.split(":")
    extra = case.extra
    if anchors:
        replay = json.dumps(rule_anchors.named(*anchors))
        extra = (*(a for a in extra if a not in ANCHORS_ONLY), f"--zero3-replay={replay}")
    elif any(cid.startswith("rule-") for cid in select.split(",")) and ANCHORS_ONLY[0] not in extra:
        extra = (*extra, *ANCHORS_ONLY)
    return run_suite(f"{BAD / file}:{cls}", select, *extra)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_flagged_contract_bites(run_suite, case):
    """Why: a contract is proven only by an implementation that breaks it; this is the part of that
    proof cheap enough for every run (the other part, "nothing else fails", is the proof run's)."""
    run = _run(run_suite, case, ",".join(sorted(case.flagged)), case.anchors)
    outcomes = run.outcomes()
    tail = run.stdout[-4000:]
    missed = sorted(cid for cid in case.flagged if outcomes.get(cid) != "fail")
    assert not missed, f"{case.name}: {missed} should FAIL on {case.bug!r}, got {outcomes}\n{tail}"
    assert run.returncode == 1, f"{case.name}: pytest exit {run.returncode}, expected 1 (contract failures)\n{tail}"
    if case.check:
        case.check(run)


@pytest.mark.proof
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_suite_flags_only_its_own_contracts(run_suite, case):
    """Why: "nothing else failed" is what makes a flag point at the right fix."""
    run = _run(run_suite, case, case.select)
    outcomes = run.outcomes()
    tail = run.stdout[-4000:]
    not_run = sorted(cid for cid, out in outcomes.items() if out == "not_run")
    assert not not_run, f"{case.name}: contracts {not_run} did not run: {outcomes}\n{tail}"
    failed = run.failed_ids()
    assert case.flagged <= failed, f"{case.name}: {sorted(case.flagged - failed)} should FAIL, got {outcomes}\n{tail}"
    wrong = sorted(failed - case.flagged - case.may_fail)
    assert not wrong, f"{case.name}: {wrong} FAIL on a coordinator whose only bug is {case.bug!r}: {outcomes}\n{tail}"
    unmoved = sorted(cid for cid in case.must_pass if outcomes.get(cid) != "pass")
    assert not unmoved, f"{case.name}: {unmoved} must pass (the bug cannot show there): {outcomes}\n{tail}"
    others = [cid for cid, out in outcomes.items() if out == "pass" and cid not in case.flagged | case.may_fail]
    assert others, f"{case.name}: no other contract passed, so none was really checked: {outcomes}"
    assert run.returncode == 1, f"{case.name}: pytest exit {run.returncode}, expected 1 (contract failures)"
    if case.check:
        case.check(run)


def test_family_003_unsupported_on_stock_deepspeed(run_suite):
    """Why: deepspeed 0.19.8 rejects the keys; that is a missing feature, not a failed contract, and
    the report must say so with the reason rather than skip silently."""
    from flags import family

    run = run_suite("installed", "003")
    run.outcomes()  # the report must exist
    rows = {c["id"]: c for c in run.report["contracts"]}
    assert sorted(rows) == sorted(family("003")), f"contracts run: {sorted(rows)}\n{run.stdout[-3000:]}"
    wrong = {
        cid: (r["outcome"], r["reason"])
        for cid, r in rows.items()
        if r["outcome"] != "unsupported"
        or not r["reason"].startswith("003:")
        or "stage3_adaptive_prefetch" not in r["reason"]
    }
    assert not wrong, f"stock deepspeed 0.19.8 must be 'unsupported: 003' with the rejected key: {wrong}"
    assert run.returncode == 0, f"pytest exit {run.returncode}: unsupported must not fail the run\n{run.stdout[-3000:]}"
