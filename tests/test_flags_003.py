"""Family 003's contracts flag the rank-local adaptive bucket with 003-b, and report stock unsupported.

The known-bad coordinator (tests/bad_coordinators/rank_local_adaptive.py) is the reference with one
bug of the first version of DeepSpeed PR 8431: each rank resizes the bucket from its own clock.  The
suite must flag it with 003-b and nothing else, and must do so without hanging the run (the
divergence is caught before a mismatched all-gather is issued; the 003-b tests carry a short
timeout for anything that slips through).  The other controller bugs of the PR's review (sampling
while recording, keeping samples across an invalidation, an unclamped start, an inverted controller)
each have a known-bad coordinator and must be flagged by exactly their contract (003-d, 003-d,
003-c, 003-f).  Stock deepspeed 0.19.8 lacks the feature: every 003
contract must read "unsupported" with the reason, none "FAIL", none silently skipped.
"""
from pathlib import Path

import pytest

BAD = Path(__file__).resolve().parent / "bad_coordinators"
FAMILY = ["003-a", "003-b", "003-c", "003-d", "003-e", "003-f", "003-g"]
#: Whole-family wall time on this 2-core box is about 25 s; a hang would need the 45 s timeouts of
#: both 003-b tests plus stack collection.  The bound catches a run that waited on a hung rank.
MAX_SECONDS = 240


def test_family_003_flags_rank_local_decisions(run_suite):
    """Why: a controller whose ranks can pick different buckets hangs real jobs; the contract that
    promises agreement (003-b) must be the one that fails, quickly, with both ranks' sequences."""
    import time
    started = time.monotonic()
    run = run_suite(f"{BAD / 'rank_local_adaptive.py'}:RankLocalAdaptiveCoordinator", "003")
    took = time.monotonic() - started
    outcomes = run.outcomes()
    missing = [cid for cid in FAMILY if cid not in outcomes]
    assert not missing, f"contracts {missing} did not run: {outcomes}\n{run.stdout[-3000:]}"
    assert run.failed_ids() == {"003-b"}, f"expected exactly 003-b to FAIL, got {outcomes}\n{run.stdout[-4000:]}"
    assert "ranks are about to issue different all-gathers" in run.stdout or "ranks differ" in run.stdout, (
        f"003-b failed without showing the diverging sequences:\n{run.stdout[-4000:]}")
    assert "still running after" not in run.stdout, f"003-b caught the divergence only as a hang:\n{run.stdout[-4000:]}"
    assert took < MAX_SECONDS, f"the run took {took:.0f} s (bound {MAX_SECONDS} s): a rank was left hanging"
    assert run.returncode == 1, f"pytest exit {run.returncode}, expected 1 (contract failures)"


def test_family_003_unsupported_on_stock_deepspeed(run_suite):
    """Why: deepspeed 0.19.8 rejects the keys; that is a missing feature, not a failed contract, and
    the report must say so with the reason rather than skip silently."""
    run = run_suite("installed", "003")
    run.outcomes()  # the report must exist
    rows = {c["id"]: c for c in run.report["contracts"]}
    assert sorted(rows) == FAMILY, f"contracts run: {sorted(rows)}\n{run.stdout[-3000:]}"
    wrong = {cid: (r["outcome"], r["reason"]) for cid, r in rows.items()
             if r["outcome"] != "unsupported" or not r["reason"].startswith("003:")
             or "stage3_adaptive_prefetch" not in r["reason"]}
    assert not wrong, f"stock deepspeed 0.19.8 must be 'unsupported: 003' with the rejected key: {wrong}"
    assert run.returncode == 0, f"pytest exit {run.returncode}: unsupported must not fail the run\n{run.stdout[-3000:]}"


@pytest.mark.parametrize("bad_file, cls, flagged", [
    ("adaptive_samples_while_recording.py", "SamplesWhileRecording", "003-d"),
    ("adaptive_unclamped_start.py", "UnclampedStart", "003-c"),
    ("adaptive_inverted_controller.py", "InvertedController", "003-f"),
    ("adaptive_keep_samples_across_invalidation.py", "KeepSamplesAcrossInvalidation", "003-d"),
])
def test_family_003_flags_each_controller_bug(run_suite, bad_file, cls, flagged):
    """Why: 003-c, 003-d and 003-f are proven only if a controller with exactly their bug fails them
    (and nothing else in the family); the fake clock makes each decision, and so each outcome,
    deterministic.  Measured on the 2-core box: about 15 s per run alone, 37 s with two in parallel."""
    run = run_suite(f"{BAD / bad_file}:{cls}", "003")
    outcomes = run.outcomes()
    missing = [cid for cid in FAMILY if cid not in outcomes]
    assert not missing, f"contracts {missing} did not run against {cls}: {outcomes}\n{run.stdout[-3000:]}"
    assert run.failed_ids() == {flagged}, f"{cls}: expected exactly {flagged} to FAIL, got {outcomes}\n{run.stdout[-4000:]}"
    assert run.returncode == 1, f"{cls}: pytest exit {run.returncode}, expected 1 (contract failures)"
