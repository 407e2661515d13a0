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


IGNORES_REUSE_DISTANCE = f"{Path(__file__).parent / 'bad_coordinators' / 'ignores_reuse_distance.py'}:IgnoresReuseDistance"
#: Measured: every family-000 contract that configures a non-zero distance fails.  000-b (default 1e9:
#: each param is gathered again in backward), 000-d (a window of 2.5 layers keeps nothing) and 000-e
#: (its window of a few layers, around a z3 leaf or a container, keeps nothing either: forcing 0
#: breaks the window before the leaf-flag scan can matter).  000-a, 000-c and 000-f already run at
#: distance 0 and 000-g compares losses only, so they pass.
IGNORES_REUSE_DISTANCE_FLAGS = {"000-b", "000-d", "000-e"}


def test_family_000_flags_ignored_reuse_distance(run_suite):
    """Why: the fix of PR 9003 must not turn into "release everything": the default must still keep
    params for backward (000-b) and a window must still keep what it covers (000-d, 000-e), while
    the distance-0 contracts cannot tell this coordinator from the reference."""
    run = run_suite(IGNORES_REUSE_DISTANCE, "000")
    outcomes = run.outcomes()
    assert {"000-a", "000-c"} <= set(outcomes), f"distance-0 contracts did not run: {outcomes}"
    assert run.failed_ids() == IGNORES_REUSE_DISTANCE_FLAGS, (
        f"expected exactly {sorted(IGNORES_REUSE_DISTANCE_FLAGS)} to FAIL, got {outcomes}\n{run.stdout[-4000:]}")
