"""Family 001's contracts flag each known-bad release cache with exactly its ID.

Each bad coordinator in tests/bad_coordinators/ subclasses the reference coordinator and
reintroduces one bug of deepspeed 0.19.8's ``__params_to_release`` lru_cache (DeepSpeed PR 8883).
A contract that cannot tell them apart, or that blames the wrong one, does not test what its
statement says.  Runs assume that a class spec is applied with the reference's non-coordinator fixes
(``FWD_MODULE_STACK``), so that 001-a judges the coordinator class alone.
"""
import pytest

from pathlib import Path

BAD = Path(__file__).resolve().parent / "bad_coordinators"
FAMILY = ["001-a", "001-b", "001-c", "001-d"]


@pytest.mark.parametrize("bad_file, cls, flagged", [
    ("class_level_cache.py", "ClassLevelCacheCoordinator", {"001-a"}),
    ("stale_cache_after_retrace.py", "StaleCacheAfterRetraceCoordinator", {"001-b"}),
    ("mutated_release_set.py", "MutatedReleaseSetCoordinator", {"001-c"}),
])
def test_family_001_flags_each_bad_cache(run_suite, bad_file, cls, flagged):
    """Why: each bug must be caught by the contract written for it and by no other, or the report
    would send a developer after the wrong fix."""
    run = run_suite(f"{BAD / bad_file}:{cls}", "001")
    outcomes = run.outcomes()
    missing = [cid for cid in FAMILY if cid not in outcomes]
    assert not missing, f"contracts {missing} did not run against {cls}: {outcomes}\n{run.stdout[-3000:]}"
    assert run.failed_ids() == flagged, (
        f"{cls}: expected exactly {sorted(flagged)} to FAIL, got {outcomes}\n{run.stdout[-4000:]}")
    assert run.returncode == 1, f"{cls}: pytest exit {run.returncode}, expected 1 (contract failures)"
