"""Family 006's contracts flag DeepSpeed forks whose cost grows, not their results.

Each fork is the installed deepspeed copied (``tests/forks.py``) with one edit that leaves every
number right and costs more per step: DeepSpeed PR 7886 undone (every gradient hook re-counts the
params the running backward reaches, walking them all: PR 7780's regression, issues 7882 and 7885),
stock's release-set ``lru_cache`` removed with nothing in its place (each release rescans the
trace), ``destroy()`` that forgets the z3 leaf modules' backward hooks, and a module's pending-gradient
count initialised once instead of at every forward (after a checkpoint recompute the post-backward
release never fires; the end-of-backward clean-up hides it from every other contract).  Run with
``--zero3-impl=DIR`` on family 006, each must FAIL the contract written for its bug.

Every run checks that each fork but :data:`PROOF_ONLY` fails its contract (one contract per run);
the proof run (``--proofs``) runs the whole family per fork and checks that the other contracts pass.
"""

import pytest
from forks import FIX_REWRAP, bite_groups

#: fork name -> (contract that must flag it, file under deepspeed/, old text, new text, what the edit costs)
COST_BUGS = {
    # DeepSpeed PR 7886 undone: count_used_parameters_in_backward (a walk over every param) in every
    # gradient hook instead of once per backward phase, so a backward walks params * params
    "hook_counts_every_param": (
        "006-b",
        "runtime/zero/stage3.py",
        "refresh_expected = self.should_refresh_expected_hook_count()",
        "refresh_expected = True",
        "every gradient hook walks every param (DeepSpeed PR 7886 undone)",
    ),
    # the lru_cache of __params_to_release deleted (the leak of DeepSpeed PR 8883 gone) and nothing
    # caching the release sets in its place: every release scans the trace up to the next use
    "release_sets_uncached": (
        "006-b",
        "runtime/zero/partitioned_param_coordinator.py",
        "    @functools.lru_cache(maxsize=None)\n    def __params_to_release(",
        "    def __params_to_release(",
        "release sets recomputed at every release (lru_cache removed, no cache in its place)",
    ),
    # destroy() removes the gradient hooks but not the z3 leaf modules' backward hooks
    "destroy_keeps_leaf_hooks": (
        "006-c",
        "runtime/zero/stage3.py",
        "        for hook in self._leaf_module_hooks:\n            hook.remove()\n",
        "",
        "destroy() leaves the z3 leaf modules' backward hooks",
    ),
    # a module's count of pending gradients initialised once instead of reset at every forward: after
    # a checkpoint recompute it never returns to zero, so the post-backward release of every
    # checkpointed module stops firing and the end-of-backward clean-up releases their params instead
    "grads_remaining_never_reset": (
        "006-d",
        "runtime/zero/parameter_offload.py",
        "        def _post_backward_module_hook(module, inputs):\n            module.ds_grads_remaining = 0\n",
        "        def _post_backward_module_hook(module, inputs):\n"
        '            if "ds_grads_remaining" not in module.__dict__:\n'
        "                module.ds_grads_remaining = 0\n",
        "post-backward release of checkpointed modules never fires (ds_grads_remaining not reset per forward)",
    ),
}

#: Proven by the proof run only: 006-b already bites in every run on the first fork and on the
#: ``release_scan_uncached`` coordinator (tests/flags.py), which is this bug in the reference.
PROOF_ONLY = frozenset({"release_sets_uncached"})

#: The cheap runs share forks: two bugs of one contract never share one.
BITE_GROUPS = bite_groups({name: ({bug[0]}, set()) for name, bug in COST_BUGS.items() if name not in PROOF_ONLY})


@pytest.fixture(scope="module")
def cost_fork(tmp_path_factory):
    """``cost_fork(name)``: the fork ``name`` of :data:`COST_BUGS`, or one with every edit of a
    :data:`BITE_GROUPS` group named ``"a+b"`` (built once)."""
    from forks import ForkCache

    # stock's own 006-c bug fixed first (forks.FIX_REWRAP): 006-c then judges the edit, not stock
    edits = {name: [FIX_REWRAP, bug[1:4]] for name, bug in COST_BUGS.items()}
    edits.update({"+".join(g): [e for name in g for e in edits[name]] for g in BITE_GROUPS})
    return ForkCache(tmp_path_factory, edits)


