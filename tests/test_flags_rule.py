"""The rule family flags realistic coordinator mistakes that every other contract lets through.

Each coordinator in tests/bad_coordinators/ used here is the reference with one plausible mistake
(see each file's docstring).  One run of the whole suite per coordinator (every family, the rule
family on its anchors only: ``--zero3-examples=0``, no shrinking) must report exactly the expected
IDs as FAIL: the rule contracts that pin the broken rule, and no contract of families
000-003/base (they read residency in forward or after backward/step, where DeepSpeed's safety nets
have cleaned up, or compare numbers only).  ``grows_fetch_log`` is flagged by 001-d's retained-memory
bound (tracemalloc), which the gc-object census alone missed.

Cost: one suite run per coordinator.  Measured on the shared 2-core box under heavy load (load
average ~24): 195-330 s each, about 20 min for the file serially; on a quiet box expect the suite's
~45 s plus ~25 s of rule anchors each, i.e. ~7 min of CPU (~3.5-4 min wall with ``-n 2``).
"""
from pathlib import Path

import pytest

BAD = Path(__file__).resolve().parent / "bad_coordinators"
EVERYTHING = "000,001,002,003,base,rule"


@pytest.mark.parametrize("bad_file, cls, flagged", [
    ("backward_defers_release.py", "BackwardDefersRelease", {"rule-b", "rule-f"}),
    ("prefetch_counts_shards.py", "PrefetchCountsShards", {"rule-d"}),
    ("prefetch_ignores_max_live.py", "PrefetchIgnoresMaxLive", {"rule-d"}),
    ("partitions_persistent_in_backward.py", "PartitionsPersistentInBackward", {"rule-e", "rule-f"}),
    ("backward_window_off_by_one.py", "BackwardWindowOffByOne", {"rule-b", "rule-f"}),
    ("grows_fetch_log.py", "GrowsFetchLog", {"001-d"}),
])
def test_only_the_rule_flags_each_bad_coordinator(run_suite, monkeypatch, bad_file, cls, flagged):
    """Why: a rule contract that misses its mistake proves nothing; a hand-written contract that
    catches it would mean the rule family adds nothing for it."""
    monkeypatch.setenv("ZERO3_RULE_SHRINK_RUNS", "0")
    run = run_suite(f"{BAD / bad_file}:{cls}", EVERYTHING, "--zero3-examples=0")
    outcomes = run.outcomes()
    assert {"000-a", "001-d", "002-a", "base-a", "rule-a"} <= set(outcomes), (
        f"{cls}: the suite did not run: {outcomes}\n{run.stdout[-3000:]}")
    assert run.failed_ids() == flagged, (f"{cls}: expected exactly {sorted(flagged)} to FAIL, got "
                                         f"{sorted(run.failed_ids())}; all: {outcomes}\n{run.stdout[-4000:]}")


def test_default_examples_are_reproducible():
    """The rule family's default examples are the same on every run: CI must not flake on a new draw."""
    import json
    from conformance import test_rule_oracle as oracle
    assert json.dumps(oracle.draw_examples(4, None)) == json.dumps(oracle.draw_examples(4, None))
    assert json.dumps(oracle.draw_examples(4, 7)) != json.dumps(oracle.draw_examples(4, None))
