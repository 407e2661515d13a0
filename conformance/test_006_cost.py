"""Family 006: cost, stated in counts.

A fork whose results are right but that does more work every step passes every other contract:
users find it weeks later in their step time.  These contracts count that work in units that do not
depend on the machine's speed or load (collectives issued and elements all-gathered, Python lines
executed, hooks registered, hook calls made), so they hold on a busy CI runner.  Each has a
known-bad implementation that the rest of the suite lets through: tests/flags.py (coordinators) and
tests/test_flags_006.py (DeepSpeed forks).  Scenarios: :mod:`pytest_zero3.fixtures.cost`.
"""

import pytest
from pytest_zero3.fixtures import cost as f6
from pytest_zero3.fixtures.verdicts import assert_clean


@pytest.mark.zero3_contract("006-a")
def test_collectives_per_step(zero3_world):
    """Collectives are counted at deepspeed.comm's backend, by kind, over each micro-step's forward,
    backward and ``step()``: the all-gathers of params, the gradients' reductions, the all-reduces of
    the optimizer step, and anything else a fork adds.  The first step records the trace and the
    second completes it (with a cross-rank check of the order); from then on nothing about the step
    changes, so neither may its collectives.  Under gradient accumulation a micro-step before the
    boundary reduces what the config says (nothing, or its buckets) and the boundary one also runs
    the optimizer step: micro-steps are compared at the same position of the window, and so each
    optimizer step's total is the same.  A count that grows step by step is the slowdown users meet
    late in a run.  The elements all-gathered per micro-step are bounded by twice the params (each
    gathered whole for forward and again for backward at most); more is a refetch storm."""
    runs = []
    for distance in (None, 0):
        zero = None if distance is None else {"stage3_max_reuse_distance": distance}
        label = "default reuse distance" if distance is None else f"reuse distance {distance}"
        runs.append([f6.collective_problems(label, r) for r in zero3_world.run(f6.collective_counts, zero=zero)])
    results = [sum(per_rank, []) for per_rank in zip(*runs)]
    assert_clean(results, "collectives per step")


@pytest.mark.zero3_contract("006-b")
def test_python_work_linear(zero3_world):
    """The Python lines DeepSpeed and the coordinator execute in one forward, one backward and one
    ``step()`` of a chain of 24 and of 48 Linear(4, 4) layers (48 and 96 params), on a complete trace
    after two warm-up steps.  Linear work with a fixed part grows less than twice; a per-param hook
    that walks every param (DeepSpeed PR 7780, fixed by PR 7886), or a release that rescans the trace
    each time, grows toward four times.  Lines, not seconds: the count is the same on a loaded runner."""
    results = [f6.growth_problems(small, large) for small, large in zero3_world.run(f6.python_work_sizes, (24, 48))]
    assert_clean(results, "Python work per phase against the params' count")


# FusedAdam built in the forkserver: a re-wrapped engine gets it on a base that pops torch_adam
@pytest.mark.zero3_preload("pytest_zero3.fixtures.fused_adam_op")
@pytest.mark.zero3_contract("006-c")
def test_hooks_through_rewraps(zero3_world):
    """Sweeps, notebooks and RL trainers wrap one model many times and re-register ZeRO-3's hooks
    around every generation.  A hook left behind by a ``destroy()`` or a re-registration costs a call
    per module (or per param) per step from then on, and may fire into a destroyed optimizer.  A z3
    leaf gets a module backward hook of stage 3's own, which family 005's re-wrap (no leaf) never
    sees; three cycles show what accumulates only from the second re-wrap on."""
    assert_clean(zero3_world.run(f6.rewrap_hooks), "hooks")


@pytest.mark.zero3_contract("006-d")
def test_hook_calls_in_checkpointed_blocks(zero3_world):
    """DeepSpeed releases a module's params in its post-backward hook, which fires when the module's
    count of pending gradients (``ds_grads_remaining``, reset at every forward, recomputes included)
    returns to zero.  If the hook stops firing, the end-of-backward clean-up releases the params
    anyway: every weight is right, every param is partitioned after the step, and the params of
    every checkpointed block stay gathered through the rest of backward.  Counted at DeepSpeed's four
    hook functions per module and step, with the blocks checkpointed non-reentrant and reentrant."""
    results = [
        [
            line
            for reentrant, result in zip((False, True), runs)
            for line in f6.hook_call_problems(f"{'reentrant' if reentrant else 'non-reentrant'} checkpointing", result)
        ]
        for runs in zero3_world.run(f6.hook_call_runs, (False, True))
    ]
    assert_clean(results, "hook calls per step")
