"""Family 002's contracts flag the known-bad coordinator that partitions frozen params during recompute.

``tests/bad_coordinators/partition_frozen_during_recompute.py`` is the reference coordinator with
deepspeed <= 0.19.2's bug put back (DeepSpeed PR 8130): a frozen param is partitioned by the forward
release of a checkpoint recompute.  One run of the whole suite against it must report 002-a as FAIL
(the contract written for it) and no contract outside family 002: a failure elsewhere would mean
the suite blames the wrong contract, or the known-bad coordinator carries more than one bug.
"""
from pathlib import Path

BAD_COORDINATOR = (f"{Path(__file__).parent / 'bad_coordinators' / 'partition_frozen_during_recompute.py'}"
                   ":PartitionFrozenDuringRecompute")
#: The family-002 contracts whose scenario needs no frozen param to be recomputed: the bug cannot
#: show there, so failing them would mean the known-bad coordinator broke something else.
UNAFFECTED = {"002-d"}
#: Contracts of other families whose scenario itself runs a non-reentrant recompute over frozen params
#: (base-f checks the lifecycle of a checkpointed model with frozen params): the bug legitimately
#: breaks them with the same CheckpointError, so they may fail too.
ALSO_EXERCISES_THE_BUG = {"base-f"}


def test_suite_flags_partition_frozen_during_recompute_with_002a(run_suite):
    """Why: 002-a is the contract the PR 8130 bug must trip; the bad coordinator differs from the
    reference only there, so every other family must still pass."""
    run = run_suite(BAD_COORDINATOR, "")
    outcomes = run.outcomes()
    assert outcomes.get("002-a") == "FAIL", (
        f"002-a should flag partitioning frozen params during recompute, got {outcomes.get('002-a')!r}; "
        f"all outcomes: {outcomes}\n{run.stdout[-4000:]}")
    outside = {cid: out for cid, out in outcomes.items()
               if not cid.startswith("002-") and cid not in ALSO_EXERCISES_THE_BUG and out == "FAIL"}
    assert not outside, (f"contracts outside family 002 failed on a coordinator whose only bug is partitioning "
                         f"frozen params during recompute: {sorted(outside)}\n{run.stdout[-4000:]}")
    wrongly = {cid: outcomes.get(cid) for cid in UNAFFECTED if outcomes.get(cid) != "pass"}
    assert not wrongly, f"contracts the bug cannot affect did not pass: {wrongly}\n{run.stdout[-4000:]}"
    checked_elsewhere = [cid for cid, out in outcomes.items() if not cid.startswith("002-") and out == "pass"]
    assert checked_elsewhere, f"no contract outside family 002 ran, so 'nothing else flagged' proves nothing: {outcomes}"
