"""Family 007's contracts flag DeepSpeed forks with one fix of DeepSpeed's history undone.

Each fork is the installed deepspeed copied (``tests/forks.py``) with the edits of one fix reverted:
a bug users of the ecosystem's entry points (PEFT, transformers) met and DeepSpeed fixed.  Run with
``--zero3-impl=DIR`` on family 007, each must FAIL the contract written for its path and pass the
others.  (007-a's known-bad implementation is a coordinator: ``tests/flags.py``.)

Every run checks that each fork fails its contract; the proof run (``--proofs``) runs the whole family
per fork and checks that the other contracts pass.
"""

import pytest

#: fork name -> (contract that must flag it, [(file under deepspeed/, old text, new text)], what the edits
#: break, text the contract's failure must show: the fork's own failure, not another one)
LIFE_BUGS = {
    # DeepSpeed PR 8144 undone (issues 7203, 7615): the hook-state checks see attributes a wrapper
    # delegates to its child (PEFT's ModulesToSaveWrapper), so the wrapper gets the child's backward
    # hook classes and raises AttributeError ('ds_grads_remaining') in its forward
    "delegated_hook_state": (
        "007-c",
        [
            (
                "runtime/zero/parameter_offload.py",
                'if "pre_bwd_fn" not in module.__dict__:',
                'if not hasattr(module, "pre_bwd_fn"):',
            ),
            (
                "runtime/zero/parameter_offload.py",
                'if "applied_pre_backward_ref_cnt" not in ctx.module.__dict__:',
                'if not hasattr(ctx.module, "applied_pre_backward_ref_cnt"):',
            ),
            (
                "runtime/zero/parameter_offload.py",
                'if "post_bwd_fn" not in module.__dict__:',
                'if not hasattr(module, "post_bwd_fn"):',
            ),
        ],
        "ZeRO-3 hook state read through attribute-delegating wrappers (DeepSpeed PR 8144 undone)",
        "object has no attribute 'ds_grads_remaining'",
    ),
}


@pytest.fixture(scope="module")
def life_fork(tmp_path_factory):
    """``life_fork(name)``: the fork ``name`` of :data:`LIFE_BUGS` (built once)."""
    from forks import ForkCache

    return ForkCache(tmp_path_factory, {name: bug[1] for name, bug in LIFE_BUGS.items()})


@pytest.mark.parametrize("name", sorted(LIFE_BUGS))
def test_life_forks_fail_their_contracts(run_suite, life_fork, name):
    """Why: a contract is proven only by an implementation that breaks it (the cheap half, every run)."""
    contract, _, bug, cause = LIFE_BUGS[name]
    run = run_suite(life_fork(name), contract)
    outcome = run.outcomes().get(contract)
    assert outcome == "fail", f"{contract} should flag the fork where {bug}, got {outcome}\n{run.stdout[-4000:]}"
    assert cause in run.stdout, f"{contract} failed, but not with {cause!r}:\n{run.stdout[-4000:]}"


@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(LIFE_BUGS))
def test_suite_flags_life_fork_with_its_contract(run_suite, life_fork, name):
    """Why: each fork differs from stock 0.19.8 by one fix undone, so the family's other contracts must
    let it through, except where stock itself fails (007-a: the attached module's step, see the 0.19.8
    expectations)."""
    contract, _, bug, _ = LIFE_BUGS[name]
    run = run_suite(life_fork(name), "007")
    outcomes = run.outcomes()
    assert outcomes.get(contract) == "fail", f"{contract} should flag the fork where {bug}: {outcomes}"
    others = {cid: out for cid, out in outcomes.items() if cid not in (contract, "007-a") and out != "pass"}
    assert not others, f"contracts the edit should not reach did not pass: {others}\n{run.stdout[-4000:]}"
