"""The baseline contracts (family ``base``) flag each known-bad coordinator with exactly its ID.

Each file in tests/bad_coordinators/ used here is the reference coordinator with one bug put back:
``never_rerecord.py`` stops recording after its first trace is invalidated (prefetch never follows
a new module order: base-g), ``keeps_recompute_attribution.py`` never empties
``ds_recompute_parameters`` (bookkeeping left after the step: base-f).  Neither changes a number or
a release, so every parity contract must still pass: a failure there would blame the wrong contract.
``stale_gather_cache.py`` (DeepSpeed's coordinator serving stale gathered copies) is the converse:
it changes only numbers, so exactly the parity contracts must flag it.
Only family ``base`` is selected (about 20-25 s per run alone on the 2-core box).
"""
from pathlib import Path

import pytest

BAD = Path(__file__).resolve().parent / "bad_coordinators"
FAMILY = ["base-a", "base-b", "base-c", "base-d", "base-e", "base-f", "base-g", "base-h"]


@pytest.mark.parametrize("bad_file, cls, flagged", [
    ("never_rerecord.py", "NeverRerecord", {"base-g"}),
    ("keeps_recompute_attribution.py", "KeepsRecomputeAttribution", {"base-f"}),
    # Stale weights break every parity contract; base-e's model keeps its small layers persistent
    # (never re-fetched) and base-f checks bookkeeping, not numbers.
    ("stale_gather_cache.py", "StaleGatherCache", {"base-a", "base-b", "base-c", "base-d", "base-g", "base-h"}),
])
def test_family_base_flags_each_bad_coordinator(run_suite, bad_file, cls, flagged):
    """Why: a baseline contract that misses its bug proves nothing, and one that fails for another
    contract's bug sends a developer after the wrong fix."""
    run = run_suite(f"{BAD / bad_file}:{cls}", "base")
    outcomes = run.outcomes()
    missing = [cid for cid in FAMILY if cid not in outcomes]
    assert not missing, f"contracts {missing} did not run against {cls}: {outcomes}\n{run.stdout[-3000:]}"
    assert run.failed_ids() == flagged, f"{cls}: expected exactly {sorted(flagged)} to FAIL, got {outcomes}\n{run.stdout[-4000:]}"
    assert run.returncode == 1, f"{cls}: pytest exit {run.returncode}, expected 1 (contract failures)"