@pytest.mark.parametrize("group", BITE_GROUPS, ids="+".join)
def test_cost_forks_fail_their_contracts(run_suite, cost_fork, group):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run:
    one fork per group; that each edit fails its contract alone is the proof run's)."""
    contracts = sorted(COST_BUGS[name][0] for name in group)
    run = run_suite(cost_fork("+".join(group)), ",".join(contracts))
    from forks import unbitten

    wrong = unbitten(run, COST_BUGS, group)
    assert not wrong, f"the contract of each edit should fail, got {wrong}; all: {run.outcomes()}\n{run.stdout[-4000:]}"


@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(COST_BUGS))
def test_suite_flags_cost_fork_with_its_contract(run_suite, cost_fork, name):
    """Why: these forks differ from stock 0.19.8 by one edit that changes no result, so the other
    contracts of the family must let them through (the whole proof: --proofs, scripts/proofs.sh)."""
    contract, _, _, _, bug = COST_BUGS[name]
    run = run_suite(cost_fork(name), "006")
    outcomes = run.outcomes()
    assert outcomes.get(contract) == "fail", (
        f"{contract} should flag the fork where {bug}, got {outcomes.get(contract)}; "
        f"all: {outcomes}\n{run.stdout[-4000:]}"
    )
    others = {cid: out for cid, out in outcomes.items() if cid != contract and out != "pass"}
    assert not others, f"contracts the edit should not reach did not pass: {others}\n{run.stdout[-4000:]}"


#: A second way to lose the release: DeepSpeed's post-backward wrapper skipped on the forward calls that
#: run inside a backward (a recompute), as a fork might to avoid counting a module's inputs twice.  With
#: reentrant checkpointing the recompute is the only forward that builds a graph, so its release never fires.
RECOMPUTE_UNWRAPPED = (
    "runtime/zero/parameter_offload.py",
    "        def _post_backward_module_hook(module, inputs):\n            module.ds_grads_remaining = 0\n",
    "        def _post_backward_module_hook(module, inputs):\n            module.ds_grads_remaining = 0\n"
    "            if torch._C._current_graph_task_id() != -1:\n                return None\n",
)


@pytest.mark.slow
def test_rule_model_judges_each_checkpointed_modules_backward(run_suite, cost_fork, tmp_path_factory):
    """Why: issue 32 part 4.  The rule model is judged where each module's backward ends inside
    activation-checkpointed blocks, reentrant and non-reentrant, not only once ``engine.backward`` returns
    (whose clean-up releases what a missed post-backward hook left).  006-d's fork (the pending-gradient
    count never reset) loses the release after a non-reentrant recompute only; a fork that skips the
    wrapper in recomputes loses it in both kinds.  rule-b flags each where it happens."""
    import json

    from forks import ForkCache
    from pytest_zero3.fixtures.rule import examples as rule_examples

    zero = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0}
    examples = [rule_examples.spec(["ckpt", "linear"], zero, reentrant=r, steps=3, ranks=1) for r in (False, True)]
    replay = f"--zero3-replay={json.dumps(examples)}"
    forks = {
        "grads_remaining_never_reset": (cost_fork("grads_remaining_never_reset"), "1 of 2 examples (examples [0]"),
        "recompute_unwrapped": (
            ForkCache(tmp_path_factory, {"r": RECOMPUTE_UNWRAPPED})("r"),
            "2 of 2 examples (examples [0, 1]",
        ),
    }
    for name, (fork, failing) in forks.items():
        run = run_suite(fork, "rule-b", replay, "--zero3-shrink=0")
        assert run.failed_ids() == {"rule-b"}, f"{name}: {run.stdout[-4000:]}"
        assert f"fails in {failing}" in run.stdout, f"{name}: {run.stdout[-4000:]}"
        assert "its post-backward hook, the release of its params, has not run" in run.stdout, run.stdout[-4000:]
